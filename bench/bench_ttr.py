"""Time to remediate a tail defect on the lab servers: tailguard with the example policy against a
naive P99.9 poller, on one seeded scenario. Prints a table; not a test.

Scenario: Triton serves `ranker` v2 (v1 healthy, both 2-4 ms per request, 4 instances); a seeded
open-loop load sends 40 req/s, each request 16 float32 drawn by ``rng.random(16, dtype=np.float32)``
from ``np.random.default_rng(seed)``; after the warm-up (T0) a fault file switches on v2's slow path
(no reload): a request with ``x[0] < fault_rate`` takes 900 ms more. Prometheus scrapes every 5 s.

Time to remediate (TTR): seconds from T0 to the first ``POST /v2/repository/index`` poll (every
0.5 s) where version 2 is no longer READY.

- tailguard: the daemon's Service in this process with examples/policies/ranker.yaml, only its
  endpoints filled in, acting on the served Triton.
- naive poller: every 5 s (aligned to T0), ``max by (model) (nv_inference_request_summary_us{
  model="ranker",quantile="0.999"})`` from Prometheus; rolls back after 2 consecutive polls over
  500 ms. It runs in the same run on a mirror: a second Triton and Prometheus that receive every
  request at the same moment with the same input (so the same slow requests), because once
  tailguard rolls the served Triton back, v2's series are gone and the poller could never decide.
  The poller's rollback is real (on the mirror), and its TTR is measured there the same way, so it
  is its decision time plus a measured rollback execution.

Each run starts and stops its own servers (by PID, lab.process). Everything is on loopback.

Run: python bench/bench_ttr.py                        # seeds 1-3, about 2-3 min each
     python bench/bench_ttr.py --quick                # one seed, 60 s after T0
     python bench/bench_ttr.py --seeds 1 --fault-rate 0.0005 --after-t0 600   # healthy noise
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from anywhere: the project's packages come first
    sys.path.insert(0, str(ROOT))

from daemon.common.config import Settings  # noqa: E402
from daemon.common.logs import configure_logging  # noqa: E402
from daemon.wiring.registries import action_registry, detector_registry  # noqa: E402
from daemon.wiring.service import Service  # noqa: E402
from lab.load import RequestSample, run_load  # noqa: E402
from lab.policies import example_policy, triton_endpoints  # noqa: E402
from lab.prometheus import PrometheusServer  # noqa: E402
from lab.triton import TritonServer, write_model_repository  # noqa: E402

MODEL = "ranker"
BAD_VERSION = "2"
EXAMPLE_POLICY = ROOT / "examples" / "policies" / "ranker.yaml"
INDEX_POLL_SECONDS = 0.5
NAIVE_POLL_SECONDS = 5.0
NAIVE_QUERY = f'max by (model) (nv_inference_request_summary_us{{model="{MODEL}",quantile="0.999"}})'
NAIVE_LINE_US = 500_000.0
NAIVE_CONSECUTIVE = 2
SLOW_RESPONSE_SECONDS = 0.5
AFTER_BOTH_SECONDS = 2.0  # after both sides remediated, before stopping: one more index poll each


@dataclass(frozen=True)
class Scenario:
    """The knobs of one run; defaults are the reference scenario."""

    rate_per_second: float = 40.0
    fault_rate: float = 0.005
    delay_ms: float = 900.0
    warmup_seconds: float = 60.0
    after_t0_seconds: float = 180.0
    """Longest time after T0; a defect run stops earlier once both sides have rolled back."""
    instances: int = 4
    scrape_interval: str = "5s"


@dataclass
class SideTimes:
    """What one side (served Triton with tailguard, or the mirror with the naive poller) saw."""

    remediated_s: float | None = None
    """First index poll with v2 not READY, seconds after T0 (negative: before T0)."""
    index_errors: int = 0


@dataclass
class RunResult:
    seed: int
    scenario: Scenario
    tailguard: SideTimes = field(default_factory=SideTimes)
    naive: SideTimes = field(default_factory=SideTimes)
    tailguard_signal_s: float | None = None
    tailguard_decision_s: float | None = None
    tailguard_decision_state: str | None = None
    tailguard_attribution: dict[str, Any] | None = None
    naive_decision_s: float | None = None
    naive_rollback_started_s: float | None = None
    naive_polls: list[tuple[float, float | None]] = field(default_factory=list)
    first_slow_request_sent_s: float | None = None
    first_slow_response_s: float | None = None
    slow_responses_before_t0: int = 0
    observed_seconds: float = 0.0
    t0_unix: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def ratio(self) -> float | None:
        """tailguard TTR / naive TTR (below 1: tailguard faster)."""
        t, n = self.tailguard.remediated_s, self.naive.remediated_s
        return t / n if t is not None and n is not None and n > 0 else None


def policy_for(triton: TritonServer) -> str:
    """The example policy, unchanged except for the served Triton's endpoints."""
    return example_policy(EXAMPLE_POLICY.name, target={"triton": triton_endpoints(triton.base_url, triton.metrics_url)})


