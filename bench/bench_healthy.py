"""Healthy noise on the lab servers: tailguard with the example policy must take no action. Prints a
table per case; not a test (the shortened suite version is tests/integration/test_healthy_noise.py).

Every case starts its own real Triton (`lab/triton.py`, `ranker` v1 and v2, both healthy: 2-4 ms per
request, no slow path, 4 instances) and real Prometheus (scrape every 5 s), runs the daemon's Service
in this process with examples/policies/ranker.yaml (only its endpoints filled in, as bench_ttr does)
and an open-loop load of 40 req/s, warms up (T0 = end of the warm-up), then disturbs the stack:

- traffic:  after T0 the rate alternates every third of the window: 120 req/s (3x), 10 req/s, 120 req/s;
- redeploy: v1 is served (pinned) until a third of the window, then v2 (no defect) is deployed the
            way the integration tests do it (a plain load after the pin: the newest version);
- restart:  at a third of the window Triton is stopped by PID and started again on the same ports
            (its counters start from zero; requests sent meanwhile fail), the load goes on;
- gap:      at a sixth of the window Prometheus is stopped for `--gap-s` seconds, then started again
            on the same port and data folder; the load goes on.

Measured per case: tailguard's remediations (decisions of the policy that acted), decisions, signals
and detector evaluations (`tailguard_detections_total` of the policy), the highest CUSUM statistic
any series reached (sampled every second from the detector gauges; it fires at 13), and what the
naive P99.9 poller of bench_ttr (summary > 500 ms at 2 consecutive 5 s polls) would have done on the
same Prometheus: its would-be decisions are counted, it never acts. With `--shadow` (default on) a
second, shadow copy of the policy reads the same counters through Prometheus (`source: prometheus`,
5 s steps), so the gap and the restart also go through the range-query path; shadow decisions are
never applied and counted apart.

Pass: zero remediations by tailguard in every case (exit code 1 otherwise). Everything is on
loopback; each case starts and stops its servers by PID; every loop is bounded by the case's clock.

Run: python bench/bench_healthy.py                     # all cases, ~4.5 min each (60 s warm-up + 180 s)
     python bench/bench_healthy.py --quick             # all cases, ~1/3 of that
     python bench/bench_healthy.py --cases restart,gap --json /tmp/healthy.json
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import yaml

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from anywhere: the project's packages come first
    sys.path.insert(0, str(ROOT))

from bench.bench_ttr import (  # noqa: E402
    MODEL,
    NAIVE_CONSECUTIVE,
    NAIVE_LINE_US,
    NAIVE_POLL_SECONDS,
    _sleep_until,
    daemon_settings,
    policy_for,
    prometheus_value,
    served_versions,
)
from daemon.common.logs import configure_logging  # noqa: E402
from daemon.storage.records import EvaluationRow  # noqa: E402
from daemon.wiring.registries import action_registry, detector_registry  # noqa: E402
from daemon.wiring.service import Service  # noqa: E402
from lab.load import RequestSample, run_load  # noqa: E402
from lab.prometheus import PrometheusServer  # noqa: E402
from lab.triton import TritonServer, write_model_repository  # noqa: E402

CASES = ("traffic", "redeploy", "restart", "gap")
POLICY = "ranker-tail"
SHADOW_POLICY = "ranker-tail-prometheus-shadow"
SAMPLE_SECONDS = 1.0
TAIL_SECONDS = 3.0  # after the window: let the last poll cycle's signals reach the journal


@dataclass(frozen=True)
class Timing:
    """Durations and rates of one case; defaults are the full run."""

    warmup_seconds: float = 60.0
    window_seconds: float = 180.0
    base_rate: float = 40.0
    burst_rate: float = 120.0
    drop_rate: float = 10.0
    gap_seconds: float = 45.0
    instances: int = 4
    scrape_interval: str = "5s"

    @classmethod
    def quick(cls) -> Timing:
        return cls(warmup_seconds=20.0, window_seconds=60.0, gap_seconds=30.0)


@dataclass
class CaseResult:
    case: str
    remediations: int = 0
    """Decisions of the policy that acted (executed); the pass criterion is zero."""
    decisions: int = 0
    signals: int = 0
    evaluations: int = 0
    fired_evaluations: int = 0
    max_cusum: float = 0.0
    max_cusum_series: str = ""
    verdicts: dict[str, int] = field(default_factory=dict)
    """Sampled once a second from the journal: verdict kind -> series-seconds."""
    shadow_signals: int = 0
    shadow_decisions: int = 0
    shadow_evaluations: int = 0
    shadow_max_cusum: float = 0.0
    verdict_age_s: float = 0.0
    """After T0, the longest a policy went without a scored verdict (its newest one's age, sampled
    each second): how long it was blind during the disturbance (normal: about its interval)."""
    shadow_verdict_age_s: float = 0.0
    naive_polls: int = 0
    naive_failed_polls: int = 0
    naive_polls_over: int = 0
    naive_would_decide: int = 0
    naive_max_ms: float | None = None
    requests_ok: int = 0
    requests_failed: int = 0
    client_p999_ms: float | None = None
    events: list[tuple[float, str]] = field(default_factory=list)
    """(seconds after T0, what happened)."""
    decision_rows: list[dict[str, Any]] = field(default_factory=list)
    signal_rows: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return self.remediations == 0 and not any(n.startswith("task failed") for n in self.notes)


@dataclass
class Clock:
    """The case's time line: T0 in monotonic and wall-clock seconds."""

    t0: float
    t0_unix: float

    def since_t0(self) -> float:
        return round(time.monotonic() - self.t0, 1)


