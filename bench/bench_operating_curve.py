"""The operating curve of tail detection at one stated false-alarm rate: tailguard's bank (on a
histogram and on latency counters) against the limit (Page's CUSUM with the true rates), the
naive poller tuned to the same rate and the summary-quantile alert rule (with and without the
evidence gate), through the project's own decision core (detectors/sequential).

    python bench/bench_operating_curve.py            # the full run: 3,000 version-days, 200 seeds
    python bench/bench_operating_curve.py --quick    # a smoke run: 300 version-days, 40 seeds
    python bench/bench_operating_curve.py --traffic 40,diurnal   # some traffic levels only
    python bench/bench_operating_curve.py --skip-replay --skip-baselines --days 100 --seeds 20 --traffic 40
                                                     # tailguard and the limit only, a few CPU-minutes

Definitions (docs/detectors.md): the budget of P99.9 < 500 ms is 0.1% of requests above 500 ms,
half budget 0.05%; the stated rate is one false alarm per version per 30 days at half budget;
a rate holds when its Poisson 95% lower bound is at most the stated rate and the estimate at most
1.2x it. Delays are seconds from the onset, censored at the horizon (15 min; 2 h at 4 req/s).

Counters are read as the live detector reads them at 1 s steps (Triton's /metrics): slow requests
counted per step (detectors/_slow_counts.py), so their healthy cases include tails far heavier
than the line (0.05% at 3,000 ms) and a heavy sub-line tail (2% at 300 ms, none above the line).
Beside them, on each defect: the limit on counters' steps (the best any test on 1 s counters can
do) and the bank on held steps (the counters' bank fed whether each step truly holds a slow
request), which split the counters' gap to the limit into the evidence, the bank and the counting.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from detectors.sequential.bank import count_alarms  # noqa: E402
from detectors.sequential.design import BankDesign  # noqa: E402
from detectors.sequential.thresholds import Promise  # noqa: E402
from detectors.tail_excess import TailExcessParams  # noqa: E402
from evaluation.operating_curve.arrivals import Fault, seeded_run  # noqa: E402
from evaluation.operating_curve.counted import CountedTailguard  # noqa: E402
from evaluation.operating_curve.deciders import Alert, Decider, Limit, Naive, Tailguard  # noqa: E402
from evaluation.operating_curve.runs import Rate, delays, detected, false_alarms, median_delay, tune_naive  # noqa: E402
from evaluation.operating_curve.step_limit import HeldStepsBank, StepLimit  # noqa: E402
from evaluation.operating_curve.traffic import Traffic  # noqa: E402

LINE_MS = 500.0
BUDGET = 0.001
NULL = BUDGET / 2
STEP = 1.0
DEFECTS = (Fault(0.005, 900), Fault(0.002, 600), Fault(0.003, 600), Fault(0.01, 600), Fault(0.1, 600))
HEALTHY = (Fault(0.0005, 900), Fault(0.0005, 600), Fault(0.0005, 501), Fault(0.0005, 1500), Fault(0.0005, 3000),
           Fault(0.02, 300))
TRAFFIC = (Traffic(4.0), Traffic(40.0), Traffic(400.0), Traffic(40.0, swing=0.6))
GATE = (NULL, 2 * BUDGET, 0.01)


def horizon(traffic: Traffic) -> float:
    return 7200.0 if traffic.mean < 10 else 900.0


def lookback(traffic: Traffic) -> float:
    """What the live detector's lookback grows to at this traffic (docs/detectors.md)."""
    return 7200.0 if traffic.mean < 10 else 900.0


