"""Time to remediate in `make demo`'s incident, over seeds: the `tail` scenario (0.5% of requests at
900 ms after a deploy of v2, 40 req/s, Triton with 4 instances, examples/policies/ranker.yaml with
its endpoints filled in) played once per seed on real local servers; TTR is deploy (v2 serving) to
the rollback's apply step in the journal. Runs use `make demo`'s own phases (the alert rule's
`for: 30s`, a 30 s baseline), with a 3 s settle: nothing before the rollback differs from the demo.
The demo keeps v1 warm (`keepWarm: previous` on the rollback); `--no-keep-warm` runs the example
policy as it is (the rollback is then a model load).

Actuation, per seed, from the run's journal: the decision (its row's time) to the rollback's load
returned (the apply step) and to v1 serving alone (the verify step, which reads every replica's
index and passes only when v1 alone is READY), the switch the plan made (`warm`: v1 already loaded;
`load`), and when the warm load of v1 landed, from the deploy. Prints a table and the lines the
README quotes; not a test.

    python bench/bench_demo_ttr.py --seeds 1,2,3,4,5 [--no-keep-warm]
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import io
import json
import os
from contextlib import closing
import signal
import sqlite3
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from anywhere: the project's packages come first
    sys.path.insert(0, str(ROOT))

from daemon.common.logs import configure_logging  # noqa: E402
from lab.scenarios.base import FULL  # noqa: E402
from lab.scenarios.progress import Console  # noqa: E402
from lab.scenarios.runner import run_scenario  # noqa: E402
from lab.scenarios.tail import TailScenario  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Actuation:
    """What happened after the decision, from a run's journal (seconds; None: not in the journal)."""

    loaded: float | None  # decision to the rollback's apply step journaled (the load returned)
    alone: float | None  # decision to the verify step that saw v1 alone on every replica
    switch: str  # the plan's switch per replica ("warm", "load"), or "none"
    warm_at: float | None  # the warm load of v1 done, seconds after the deploy marker's time
    warm_load: float | None  # that warm load's own time (intent to done)


async def one(seed: int, out: Path, keep_warm: bool) -> tuple[float | None, str | None, str, Actuation]:
    scenario = TailScenario(model_seed=seed, keep_warm=keep_warm)
    log = io.StringIO()
    outcome = await run_scenario(scenario, out / f"seed-{seed}", console=Console(log, live=False),
                                 timings=dataclasses.replace(FULL, settle_seconds=3.0))
    first = next((m.label for m in outcome.markers if m.kind == "detection"), "none")
    deployed = next((m.t for m in outcome.markers if m.kind == "deploy"), None)
    run_dir = out / f"seed-{seed}"
    return (scenario.ttr_seconds, outcome.verdict, f"{first}; decided by {decided_by(run_dir)}",
            actuation(run_dir, deployed))


def actuation(run_dir: Path, deployed_at: float | None) -> Actuation:
    """The executed rollback's times after its decision, read from the run's journal (`deployed_at`:
    the deploy marker's wall time, for when the warm load landed)."""
    journal = run_dir / "tail-work" / "journal.db"
    if not journal.exists():
        return Actuation(None, None, "none", None, None)
    with closing(sqlite3.connect(journal)) as db:
        decision = db.execute("SELECT id, at FROM decisions WHERE executed = 1 ORDER BY at LIMIT 1").fetchone()
        warm = db.execute("SELECT e.at, (SELECT i.at FROM effects i WHERE i.writer = 'warm' AND i.status = 'intent' "
                          "AND i.id < e.id ORDER BY i.id DESC LIMIT 1) FROM effects e "
                          "WHERE e.writer = 'warm' AND e.status = 'done' ORDER BY e.id LIMIT 1").fetchone()
        steps = [] if decision is None else db.execute(
            "SELECT phase, status, at, data FROM steps WHERE decision_id = ? AND idx >= 0 ORDER BY id",
            (decision[0],)).fetchall()
    warm_at = None if warm is None or deployed_at is None else warm[0] - deployed_at
    warm_load = None if warm is None or warm[1] is None else warm[0] - warm[1]
    if decision is None:
        return Actuation(None, None, "none", warm_at, warm_load)
    at = float(decision[1])
    applied = next((row for row in steps if row[0] == "apply" and row[1] == "ok"), None)
    verified = next((row for row in steps if row[0] == "verify" and row[1] == "ok"), None)
    switch = "none"
    if applied is not None:
        planned = json.loads(applied[3]).get("step", {}).get("after", {}).get("replicas", {})
        switch = ",".join(sorted({str(r.get("switch", "?")) for r in planned.values()})) or "none"
    return Actuation(None if applied is None else applied[2] - at, None if verified is None else verified[2] - at,
                     switch, warm_at, warm_load)


