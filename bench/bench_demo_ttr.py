"""Time to remediate in `make demo`'s incident, over seeds: the `tail` scenario (0.5% of requests at
900 ms after a deploy of v2, 40 req/s, Triton with 4 instances, examples/policies/ranker.yaml with
its endpoints filled in) played once per seed on real local servers; TTR is deploy (v2 serving) to
the rollback's apply step in the journal. Runs use `make demo`'s own phases (the alert rule's
`for: 30s`, a 30 s baseline), with a 3 s settle: nothing before the rollback differs from the demo.
Prints a table and the line the README quotes; not a test.

    python bench/bench_demo_ttr.py --seeds 1,2,3,4,5
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import io
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


async def one(seed: int, out: Path) -> tuple[float | None, str | None, str]:
    scenario = TailScenario(model_seed=seed)
    log = io.StringIO()
    outcome = await run_scenario(scenario, out / f"seed-{seed}", console=Console(log, live=False),
                                 timings=dataclasses.replace(FULL, settle_seconds=3.0))
    first = next((m.label for m in outcome.markers if m.kind == "detection"), "none")
    return scenario.ttr_seconds, outcome.verdict, f"{first}; decided by {decided_by(out / f'seed-{seed}')}"


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
    args = parser.parse_args(argv)
    configure_logging("console", "warning")
    # SIGTERM as Ctrl-C: asyncio.run cancels the run, which stops every server it started.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    seeds = [int(s) for s in args.seeds.split(",")]
    rows: list[tuple[int, float | None, str | None, str]] = []
    with tempfile.TemporaryDirectory(prefix="tailguard-demo-ttr-") as tmp:
        out = args.keep if args.keep is not None else Path(tmp)
        for seed in seeds:
            ttr, verdict, first = asyncio.run(one(seed, out))
            rows.append((seed, ttr, verdict, first))
            print(f"seed {seed}: TTR {'--' if ttr is None else f'{ttr:.1f} s'}, first signal {first}, "
                  f"verdict {verdict}", flush=True)
    print(f"\n# `make demo`'s incident, time to remediate (`python bench/bench_demo_ttr.py --seeds {args.seeds}`)\n")
    print("| seed | deploy to rollback (s) | first signal; the one that rolled back | recovery verdict |")
    print("|---|---|---|---|")
    for seed, ttr, verdict, first in rows:
        print(f"| {seed} | {'none' if ttr is None else f'{ttr:.1f}'} | {first} | {verdict} |")
    done = [t for _, t, _, _ in rows if t is not None]
    if done:
        print(f"\nmedian {statistics.median(done):.1f} s, range {min(done):.1f}-{max(done):.1f} s, "
              f"{len(done)} of {len(rows)} seeds rolled back")
    return 0 if len(done) == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
