"""The poller: runs the PromQL that policies' detector triggers declare, feeds detectors, emits
signals. One range query serves every policy that shares it; failures back off and go stale."""
from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass, field, fields
from datetime import datetime, timezone
from operator import attrgetter
from typing import Any, Callable, Mapping, Sequence

import structlog

from core.collector import collector_paused
from core.detection import BudgetEvidence, Detection, DetectorStatus, sees_target
from core.promql import render_query
from core.query import Series, series_key
from core.signal import Signal, SignalSource, TriggerRef, stable_key
from daemon.storage.errors import JournalError
from daemon.storage.journal import Journal
from daemon.storage.records import Verdict
from daemon.common.lifecycle import Spawn, plain_spawn, wait_or_stop
from daemon.common.metrics import Metrics
from daemon.sources.prometheus import INGESTING, PrometheusClient, RangeResult
from daemon.sources.range_cache import RangeCache
from daemon.sources.triton_metrics import TritonMetricsSource, metrics_url
from daemon.workers.emit import Emit
from daemon.workers.series_pairing import LabelMemo, PairingMemo
from daemon.workers.series_pairing import pair_companions as pair_companions  # bench_poll_cycle reads it here
from detectors.base import ClusterReader, Detector, Offload, ReadsCluster, judges_together
from detectors.tail_excess_start import RemembersStarts
from policies.loader import BoundDetector, LoadedPolicy, PolicySet

log = structlog.get_logger("tailguard.poller")


@dataclass
class Watch:
    """One detector trigger of one policy, with its live detector instance."""

    policy: LoadedPolicy
    bound: BoundDetector
    detector: Detector
    fingerprint: str
    scoped: bool  # the query names the target itself ($model), so unlabeled series are its own
    # What each cycle derives from the series' labels, memoized (see LabelMemo, PairingMemo).
    keys: LabelMemo = field(default_factory=lambda: LabelMemo(series_key), compare=False, repr=False)
    gauges: LabelMemo = field(default_factory=lambda: LabelMemo(gauge_series), compare=False, repr=False)
    pairing: PairingMemo = field(default_factory=PairingMemo, compare=False, repr=False)
    # The last cycle's verdicts (what a gate on an alert trigger weighs): when, and per series.
    latest: "Latest | None" = field(default=None, compare=False, repr=False)
    no_data_since: float | None = None  # when its answers stopped holding a series of its model
    starts_read: bool = False  # its journaled version starts handed to the detector (RemembersStarts)


_BUDGET_FIELDS = attrgetter(*(f.name for f in fields(BudgetEvidence)))  # in the order BudgetEvidence(*...) takes


@dataclass(frozen=True)
class Latest:
    """What one watch's last cycle leaves for the next: the series it judged, the budget evidence
    the alert gates weigh, and the most telling verdict `tailguard status` shows; not every
    Detection, which each full collection of the next cycle would walk. A budget row is an exact
    tuple of numbers, which the collector stops tracking once it has seen it."""

    at: float
    stale_after: float  # the watch's staleness horizon: the gates weigh evidence no older than this
    series: tuple[Mapping[str, str], ...]  # every series' labels, in the answer's order
    budget_rows: tuple[tuple[Any, ...], ...]  # (index in `series`, *BudgetEvidence's fields) where there is one
    telling: tuple[Mapping[str, str], Detection] | None  # fired first, then the highest score
    # The last cycle that judged fresh data of the target with sight (core.detection.sees_target; None:
    # none since the daemon started): the governed alert rule's liveness evidence (policies.governance).
    fresh_at: float | None = None

    @classmethod
    def of(cls, at: float, stale_after: float, labels: Sequence[Mapping[str, str]],
           detections: Sequence[Detection], fresh_at: float | None = None) -> "Latest":
        telling = None
        if detections:
            telling = max(zip(labels, detections), key=lambda v: (v[1].fired, v[1].score or 0.0))
        rows = tuple((i, *_BUDGET_FIELDS(b)) for i, b in enumerate(d.budget for d in detections) if b is not None)
        return cls(at, stale_after, tuple(labels), rows, telling, fresh_at)

    @property
    def budgets(self) -> list[tuple[Mapping[str, str], BudgetEvidence]]:
        """What the alert gates weigh (built when an alert asks, not every cycle)."""
        return [(self.series[row[0]], BudgetEvidence(*row[1:])) for row in self.budget_rows]