def shadow_policy_for(triton: TritonServer) -> str:
    """The example policy read through Prometheus (5 s steps, its scrape interval), shadow: it
    journals what it would do and never acts, so it cannot change what the example policy does."""
    policy = yaml.safe_load(policy_for(triton))
    policy["name"] = SHADOW_POLICY
    trigger = policy["triggers"][0]["detector"]
    trigger.update(source="prometheus", interval="5s")
    policy["triggers"] = [{"detector": trigger, "shadow": True}]
    return yaml.safe_dump(policy, sort_keys=False)


def rate_stages(case: str, timing: Timing) -> list[tuple[float, float]]:
    """(requests per second, seconds) of the load, warm-up included."""
    if case != "traffic":
        return [(timing.base_rate, timing.warmup_seconds + timing.window_seconds)]
    third = timing.window_seconds / 3
    return [(timing.base_rate, timing.warmup_seconds), (timing.burst_rate, third), (timing.drop_rate, third),
            (timing.burst_rate, third)]


async def staged_load(triton: TritonServer, stages: list[tuple[float, float]], clock: Clock,
                      result: CaseResult, on_sample: Callable[[RequestSample], None]) -> None:
    """Open-loop load, one `run_load` per stage back to back; each stage is logged as an event."""
    rng = np.random.default_rng(0)
    for rate, seconds in stages:
        if clock.since_t0() > -1.0:  # the warm-up stage is the baseline, not an event
            result.events.append((clock.since_t0(), f"load {rate:g} req/s"))
        await run_load(triton.base_url, model=MODEL, rate_per_second=rate, duration_seconds=seconds,
                       max_in_flight=256, request_timeout_seconds=10.0, on_sample=on_sample,
                       inputs=lambda: rng.random(16, dtype=np.float32).tolist())


async def set_version(triton: TritonServer, version: int | None) -> None:
    """Serve `version` pinned (a config override), or None: a plain load, the newest version on disk,
    which is how a deploy of v2 reaches Triton (as tests/integration/test_tail_integration._pin)."""
    from tritonclient.http.aio import InferenceServerClient

    client = InferenceServerClient(triton.http_url, conn_timeout=60)
    try:
        if version is None:
            await client.load_model(MODEL)
        else:
            config = await client.get_model_config(MODEL)
            config["version_policy"] = {"specific": {"versions": [version]}}
            await client.load_model(MODEL, config=json.dumps(config))
    finally:
        await client.close()


async def disturb(case: str, timing: Timing, triton: TritonServer, prometheus: PrometheusServer,
                  clock: Clock, result: CaseResult) -> None:
    """The case's disturbance after T0 (traffic is all in the load's stages)."""
    note = result.events.append
    if case == "redeploy":
        await asyncio.sleep(max(0.0, clock.t0 + timing.window_seconds / 3 - time.monotonic()))
        started = clock.since_t0()
        await set_version(triton, None)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            served = await served_versions(session, triton)
        note((started, f"deploy v2: load took {clock.since_t0() - started:.1f} s, serving {served}"))
        if served != ["2"]:
            result.notes.append(f"deploy did not take: serving {served}")
    elif case == "restart":
        await asyncio.sleep(max(0.0, clock.t0 + timing.window_seconds / 3 - time.monotonic()))
        started = clock.since_t0()
        await asyncio.to_thread(triton.restart)
        note((started, f"Triton restarted (stop by PID, start on the same ports): ready after "
                       f"{clock.since_t0() - started:.1f} s"))
    elif case == "gap":
        await asyncio.sleep(max(0.0, clock.t0 + timing.window_seconds / 6 - time.monotonic()))
        note((clock.since_t0(), "Prometheus stopped"))
        await asyncio.to_thread(prometheus.stop)
        await asyncio.sleep(timing.gap_seconds)
        await asyncio.to_thread(prometheus.restart)
        note((clock.since_t0(), "Prometheus started again (same port and data)"))