def replay_section(seeds: range) -> None:
    """The reference replay's figures through this project's core: the previous single CUSUM
    (null 0.1%, ratio 10, a 900 ms request worth 1.79 requests, thresholds fixed) and the naive
    poller on the rig's seeded arrivals, 40 req/s, 1 s steps."""
    print("## The previous detector on the rig's arrivals (the reference replay's figures)\n")
    legacy = BankDesign(0.001, (10.0,))
    traffic = Traffic(40.0)
    exact = (0.0, 0.0)  # the replay lands a slow request exactly its latency after it was sent
    defect = [seeded_run(s, traffic, Fault(0.005, 900), 300, LINE_MS, own_ms=exact) for s in seeds]
    noise = [seeded_run(s, traffic, Fault(0.0005, 900), 600, LINE_MS, own_ms=exact) for s in seeds]
    print("| detector | median delay (s), 0.5% at 900 ms | false share per 600 s | per version-day |")
    print("|---|---|---|---|")
    for h in (13.0, 20.0):
        def first(steps, units=1.79):
            _, f, _ = count_alarms(legacy, steps.above * units, steps.requests, np.array([h]))
            return (f[0] + 1.0) if f[0] >= 0 else math.nan
        d = [first(s) for s in defect]
        d = [300.0 if math.isnan(x) else x for x in d]
        f = np.mean([not math.isnan(first(s)) for s in noise])
        day = _legacy_day_share(legacy, h)
        print(f"| previous CUSUM h={h:g} | {np.median(d):.1f} | {f:.3f} | {day:.2f} |")
    for n in (5, 9):
        naive = Naive(n)
        d = [r if not math.isnan(r) else 300.0 for r in delays([naive], traffic, Fault(0.005, 900), seeds, 300,
                                                               LINE_MS)[naive.name]]
        f = np.mean(~np.isnan(delays([naive], traffic, Fault(0.0005, 900), seeds, 600, LINE_MS)[naive.name]))
        print(f"| naive poller N={n} | {np.median(d):.1f} | {f:.3f} | |")
    moderate = [seeded_run(s + 1000, traffic, Fault(0.002, 600), 600, LINE_MS, own_ms=exact) for s in seeds]
    units = (600 - 3) / 497
    hits = []
    for s in moderate:
        _, f, _ = count_alarms(legacy, s.above * units, s.requests, np.array([13.0]))
        hits.append(f[0] >= 0)
    print(f"\n0.2% at 600 ms, previous CUSUM h=13: detected within 600 s in {np.mean(hits):.0%} of seeds\n")


def _legacy_day_share(design: BankDesign, h: float, days: int = 100) -> float:
    """Share of simulated version-days at 0.05% x 1.79 units (the replay's noise) with an alarm."""
    rng = np.random.default_rng(1)
    fired = np.zeros(days, dtype=bool)
    state = None
    for _ in range(0, 86_400, 3_600):
        units = rng.poisson(40 * 0.0005, (days, 3_600)) * 1.79
        _, first, state = count_alarms(design, units.astype(float), np.full(units.shape, 40.0), np.array([h]), state)
        fired |= first >= 0
    return float(fired.mean())


def traffic_levels(spec: str | None) -> tuple[Traffic, ...]:
    """The levels `--traffic` names ("4,40,400,diurnal"; all when None), in the benchmark's order."""
    if spec is None:
        return TRAFFIC
    names = {t.name.split()[0] if t.swing == 0 else "diurnal": t for t in TRAFFIC}
    wanted = [w.strip() for w in spec.split(",") if w.strip()]
    unknown = [w for w in wanted if w not in names]
    if unknown or not wanted:
        raise SystemExit(f"--traffic: unknown level(s) {', '.join(unknown) or '(none given)'}; "
                         f"choose from {', '.join(names)}")
    return tuple(t for name, t in names.items() if name in wanted)


