"""Detection delays with sharded replicas (#45): real `tailguard run` processes, sharding on (4 shards,
Leases on the repository's Kubernetes emulator, one PostgreSQL journal started as the shard tests
start it), against the live detector's replay on the same arrivals.

Each of --targets models (m0, m1, ...; 5, 4, 3 and 4 on shards 0-3 at 16) is served by a loopback fake
Prometheus (bench/shard_delay_rig.py) from arrivals made by the operating curve's generators: 40
req/s, healthy at half budget until its onset, then the reference defect (0.5% of requests at
900 ms, line 500 ms), a seed of its own per target. The policies read Triton's histogram through
Prometheus (`_bucket{le="500"}` and `_count`, `interval: 5s`, the 5 s scrape of the reference
setup) and notify. Prometheus rather than `source: triton`: a range query's answer is a function of
the arrivals and the grid alone, so the replay reads exactly what a replica read (with Triton's
/metrics the detector's history is what the process scraped, when it scraped); and serving it
costs one small JSON answer per poll.

Per target: (a) the replay: the live `detect_many` polled at every scrape on the same answers, from
the replicas' first poll of the target, seconds from the onset to its first firing poll; (b) the
replicas: the first detector signal the fleet journaled for the target's policy, its `observed_at`
(the firing poll's time) and its `received_at` (the journal's insert) minus the onset. The bar
(issue 45): |b - a| <= one poll step (5 s) for every target. Also shown: the scrape (b) fired on
(the replay's when both read the same data), each replica's polls' phase after the scrape (which
b - a is when a replica reads the newest scrape on time), the phase of the newest grid point its
answers held, and the journaled reason of a target that fired on another scrape. Two poller faults
this found are fixed: ranges ended past the clock (the client rounded up; a scrape between a cycle's
`_bucket` and `_count` answers made healthy models fire: b41396d), and polls drifted off the range
cache's grid, reading the scrape before the newest for minutes (b - a = 5 s + the phase: 88b0bc4).
The same arrivals run twice in one run: --replicas replicas (sharding.shards 4), then one replica
(sharding off, the single leader).

Run: python bench/bench_shard_delays.py [--replicas 4] [--targets 16] [--lead 75] [--horizon 300]
(about 10 minutes wall, light CPU). Against a snapshot of a commit, away from uncommitted edits:
  git archive HEAD | tar -x -C /tmp/src && TAILGUARD_SRC=/tmp/src TAILGUARD_COMMIT=$(git rev-parse --short HEAD) \
    python /tmp/src/bench/bench_shard_delays.py
"""
from __future__ import annotations

import argparse
import asyncio
import math
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