async def naive_poller(prometheus: PrometheusServer, clock: Clock, end: float, result: CaseResult) -> None:
    """bench_ttr's naive rule on the same Prometheus, counting would-be decisions (it never acts):
    2 consecutive polls over 500 ms make one; the count starts again after each."""
    k = -math.floor((clock.t0 - time.monotonic()) / NAIVE_POLL_SECONDS)
    over = 0
    never = asyncio.Event()  # bounded by `end`, not by a stop signal
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5.0)) as session:
        while clock.t0 + k * NAIVE_POLL_SECONDS < end:
            await _sleep_until(clock.t0 + k * NAIVE_POLL_SECONDS, never)
            k += 1
            result.naive_polls += 1
            try:
                value = await prometheus_value(session, prometheus)
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError):
                # No answer is no evidence, as in bench_ttr: not over.
                result.naive_failed_polls += 1
                value = None
            if value is not None and not math.isnan(value):
                ms = value / 1000.0
                result.naive_max_ms = ms if result.naive_max_ms is None else max(result.naive_max_ms, ms)
            over = over + 1 if value is not None and value > NAIVE_LINE_US else 0
            result.naive_polls_over += int(over > 0)
            if over >= NAIVE_CONSECUTIVE:
                result.naive_would_decide += 1
                result.events.append((clock.since_t0(), f"naive poller would roll back (P99.9 {_ms(result.naive_max_ms)} "
                                                        "ms at most so far)"))
                over = 0


def verdict_kind(reason: str) -> str:
    """A verdict's reason line reduced to its kind, for counting."""
    for kind in ("stale", "too little history", "no data", "no request counter", "no excess", "malformed"):
        if reason.startswith(kind):
            return kind
    return "excess, CUSUM below the line" if "<" in reason else "fired" if ">=" in reason else reason[:40]


def max_gauge(service: Service, policy: str) -> tuple[float, str]:
    """The highest `tailguard_detector_value` (the CUSUM statistic) of the policy's series now."""
    best, where = 0.0, ""
    for family in service.metrics.registry.collect():
        if family.name != "tailguard_detector_value":
            continue
        for sample in family.samples:
            if sample.labels.get("policy") == policy and sample.value > best:
                best, where = sample.value, sample.labels.get("series", "")
    return best, where


SCORED_KINDS = frozenset({"no excess", "excess, CUSUM below the line", "fired"})


def newest_scored(rows: list[EvaluationRow]) -> float | None:
    """Wall-clock time of the newest verdict that ran the test (not stale, no data, too little history)."""
    times = [r.at for r in rows if verdict_kind(r.reason) in SCORED_KINDS]
    return max(times) if times else None


async def sampler(service: Service, clock: Clock, end: float, result: CaseResult) -> None:
    """Once a second: the highest CUSUM of each policy, the kind of each live verdict, and after T0
    how old each policy's newest scored verdict is."""
    kinds: Counter[str] = Counter()
    while time.monotonic() < end:
        value, series = max_gauge(service, POLICY)
        if value > result.max_cusum:
            result.max_cusum, result.max_cusum_series = value, series
        result.shadow_max_cusum = max(result.shadow_max_cusum, max_gauge(service, SHADOW_POLICY)[0])
        now = time.time()
        rows = await service.journal.evaluations.all.in_thread(POLICY)
        for row in rows:
            if row.at >= now - 2 * SAMPLE_SECONDS:  # a row not rewritten lately: a series gone, or '*'
                kinds[verdict_kind(row.reason)] += 1
        if now >= clock.t0_unix:
            shadow = newest_scored(await service.journal.evaluations.all.in_thread(SHADOW_POLICY))
            mine = newest_scored(rows)
            result.verdict_age_s = max(result.verdict_age_s, now - (mine if mine is not None else clock.t0_unix))
            if shadow is not None:
                result.shadow_verdict_age_s = max(result.shadow_verdict_age_s, now - shadow)
        await asyncio.sleep(SAMPLE_SECONDS)
    result.verdicts = dict(kinds)


