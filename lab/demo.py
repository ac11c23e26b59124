"""`make demo`: an incident, live, on real local servers, with tailguard watching and acting.

    python -m lab.demo [--scenario tail|tail-easy|ramp|canary|canary-healthy|canary-shared] [--seed N]
                       [--short] [--no-keep-warm] [--out DIR]

Prints a timeline and a live progress line while it runs, then the path of the report (a
self-contained HTML page and its PNG). Ctrl-C stops everything the demo started (by PID), then exits.
"""
from __future__ import annotations

import argparse
import copy
import os
import asyncio
import signal
import sys
import tempfile
from pathlib import Path

from daemon.common.logs import configure_logging
from lab.scenarios import SCENARIOS
from lab.scenarios.progress import Console
from lab.scenarios.runner import Outcome, run_scenario
from lab.scenarios.tail import TailScenario


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m lab.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), default="tail",
                        help="tail: a deploy sends 0.5%% of requests to 900 ms (P99 holds, P99.9 jumps), the "
                             "example policy rolls back; tail-easy: 3%% at 600 ms (P99 moves too), a short-window "
                             "detector; ramp: a slow leak, forecast; canary: a bad canary "
                             "judged against its stable, Istio weights shifted back; canary-healthy: a good "
                             "canary, never shifted; canary-shared: both versions slow, nothing acts")
    parser.add_argument("--seed", type=int, default=0, help="seed of the model's slow requests (tail)")
    parser.add_argument("--short", action="store_true", help="short phases (as the tests run them)")
    parser.add_argument("--no-keep-warm", dest="keep_warm", action="store_false",
                        help="tail: run the example policy as it is, without `keepWarm: previous` on its rollback "
                             "(the rollback is then a model load, not a switch)")
    parser.add_argument("--out", type=Path, default=None,
                        help="where the report and the servers' files go (default: a new temp folder)")
    return parser.parse_args(argv)


async def play(args: argparse.Namespace, console: Console) -> Outcome:
    """Run the scenario as a task that SIGINT/SIGTERM cancel: cancellation unwinds every start."""
    out = args.out or Path(tempfile.mkdtemp(prefix="tailguard-demo-"))
    scenario = copy.copy(SCENARIOS[args.scenario])
    scenario.model_seed = args.seed
    if isinstance(scenario, TailScenario):
        scenario.keep_warm = args.keep_warm
    task = asyncio.create_task(run_scenario(scenario, out, short=args.short, console=console))
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, task.cancel)
    try:
        return await task
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    configure_logging("console", "warning")
    console = Console()
    try:
        outcome = asyncio.run(play(args, console))
    except asyncio.CancelledError:
        console.text("stopped: every server, the daemon and the load the demo started are stopped")
        return 130
    console.text("\ntimeline:")
    for line in outcome.timeline():
        console.text("  " + line)
    if outcome.final_objects:
        console.text(f"final objects: {outcome.final_objects}")
    console.text(f"\nreport: {outcome.html}\npicture: {outcome.png}")
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Everything the demo started is stopped by now (by PID). Some runs (1 in 3 of the canary and
    # tail runs under the test suite, never reproduced alone) then failed closing stdout in
    # interpreter shutdown ("Exception ignored in: <_io.TextIOWrapper name='<stdout>'>: TypeError:
    # an integer is required"), which turns the exit code into 120 after a run that succeeded; the
    # output is flushed above, so leave without that teardown.
    os._exit(code)
