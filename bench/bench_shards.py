"""Sharding (#45): how the shard assignment moves and balances, and what a replica's poll cycle
costs when it polls only its shards' targets.

Part 1 (pure, seconds): daemon/cluster/shard_assignment.py over 16 to 1,000 shards and 2 to 8
replicas: shards moved when a replica joins or leaves against the ideal 1/N, and the most shards one
replica holds against its fair share ceil(shards/replicas), for plain rendezvous hashing and for the
bounded-load variant the shard manager uses; then the targets (models) a replica leads, at 1,000
models hashed to 64 shards.

Part 2 (`--poll`, about 2 CPU-minutes): the real poll cycle of bench/bench_poll_cycle.py (its Poller, its
SQLite journal, its loopback Prometheus in a subprocess) run once per replica count in this run, on
the series the busiest replica polls: 10,000 series over 200 models (50 series each), hashed to 64
shards, assigned by bounded-load rendezvous; the busiest replica polls its models' series through
queries narrowed to them (one model's query per policy, as `$model` scopes it). Its steady and first
cycles' CPU (process_time, best of 2) against one leader polling all 10,000 in the same run.
Part 3 (`--fleet-wide`, a few CPU-minutes): the cost of a fleet-wide query that cannot be narrowed (it
names no $model and is no plain selector, so every replica leading one of its policies fetches and
parses it whole; only routing, detection and journaling split; a plain selector is narrowed to the
led models, daemon/cluster/query_narrowing.py: the `narrowed` row). bench/bench_poll_cycle.py with one query shared by the
MODELS policies: one leader loading all of them; a replica of four leading a quarter of them (`--led`)
on the whole answer; and the same quarter narrowed (an answer of its models' series only).
Part 4 (`--steady`, for large fleets): the steady cycles only, one process per replica count (the
busiest replica's series as in part 2), without part 2's first cycles and detail rows: at 100,000
series bench_poll_cycle.py's whole run costs tens of CPU-minutes, this about 8 (one leader ~6, the
busiest of four ~2) and ~9 GB of memory for one leader.
What this does not measure: the Lease traffic (one list and about shards/replicas writes per retry
period).

Run: python bench/bench_shards.py [--poll | --steady] [--replicas 1,2,4] [--fleet-wide] [--series 10000]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SRC = Path(os.environ.get("TAILGUARD_SRC", Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(SRC))

from daemon.cluster.shard_assignment import assign, assign_bounded, fair_share, moved, shard_of  # noqa: E402

REPLICAS = (2, 3, 4, 8)
SHARD_COUNTS = (16, 64, 256, 1_000)
MODELS, SERIES_PER_MODEL_AT_10K, POLL_SHARDS = 200, 50, 64


def _names(n: int) -> list[str]:
    return [f"tailguard-{i}" for i in range(n)]


def _loads(assignment: dict[int, str], n: int) -> list[int]:
    return [sum(1 for owner in assignment.values() if owner == r) for r in _names(n)]


def movement_and_balance() -> None:
    print("| shards | replicas | join: moved (ideal S/(N+1)) | leave: moved (ideal S/N) | most held / fair share "
          "| bounded: join moved | bounded: leave moved | bounded: most held |")
    print("|---|---|---|---|---|---|---|---|")
    for shards in SHARD_COUNTS:
        for n in REPLICAS:
            row = [f"{shards:,}", str(n)]
            for fn in (assign, assign_bounded):
                before = fn(shards, _names(n))
                joined = moved(before, fn(shards, _names(n + 1)))
                left = moved(before, fn(shards, _names(n)[1:]))
                most = max(_loads(before, n))
                if fn is assign:
                    row += [f"{joined} ({shards / (n + 1):.1f})", f"{left} ({shards / n:.1f})",
                            f"{most} / {fair_share(shards, n)}"]
                else:
                    row += [str(joined), str(left), str(most)]
            print("| " + " | ".join(row) + " |")
    print()
    models = [f"serving/model-{i:03d}" for i in range(1_000)]
    print("1,000 models hashed to 64 shards (bounded-load assignment): models led by each replica")
    for n in REPLICAS:
        owners = assign_bounded(64, _names(n))
        per = [sum(1 for m in models if owners[shard_of(m, 64)] == r) for r in _names(n)]
        print(f"  {n} replicas: {per} (ideal {1_000 / n:.0f}; busiest {max(per) / (1_000 / n):.2f}x)")
    print()


def busiest_series(n: int, series: int) -> int:
    """The series the busiest of `n` replicas polls: MODELS models of series/MODELS series each."""
    owners = assign_bounded(POLL_SHARDS, _names(n))
    models = [f"default/model-{i:03d}" for i in range(MODELS)]
    per = [sum(1 for m in models if owners[shard_of(m, POLL_SHARDS)] == r) for r in _names(n)]
    return max(per) * (series // MODELS)


def poll_cycles(series: int, replicas: tuple[int, ...] = (1, 2, 4)) -> None:
    """bench_poll_cycle.py once per replica count, in this run, on the busiest replica's series. The
    busiest replica's share of the series is the floor of its ratio to one leader when a cycle's cost
    is proportional to its series: the assignment balances shards, not the models in them."""
    results: dict[int, tuple[int, float, float]] = {}
    for n in sorted({1, *replicas}):
        mine = series if n == 1 else busiest_series(n, series)
        first, steady = _cycles(["--series", str(mine)])
        results[n] = (mine, first, steady)
        print(f"  {n} replica(s): busiest polls {mine:,} series: first {first:.3f} CPU-s, steady {steady:.3f} CPU-s",
              flush=True)
    one = results[1]
    print("\n| replicas | series on the busiest replica (share) | first cycle CPU-s | steady cycle CPU-s "
          "| steady x one leader |")
    print("|---|---|---|---|---|")
    for n, (mine, first, steady) in results.items():
        print(f"| {n} | {mine:,} ({mine / series:.3f}) | {first:.3f} | {steady:.3f} | {steady / one[2]:.2f}x |")


def _cycles(args: list[str]) -> tuple[float, float]:
    """(first, steady) cycle CPU-s of one bench_poll_cycle.py run (--quick: best of 2)."""
    cmd = [sys.executable, str(SRC / "bench" / "bench_poll_cycle.py"), "--quick", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=SRC).stdout
    first = float(re.search(r"^first cycle: ([0-9.]+) CPU-s", out, re.M).group(1))  # type: ignore[union-attr]
    steady = float(re.search(r"^steady cycle: ([0-9.]+) CPU-s", out, re.M).group(1))  # type: ignore[union-attr]
    return first, steady


def steady_cycles(series: int, replicas: tuple[int, ...]) -> None:
    """Part 4: each replica count's busiest series in a process of its own, its steady cycles' CPU."""
    results: dict[int, tuple[int, list[float]]] = {}
    for n in sorted({1, *replicas}):
        mine = series if n == 1 else busiest_series(n, series)
        out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--steady-one", str(mine)],
                             capture_output=True, text=True, check=True, cwd=SRC).stdout
        cycles = [float(x) for x in re.findall(r"^steady cycle CPU-s: ([0-9.]+)$", out, re.M)]
        results[n] = (mine, cycles)
        print(f"  {n} replica(s): busiest polls {mine:,} series: steady {' / '.join(f'{c:.3f}' for c in cycles)} CPU-s",
              flush=True)
    one = min(results[1][1])
    print("\n| replicas | series on the busiest replica (share) | steady cycle CPU-s, best of 4 | x one leader |")
    print("|---|---|---|---|")
    for n, (mine, cycles) in results.items():
        print(f"| {n} | {mine:,} ({mine / series:.3f}) | {min(cycles):.3f} | {min(cycles) / one:.2f}x |")


async def _steady_one(n_series: int, work: Path) -> None:
    """bench_poll_cycle.py's Poller, journal and loopback Prometheus on one policy of `n_series` series:
    a warm-up, the thresholds derived, then its steady cycles one step apart, each one's CPU printed."""
    import numpy as np

    import bench_poll_cycle as b
    from daemon.common.heap import freeze_startup_heap
    from daemon.common.logs import configure_logging
    from daemon.common.metrics import Metrics
    from daemon.sources.prometheus import PrometheusClient
    from daemon.storage.journal import Journal
    from daemon.wiring.registries import action_registry, detector_registry
    from daemon.workers.poller import Poller
    from detectors.sequential.thresholds import STORE
    from detectors.tail_excess import TailExcessDetector
    from policies.loader import load_policies_text

    configure_logging("json", "info")
    counters = b.make_counters(n_series, 1, np.random.default_rng(15))  # the seed bench_poll_cycle uses
    detectors = {**detector_registry(), TailExcessDetector.kind: TailExcessDetector}
    policy_set = load_policies_text(b.policy_yaml(1), "bench", action_registry(), detectors)
    with b.fake_prometheus(work, counters) as url:
        journal = Journal(work / "journal.db")
        client = PrometheusClient(url, timeout_seconds=600.0)

        async def emit(signal: Any) -> None:
            await journal.signals.intake([signal])

        async def offload(fn: Any, *args: Any) -> Any:
            return fn(*args)

        poller = Poller(client, journal, Metrics(), detectors, emit, offload, incremental_range_queries=True)
        poller.sync(policy_set)
        (group,) = poller.groups.values()
        freeze_startup_heap()
        await poller.poll_group(group, b.NOW)  # warm-up: the journal's rows and the range cache
        ahead = TailExcessDetector(group.watches[0].detector.params)  # type: ignore[attr-defined]
        for k in range(1, b.STEADY_CYCLES + 1):  # the steady cycles' traffic cells, derived beforehand
            cols = b.POINTS + k
            ahead.evaluate(counters.timestamps[:cols], counters.latency[:, :cols], counters.requests[:, :cols],
                           b.NOW + b.STEP_SECONDS * k)
        assert STORE.wait(3600), "thresholds not derived"
        await poller.poll_group(group, b.NOW)
        for k in range(1, b.STEADY_CYCLES + 1):
            cpu0 = time.process_time()
            await poller.poll_group(group, b.NOW + b.STEP_SECONDS * k)
            print(f"steady cycle CPU-s: {time.process_time() - cpu0:.3f}", flush=True)
        client.close()
        journal.close()