@dataclass
class QueryGroup:
    """Watches that share one query, interval and lookback: one range query per cycle."""

    query: str
    interval: float
    lookback: float
    companion: str | None = None  # e.g. P99 beside P99.9, for tail divergence
    source: str = "prometheus"  # or "triton": the target's /metrics read directly
    endpoints: tuple[str, ...] = ()  # the metrics URLs a triton-source group scrapes
    watches: list[Watch] = field(default_factory=list)
    next_due: float = 0.0
    failures: int = 0
    stale: bool = False
    last_error: str | None = None
    partial: bool = False  # the last fetch read some sources, not all (source: triton)
    id: str = ""  # short and stable (query, interval, companion, source, endpoints): the gauge's label


# (query, interval, lookback, companion, source, metrics endpoints): watches sharing one fetch.
GroupKey = tuple[str, float, float, str | None, str, tuple[str, ...]]


def _metrics_endpoints(policy: LoadedPolicy) -> tuple[str, ...]:
    """Where a triton-source detector of this policy reads /metrics (validated at load)."""
    target = policy.target
    return tuple(sorted(target.triton_metrics or [metrics_url(e) for e in target.triton_endpoints]))


def _fingerprint(policy: LoadedPolicy, bound: BoundDetector) -> str:
    return stable_key(policy.name, bound.index, bound.trigger.model_dump(mode="json"),
                      policy.target.model, policy.target.namespace)