def daemon_settings(workdir: Path, prometheus: PrometheusServer) -> Settings:
    """What bench/tailguard_rig_remediator.sh writes, with a free port: only endpoints and paths."""
    return Settings.model_validate({
        "listen": {"host": "127.0.0.1", "port": 0},
        "webhook": {"allowUnauthenticated": True},
        "policies": {"path": str(workdir / "policies")},
        "journal": {"path": str(workdir / "journal.db")},
        "prometheus": {"url": prometheus.url},
        "log": {"format": "console", "level": "warning"},
        # One target: the common-cause hold (on by default: a lone target waits quietHoldSeconds, 15 s)
        # would only add its hold.
        "blastRadius": {"maxTargetsPerWindow": None, "commonCauseTargets": None},
    })


def write_fault(path: Path, enabled: bool, scenario: Scenario) -> None:
    """Replace the fault file in one rename, so the model never reads half of it."""
    staging = path.with_suffix(".tmp")
    staging.write_text(json.dumps({"enabled": enabled, "fault_rate": scenario.fault_rate,
                                   "delay_ms": scenario.delay_ms}))
    os.replace(staging, path)


async def served_versions(session: aiohttp.ClientSession, triton: TritonServer) -> list[str]:
    """Versions of the model that the repository index lists READY."""
    async with session.post(f"{triton.base_url}/v2/repository/index", json={}) as response:
        entries = await response.json()
    return sorted(e["version"] for e in entries if e.get("name") == MODEL and e.get("state") == "READY")


async def watch_index(session: aiohttp.ClientSession, triton: TritonServer, t0: float, side: SideTimes,
                      stop: asyncio.Event) -> None:
    """Poll the repository index every 0.5 s; note the first poll where v2 is not READY."""
    while not stop.is_set() and side.remediated_s is None:
        polled_at = time.monotonic()
        try:
            ready = await served_versions(session, triton)
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            # A load in progress may hold the index for a moment; the next poll decides.
            side.index_errors += 1
        else:
            if BAD_VERSION not in ready:
                side.remediated_s = polled_at - t0
                return
        await _sleep_until(polled_at + INDEX_POLL_SECONDS, stop)


async def prometheus_value(session: aiohttp.ClientSession, prometheus: PrometheusServer) -> float | None:
    """The naive query's value now; None when it has no data (never read as over the line)."""
    async with session.get(f"{prometheus.url}/api/v1/query", params={"query": NAIVE_QUERY}) as response:
        body = await response.json()
    result = body.get("data", {}).get("result", [])
    return float(result[0]["value"][1]) if result else None


async def rollback(triton: TritonServer) -> None:
    """The rig's rollback: the model's config with version_policy pinned to v1, loaded."""
    from tritonclient.http.aio import InferenceServerClient

    client = InferenceServerClient(triton.http_url, conn_timeout=60)
    try:
        config = await client.get_model_config(MODEL)
        config["version_policy"] = {"specific": {"versions": [1]}}
        await client.load_model(MODEL, config=json.dumps(config))
    finally:
        await client.close()


