"""tail_excess's start test on simulated deploys: with the defect present from the version's first
request, the median delay from that request to the first alarm against the deploy-aware limit (an
SPRT from the deploy with the true rates at the same per-deploy probability); healthy deploys at
half budget, the share that alarm within the horizon (the per-deploy false-alarm probability);
the settle on deploys whose first seconds' requests are held by the model load; and the live
detector (`detect_many` every second) against the replay on a few seeds.

    python bench/bench_start_test.py            # 200 seeds, 20,000 healthy deploys per case
    python bench/bench_start_test.py --quick    # 100 seeds, 20,000 healthy deploys on the histogram at 40 req/s only

The reference defect is 0.5% of requests at 900 ms against a line of 500 ms (P99.9 < 500 ms);
healthy is half budget, 0.05% at 900 ms; 1 s steps; the start test at its defaults (0.001 per
deploy, 900 s horizon, a settle of at most 5 s; docs/detectors.md, "The start test").
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
from scipy.stats import chi2

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from core.query import Series  # noqa: E402
from detectors.tail_excess import TailExcessDetector, TailExcessParams  # noqa: E402
from detectors.tail_excess_settle import may_be_held, settle_columns  # noqa: E402
from evaluation.operating_curve.arrivals import Fault, Steps, seeded_run  # noqa: E402
from evaluation.operating_curve.deciders import Tailguard  # noqa: E402
from evaluation.operating_curve.start_limit import (StartSpec, false_starts, limit_first,  # noqa: E402
                                                    median_or_inf, start_first, step_limit_first)
from evaluation.operating_curve.traffic import Traffic  # noqa: E402

LINE_MS = 500.0
NULL = 0.0005
DEFECT = Fault(0.005, 900.0)
HEALTHY = Fault(NULL, 900.0)
STEP = 1.0
RUN_SECONDS = 300.0  # each delay run: the defect is found well within it


def settled(steps: Steps, first: int) -> Steps:
    """The steps with the settle's columns left out (NaN), as the live detector leaves them out."""
    def cut(x: np.ndarray) -> np.ndarray:
        y = x.copy()
        y[:, :first] = np.nan
        return y
    return Steps(cut(steps.requests), cut(steps.above), cut(steps.latency_ms))


def delay_section(seeds: range) -> bool:
    """Median delays from the first request: the start test alone, the detector (start test and
    bank, whichever first), the limit from the deploy, the limit after the same settle."""
    ok = True
    print("## Delay: the reference defect present from the version's first request\n")
    print(f"{len(seeds)} seeds; 1 s steps; seconds from the first request to the first alarm\n")
    print("| evidence | req/s | start test | start test + bank | start test, no settle | limit (from the deploy) "
          "| limit after the settle | start test + bank / limit | bar |")
    print("|---|---|---|---|---|---|---|---|---|")
    cases = [("histogram", 40.0), ("histogram", 400.0), ("counters", 40.0)]
    for evidence, rate in cases:
        params = TailExcessParams(line=LINE_MS, evidence=evidence)
        spec = StartSpec.of(params)
        unsettled = StartSpec.of(params.model_copy(update={"start_settle_seconds": 0.0}))
        first = spec.first_scored(STEP)
        bank = Tailguard.of(params, STEP, 900.0)
        start, both, bare, limit, limit_settled, step_settled = [], [], [], [], [], []
        for seed in seeds:
            steps = seeded_run(seed, Traffic(rate), DEFECT, RUN_SECONDS, LINE_MS, STEP)
            s = float(start_first(spec, steps, STEP)[0])
            run = bank.start(1)
            run.feed(settled(steps, first))
            b = float(run.first[0])
            start.append(s)
            bare.append(float(start_first(unsettled, steps, STEP)[0]))
            both.append(np.nanmin([s, b]) if not (math.isnan(s) and math.isnan(b)) else math.nan)
            limit.append(float(limit_first(NULL, DEFECT.share, spec.alpha, spec.horizon_seconds, steps, STEP,
                                           rate * STEP)[0]))
            late = Steps(steps.requests[:, first:], steps.above[:, first:], steps.latency_ms[:, first:])
            limit_settled.append(first * STEP + float(limit_first(NULL, DEFECT.share, spec.alpha, spec.horizon_seconds,
                                                                  late, STEP, rate * STEP)[0]))
            step_settled.append(first * STEP + float(step_limit_first(NULL, DEFECT.share, spec.alpha,
                                                                      spec.horizon_seconds, late, STEP, rate * STEP)[0]))
        med, med_both = median_or_inf(start), median_or_inf(both)
        lim, lim_s = median_or_inf(limit), median_or_inf(limit_settled)
        if evidence == "histogram":
            passed = med_both <= 1.1 * lim or med_both <= lim + STEP
            bar = f"<= 1.1x limit or one step: {'yes' if passed else '**no**'}"
        else:
            passed = med_both <= 35.0
            steps_only = median_or_inf(step_settled)
            bar = (f"<= 35 s: {'yes' if passed else '**no**'} (the limit on what 1 s counters show, whether a step "
                   f"holds a slow request, after the settle: {steps_only:.0f} s, {med_both / steps_only:.2f}x)")
        ok &= passed
        print(f"| {evidence} | {rate:g} | {med:.0f} | {med_both:.0f} | {median_or_inf(bare):.0f} | {lim:.0f} | {lim_s:.0f} | "
              f"{med_both / lim:.2f}x | {bar} |")
    print()
    return ok