def fleet_wide(series: int, models: int = MODELS, replicas: int = 4) -> None:
    """One fleet-wide query shared by `models` policies: a replica leading 1/replicas of them, on the
    whole answer (not narrowed) and on its models' series only (narrowed), against one leader."""
    share = models // replicas
    runs = {"one leader, every policy": ["--series", str(series), "--policies", str(models)],
            f"1 of {replicas} replicas, not narrowed": ["--series", str(series), "--policies", str(models),
                                                        "--led", str(share)],
            f"1 of {replicas} replicas, narrowed": ["--series", str(series * share // models), "--policies", str(share)]}
    results = {}
    for name, args in runs.items():
        results[name] = _cycles(args)
        print(f"  {name}: first {results[name][0]:.3f} CPU-s, steady {results[name][1]:.3f} CPU-s", flush=True)
    one = results["one leader, every policy"][1]
    print(f"\n| {series:,} series, {models} policies on one fleet-wide query | first cycle CPU-s | steady cycle CPU-s "
          "| steady x one leader |")
    print("|---|---|---|---|")
    for name, (first, steady) in results.items():
        print(f"| {name} | {first:.3f} | {steady:.3f} | {steady / one:.2f}x |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--poll", action="store_true", help="also the poll cycle per replica (~2 CPU-minutes)")
    parser.add_argument("--fleet-wide", action="store_true",
                        help="also the cost of a fleet-wide query that cannot be narrowed (a few CPU-minutes)")
    parser.add_argument("--series", type=int, default=10_000, help="series of the whole fleet (default 10,000)")
    parser.add_argument("--replicas", default="1,2,4",
                        help="--poll, --steady: replica counts to run, one leader always included (default 1,2,4; "
                             "at 100,000 series each run costs minutes of CPU)")
    parser.add_argument("--steady", action="store_true",
                        help="the steady cycles only, per replica count (for 100,000 series: ~8 CPU-minutes with "
                             "--replicas 4)")
    parser.add_argument("--steady-one", type=int, default=None, help=argparse.SUPPRESS)  # one --steady process
    args = parser.parse_args()
    if args.steady_one is not None:
        sys.path.insert(0, str(SRC / "bench"))
        with tempfile.TemporaryDirectory(prefix="bench-shards-") as tmp:
            asyncio.run(_steady_one(args.steady_one, Path(tmp)))
        return
    print(f"$ python bench/bench_shards.py{' --poll' if args.poll else ''}{' --steady' if args.steady else ''}"
          f"{' --fleet-wide' if args.fleet_wide else ''}"
          f"{'' if args.series == 10_000 else f' --series {args.series}'}"
          f"{'' if args.replicas == '1,2,4' else f' --replicas {args.replicas}'}\n")
    movement_and_balance()
    if args.poll:
        print(f"poll cycle per replica: {args.series:,} series over {MODELS} models, {POLL_SHARDS} shards")
        poll_cycles(args.series, tuple(int(n) for n in args.replicas.split(",")))
    if args.steady:
        print(f"steady poll cycles per replica: {args.series:,} series over {MODELS} models, {POLL_SHARDS} shards")
        steady_cycles(args.series, tuple(int(n) for n in args.replicas.split(",")))
    if args.fleet_wide:
        print(f"fleet-wide query: {args.series:,} series over {MODELS} models")
        fleet_wide(args.series)


if __name__ == "__main__":
    main()
