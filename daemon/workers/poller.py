"""The poller: runs the PromQL that policies' detector triggers declare, feeds detectors, emits
signals. One range query serves every policy that shares it; failures back off and go stale."""
from __future__ import annotations

import asyncio
import logging
import operator
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Iterable, Iterator, Mapping

import structlog

from core.detection import Detection
from core.promql import render_query
from core.query import Series, series_key
from core.signal import Signal, SignalSource, stable_key
from daemon.storage.journal import AsyncJournal
from daemon.common.metrics import Metrics
from daemon.sources.prometheus import PrometheusClient, RangeResult
from daemon.sources.range_cache import RangeCache
from daemon.sources.triton_metrics import TritonMetricsSource, metrics_url
from daemon.workers.emit import Emit
from detectors.base import Detector, Offload
from policies.loader import BoundDetector, LoadedPolicy, PolicySet

log = structlog.get_logger("tailguard.poller")


class LabelMemo:
    """`fn(labels)` computed once per labels mapping object while that object keeps coming back:
    the range cache hands out the same mapping of a series every cycle, so a steady cycle finds
    the series' keys here instead of sorting and encoding 10,000 label sets again. Keyed by the
    mapping's id, the mapping held so that the id stays its own (a Series' labels are never
    changed in place); what a cycle did not ask for is dropped at the next (`next_cycle`). Only
    dicts of ints and strings and lists: nothing more for the cyclic GC to walk."""

    def __init__(self, fn: Callable[[Mapping[str, str]], str]) -> None:
        self._fn = fn
        self._now: dict[int, str] = {}
        self._last: dict[int, str] = {}
        self._held_now: list[Mapping[str, str]] = []
        self._held_last: list[Mapping[str, str]] = []

    def next_cycle(self) -> None:
        self._last, self._held_last = self._now, self._held_now
        self._now, self._held_now = {}, []

    def many(self, labels: Iterable[Mapping[str, str]]) -> Iterator[str]:
        """`fn` of each mapping, in order, each when asked for (as `fn` one call at a time)."""
        now, last, held, fn = self._now, self._last, self._held_now, self._fn
        for mapping in labels:
            value = now.get(id(mapping))
            if value is None:
                value = last.get(id(mapping))
                if value is None:
                    value = fn(mapping)
                now[id(mapping)] = value
                held.append(mapping)
            yield value


class PairingMemo:
    """`pair_companions` of a watch's last cycle, reused while the same series come back in the
    same order (the same labels mapping objects: the range cache keeps them, and a Series' labels
    are never changed in place), so they pair the same way; otherwise paired anew."""

    def __init__(self) -> None:
        self._series: list[Mapping[str, str]] = []
        self._companions: list[Mapping[str, str]] = []
        self._positions: list[int] = []  # per series, its companion's position; -1: none

    def pair(self, series: list[Series], companions: RangeResult) -> list[Series | None]:
        labels = [s.labels for s in series]
        companion_labels = [c.labels for c in companions.series]
        if not (_same_objects(labels, self._series) and _same_objects(companion_labels, self._companions)):
            position = {id(c): i for i, c in enumerate(companions.series)}
            self._positions = [-1 if c is None else position[id(c)] for c in pair_companions(series, companions)]
            self._series, self._companions = labels, companion_labels
        found = companions.series
        return [found[i] if i >= 0 else None for i in self._positions]