def curve_section(days: int, seeds: range, rate_days: float, levels: tuple[Traffic, ...] = TRAFFIC,
                  baselines: bool = True) -> bool:
    stated = 1.0 / rate_days
    promise = Promise(rate_days, STEP)
    ok = True
    print(f"## Operating curve at one false alarm per {rate_days:g} version-days at half budget\n")
    print(f"{days:,} simulated version-days per traffic level and healthy case; {len(seeds)} seeds per defect; "
          f"{STEP:g} s steps; line {LINE_MS:g} ms\n")
    for traffic in levels:
        t0 = time.process_time()
        tg: list[Decider] = [Tailguard.of(TailExcessParams(line=LINE_MS, evidence="histogram"), STEP, lookback(traffic)),
                             CountedTailguard.counting(TailExcessParams(line=LINE_MS), STEP, lookback(traffic))]
        # The counters' bank on whether each step truly holds one: what the bank costs on held steps,
        # apart from what the counting costs.
        held_bank = HeldStepsBank(tg[1].design, tg[1].promise, LINE_MS, "counts", lookback(traffic))
        if baselines:
            n_slow = tune_naive(traffic, Fault(NULL, 900), days, LINE_MS, stated)
            others: list[Decider] = [Naive(n_slow), Alert(), Alert(gate=GATE, gate_lookback_seconds=lookback(traffic))]
            print(f"### {traffic.name} (naive poller tuned to N = {n_slow} requests above the line in 60 s)\n")
        else:
            others = []
            print(f"### {traffic.name} (baselines left out)\n")
        print("| healthy case | decider | false alarms | per version-day | 95% lower | holds 1/" f"{rate_days:g} |")
        print("|---|---|---|---|---|---|")
        for k, fault in enumerate(HEALTHY):
            limit = Limit(NULL, 2 * BUDGET, promise, traffic.mean * STEP)
            # The cases differ only in the slow requests' latency: every decider but the one on
            # latency mass sees the same counts (same seed), so they are run on the first case only.
            deciders: list[Decider] = [*tg, limit, *others] if k == 0 else [tg[1]]
            rates = false_alarms(deciders, traffic, fault, days, LINE_MS, STEP)
            for d in deciders:
                r: Rate = rates[d.name]
                held = r.holds(stated)
                # The promise: at half budget whatever the slow requests' latency, on a histogram
                # and on counters counted per step (sub-line slow requests included).
                promised = d.name.startswith("tailguard")
                if promised and not held:
                    ok = False
                mark = ("yes" if held else "**no**") if promised else ("yes" if held else "no")
                print(f"| {fault.name} | {d.name} | {r.alarms} | {r.per_day:.4f} | {r.lower:.4f} | {mark} |")
        print()
        print("| defect | decider | median delay (s) | detected within " f"{horizon(traffic):g} s | vs limit |")
        print("|---|---|---|---|---|")
        for fault in DEFECTS:
            limit = Limit(NULL, fault.share, promise, traffic.mean * STEP)
            # What 1 s counters can show at best (whether a step holds one): the physics of the
            # counters row, beside the exact-count limit.
            steps_limit = StepLimit(NULL, fault.share, promise, traffic.mean * STEP)
            deciders = [*tg, limit, steps_limit, held_bank, *others]
            found = delays(deciders, traffic, fault, seeds, horizon(traffic), LINE_MS, STEP)
            lim = median_delay(found["limit"])
            on_steps = median_delay(found[steps_limit.name])
            for d in deciders:
                med = median_delay(found[d.name])
                ratio = med / lim if math.isfinite(med) and math.isfinite(lim) and lim > 0 else math.nan
                cell = "" if d.name == "limit" or math.isnan(ratio) else f"{ratio:.2f}x"
                on_held = d.name in ("tailguard (counters)", held_bank.name)
                if on_held and math.isfinite(med) and math.isfinite(on_steps) and on_steps > 0:
                    cell += f" ({med / on_steps:.2f}x the limit on steps)"
                print(f"| {fault.name} | {d.name} | {med:.0f} | {detected(found[d.name]):.0%} | {cell} |")
            ok &= _checks(traffic, fault, found, lim, others[0].name if others else None)
        print(f"\n({time.process_time() - t0:.0f} CPU-s)\n")
    return ok