def detections_total(service: Service, policy: str) -> tuple[int, int]:
    """(evaluations, fired evaluations) of `policy` from `tailguard_detections_total`."""
    total = fired = 0
    for family in service.metrics.registry.collect():
        if family.name != "tailguard_detections":
            continue
        for sample in family.samples:
            if sample.name.endswith("_total") and sample.labels.get("policy") == policy:
                total += int(sample.value)
                fired += int(sample.value) if sample.labels.get("fired") == "true" else 0
    return total, fired


async def collect(service: Service, result: CaseResult, clock: Clock) -> None:
    """The journal's signals and decisions and the verdict counters, per policy."""
    signals = await service.journal.signals.all.in_thread()
    for s in signals:
        policy = s.payload.get("policy")
        if policy == POLICY:
            result.signals += 1
            result.signal_rows.append({"at_s": round(s.received_at - clock.t0_unix, 1),
                                       "name": s.name, "labels": s.payload.get("labels"),
                                       "reason": s.payload.get("reason")})
        elif policy == SHADOW_POLICY:
            result.shadow_signals += 1
    for d in await service.journal.decisions.all.in_thread(POLICY):
        result.decisions += 1
        result.remediations += int(d.executed)
        result.decision_rows.append({"at_s": round(d.at - clock.t0_unix, 1), "state": str(d.state),
                                     "executed": d.executed, "reason": d.reason})
    result.shadow_decisions = len(await service.journal.decisions.all.in_thread(SHADOW_POLICY))
    result.evaluations, result.fired_evaluations = detections_total(service, POLICY)
    result.shadow_evaluations = detections_total(service, SHADOW_POLICY)[0]