def _same_objects(a: list[Mapping[str, str]], b: list[Mapping[str, str]]) -> bool:
    return len(a) == len(b) and all(map(operator.is_, a, b))


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
        journal: AsyncJournal,
        metrics: Metrics,
        detectors: Mapping[str, type[Detector]],
        emit: Emit,
        offload: Offload,
        max_backoff_seconds: float = 15.0,
        clock: Callable[[], float] = time.time,
        triton_metrics: TritonMetricsSource | None = None,
        incremental_range_queries: bool = True,
    ) -> None:
        """`incremental_range_queries`: keep each Prometheus query's lookback in memory and ask
        only for the steps since the last cycle (`RangeCache`); off, every cycle asks for the whole
        lookback."""
        self._prom = prometheus
        self._ranges = RangeCache(prometheus) if incremental_range_queries else None
        self._triton = triton_metrics
        self._journal = journal
        self._metrics = metrics
        self._registry = detectors
        self._emit = emit
        self._offload = offload
        self._max_backoff = max_backoff_seconds
        self._clock = clock
        self.groups: dict[GroupKey, QueryGroup] = {}

    def sync(self, policies: PolicySet) -> None:
        """Follow a policy reload; detectors whose trigger did not change keep their state."""
        old = {w.fingerprint: w for g in self.groups.values() for w in g.watches}
        old_groups = self.groups
        groups: dict[GroupKey, QueryGroup] = {}
        for policy in policies.enabled:
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
                                       endpoints, next_due=prev.next_due if prev else 0.0)
                    groups[key] = group
                group.watches.append(watch)
        self.groups = groups
        self._metrics.stale_queries.set(sum(g.stale for g in groups.values()))

    def stale_queries(self) -> list[dict[str, Any]]:
        return [{"query": g.query, "error": g.last_error, "failures": g.failures}
                for g in self.groups.values() if g.stale]

    async def run(self, stop: asyncio.Event) -> None:
        """Poll until `stop` is set; each due group runs as its own task so one slow query waits alone."""
        running: dict[GroupKey, asyncio.Task[None]] = {}
        try:
            while not stop.is_set():
                now = self._clock()
                for key, group in list(self.groups.items()):
                    if group.next_due <= now and key not in running:
                        running[key] = asyncio.create_task(self.poll_group(group, now))
                for key in [k for k, t in running.items() if t.done()]:
                    task = running.pop(key)
                    if task.exception() is not None:
                        self._metrics.faults.labels("poller").inc()
                        log.error("poll cycle failed", error=repr(task.exception()))
                try:
                    await asyncio.wait_for(stop.wait(), timeout=0.5)
                except asyncio.TimeoutError:
                    pass
        finally:
            for task in running.values():
                task.cancel()
            await asyncio.gather(*running.values(), return_exceptions=True)

    async def poll_group(self, group: QueryGroup, now: float) -> None:
        """One cycle of one query: fetch, detect per series, journal verdicts, emit signals."""
        group.next_due = now + group.interval
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
            log.info("query recovered", query=group.query)
        group.failures, group.stale, group.last_error = 0, False, None
        self._metrics.prometheus_up.set(1)
        self._metrics.stale_queries.set(sum(g.stale for g in self.groups.values()))
        for watch in group.watches:
            await self._evaluate(watch, result, companions, now)

    async def _fetch(self, group: QueryGroup, query: str, now: float) -> RangeResult:
        """The group's range of `query` from its source."""
        if group.source == "triton":
            if self._triton is None:
                return RangeResult(query, error="source: triton is not available in this process")
            return await self._triton.query_range(query, now - group.lookback, now, group.interval,
                                                  group.endpoints)
        source = self._ranges if self._ranges is not None else self._prom
        return await source.query_range(query, now - group.lookback, now, group.interval)

    def _mark_failed(self, group: QueryGroup, result: RangeResult, now: float) -> None:
        group.failures += 1
        group.stale = True
        group.last_error = result.error
        backoff = min(self._max_backoff, group.interval * 2 ** min(group.failures, 10))
        group.next_due = now + backoff
        self._metrics.prometheus_up.set(0)
        self._metrics.stale_queries.set(sum(g.stale for g in self.groups.values()))
        log.warning("query failed; series stale, not acting on them", query=group.query,
                    error=result.error, retry_in_seconds=backoff)

    async def _evaluate(self, watch: Watch, result: RangeResult, companions: RangeResult | None,
                        now: float) -> None:
        policy, trigger = watch.policy, watch.bound.trigger
        mine = routed(watch, result.series)
        if not mine:
            await self._journal.record_evaluations([(
                policy.name, watch.bound.index, "*", False,
                f"no data for model {policy.target.model!r}: {_short(trigger.query)}")])
            return
        try:
            await watch.detector.prepare(mine, now, self._offload)
        except Exception as exc:  # a failed refit leaves the old model in place; recorded, not fatal
            self._metrics.faults.labels("detector_prepare").inc()
            log.error("detector prepare failed", policy=policy.name, error=repr(exc))
        detections = self._detect_all(watch, mine, companions, now)
        watch.keys.next_cycle()
        watch.gauges.next_cycle()
        keys = list(watch.keys.many(s.labels for s in mine))  # once per series: the journal row and the log
        count_verdicts(self._metrics, watch, detections)
        self._metrics.detector.observe_many(policy.name, watch.bound.index, watch.gauges.many(s.labels for s in mine),
                                            detections, now)
        if _debug_enabled():  # structlog's level check costs a logger per call: asked once per cycle
            for key, detection in zip(keys, detections):
                log.debug("evaluated", policy=policy.name, series=key, fired=detection.fired,
                          value=detection.value, baseline=detection.baseline, reason=detection.reason)
        # Signals first: acting is what matters, and an evaluation journaled as fired then always
        # has its signal journaled already (a reader of evaluations never sees one without it).
        for series, detection in zip(mine, detections):
            if detection.fired:
                await self._emit(detection_signal(watch, series, detection, now))
        await self._journal.record_evaluations([(policy.name, watch.bound.index, key, d.fired, d.reason)
                                                for key, d in zip(keys, detections)])

    def _detect_all(self, watch: Watch, mine: list[Series], companions: RangeResult | None,
                    now: float) -> list[Detection]:
        """One Detection per series: the detector's batch path when the batch is big enough to pay
        for it (a vectorized detector aligns the series on one grid), else one call per series."""
        detector, kind = watch.detector, watch.bound.trigger.type
        pairs = watch.pairing.pair(mine, companions) if companions is not None else None
        if len(mine) >= BATCH_MIN_SERIES:
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
                out.append(Detection(kind, False, f"detector raised {type(exc).__name__}: {exc}"))
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