class Poller:
    def __init__(
        self,
        prometheus: PrometheusClient,
        journal: Journal,
        metrics: Metrics,
        detectors: Mapping[str, type[Detector]],
        emit: Emit,
        offload: Offload,
        max_backoff_seconds: float = 15.0,
        clock: Callable[[], float] = time.time,
        triton_metrics: TritonMetricsSource | None = None,
        incremental_range_queries: bool = True,
        cluster: ClusterReader | None = None,
    ) -> None:
        """`incremental_range_queries`: keep each Prometheus query's lookback in memory and ask
        only for the steps since the last cycle (`RangeCache`); off, every cycle asks for the whole
        lookback."""
        self._prom = prometheus
        self._ranges = RangeCache(prometheus) if incremental_range_queries else None
        self._triton = triton_metrics
        self._cluster = cluster  # what a detector reading the cluster (the canary judge) is handed
        self._journal = journal
        self._metrics = metrics
        self._registry = detectors
        self._emit = emit
        self._offload = offload
        self._max_backoff = max_backoff_seconds
        self._clock = clock
        self.groups: dict[GroupKey, QueryGroup] = {}
        # Starts each group's poll task; the service hands the supervisor's, so a crash counts.
        self.spawn: Spawn = plain_spawn
        # With sharding on: whether this replica watches a policy (it leads its target's shard); None: all.
        self.follows: Callable[[LoadedPolicy], bool] | None = None
        self.narrow: Callable[[QueryGroup], None] = lambda group: None  # and narrows its queries to those

    def sync(self, policies: PolicySet) -> None:
        """Follow a policy reload; detectors whose trigger did not change keep their state."""
        old = {w.fingerprint: w for g in self.groups.values() for w in g.watches}
        old_groups = self.groups
        groups: dict[GroupKey, QueryGroup] = {}
        for policy in policies.enabled:
            if self.follows is not None and not self.follows(policy):
                continue  # another replica leads this target's shard (sharding; daemon/wiring/sharding.py)
            for bound in policy.detectors:
                fp = _fingerprint(policy, bound)
                values = {"model": policy.target.model, "namespace": policy.target.namespace}
                query = render_query(bound.trigger.query, values)
                companion = (render_query(bound.trigger.companion_query, values)
                             if bound.trigger.companion_query else None)
                watch = old.get(fp) or Watch(policy, bound, self._registry[bound.trigger.type](bound.params),
                                             fp, scoped=query != bound.trigger.query)
                watch.policy = policy
                lookback = float(watch.detector.lookback_seconds)
                source = bound.trigger.source
                endpoints = _metrics_endpoints(policy) if source == "triton" else ()
                key = (query, bound.trigger.interval, lookback, companion, source, endpoints)
                group = groups.get(key)
                if group is None:
                    prev = old_groups.get(key)
                    group = QueryGroup(query, bound.trigger.interval, lookback, companion, source,
                                       endpoints, next_due=prev.next_due if prev else 0.0,
                                       id=stable_key(query, bound.trigger.interval, companion, source, endpoints)[:12])
                    groups[key] = group
                group.watches.append(watch)
        kept = {w.fingerprint for g in groups.values() for w in g.watches}
        for fp, w in old.items():  # a watch gone with its policy or trigger takes its gauges along
            if fp not in kept:
                self._forget_watch(w)
        for old_key, g in old_groups.items():
            if old_key not in groups:
                _remove(self._metrics.query_up, g.id, g.source)
        for g in groups.values():
            self.narrow(g)
        self.groups = groups
        self._health()

    def _health(self) -> None:
        """The coverage gauges from every group's last fetch: per group, Prometheus as a whole (down
        only when every Prometheus group fails: one bad query is not Prometheus away), stale count."""
        groups = list(self.groups.values())
        for g in groups:
            if g.failures or g.next_due:  # fetched at least once
                self._metrics.query_up.labels(g.id, g.source).set(int(not (g.stale or g.partial)))
        prom = [g for g in groups if g.source == "prometheus" and (g.failures or g.next_due)]
        self._metrics.prometheus_up.set(int(not prom or not all(g.stale for g in prom)))
        self._metrics.stale_queries.set(sum(g.stale or g.partial for g in groups))

    def _forget_watch(self, watch: Watch) -> None:
        self._metrics.detector.forget(watch.policy.name, watch.bound.index)
        _remove(self._metrics.no_data, watch.policy.name, str(watch.bound.index))

    def latest(self, policy: str, trigger_index: int) -> Latest | None:
        """The last cycle's verdicts of a policy's detector trigger (None: not polled yet)."""
        for group in self.groups.values():
            for watch in group.watches:
                if watch.policy.name == policy and watch.bound.index == trigger_index:
                    return watch.latest
        return None

    def telling(self) -> dict[tuple[str, int], dict[str, Any]]:
        """Per (policy, detector trigger), the last cycle's most telling verdict (fired first, then
        the highest score), with what the test assumed: what `tailguard status` shows."""
        out: dict[tuple[str, int], dict[str, Any]] = {}
        for group in self.groups.values():
            for watch in group.watches:
                latest = watch.latest
                if latest is None or latest.telling is None:
                    continue
                labels, d = latest.telling
                out[(watch.policy.name, watch.bound.index)] = {
                    "detector": d.detector, "series": gauge_series(labels), "fired": d.fired, "reason": d.reason,
                    "score": d.score, "assumed": d.details.get("assumed"),
                    "at": datetime.fromtimestamp(latest.at, timezone.utc).isoformat(timespec="seconds")}
        return out

    def stale_queries(self) -> list[dict[str, Any]]:
        """Groups whose last fetch failed, or read only some of their sources (`partial`)."""
        return [{"group": g.id, "source": g.source, "query": g.query, "error": g.last_error,
                 "failures": g.failures, "partial": g.partial}
                for g in self.groups.values() if g.stale or g.partial]

    def vanished(self) -> list[dict[str, Any]]:
        """Detector triggers whose answers hold no series of their model: the model is not
        watched by them (its metrics vanished, or never were), said in /readyz and as a gauge."""
        return [{"policy": w.policy.name, "trigger": w.bound.index, "model": w.policy.target.model,
                 "query": _short(w.bound.trigger.query),
                 "since": datetime.fromtimestamp(w.no_data_since, timezone.utc).isoformat(timespec="seconds")}
                for g in self.groups.values() for w in g.watches if w.no_data_since is not None]

    async def run(self, stop: asyncio.Event) -> None:
        """Poll until `stop` is set; each due group runs as its own task so one slow query waits alone."""
        running: dict[GroupKey, asyncio.Task[None]] = {}
        try:
            while not stop.is_set():
                now = self._clock()
                for key, group in list(self.groups.items()):
                    if group.next_due <= now and key not in running:
                        running[key] = self.spawn(f"poll-{group.id}", self.poll_group(group, now))
                for key in [k for k, t in running.items() if t.done()]:
                    task = running.pop(key)
                    if task.exception() is not None:
                        self._metrics.faults.labels("poller").inc()
                        log.error("poll cycle failed", error=repr(task.exception()))
                await wait_or_stop(stop, 0.5)
        finally:
            for task in running.values():
                task.cancel()
            await asyncio.gather(*running.values(), return_exceptions=True)

    async def poll_group(self, group: QueryGroup, now: float) -> None:
        """One cycle of one query: fetch, detect per series, journal verdicts, emit signals."""
        group.next_due = max(group.next_due, math.floor(now)) + group.interval  # no drift off the range cache's grid
        # A detector may ask for more history than at the last sync (tail_excess grows its lookback
        # when it sees slow traffic): the next fetch follows it.
        group.lookback = max(float(w.detector.lookback_seconds) for w in group.watches)
        result = await self._fetch(group, group.query, now)
        if result.error is not None:
            self._mark_failed(group, result, now)
            return
        companions: RangeResult | None = None
        if group.companion is not None:
            companions = await self._fetch(group, group.companion, now)
            if companions.error is not None:
                self._mark_failed(group, companions, now)
                return
        if group.stale:
            log.info("query recovered", query=group.query, group=group.id)
        partial = result.partial + (companions.partial if companions is not None else ())
        if partial and not group.partial:
            log.warning("some sources of the query could not be read; watching the others", query=group.query,
                        group=group.id, errors=list(partial))
        group.failures, group.stale = 0, False
        group.partial, group.last_error = bool(partial), "; ".join(partial) or None
        self._health()
        for watch in group.watches:
            await self._evaluate(watch, result, companions, now)

    async def _fetch(self, group: QueryGroup, query: str, now: float) -> RangeResult:
        """The group's range of `query` from its source (Prometheus: to the whole second `ingesting` before `now`)."""
        if group.source == "triton":
            if self._triton is None:
                return RangeResult(query, error="source: triton is not available in this process")
            return await self._triton.query_range(query, now - group.lookback, now, group.interval, group.endpoints)
        end = float(math.floor(now - getattr(self._prom, "ingesting", INGESTING)))
        source = self._ranges if self._ranges is not None else self._prom
        return await source.query_range(query, end - group.lookback, end, group.interval)

    def _mark_failed(self, group: QueryGroup, result: RangeResult, now: float) -> None:
        group.failures += 1
        group.stale = True
        group.last_error = result.error
        backoff = min(self._max_backoff, group.interval * 2 ** min(group.failures, 10))
        group.next_due = now + backoff
        for watch in group.watches:  # the detector gauges go stale with their data: not shown as if fresh
            self._metrics.detector.forget(watch.policy.name, watch.bound.index)
        self._health()
        log.warning("query failed; series stale, not acting on them", query=group.query, group=group.id,
                    error=result.error, retry_in_seconds=backoff)

    async def _evaluate(self, watch: Watch, result: RangeResult, companions: RangeResult | None,
                        now: float) -> None:
        policy, trigger, index = watch.policy, watch.bound.trigger, watch.bound.index
        mine = routed(watch, result.series)
        horizon = staleness_horizon(watch)
        has_data = bool(mine) and fresh(mine, now, horizon)
        self._mark_data(watch, has_data, now)
        if not mine:
            reason = f"no data for model {policy.target.model!r}: {_short(trigger.query)}"
            await self._journal.evaluations.record_many.in_thread([Verdict(policy.name, index, "*", False, reason)])
            return
        if isinstance(watch.detector, ReadsCluster) and self._cluster is not None:
            await watch.detector.observe_cluster(self._cluster)
        pairs = watch.pairing.pair(mine, companions) if companions is not None else None
        remembers = isinstance(watch.detector, RemembersStarts)
        if remembers and not watch.starts_read:
            await self._restore_starts(watch)
        try:
            await watch.detector.prepare(mine, now, self._offload, pairs)
        except Exception as exc:  # a failed refit leaves the old model in place; recorded, not fatal
            self._metrics.faults.labels("detector_prepare").inc()
            log.error("detector prepare failed", policy=policy.name, error=repr(exc))
        # The cycle's verdicts are built, counted and turned into journal rows with the collector
        # paused, and dropped before anything is awaited: they hold no cycles, and left alive across
        # the journal's write they would be promoted into the old generation, which every full
        # collection of the next cycles walks.
        with collector_paused():
            detections = self._detect_all(watch, mine, pairs, now)
            labels = [s.labels for s in mine]
            before = watch.latest.fresh_at if watch.latest is not None else None
            watch.latest = Latest.of(now, horizon, labels, detections, now if has_data and sees_target(detections) else before)
            watch.keys.next_cycle()
            watch.gauges.next_cycle()
            keys = list(watch.keys.many(labels))  # once per series: the journal row and the log
            count_verdicts(self._metrics, watch, detections)
            self._metrics.detector.observe_many(policy.name, watch.bound.index, watch.gauges.many(labels),
                                                detections, now)
            if not has_data:  # only old points (the series vanished, the range still holds them): not shown as fresh
                self._metrics.detector.forget(policy.name, watch.bound.index)
            if _debug_enabled():  # structlog's level check costs a logger per call: asked once per cycle
                for key, detection in zip(keys, detections):
                    log.debug("evaluated", policy=policy.name, series=key, fired=detection.fired,
                              value=detection.value, baseline=detection.baseline, reason=detection.reason)
            rows = [Verdict(policy.name, index, key, d.fired, d.reason) for key, d in zip(keys, detections)]
            fired = [(series, d) for series, d in zip(mine, detections) if d.fired]
            del detections
        # Signals first: acting is what matters, and an evaluation journaled as fired then always
        # has its signal journaled already (a reader of evaluations never sees one without it).
        for series, detection in fired:
            await self._emit(detection_signal(watch, series, detection, now))
        await self._journal.evaluations.record_many.in_thread(rows)
        if remembers:
            await self._journal_starts(watch)

    async def _restore_starts(self, watch: Watch) -> None:
        """Before a detector's first cycle, the version starts journaled for its trigger: a restart or
        a failover resumes their start tests and never starts a second one."""
        detector = watch.detector
        assert isinstance(detector, RemembersStarts)
        try:
            starts = await self._journal.starts.of.in_thread(watch.policy.target.key, watch.fingerprint)
        except JournalError as exc:  # unread: tried again next cycle; meanwhile serving versions get no test
            log.warning("journaled version starts unreadable", policy=watch.policy.name, error=str(exc))
            return
        detector.restore_starts(starts)
        watch.starts_read = True

    async def _journal_starts(self, watch: Watch) -> None:
        """The version starts the detector found this cycle, journaled for a restart to resume."""
        detector = watch.detector
        assert isinstance(detector, RemembersStarts)
        found = detector.take_new_starts()
        if not found:
            return
        try:
            await self._journal.starts.record.in_thread(watch.policy.target.key, watch.fingerprint, dict(found))
        except (JournalError, ValueError) as exc:  # the test runs on; a restart gives these versions none
            self._metrics.faults.labels("poller").inc()
            log.warning("version starts not journaled: a restart will not resume their start tests",
                        policy=watch.policy.name, starts=found, error=str(exc))
        else:
            log.info("version started", policy=watch.policy.name, trigger=watch.bound.index, starts=found)

    def _mark_data(self, watch: Watch, has_data: bool, now: float) -> None:
        """Whether this cycle's answer held a fresh series of the watch's model; a change is logged."""
        policy, index = watch.policy.name, watch.bound.index
        if has_data:
            if watch.no_data_since is not None:
                log.info("detector data back", policy=policy, trigger=index)
            watch.no_data_since = None
        else:
            if watch.no_data_since is None:
                watch.no_data_since = now
                log.warning("no fresh series of the model in the detector's answer: the model is not watched by it",
                            policy=policy, trigger=index, model=watch.policy.target.model)
            self._metrics.detector.forget(policy, index)
        self._metrics.no_data.labels(policy, str(index)).set(int(not has_data))

    def _detect_all(self, watch: Watch, mine: list[Series], pairs: list[Series | None] | None,
                    now: float) -> list[Detection]:
        """One Detection per series (`pairs[i]`: its companion): the detector's batch path when the
        batch is big enough to pay for it (a vectorized detector aligns the series on one grid) or
        when the detector judges its series together (`judges_together`: a canary beside its
        stable), else one call per series."""
        detector, kind = watch.detector, watch.bound.trigger.type
        if len(mine) >= BATCH_MIN_SERIES or judges_together(detector):
            try:
                batch = detector.detect_many(mine, now, pairs)
                if len(batch) != len(mine):  # zip with the series would silently drop verdicts
                    raise ValueError(f"detect_many returned {len(batch)} detections for {len(mine)} series")
                return batch
            except Exception:  # the batch path failing must not blind the detector: go per series
                self._metrics.faults.labels("detector").inc()
                log.exception("batch detection failed; falling back to per-series", policy=watch.policy.name)
        out = []
        for i, series in enumerate(mine):
            try:
                out.append(detector.detect(series, now, pairs[i] if pairs is not None else None))
            except Exception as exc:  # detectors promise not to raise; if one does, it is recorded
                self._metrics.faults.labels("detector").inc()
                log.exception("detector raised", policy=watch.policy.name, series=series_key(series.labels))
                out.append(Detection(kind, False, f"detector raised {type(exc).__name__}: {exc}",
                                     status=DetectorStatus.FAILED))
        return out

    def _belongs(self, watch: Watch, series: Series) -> bool:
        label = watch.bound.trigger.model_label
        if label in series.labels:
            return series.labels[label] == watch.policy.target.model
        return watch.scoped