async def naive_poller(session: aiohttp.ClientSession, prometheus: PrometheusServer, mirror: TritonServer,
                       t0: float, result: RunResult, stop: asyncio.Event) -> None:
    """Poll at T0 + 5k s from the start of the run; after 2 consecutive polls over 500 ms, roll back."""
    k = -math.floor((t0 - time.monotonic()) / NAIVE_POLL_SECONDS)
    over = 0
    while not stop.is_set():
        await _sleep_until(t0 + k * NAIVE_POLL_SECONDS, stop)
        if stop.is_set():
            return
        at = time.monotonic() - t0
        try:
            value = await prometheus_value(session, prometheus)
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError):
            # A failed poll is no evidence either way, as for a real poller; it counts as not over.
            value = None
        result.naive_polls.append((round(at, 2), value))
        over = over + 1 if value is not None and value > NAIVE_LINE_US else 0
        if over >= NAIVE_CONSECUTIVE:
            result.naive_decision_s = at
            result.naive_rollback_started_s = time.monotonic() - t0
            await rollback(mirror)
            return
        k += 1


async def _sleep_until(deadline: float, stop: asyncio.Event) -> None:
    delay = deadline - time.monotonic()
    if delay > 0:
        try:
            await asyncio.wait_for(stop.wait(), delay)
        except asyncio.TimeoutError:
            pass  # the deadline came first: the usual case


async def _start_all(starts: list[Callable[[], None]]) -> None:
    await asyncio.gather(*(asyncio.to_thread(start) for start in starts))


async def run_one(seed: int, scenario: Scenario, keep: bool = False) -> RunResult:
    """One full run on fresh servers: warm-up, T0, until both sides rolled back or the window ends."""
    result = RunResult(seed=seed, scenario=scenario)
    workdir = Path(tempfile.mkdtemp(prefix="tailguard-bench-ttr-"))
    fault_file = workdir / "fault.json"
    write_fault(fault_file, False, scenario)
    tritons: list[TritonServer] = []
    proms: list[PrometheusServer] = []
    for name in ("served", "mirror"):
        models = write_model_repository(
            workdir / name / "models", name=MODEL, slow_fraction_by_version={1: 0.0, 2: 0.0},
            fast_ms=2, fast_ms_max=4, instances=scenario.instances, seed=seed,
            fault_file_by_version={2: fault_file})
        triton = TritonServer(models.parent, models=[MODEL], workdir=workdir / name / "triton")
        tritons.append(triton)
        proms.append(PrometheusServer({"triton": [triton.metrics_target]}, scrape_interval=scenario.scrape_interval,
                                      workdir=workdir / name / "prometheus"))
    served, mirror = tritons
    started: list[TritonServer | PrometheusServer] = []
    try:
        started.extend(tritons)
        await _start_all([t.start for t in tritons])
        started.extend(proms)
        await _start_all([p.start for p in proms])
        daemon_dir = workdir / "tailguard"
        (daemon_dir / "policies").mkdir(parents=True)
        (daemon_dir / "policies" / "ranker.yaml").write_text(policy_for(served))
        settings = daemon_settings(daemon_dir, proms[0])
        async with Service(settings, action_registry(), detector_registry()) as service:
            await _observe(result, scenario, served, mirror, proms[1], fault_file)
            await _collect_journal(result, service)
    finally:
        for server in reversed(started):
            await asyncio.to_thread(server.stop)
        if keep:
            print(f"  kept {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return result


async def _observe(result: RunResult, scenario: Scenario, served: TritonServer, mirror: TritonServer,
                   mirror_prom: PrometheusServer, fault_file: Path) -> None:
    """Load both Tritons alike, switch the fault on at T0, and time both sides' rollbacks."""
    load_seconds = scenario.warmup_seconds + scenario.after_t0_seconds + 5.0
    t_start = time.monotonic()
    t0 = t_start + scenario.warmup_seconds
    result.t0_unix = time.time() + scenario.warmup_seconds

    def on_served(sample: RequestSample) -> None:
        if sample.status == 200 and sample.latency_seconds > SLOW_RESPONSE_SECONDS:
            sent = sample.sent_at_unix - result.t0_unix
            if sent < 0:
                result.slow_responses_before_t0 += 1
            elif result.first_slow_request_sent_s is None or sent < result.first_slow_request_sent_s:
                result.first_slow_request_sent_s = sent
                result.first_slow_response_s = sent + sample.latency_seconds

    def seeded_inputs() -> Callable[[], list[float]]:
        rng = np.random.default_rng(result.seed)
        return lambda: rng.random(16, dtype=np.float32).tolist()

    common: dict[str, Any] = {"model": MODEL, "rate_per_second": scenario.rate_per_second,
                              "duration_seconds": load_seconds, "max_in_flight": 256,
                              "request_timeout_seconds": 10.0}
    stop = asyncio.Event()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5.0)) as session:
        tasks: list[asyncio.Task[Any]] = [
            asyncio.create_task(run_load(served.base_url, inputs=seeded_inputs(), on_sample=on_served, **common)),
            asyncio.create_task(run_load(mirror.base_url, inputs=seeded_inputs(), **common)),
        ]
        watchers: list[Awaitable[Any]] = [
            watch_index(session, served, t0, result.tailguard, stop),
            watch_index(session, mirror, t0, result.naive, stop),
            naive_poller(session, mirror_prom, mirror, t0, result, stop),
        ]
        tasks.extend(asyncio.create_task(w) for w in watchers)  # type: ignore[arg-type]
        try:
            await _sleep_until(t0, stop)
            write_fault(fault_file, True, scenario)
            deadline = t0 + scenario.after_t0_seconds
            both_at: float | None = None
            while time.monotonic() < deadline:
                if any(t.done() and t.exception() for t in tasks):
                    break
                done = result.tailguard.remediated_s is not None and result.naive.remediated_s is not None
                if done and both_at is None:
                    both_at = time.monotonic()
                if both_at is not None and time.monotonic() > both_at + AFTER_BOTH_SECONDS:
                    break
                await asyncio.sleep(0.25)
            result.observed_seconds = time.monotonic() - t0
        finally:
            stop.set()
            write_fault(fault_file, False, scenario)
            for task in tasks[:2]:
                task.cancel()  # the loads end here; run_load cancels its own requests
            outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, BaseException) and not isinstance(outcome, asyncio.CancelledError):
            result.notes.append(f"task failed: {outcome!r}")


