"""The model-based safety test (tests/unit/test_stateful_safety.py) at a stated budget: how many steps
it ran, how much CPU, and, for an invariant that breaks, after how many steps and CPU seconds the
first broken step was found (before shrinking) and the shrunk sequence.

    .venv/bin/python bench/bench_stateful.py                      # the long profile, every invariant
    .venv/bin/python bench/bench_stateful.py --profile unit       # the unit run's budget, per invariant

The long profile runs `--examples` sequences of up to `--steps` rules (default 250 x 60: at most
15,000 steps, 13,152 on 515670a) with every invariant checked at once; the unit profile runs each
invariant as the unit test does, shrinking a failure to the sequence a regression test is written from.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.unit import test_stateful_safety as model  # noqa: E402


def run(names: tuple[str, ...], budget: settings) -> dict[str, object]:
    """One machine checking `names` under `budget`: what it ran and what it found."""
    model.reset_stats()
    started, wall = time.process_time(), time.time()
    failure = None
    try:
        with model.quiet_logs():
            run_state_machine_as_test(model.machine_checking(*names), settings=budget)
    except AssertionError as exc:
        failure = [*getattr(exc, "__notes__", []), *str(exc).strip().splitlines()]
    stats = dict(model.RUN_STATS)
    return {"invariants": names, "steps": int(stats["steps"]), "examples": int(stats["examples"]),
            "cpu_seconds": round(time.process_time() - started, 1), "wall_seconds": round(time.time() - wall, 1),
            "first_failure_steps": stats.get("first_failure_steps"),
            "first_failure_cpu_seconds": round(float(stats["first_failure_cpu_seconds"]), 2)
            if "first_failure_cpu_seconds" in stats else None,
            "failure": failure}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", choices=("long", "unit"), default="long")
    parser.add_argument("--invariant", action="append", choices=model.INVARIANTS,
                        help="unit profile: only this invariant (repeatable; default: each in turn)")
    parser.add_argument("--examples", type=int, default=None, help="sequences (default: the profile's)")
    parser.add_argument("--steps", type=int, default=None, help="rules per sequence at most (default: the profile's)")
    args = parser.parse_args()
    print("command:", " ".join([".venv/bin/python", "bench/bench_stateful.py", *sys.argv[1:]]))
    groups: list[tuple[str, ...]]
    if args.profile == "unit":
        groups = [(name,) for name in args.invariant or model.INVARIANTS]
        # As the unit run, shrunk: the sequence a regression test is written from.
        budget = settings(model.UNIT, max_examples=args.examples or model.UNIT.max_examples,
                          stateful_step_count=args.steps or model.UNIT.stateful_step_count,
                          phases=tuple(Phase))
    else:
        groups = [model.INVARIANTS]
        budget = settings(model.LONG, max_examples=args.examples or model.LONG.max_examples,
                          stateful_step_count=args.steps or model.LONG.stateful_step_count)
    print(f"budget: {budget.max_examples} examples x up to {budget.stateful_step_count} steps, "
          f"derandomized={budget.derandomize}")
    broken = 0
    for names in groups:
        result = run(names, budget)
        failure = result.pop("failure")
        assert failure is None or isinstance(failure, list)
        print(result)
        if failure:
            broken += 1
            print("  FAILED; the shrunk sequence and the broken invariant:")
            for line in failure:
                print("   ", line)
    return 1 if broken and args.profile == "long" else 0


if __name__ == "__main__":
    sys.exit(main())