def routed(watch: Watch, series: list[Series]) -> list[Series]:
    """The series a watch judges: `Poller._belongs` over a whole answer, its lookups done once."""
    label, model, scoped = watch.bound.trigger.model_label, watch.policy.target.model, watch.scoped
    return [s for s in series if (s.labels[label] == model if label in s.labels else scoped)]


def count_verdicts(metrics: Metrics, watch: Watch, detections: list[Detection]) -> None:
    """`tailguard_detections_total`: one increment per policy and result, by the count, where
    one per verdict looked the labelled child up 10,000 times a cycle."""
    fired = sum(1 for d in detections if d.fired)
    counts = {"true": fired, "false": len(detections) - fired}
    if detections and not detections[0].fired:  # the first verdict's child first, as one by one
        counts = {"false": counts["false"], "true": counts["true"]}
    counter, policy, kind = metrics.detections, watch.policy.name, watch.bound.trigger.type
    for result, count in counts.items():
        if count:
            counter.labels(policy, kind, result).inc(count)


def staleness_horizon(watch: Watch) -> float:
    """How old a series' newest point may be and count as data: its params' own, else 3 intervals (1 min or more)."""
    return watch.bound.params.max_staleness_seconds or max(3.0 * watch.bound.trigger.interval, 60.0)