async def _collect_journal(result: RunResult, service: Service) -> None:
    """tailguard's first signal and decision for the policy, in seconds after T0."""
    t0_unix = result.t0_unix
    signals = [s for s in await service.journal.signals.all.in_thread()
               if s.payload.get("policy") == "ranker-tail" or s.policy == "ranker-tail"]
    if signals:
        first = signals[0]
        result.tailguard_signal_s = first.received_at - t0_unix
        labels = first.payload.get("labels", {})
        details = first.payload.get("details", {})
        result.tailguard_attribution = {"source": first.source, "version": labels.get("version"),
                                        **{k: details[k] for k in ("episode_start", "series_first_seen")
                                           if k in details}}
    decisions = await service.journal.decisions.all.in_thread("ranker-tail")
    if decisions:
        result.tailguard_decision_s = decisions[0].at - t0_unix
        result.tailguard_decision_state = str(decisions[0].state)


def _fmt(value: float | None, none: str = "-") -> str:
    return none if value is None else f"{value:.1f}"


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def print_table(results: list[RunResult]) -> None:
    """The per-seed table and the medians, as Markdown."""
    window = results[0].scenario.after_t0_seconds if results else 0
    none = f"none in {window:.0f} s"
    print("\n| seed | tailguard TTR (s) | naive TTR (s) | ratio | tailguard signal / decision | "
          "naive decision | first slow request sent / answered |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        ratio = f"{r.ratio:.2f}" if r.ratio is not None else "-"
        print(f"| {r.seed} | {_fmt(r.tailguard.remediated_s, none)} | {_fmt(r.naive.remediated_s, none)} | {ratio} | "
              f"{_fmt(r.tailguard_signal_s)} / {_fmt(r.tailguard_decision_s)} | {_fmt(r.naive_decision_s)} | "
              f"{_fmt(r.first_slow_request_sent_s)} / {_fmt(r.first_slow_response_s)} |")
    if len(results) > 1:
        ratios = [r.ratio for r in results]
        print(f"| median | {_fmt(_median([r.tailguard.remediated_s for r in results]))} | "
              f"{_fmt(_median([r.naive.remediated_s for r in results]))} | "
              f"{'-' if _median(ratios) is None else f'{_median(ratios):.2f}'} | | | |")
    for r in results:
        tg_exec = (r.tailguard.remediated_s - r.tailguard_decision_s
                   if r.tailguard.remediated_s is not None and r.tailguard_decision_s is not None else None)
        nv_exec = (r.naive.remediated_s - r.naive_decision_s
                   if r.naive.remediated_s is not None and r.naive_decision_s is not None else None)
        print(f"\nseed {r.seed}: observed {r.observed_seconds:.0f} s after T0; rollback execution "
              f"(decision to v2 not READY) tailguard {_fmt(tg_exec)} s, naive {_fmt(nv_exec)} s; "
              f"slow responses before T0: {r.slow_responses_before_t0}; tailguard decision state "
              f"{r.tailguard_decision_state or '-'}, attribution {r.tailguard_attribution or '-'}")
        over = [(t, round(v / 1000.0, 1)) for t, v in r.naive_polls if t >= -5 and v is not None]
        print(f"  naive polls after T0 (s, P99.9 ms): {over[:16]}")
        for note in r.notes:
            print(f"  note: {note}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--seeds", default="1,2,3", help="comma-separated seeds (default 1,2,3)")
    parser.add_argument("--quick", action="store_true", help="one seed (the first), 60 s after T0")
    parser.add_argument("--fault-rate", type=float, default=Scenario.fault_rate,
                        help="fraction of requests (x[0] below it) on the slow path after T0")
    parser.add_argument("--delay-ms", type=float, default=Scenario.delay_ms)
    parser.add_argument("--rate", type=float, default=Scenario.rate_per_second, help="requests per second")
    parser.add_argument("--warmup-s", type=float, default=Scenario.warmup_seconds)
    parser.add_argument("--after-t0", type=float, default=None,
                        help="longest window after T0, seconds (default 180; --quick 60)")
    parser.add_argument("--instances", type=int, default=Scenario.instances)
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--keep-tmp", action="store_true", help="keep each run's folder (server logs)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    after = args.after_t0 if args.after_t0 is not None else (60.0 if args.quick else Scenario.after_t0_seconds)
    if args.quick:
        seeds = seeds[:1]
    scenario = Scenario(rate_per_second=args.rate, fault_rate=args.fault_rate, delay_ms=args.delay_ms,
                        warmup_seconds=args.warmup_s, after_t0_seconds=after, instances=args.instances)
    configure_logging("console", "warning")
    print(f"scenario: {scenario}", flush=True)
    results: list[RunResult] = []
    for seed in seeds:
        started = time.monotonic()
        result = asyncio.run(run_one(seed, scenario, keep=args.keep_tmp))
        results.append(result)
        print(f"seed {seed}: tailguard {_fmt(result.tailguard.remediated_s, 'none')}, "
              f"naive {_fmt(result.naive.remediated_s, 'none')} (run {time.monotonic() - started:.0f} s)",
              flush=True)
    print_table(results)
    if args.json:
        args.json.write_text(json.dumps([_as_json(r) for r in results], indent=2, default=str))
    return 0


def _as_json(r: RunResult) -> dict[str, Any]:
    return {"seed": r.seed, "scenario": r.scenario.__dict__, "tailguard_ttr_s": r.tailguard.remediated_s,
            "naive_ttr_s": r.naive.remediated_s, "ratio": r.ratio, "tailguard_signal_s": r.tailguard_signal_s,
            "tailguard_decision_s": r.tailguard_decision_s, "tailguard_decision_state": r.tailguard_decision_state,
            "tailguard_attribution": r.tailguard_attribution, "naive_decision_s": r.naive_decision_s,
            "naive_polls": r.naive_polls, "first_slow_request_sent_s": r.first_slow_request_sent_s,
            "first_slow_response_s": r.first_slow_response_s,
            "slow_responses_before_t0": r.slow_responses_before_t0, "observed_s": r.observed_seconds,
            "index_errors": {"served": r.tailguard.index_errors, "mirror": r.naive.index_errors},
            "notes": r.notes}


if __name__ == "__main__":
    sys.exit(main())