def ms(seconds: float | None) -> str:
    return "--" if seconds is None else f"{seconds * 1000:.0f}"


def decided_by(run_dir: Path) -> str:
    """The signal whose plan ran (source/name), read from the run's journal: a governed alert that
    arrived first only notified, and the first signal is then not the one that rolled back."""
    journal = run_dir / "tail-work" / "journal.db"
    if not journal.exists():
        return "unknown (no journal)"
    with closing(sqlite3.connect(journal)) as db:
        row = db.execute("SELECT s.source, s.name FROM decisions d JOIN signals s ON s.id = d.signal_id "
                         "WHERE d.executed = 1 ORDER BY d.at LIMIT 1").fetchone()
    return f"{row[0]}/{row[1]}" if row else "none"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="1,2,3,4,5", help="comma-separated model seeds")
    parser.add_argument("--keep", type=Path, help="write each seed's report (HTML and picture) here instead of a temporary folder")
    parser.add_argument("--no-keep-warm", dest="keep_warm", action="store_false",
                        help="the example policy as it is: no version kept warm, the rollback a model load")
    args = parser.parse_args(argv)
    configure_logging("console", "warning")
    # SIGTERM as Ctrl-C: asyncio.run cancels the run, which stops every server it started.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    seeds = [int(s) for s in args.seeds.split(",")]
    rows: list[tuple[int, float | None, str | None, str, Actuation, str]] = []
    with tempfile.TemporaryDirectory(prefix="tailguard-demo-ttr-") as tmp:
        out = args.keep if args.keep is not None else Path(tmp)
        for seed in seeds:
            ttr, verdict, first, act = asyncio.run(one(seed, out, args.keep_warm))
            load = "load average " + " ".join(f"{v:.1f}" for v in os.getloadavg())
            rows.append((seed, ttr, verdict, first, act, load))
            print(f"seed {seed}: TTR {'--' if ttr is None else f'{ttr:.1f} s'}, decision to v1 alone "
                  f"{ms(act.alone)} ms ({act.switch}), first signal {first}, verdict {verdict}; {load}", flush=True)
    flag = "" if args.keep_warm else " --no-keep-warm"
    print(f"\n# `make demo`'s incident, time to remediate (`python bench/bench_demo_ttr.py --seeds {args.seeds}{flag}`)\n")
    print("| seed | deploy to rollback (s) | first signal; the one that rolled back | recovery verdict |")
    print("|---|---|---|---|")
    for seed, ttr, verdict, first, _, _ in rows:
        print(f"| {seed} | {'none' if ttr is None else f'{ttr:.1f}'} | {first} | {verdict} |")
    done = [row[1] for row in rows if row[1] is not None]
    if done:
        print(f"\nmedian {statistics.median(done):.1f} s, range {min(done):.1f}-{max(done):.1f} s, "
              f"{len(done)} of {len(rows)} seeds rolled back")
    print("\n# actuation after the decision (the run's journal)\n")
    print("| seed | switch | decision to load returned (ms) | decision to v1 alone (ms) | warm load done, after the deploy (s) "
          "| warm load took (ms) | after the run |")
    print("|---|---|---|---|---|---|---|")
    for seed, _, _, _, act, load in rows:
        warm_at = "--" if act.warm_at is None else f"{act.warm_at:.1f}"
        print(f"| {seed} | {act.switch} | {ms(act.loaded)} | {ms(act.alone)} | {warm_at} | {ms(act.warm_load)} | {load} |")
    alone = [row[4].alone for row in rows if row[4].alone is not None]
    if alone:
        print(f"\ndecision to v1 alone: median {statistics.median(alone) * 1000:.0f} ms, range "
              f"{min(alone) * 1000:.0f}-{max(alone) * 1000:.0f} ms over {len(alone)} seed(s)")
    return 0 if len(done) == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