def _checks(traffic: Traffic, fault: Fault, found: dict[str, np.ndarray], lim: float, naive: str | None) -> bool:
    """The issues' bars for this case, printed where one fails."""
    ok = _counter_checks(traffic, fault, found, lim)
    slack = 1.3 if traffic.mean < 10 else 1.1
    for name in ("tailguard (histogram)",):
        med = median_delay(found[name])
        if fault.share in (0.005, 0.002, 0.01, 0.1) and not med <= slack * lim + STEP:
            print(f"  FAIL {traffic.name}, {fault.name}: {name} median {med:.0f} s > {slack}x limit {lim:.0f} s + 1 step")
            ok = False
        if fault.share == 0.002 and traffic.mean >= 10:
            both = ~np.isnan(found["limit"])
            share = np.mean(~np.isnan(found[name][both])) if both.any() else 1.0
            if share < 0.9:
                print(f"  FAIL {traffic.name}, {fault.name}: {name} detects {share:.0%} of the seeds the limit detects")
                ok = False
        if naive is None:
            continue
        nv = median_delay(found[naive])
        either = detected(found[name]) >= 0.5 or detected(found[naive]) >= 0.5
        if either and not med <= nv + STEP:
            print(f"  FAIL {traffic.name}, {fault.name}: {name} median {med:.0f} s slower than the naive poller's {nv:.0f} s")
            ok = False
    return ok


def _counter_checks(traffic: Traffic, fault: Fault, found: dict[str, np.ndarray], lim: float) -> bool:
    """Counters at 1 s steps (issue 41): every defect's median within 1.15x the limit (+ 1 step, as the
    histogram's bar) at 4 and 40 req/s (400 req/s, where slow requests share steps, is measured, not barred); 0.2% at 600 ms
    found within 15 minutes in at least 80% of seeds at 40 req/s."""
    name, ok = "tailguard (counters)", True
    if STEP != 1.0:  # the bars are for Triton's /metrics read every second
        return ok
    med = median_delay(found[name])
    if traffic.swing == 0 and traffic.mean <= 40 and not med <= 1.15 * lim + STEP:
        print(f"  FAIL {traffic.name}, {fault.name}: {name} median {med:.0f} s > 1.15x limit {lim:.0f} s + 1 step")
        ok = False
    if traffic.swing == 0 and traffic.mean == 40 and fault == Fault(0.002, 600):
        within = float(np.mean(found[name] <= 900.0))  # NaN (not found) compares False
        if within < 0.8:
            print(f"  FAIL {traffic.name}, {fault.name}: {name} finds {within:.0%} within 900 s (bar 80%)")
            ok = False
    return ok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="300 version-days and 40 seeds: a smoke run")
    ap.add_argument("--days", type=int, help="version-days per traffic level and healthy case (default 3,000)")
    ap.add_argument("--seeds", type=int, help="seeds per defect (default 200)")
    ap.add_argument("--rate-days", type=float, default=30.0, help="one false alarm per this many version-days")
    ap.add_argument("--skip-replay", action="store_true", help="leave out the reference-replay section")
    ap.add_argument("--skip-baselines", action="store_true",
                    help="leave out the naive poller (and its tuning) and the alert rules")
    ap.add_argument("--step", type=float, default=1.0,
                    help="seconds per step (5: Prometheus' scrape, at 4 and 40 req/s: 400 req/s at 5 s steps is too long "
                         "to count; with --skip-baselines, which are modelled at 1 s)")
    ap.add_argument("--traffic", help="traffic levels to run, comma-separated from 4, 40, 400, diurnal (default: all)")
    args = ap.parse_args()
    days = args.days or (300 if args.quick else 3000)
    seeds = range(1, (args.seeds or (40 if args.quick else 200)) + 1)
    levels = traffic_levels(args.traffic)
    if args.step != 1.0 and not args.skip_baselines:
        raise SystemExit("--step other than 1 needs --skip-baselines (the naive poller and the alert rules are modelled "
                         "at 1 s steps)")
    global STEP
    STEP = args.step
    cmd = " ".join(["python bench/bench_operating_curve.py", *sys.argv[1:]])  # what reproduces this run
    print(f"# Operating curve (`{cmd}`)\n")
    if not args.skip_replay:
        replay_section(range(1, 201))
    ok = curve_section(days, seeds, args.rate_days, levels, baselines=not args.skip_baselines)
    print("every bar met" if ok else "some bars not met (FAIL lines above)")


if __name__ == "__main__":
    main()
