"""The canary benchmark: the canary judge (tail_canary) against the single-version test on the
canary alone (tail_excess) and a Kayenta-style Mann-Whitney judge, at one stated false-verdict rate.

    python bench/bench_canary.py            # the full run: 40 seeds per case, 300 version-days
    python bench/bench_canary.py --quick    # a smoke run: 8 seeds, 20 version-days (the unit test's)

Traffic: 40 and 400 req/s split by the route, the canary at 1% and 10%. Cases: the reference
defect (0.5% of the canary's requests at 900 ms, from its start; the stable at half budget); a
healthy canary (both at half budget, 0.05% at 900 ms); a shared slowdown (both at 0.5% at 900 ms,
from 5 minutes after the canary started; in the version-days one hour of each day). The line is
500 ms, the budget 0.1% above it, the stated rate one false verdict per version per 30 days at half
budget (the judge's and the single-version test's promise), of which the judge's start test spends
0.001 per canary start. The Mann-Whitney judge's alpha is the largest that keeps both parts of that
promise: its false verdicts on healthy version-days at most that rate (where none is, it says so),
and the share of 20,000 healthy canary starts with a verdict in their first lookback at most the
judge's per start. The column "per day only" is tuned on version-days alone, as a user tuning it on
a day of history would: it spends its false verdicts on young canaries. Delays are seconds from the
onset to the first verdict, censored at the horizon (10 min; 1 h where the canary gets under 10
req/s); a median is "never" when half the seeds or more did not decide. A shared slowdown is no canary defect: the single-version test's verdicts there are the
false verdicts the judge exists to avoid.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from detectors.canary_start import start_alpha  # noqa: E402
from detectors.tail_excess import TailExcessParams  # noqa: E402
from evaluation.operating_curve.arrivals import Fault  # noqa: E402
from evaluation.operating_curve.canary_judge import Judge  # noqa: E402
from evaluation.operating_curve.deciders import Tailguard  # noqa: E402
from evaluation.operating_curve.kayenta import (MannWhitney, start_alpha_cap, start_lowest_p,  # noqa: E402
                                                tune_alpha, verdicts_below)
from evaluation.operating_curve.pair_runs import Single, pair_delays, pair_false_verdicts  # noqa: E402
from evaluation.operating_curve.pairs import HALF_BUDGET, Case, PairDecider, Split  # noqa: E402
from evaluation.operating_curve.runs import detected, median_delay  # noqa: E402
from evaluation.operating_curve.traffic import DAY  # noqa: E402

LINE_MS = 500.0
STEP = 1.0
RATE_DAYS = 30.0
WITHIN = 600.0
REFERENCE = Fault(0.005, 900)
SPLITS = (Split(40.0, 0.01), Split(40.0, 0.1), Split(400.0, 0.01), Split(400.0, 0.1))
DEFECT = Case("reference defect", "defect", HALF_BUDGET, REFERENCE)
HEALTHY = Case("healthy canary", "healthy", HALF_BUDGET, HALF_BUDGET)
SHARED = Case("shared slowdown", "shared", REFERENCE, REFERENCE)
CASES = (DEFECT, HEALTHY, SHARED)
SHARED_LEAD = 300.0  # the canary serves this long before a shared slowdown starts
EPISODE = 3600.0  # a version-day's shared slowdown
STARTS = 20_000  # healthy canary starts the Mann-Whitney judge's alpha is held to the promise per start on
PER_DAY_ONLY = "Mann-Whitney, per day only"


def horizon(split: Split) -> float:
    return 3600.0 if split.canary_rate < 10 else 600.0


def history(params: TailExcessParams) -> float:
    """The stable's history before the onset: the judge's whole lookback."""
    return params.lookback_seconds_


@dataclass
class Row:
    split: Split
    case: Case
    decider: str
    delays: np.ndarray
    per_day: float | None

    @property
    def median(self) -> float:
        return median_delay(self.delays)

    @property
    def within(self) -> float:
        return float(np.mean(self.delays <= WITHIN))  # NaN compares false: not detected

    @property
    def decided(self) -> float:
        return detected(self.delays)


def deciders(params: TailExcessParams, alpha: float | None, split: Split, day_alpha: float | None = None
             ) -> list[PairDecider]:
    out: list[PairDecider] = [Judge(params, STEP, weight=split.weight),
                              Single(Tailguard.of(params, STEP, params.lookback_seconds_))]
    if alpha is not None:
        out.append(MannWhitney(alpha))
    if day_alpha is not None:
        out.append(MannWhitney(day_alpha, label=PER_DAY_ONLY))
    return out


def start_share(params: TailExcessParams) -> float:
    """The judge's promise per canary start over its first lookback: what its start test spends
    (the default `start_false_verdicts`, as the replay's judge) and the running bank's share of
    that long."""
    return start_alpha(RATE_DAYS) + params.lookback_seconds_ / DAY / RATE_DAYS


def run(seeds: range, days: int, starts: int = STARTS) -> tuple[list[Row], dict[str, str]]:
    params = TailExcessParams(line=LINE_MS, evidence="histogram")
    stated = 1.0 / RATE_DAYS
    share = start_share(params)
    window = params.lookback_seconds_
    rows: list[Row] = []
    notes: dict[str, str] = {}
    for split in SPLITS:
        t0 = time.process_time()
        lowest = start_lowest_p(split, starts, window)
        alpha, verdicts, smallest = tune_alpha(split, days, stated, cap=min(0.05, start_alpha_cap(lowest, share)))
        day_alpha, day_verdicts, _ = tune_alpha(split, days, stated)
        reached = verdicts <= stated * days
        notes[split.name] = (f"Mann-Whitney alpha {alpha:.3g} ({verdicts} false verdicts in {days} healthy "
                             f"version-days; smallest p seen {smallest:.2g})" if reached else
                             f"Mann-Whitney cannot reach 1/{RATE_DAYS:g} days: at alpha {alpha:.3g} it gives "
                             f"{verdicts} in {days} version-days (smallest p seen {smallest:.2g}); shown at that alpha")
        notes[split.name] += (f"; {verdicts_below(lowest, alpha)} of {starts} healthy canary starts with a verdict "
                              f"in their first {window:.0f} s (the judge's promise: {share:.2g} per start); "
                              f"{PER_DAY_ONLY}: alpha {day_alpha:.3g}, {day_verdicts} false verdicts in {days} "
                              f"version-days, {verdicts_below(lowest, day_alpha)} of {starts} starts with a verdict "
                              f"in their first {window:.0f} s")
        ds = deciders(params, alpha, split, day_alpha)
        for case in CASES:
            start = -SHARED_LEAD if case.kind == "shared" else 0.0
            found = pair_delays(ds, split, case, seeds, horizon(split), history(params) + SHARED_LEAD, LINE_MS,
                                STEP, canary_start=start)
            if case.kind == "defect":
                rates = {d.name: None for d in ds}
            else:
                episode = EPISODE if case.kind == "shared" else None
                rates = {k: r.per_day for k, r in pair_false_verdicts(
                    ds, split, case, days, history(params), LINE_MS, STEP, episode_seconds=episode).items()}
            rows += [Row(split, case, d.name, found[d.name], rates[d.name]) for d in ds]
        notes[split.name] += f"; {time.process_time() - t0:.0f} CPU-s"
    return rows, notes


def table(rows: list[Row], seeds: int, days: int) -> list[str]:
    out = [f"{seeds} seeds per case; {days} version-days per healthy and shared case; 1 s steps; line "
           f"{LINE_MS:g} ms; stated rate 1 per {RATE_DAYS:g} version-days\n",
           "| traffic | case | decider | median to verdict (s) | within 10 min | seeds with a verdict | "
           "false verdicts per version-day |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        med = "never" if not math.isfinite(r.median) else f"{r.median:.0f}"
        false = "" if r.per_day is None else f"{r.per_day:.4f}"
        out.append(f"| {r.split.name} | {r.case.name} | {r.decider} | {med} | {r.within:.0%} | {r.decided:.0%} "
                   f"| {false} |")
    return out


def checks(rows: list[Row]) -> list[tuple[bool, str]]:
    """The issue's Done-when lines, each PASS or FAIL with the numbers."""
    stated = 1.0 / RATE_DAYS
    judge = [r for r in rows if r.decider == "judge"]
    quiet = [r for r in judge if r.case.kind != "defect"]
    shifts = sum(int(np.sum(~np.isnan(r.delays))) for r in quiet)
    over = [r for r in quiet if r.per_day is not None and r.per_day > 1.2 * stated]
    out = [(shifts == 0, f"zero shifts on the healthy canary and the shared slowdown (seeded runs): {shifts} verdicts"),
           (not over, "false verdicts per version-day within 1.2x the stated rate on healthy and shared days: "
                      + (", ".join(f"{r.split.name} {r.case.name} {r.per_day:.4f}" for r in over) or "all"))]
    top = next(r for r in judge if r.case.kind == "defect" and r.split == Split(400.0, 0.1))
    out.append((top.within >= 0.95, f"10% of 400 req/s, reference defect detected within 10 min: {top.within:.0%} "
                                     "(at least 95%)"))
    for r in (r for r in judge if r.case.kind == "defect"):
        peers = {p.decider: p for p in rows if p.split == r.split and p.case == r.case}
        if max(p.decided for p in peers.values()) < 0.5:
            continue
        single = peers["single-version"].median
        mw = peers["Mann-Whitney"].median if "Mann-Whitney" in peers else math.inf
        ok = r.median <= 1.2 * single and r.median <= mw
        out.append((ok, f"{r.split.name}, {r.case.name}: judge median {_s(r.median)} <= 1.2 x single-version "
                        f"{_s(single)} and <= Mann-Whitney {_s(mw)}"))
    return out


def _s(seconds: float) -> str:
    return f"{seconds:.0f} s" if math.isfinite(seconds) else "never"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="8 seeds and 20 version-days: a smoke run")
    ap.add_argument("--seeds", type=int, help="seeds per case (default 40)")
    ap.add_argument("--days", type=int, help="version-days per healthy and shared case (default 300)")
    ap.add_argument("--starts", type=int, help=f"healthy canary starts for Mann-Whitney's alpha (default {STARTS:,})")
    args = ap.parse_args()
    seeds = range(1, (args.seeds or (8 if args.quick else 40)) + 1)
    days = args.days or (20 if args.quick else 300)
    starts = args.starts or (2_000 if args.quick else STARTS)
    cmd = "python bench/bench_canary.py" + (" --quick" if args.quick else "") + (
        f" --seeds {args.seeds}" if args.seeds else "") + (f" --days {args.days}" if args.days else "") + (
        f" --starts {args.starts}" if args.starts else "")
    print(f"# Canary benchmark (`{cmd}`)\n")
    rows, notes = run(seeds, days, starts)
    print("\n".join(table(rows, len(seeds), days)))
    print()
    for name, note in notes.items():
        print(f"- {name}: {note}")
    print()
    for ok, line in checks(rows):
        print(f"{'PASS' if ok else 'FAIL'}: {line}")
    print(f"\nreproduce: {cmd}")


if __name__ == "__main__":
    main()