SRC = Path(os.environ.get("TAILGUARD_SRC", Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(SRC))
sys.path.insert(0, str(SRC / "bench"))

from daemon.cluster.shard_assignment import assign_bounded, shard_of  # noqa: E402
from daemon.storage.journal import Journal  # noqa: E402
from daemon.wiring.registries import action_registry, detector_registry  # noqa: E402
from detectors.tail_excess import TailExcessParams  # noqa: E402
from lab.kube.emulator import KubeEmulator  # noqa: E402
from lab.kube.seeds import kube_settings, write_kubeconfig  # noqa: E402
from lab.ports import free_port  # noqa: E402
from lab.process import ManagedProcess  # noqa: E402
from policies.loader import load_policies  # noqa: E402
from shard_delay_rig import BUCKET, COUNT, SCRAPE, FakePrometheus, make_target, replay  # noqa: E402
from tests.support.postgres import PostgresServer, start_postgres, stop_postgres  # noqa: E402

NS, SHARDS, TOKEN = "tailguard", 4, "bench-token-5d1e"
LEASE = {"enabled": True, "leaseName": "tailguard", "leaseNamespace": NS, "leaseDurationSeconds": 6,
         "renewDeadlineSeconds": 4, "retryPeriodSeconds": 1}
NO_BLAST_RADIUS = {"maxTargetsPerWindow": None, "commonCauseTargets": None, "commonCauseShare": None}


def policy(model: str, hook: str) -> str:
    return f"""name: delay-{model}
target: {{model: {model}}}
triggers:
  - detector:
      type: tail_excess
      source: prometheus
      query: {BUCKET}{{model="$model", le="500"}}
      companionQuery: {COUNT}{{model="$model"}}
      interval: 5s
      params: {{line: 500, line_unit: ms, evidence: histogram}}
actions:
  - type: notify
    url: {hook}
guards: {{cooldown: 0s, maxActions: 1000}}
"""


@dataclass
class Replica:
    """`tailguard run` as pod `name`, in a subprocess only ever signalled by its own PID."""

    name: str
    port: int
    process: ManagedProcess

    @classmethod
    def make(cls, root: Path, name: str, dsn: str, kubeconfig: Path, policies: Path, prometheus: str,
             shards: int) -> "Replica":
        port = free_port()
        config = root / f"{name}.yaml"
        config.write_text(yaml.safe_dump({
            "listen": {"host": "127.0.0.1", "port": port},
            "policies": {"path": str(policies), "reloadIntervalSeconds": 60},
            "journal": {"backend": "postgres", "sharedPollSeconds": 0.2},
            "prometheus": {"url": prometheus},
            "kubernetes": kube_settings(kubeconfig), "leaderElection": LEASE, "sharding": {"shards": shards},
            "executor": {"workers": 2, "pinReconcileIntervalSeconds": 3600},
            "log": {"format": "json", "level": "info"}, "blastRadius": NO_BLAST_RADIUS,
        }))
        process = ManagedProcess(
            [sys.executable, "-m", "daemon.wiring.cli", "run", "--config", str(config)], root / f"{name}.log", cwd=SRC,
            env={**os.environ, "TAILGUARD_WEBHOOK_TOKEN": TOKEN, "TAILGUARD_JOURNAL_DSN": dsn, "POD_NAME": name,
                 "PYTHONUNBUFFERED": "1"})
        return cls(name, port, process)

    async def start(self) -> None:
        self.process.start()
        await asyncio.to_thread(self.process.wait_ready, f"http://127.0.0.1:{self.port}/readyz", 120)


@dataclass(frozen=True)
class Row:
    """One target's delays (seconds from its onset) and who led it."""

    model: str
    seed: int
    shard: int
    leader: str
    replay: float  # (a)
    observed: float  # (b) the firing poll's time
    journaled: float  # (b') the journal's insert
    phase: float  # the replicas' polls of the target, median seconds past a scrape (when the fake answered)
    grid: float  # the newest grid point of their answers, median seconds past a scrape (the cached grid's phase)
    reason: str  # the first signal's detection, as the replica journaled it

    @property
    def diff(self) -> float:
        return self.observed - self.replay

    @property
    def scrape(self) -> float:
        """The newest scrape the replicas' firing poll read (its time floored to the scrape grid;
        onsets are on it), seconds from the onset: the replay's when both fired on the same data."""
        return math.floor(self.observed / SCRAPE) * SCRAPE if math.isfinite(self.observed) else math.inf


def holders(emulator: KubeEmulator, shards: int) -> dict[int, str | None]:
    """Each shard Lease's holder (the single leader's Lease when sharding is off)."""
    names = [f"tailguard-shard-{s}" for s in range(shards)] if shards > 1 else ["tailguard"]
    out: dict[int, str | None] = {}
    for s, name in enumerate(names):
        lease = emulator.get("leases", NS, name)
        out[s] = lease["spec"].get("holderIdentity") if lease is not None else None
    return out


def first_signals(dsn: str) -> dict[str, tuple[float, float, str]]:
    """Per policy, its first detector signal: (observed_at, received_at) in unix seconds, and the
    detection's reason."""
    journal = Journal(dsn)
    try:
        rows = journal.signals.all()
    finally:
        journal.close()
    out: dict[str, tuple[float, float, str]] = {}
    for r in rows:
        if r.source == "detector" and r.policy is not None and r.policy not in out:
            out[r.policy] = (datetime.fromisoformat(r.payload["observed_at"]).timestamp(), r.received_at,
                             str((r.payload.get("details") or {}).get("reason", "")))
    return out


async def run_fleet(server: PostgresServer, root: Path, replicas: int, models: list[str], seeds: list[int],
                    lead: float, horizon: float) -> tuple[list[Row], dict[str, Any]]:
    """One fleet of `replicas` on the arrivals: the targets' onsets `lead` s (plus 0-10 s, staggered) after
    this call's start on the scrape grid; until every target was signalled or `horizon` past its onset."""
    root.mkdir()
    dsn = server.create_database()
    Journal(dsn).close()  # migrated before the replicas race for it
    shards = SHARDS if replicas > 1 else 1
    anchor = math.ceil(time.time() / SCRAPE) * SCRAPE + lead
    targets = {m: make_target(m, seed, anchor + SCRAPE * (i % 3), horizon + 60)
               for i, (m, seed) in enumerate(zip(models, seeds))}
    fake = FakePrometheus(targets)
    runner = web.AppRunner(fake.app(), access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    policies = root / "policies"
    policies.mkdir()
    (policies / "p.yaml").write_text("\n---\n".join(policy(m, f"http://127.0.0.1:{port}/hook") for m in models))
    loaded = load_policies(policies, action_registry(), detector_registry())
    keys = {p.name: p.target.key for p in loaded.policies}
    params = {p.name: p.detectors[0].params for p in loaded.policies}
    info: dict[str, Any] = {}
    fleet: list[Replica] = []
    try:
        async with KubeEmulator() as emulator:
            kubeconfig = write_kubeconfig(root / "kubeconfig", emulator)
            fleet = [Replica.make(root, f"tailguard-{i}", dsn, kubeconfig, policies, f"http://127.0.0.1:{port}", shards)
                     for i in range(replicas)]
            started = time.time()
            await asyncio.gather(*(r.start() for r in fleet))
            names = [r.name for r in fleet]
            want = assign_bounded(SHARDS, names) if shards > 1 else {0: names[0]}
            while holders(emulator, shards) != want:
                if time.time() > anchor + horizon:
                    raise RuntimeError(f"the Leases never settled: {holders(emulator, shards)} != {want}")
                await asyncio.sleep(0.2)
            info["settled_after"] = time.time() - started
            info["settled_before_onset"] = anchor - time.time()
            moves = 0
            last = min(t.onset for t in targets.values()) + horizon
            found: dict[str, tuple[float, float, str]] = {}
            while time.time() < last and len(found) < len(models):
                await asyncio.sleep(1.0)
                moves += holders(emulator, shards) != want
                found = await asyncio.to_thread(first_signals, dsn)
            info["lease_moves_after_settling"] = moves
    finally:
        for r in fleet:
            await asyncio.to_thread(r.process.stop)
        await runner.cleanup()
        server.drop_database(dsn)
    first_poll = {m: min(p.end for p in fake.polls if p.model == m) for m in models}
    rows = []
    for m in models:
        name, t = f"delay-{m}", targets[m]
        p = params[name]
        assert isinstance(p, TailExcessParams)
        a = replay(t, p, math.floor(first_poll[m] / SCRAPE) * SCRAPE, t.onset + horizon)
        observed, journaled, reason = found.get(name, (math.inf, math.inf, ""))
        shard = shard_of(keys[name], shards)
        mine = [p for p in fake.polls if p.model == m and t.onset <= p.wall <= t.onset + max(observed - t.onset, 0)]
        phase = statistics.median([p.wall % SCRAPE for p in mine] or [math.nan])
        grid = statistics.median([p.newest % SCRAPE for p in mine] or [math.nan])
        rows.append(Row(m, t.seed, shard, want[shard], a, observed - t.onset, journaled - t.onset, phase, grid,
                        reason))
    return rows, info


def _fmt(x: float) -> str:
    return "-" if not math.isfinite(x) else f"{x:.1f}"


def report(title: str, rows: list[Row], info: dict[str, Any]) -> bool:
    print(f"\n### {title}\n")
    print(f"Leases settled {info['settled_after']:.1f} s after the start, {info['settled_before_onset']:.1f} s before "
          f"the first onset; seconds with a shard off the assignment afterwards: {info['lease_moves_after_settling']}\n")
    print("| target | seed | shard | led by | (a) replay s | (b) signal observed_at s | journaled s | b - a "
          "| scrape (b) fired on |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r.model} | {r.seed} | {r.shard} | {r.leader} | {_fmt(r.replay)} | {_fmt(r.observed)} | "
              f"{_fmt(r.journaled)} | {_fmt(r.diff)} | {_fmt(r.scrape)} |")
    diffs = [r.diff for r in rows]
    ok = all(math.isfinite(d) and abs(d) <= SCRAPE for d in diffs)
    finite = [d for d in diffs if math.isfinite(d)]
    print(f"\nb - a: median {statistics.median(finite) if finite else math.nan:.1f} s, min {min(finite, default=math.nan):.1f},"
          f" max {max(finite, default=math.nan):.1f}; median delay replay {statistics.median(r.replay for r in rows):.1f} s,"
          f" replicas {statistics.median(r.observed for r in rows):.1f} s")
    print("\n| replica | shards | targets | (a) replay median s | (b) replicas median s | b - a min / median / max s "
          "| polls' phase after the scrape s | newest grid point's phase s | fired on the replay's scrape |")
    print("|---|---|---|---|---|---|---|---|---|")
    for leader in sorted({r.leader for r in rows}):
        mine = [r for r in rows if r.leader == leader]
        d = [r.diff for r in mine]
        print(f"| {leader} | {', '.join(str(s) for s in sorted({r.shard for r in mine}))} | {len(mine)} "
              f"| {_fmt(statistics.median(r.replay for r in mine))} | {_fmt(statistics.median(r.observed for r in mine))} "
              f"| {_fmt(min(d))} / {_fmt(statistics.median(d))} / {_fmt(max(d))} "
              f"| {statistics.median(r.phase for r in mine):.2f} | {statistics.median(r.grid for r in mine):.2f} | {sum(r.scrape == r.replay for r in mine)} of {len(mine)} |")
    for r in rows:
        if r.scrape != r.replay:
            print(f"  {r.model} fired on another scrape than the replay's: {r.reason}")
    same = sum(r.scrape == r.replay for r in rows)
    print(f"fired on the scrape the replay fired on: {same} of {len(rows)} targets")
    print(f"bar |b - a| <= {SCRAPE:g} s for every target: {'met' if ok else 'NOT met'}")
    return ok


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--targets", type=int, default=16)
    ap.add_argument("--lead", type=float, default=75.0, help="seconds from a fleet's start to the first onset")
    ap.add_argument("--horizon", type=float, default=300.0, help="seconds after an onset a signal is waited for")
    a = ap.parse_args()
    print("python bench/bench_shard_delays.py " + shlex.join(sys.argv[1:]))
    # A snapshot (git archive, TAILGUARD_SRC) has no git: TAILGUARD_COMMIT names its commit.
    commit = os.environ.get("TAILGUARD_COMMIT") or subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=SRC).stdout.strip()
    dirty = subprocess.run(["git", "status", "--short", "--", "daemon", "detectors", "core", "policies"],
                           capture_output=True, text=True, cwd=SRC).stdout.strip()
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, commit {commit or '(no git)'} at {SRC}"
          + (f"; uncommitted product changes: {dirty.splitlines()}" if dirty else ""))
    models = [f"m{i}" for i in range(a.targets)]
    seeds = [101 + i for i in range(a.targets)]
    root = Path(tempfile.mkdtemp(prefix="tailguard-shard-delays-"))
    pg = Path(tempfile.mkdtemp(prefix="tailguard-pg-"))  # its own: the server may run as another user
    server = start_postgres(pg)
    ok = True
    try:
        for n in (a.replicas, 1):
            rows, info = await run_fleet(server, root / f"fleet{n}", n, models, seeds, a.lead, a.horizon)
            ok &= report(f"{n} replica(s)" + (f", {SHARDS} shards" if n > 1 else ", sharding off (the single leader)"),
                         rows, info)
    finally:
        stop_postgres(server)
        shutil.rmtree(pg, ignore_errors=True)
    if ok:
        shutil.rmtree(root, ignore_errors=True)
    else:
        print(f"\nthe replicas' logs: {root}")
    print("every bar met" if ok else "a bar NOT met")


if __name__ == "__main__":
    asyncio.run(main())