async def run_case(case: str, timing: Timing, shadow: bool, keep: bool) -> CaseResult:
    """One case on fresh servers: start, warm up, disturb, observe to the end of the window, stop."""
    result = CaseResult(case)
    began = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix=f"tailguard-bench-healthy-{case}-"))
    models = write_model_repository(workdir / "models", name=MODEL, slow_fraction_by_version={1: 0.0, 2: 0.0},
                                    fast_ms=2, fast_ms_max=4, instances=timing.instances)
    triton = TritonServer(models.parent, models=[MODEL], workdir=workdir / "triton")
    prometheus = PrometheusServer({"triton": [triton.metrics_target]}, scrape_interval=timing.scrape_interval,
                                  workdir=workdir / "prometheus")
    started: list[TritonServer | PrometheusServer] = []
    try:
        started.append(triton)
        await asyncio.to_thread(triton.start)
        started.append(prometheus)
        await asyncio.to_thread(prometheus.start)
        if case == "redeploy":
            await set_version(triton, 1)  # v1 served before the daemon starts, as in production
        policies = workdir / "tailguard" / "policies"
        policies.mkdir(parents=True)
        (policies / "ranker.yaml").write_text(policy_for(triton))
        if shadow:
            (policies / "ranker-prometheus-shadow.yaml").write_text(shadow_policy_for(triton))
        settings = daemon_settings(workdir / "tailguard", prometheus)
        async with Service(settings, action_registry(), detector_registry()) as service:
            await observe(case, timing, triton, prometheus, service, result)
    finally:
        for server in reversed(started):
            await asyncio.to_thread(server.stop)
        if keep:
            print(f"  kept {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    result.seconds = time.monotonic() - began
    return result


async def observe(case: str, timing: Timing, triton: TritonServer, prometheus: PrometheusServer,
                  service: Service, result: CaseResult) -> None:
    """Load, disturbance, naive poller and sampler side by side until the window ends."""
    clock = Clock(time.monotonic() + timing.warmup_seconds, time.time() + timing.warmup_seconds)
    end = clock.t0 + timing.window_seconds
    latencies: list[float] = []

    def on_sample(sample: RequestSample) -> None:
        if sample.status == 200:
            result.requests_ok += 1
            latencies.append(sample.latency_seconds * 1000.0)
        else:
            result.requests_failed += 1

    work: list[Coroutine[Any, Any, None]] = [
        staged_load(triton, rate_stages(case, timing), clock, result, on_sample),
        naive_poller(prometheus, clock, end, result),
        sampler(service, clock, end, result),
        disturb(case, timing, triton, prometheus, clock, result),
    ]
    tasks = [asyncio.create_task(w) for w in work]
    try:
        # Bounded: the load ends with its stages; a stuck task is cancelled at the hard deadline.
        done, pending = await asyncio.wait(tasks, timeout=max(0.0, end - time.monotonic()) + 60.0)
        for task in pending:
            result.notes.append(f"task failed: still running at the deadline: {task.get_coro()!r}")
    finally:
        for task in tasks:
            task.cancel()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, BaseException) and not isinstance(outcome, asyncio.CancelledError):
            result.notes.append(f"task failed: {outcome!r}")
    await asyncio.sleep(TAIL_SECONDS)
    await collect(service, result, clock)
    if latencies:
        result.client_p999_ms = float(np.quantile(latencies, 0.999))


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def print_tables(results: list[CaseResult], timing: Timing, shadow: bool) -> None:
    """One Markdown row per case, then each case's timeline and anything odd."""
    print(f"\ntiming: {timing}")
    print("\n| case | tailguard remediations | decisions | signals | detector evaluations (fired) | "
          "max CUSUM (line 13) | longest without a scored verdict (s) | naive polls (over 500 ms / failed) | naive would-be rollbacks | "
          "naive max P99.9 (ms) | requests ok / failed | pass |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r.case} | {r.remediations} | {r.decisions} | {r.signals} | {r.evaluations} "
              f"({r.fired_evaluations}) | {r.max_cusum:.2f} | {r.verdict_age_s:.0f} | {r.naive_polls} ({r.naive_polls_over} / "
              f"{r.naive_failed_polls}) | {r.naive_would_decide} | {_ms(r.naive_max_ms)} | "
              f"{r.requests_ok} / {r.requests_failed} | {'yes' if r.passed else '**NO**'} |")
    if shadow:
        print("\nshadow copy of the policy on Prometheus (source: prometheus, 5 s steps; never acts):")
        print("\n| case | signals | shadow decisions | evaluations | max CUSUM | longest without a scored verdict (s) |")
        print("|---|---|---|---|---|---|")
        for r in results:
            print(f"| {r.case} | {r.shadow_signals} | {r.shadow_decisions} | {r.shadow_evaluations} | "
                  f"{r.shadow_max_cusum:.2f} | {r.shadow_verdict_age_s:.0f} |")
    for r in results:
        print(f"\n{r.case} ({r.seconds:.0f} s): verdicts sampled (kind: series-seconds) {r.verdicts}; "
              f"highest CUSUM on {r.max_cusum_series or '-'}; client P99.9 {_ms(r.client_p999_ms)} ms")
        for at, what in r.events:
            print(f"  [{at:+7.1f} s] {what}")
        for row in r.decision_rows + r.signal_rows:
            print(f"  journal: {row}")
        for note in r.notes:
            print(f"  note: {note}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    parser.add_argument("--quick", action="store_true", help="20 s warm-up, 60 s window, 30 s gap")
    parser.add_argument("--warmup-s", type=float, default=None)
    parser.add_argument("--window-s", type=float, default=None, help="seconds after T0 (default 180)")
    parser.add_argument("--gap-s", type=float, default=None, help="Prometheus down, seconds (default 45)")
    parser.add_argument("--no-shadow", action="store_true", help="only the example policy, no shadow copy")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--keep-tmp", action="store_true", help="keep each case's folder (server logs, journal)")
    return parser.parse_args(argv)


def timing_from(args: argparse.Namespace) -> Timing:
    base = Timing.quick() if args.quick else Timing()
    return Timing(warmup_seconds=base.warmup_seconds if args.warmup_s is None else args.warmup_s,
                  window_seconds=base.window_seconds if args.window_s is None else args.window_s,
                  gap_seconds=base.gap_seconds if args.gap_s is None else args.gap_s)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        print(f"unknown case(s) {unknown}; choose from {CASES}", file=sys.stderr)
        return 2
    timing = timing_from(args)
    configure_logging("console", "warning")
    results: list[CaseResult] = []
    for case in cases:
        result = asyncio.run(run_case(case, timing, shadow=not args.no_shadow, keep=args.keep_tmp))
        results.append(result)
        print(f"{case}: {result.remediations} remediation(s), {result.signals} signal(s), "
              f"{result.evaluations} evaluations, naive would-be rollbacks {result.naive_would_decide} "
              f"({result.seconds:.0f} s)", flush=True)
    print_tables(results, timing, shadow=not args.no_shadow)
    if args.json:
        args.json.write_text(json.dumps({"timing": asdict(timing), "results": [asdict(r) | {"passed": r.passed}
                                                                                for r in results]},
                                        indent=2, default=str))
    return 0 if all(r.passed for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