def rate_line(fired: int, deploys: int, alpha: float) -> str:
    lower = 0.0 if fired == 0 else float(chi2.ppf(0.025, 2 * fired) / 2) / deploys
    holds = lower <= alpha and fired / deploys <= 1.2 * alpha
    return f"{fired} | {fired / deploys:.5f} | {lower:.5f} | {'yes' if holds else '**no**'}"


def healthy_section(deploys: int, quick: bool) -> bool:
    """Healthy deploys at half budget through the start test over its horizon."""
    ok = True
    print("## Healthy deploys: false starts per deploy (stated 0.001)\n")
    print("| evidence | req/s | healthy case | deploys | false starts | per deploy | 95% lower | holds 0.001 |")
    print("|---|---|---|---|---|---|---|---|")
    # Counters count slow requests per step, whatever their size: half budget at 900 ms and at
    # 3,000 ms (the heavy healthy tail a latency-mass reading rolled back on the real stack).
    cases = [("histogram", 40.0, HEALTHY), ("counters", 40.0, Fault(NULL, 6 * LINE_MS))] if quick else [
        ("histogram", 40.0, HEALTHY), ("histogram", 400.0, HEALTHY), ("histogram", 4.0, HEALTHY),
        ("counters", 40.0, HEALTHY), ("counters", 40.0, Fault(NULL, 6 * LINE_MS)), ("counters", 4.0, HEALTHY)]
    for evidence, rate, fault in cases:
        spec = StartSpec.of(TailExcessParams(line=LINE_MS, evidence=evidence))
        fired = false_starts(spec, rate, fault, deploys, STEP, seed=7)
        line = rate_line(fired, deploys, spec.alpha)
        ok &= "**no**" not in line
        print(f"| {evidence} | {rate:g} | {fault.name} | {deploys:,} | {line} |")
    print()
    return ok


HELD = {"first 3 s all held above the line": (1.0, 1.0, 1.0),
        "a drain: 100%, 75%, 50%, 25% of the first 4 s above": (1.0, 0.75, 0.5, 0.25),
        "a slow drain: 100% for 3 s, then 60%, 40%, 20%": (1.0, 1.0, 1.0, 0.6, 0.4, 0.2)}
"""Healthy deploys whose first seconds' requests the model load held (the share above the line per
second from the first request): all at once, and a busy node's backlog draining."""


def settle_section(deploys: int) -> None:
    """Healthy deploys whose first seconds' requests are held above the line by a slow model load:
    how many the start test fires on without a settle, and with the settle as it runs (it ends with
    the first step after the first request's that the load mostly did not hold, at most 5 s)."""
    print("## The settle: healthy deploys whose first seconds' requests are held above the line\n")
    print("| held | deploys | no settle | the settle (at most 5 s) | its median length |")
    print("|---|---|---|---|---|")
    for name, shares in HELD.items():
        rng = np.random.default_rng(11)
        cols = 300
        requests = rng.poisson(40.0, (deploys, cols)).astype(np.float64)
        above = rng.binomial(requests.astype(np.int64), NULL).astype(np.float64)
        for c, share in enumerate(shares):
            above[:, c] = np.maximum(above[:, c], rng.binomial(requests[:, c].astype(np.int64), share))
        latency = requests * 3.0 + above * (900.0 - 3.0)
        steps = Steps(requests, above, latency)
        fired = []
        for settle in (0.0, 5.0):
            params = TailExcessParams(line=LINE_MS, evidence="histogram", start_settle_seconds=settle)
            fired.append(int(np.isfinite(start_first(StartSpec.of(params), steps, STEP)).sum()))
        spec = StartSpec.of(TailExcessParams(line=LINE_MS, evidence="histogram"))
        ends = settle_columns(may_be_held("histogram", LINE_MS, requests - above, requests),
                              spec.first_scored(STEP) - 1)
        print(f"| {name} | {deploys:,} | {fired[0]} | {fired[1]} | {float(np.median(ends)) * STEP:g} s |")
    print()