def fresh(series: list[Series], now: float, horizon: float) -> bool:
    """Whether any series' newest finite point is within `horizon` of `now` (usually the first
    point looked at: O(series))."""
    for s in series:
        for t, v in zip(reversed(s.timestamps), reversed(s.values)):
            if math.isfinite(v):
                if t >= now - horizon:
                    return True
                break
    return False


def _remove(gauge: Any, *labels: str) -> None:
    try:
        gauge.remove(*labels)
    except KeyError:  # never set
        pass


def _debug_enabled() -> bool:
    """Whether the poller's debug lines would be written (True where the logger cannot tell)."""
    is_enabled_for = getattr(log, "is_enabled_for", None)
    return True if is_enabled_for is None else bool(is_enabled_for(logging.DEBUG))


BATCH_MIN_SERIES = 8  # below this, per-series calls cost less than aligning arrays


def gauge_series(labels: Mapping[str, str]) -> str:
    """A series as a readable label value for the detector gauges: `k=v` pairs, sorted, without the
    metric name (the JSON of `series_key` would be all escapes in the exposition format)."""
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()) if k != "__name__") or "{}"


def _short(query: str) -> str:
    return query if len(query) < 200 else query[:197] + "..."


def detection_signal(watch: Watch, series: Series, d: Detection, now: float) -> Signal:
    """A detector verdict as a Signal; the episode start makes re-detections of one episode dedup."""
    episode = d.episode_start if d.episode_start is not None else now
    # Marked on the signal too (a reload that moves triggers cannot turn it live); no detail overwrites it or query.
    shadow = {"shadow": True} if watch.policy.spec.triggers[watch.bound.index].shadow else {}
    labels = dict(series.labels)
    labels.setdefault("model", watch.policy.target.model)
    return Signal(
        source=SignalSource.DETECTOR, name=d.detector, labels=labels,
        observed_at=datetime.fromtimestamp(now, timezone.utc),
        dedup_key=f"detector:{watch.policy.name}:{watch.bound.index}:"
                  f"{stable_key(series_key(series.labels), round(episode, 3))}",
        value=d.value, policy=watch.policy.name,
        details={"reason": d.reason, "baseline": d.baseline, "score": d.score, "threshold": d.threshold,
                 "episode_start": d.episode_start, "query": watch.bound.trigger.query,
                 "evidence": [list(p) for p in d.evidence][-20:],
                 **{k: v for k, v in d.details.items() if k not in ("query", "shadow")}, **shadow},
        recovery_line=d.recovery_line,
        trigger=TriggerRef(SignalSource.DETECTOR, watch.bound.index, watch.bound.trigger.type),
    )