def _debug_enabled() -> bool:
    """Whether the poller's debug lines would be written (True where the logger cannot tell)."""
    is_enabled_for = getattr(log, "is_enabled_for", None)
    return True if is_enabled_for is None else bool(is_enabled_for(logging.DEBUG))


IDENTITY_IGNORED = frozenset({"__name__", "quantile", "le"})
BATCH_MIN_SERIES = 8  # below this, per-series calls cost less than aligning arrays


def companion_identity(labels: Mapping[str, str]) -> frozenset[tuple[str, str]]:
    """What pairs a series with its companion: its labels other than name, quantile and bound."""
    return frozenset((k, v) for k, v in labels.items() if k not in IDENTITY_IGNORED)


def companion_for(series: Series, companions: RangeResult) -> Series | None:
    """The companion series with the same identity (labels other than name and quantile)."""
    want = companion_identity(series.labels)
    return next((c for c in companions.series if companion_identity(c.labels) == want), None)


def pair_companions(series: list[Series], companions: RangeResult) -> list[Series | None]:
    """`companion_for` of every series through one index by identity: O(S) per cycle, where one
    scan per series was O(S^2) (about a minute of CPU at 10,000 series). The first companion of
    an identity wins, as the scan in order found it."""
    index: dict[frozenset[tuple[str, str]], Series] = {}
    for cand in companions.series:
        index.setdefault(companion_identity(cand.labels), cand)
    return [index.get(companion_identity(s.labels)) for s in series]


def gauge_series(labels: Mapping[str, str]) -> str:
    """A series as a readable label value for the detector gauges: `k=v` pairs, sorted, without the
    metric name (the JSON of `series_key` would be all escapes in the exposition format)."""
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()) if k != "__name__") or "{}"


def _short(query: str) -> str:
    return query if len(query) < 200 else query[:197] + "..."


def detection_signal(watch: Watch, series: Series, d: Detection, now: float) -> Signal:
    """A detector verdict as a Signal; the episode start makes re-detections of one episode dedup."""
    episode = d.episode_start if d.episode_start is not None else now
    # Marked on the signal too, so a reload that moves triggers cannot turn it live (fails safe).
    shadow = {"shadow": True} if watch.policy.spec.triggers[watch.bound.index].shadow else {}
    labels = dict(series.labels)
    labels.setdefault("model", watch.policy.target.model)
    return Signal(
        source=SignalSource.DETECTOR,
        name=d.detector,
        labels=labels,
        observed_at=datetime.fromtimestamp(now, timezone.utc),
        dedup_key=f"detector:{watch.policy.name}:{watch.bound.index}:"
                  f"{stable_key(series_key(series.labels), round(episode, 3))}",
        value=d.value,
        policy=watch.policy.name,
        details={"reason": d.reason, "baseline": d.baseline, "score": d.score, "threshold": d.threshold,
                 "episode_start": d.episode_start, "query": watch.bound.trigger.query,
                 "evidence": [list(p) for p in d.evidence][-20:], **dict(d.details), **shadow},
    )