def live_section(seeds: range) -> bool:
    """The live detector, `detect_many` every second from the deploy on the seeds' arrivals (an old
    version served alone before it, none after: a full rollout), against the replay's crossing
    second. A busy old version serving on beside it holds a crossing until it is shown below the
    new version's share (the bank's shared-slowdown rule): a second or so at 40 req/s."""
    print("## The live detector against the replay (histogram, 40 req/s)\n")
    params = TailExcessParams(line=LINE_MS, evidence="histogram")
    spec = StartSpec.of(params)
    same = True
    rows = []
    for seed in seeds:
        steps = seeded_run(seed, Traffic(40.0), DEFECT, 120.0, LINE_MS, STEP)
        replay = float(start_first(spec, steps, STEP)[0])
        live = _live_first(params, steps)
        rows.append(f"seed {seed}: replay {replay:.0f} s, live {live:.0f} s")
        same &= (math.isnan(replay) and math.isnan(live)) or replay == live
    print("; ".join(rows) + f": {'the same' if same else '**differ**'}\n")
    return same


def _live_first(params: TailExcessParams, steps: Steps) -> float:
    """Seconds from the first request to the live detector's first start-test alarm."""
    t0 = 1_000.0  # the deploy's first request; the old version serves from 0 until then (a full rollout)
    old_t = np.arange(0.0, t0 + steps.requests.shape[1] + 1)
    old_n = np.cumsum(np.where(old_t < t0, 40.0, 0.0))
    old = (Series({"version": "1", "le": "500"}, old_t.tolist(), old_n.tolist()),
           Series({"version": "1"}, old_t.tolist(), old_n.tolist()))
    new_t = t0 + np.arange(0, steps.requests.shape[1] + 1, dtype=np.float64)  # the sample at zero first
    count = np.concatenate([[0.0], np.cumsum(steps.requests[0])])
    bucket = np.concatenate([[0.0], np.cumsum(steps.requests[0] - steps.above[0])])
    det = TailExcessDetector(params)
    for k in range(0, new_t.size):
        now = new_t[k]
        keep = old_t <= now
        series = [Series(old[0].labels, old_t[keep].tolist(), old[0].values[:int(keep.sum())])]
        totals = [Series(old[1].labels, old_t[keep].tolist(), old[1].values[:int(keep.sum())])]
        if k > 0:
            series.append(Series({"version": "2", "le": "500"}, new_t[:k + 1].tolist(), bucket[:k + 1].tolist()))
            totals.append(Series({"version": "2"}, new_t[:k + 1].tolist(), count[:k + 1].tolist()))
        out = det.detect_many(series, now, totals)
        if any(d.fired and d.reason.startswith("start test:") for d in out):
            return now - t0
    return math.nan


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="100 seeds; healthy deploys on one case only")
    parser.add_argument("--seeds", type=int, default=None)
    parser.add_argument("--deploys", type=int, default=20_000)
    args = parser.parse_args()
    seeds = range(args.seeds if args.seeds is not None else (100 if args.quick else 200))
    command = "python bench/bench_start_test.py" + (" --quick" if args.quick else "") + (
        f" --seeds {args.seeds}" if args.seeds is not None else "") + (
        f" --deploys {args.deploys}" if args.deploys != 20_000 else "")
    print(f"# The start test (reproduce: `{command}`)\n")
    t0 = time.process_time()
    ok = delay_section(seeds)
    ok &= healthy_section(args.deploys, args.quick)
    settle_section(2_000)
    ok &= live_section(range(3))
    print(f"({time.process_time() - t0:.0f} CPU-s; every bar met: {'yes' if ok else 'no'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
