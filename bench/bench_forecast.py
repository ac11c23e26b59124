"""Cost of ForecastBreachDetector: fit and per-cycle CPU for 1, 100, 1,000 series, Holt and Prophet.

Run: ``python bench/bench_forecast.py [--prophet-sample 100]``. CPU seconds are
``time.process_time`` plus the Stan child processes (``RUSAGE_CHILDREN``); memory is ru_maxrss.
"""
from __future__ import annotations

import argparse
import asyncio
import resource
import time
from typing import Any, Callable

import numpy as np

from core.query import Series
from detectors.forecast import ForecastBreachDetector, ProphetForecast, fit_prophet_forecast

STEP = 15.0
T0 = 1_700_000_000.0


def cpu() -> float:
    """This process's CPU seconds plus those of waited-for children (cmdstan runs as one)."""
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + c.ru_utime + c.ru_stime


def maxrss_mib() -> tuple[float, float]:
    self_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    child_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return self_kb / 1024, child_kb / 1024


def make_batch(n: int, seconds: float, seed: int = 0) -> list[Series]:
    """Noisy daily-seasonal latency-like series at a 15 s step."""
    rng = np.random.default_rng(seed)
    ts = T0 + STEP * np.arange(int(seconds / STEP))
    base = 200 + 40 * np.sin(2 * np.pi * ts / 86400)
    return [Series({"pod": f"p{i}"}, ts, base + rng.normal(0, 10, ts.size)) for i in range(n)]


async def inline_offload(fn: Callable[..., Any], *args: Any) -> Any:
    """Runs the job in this process, so its CPU is measured here (a pool would hide it)."""
    return fn(*args)


def make_rates(batch: list[Series], seed: int = 3) -> list[Series]:
    """A request rate beside each series: for half of them the rate that explains its latency
    through a knee (``1 / latency`` falling in a line with the rate), for the rest a rate of its own."""
    rng = np.random.default_rng(seed)
    out = []
    for i, s in enumerate(batch):
        v = np.asarray(s.values)
        rate = (200.0 * (1.0 - 100.0 / v) if i % 2 == 0 else 100.0 * np.exp(rng.normal(0, 0.05, v.size)))
        out.append(Series(s.labels, s.timestamps, rate * np.exp(rng.normal(0, 0.01, v.size))))
    return out


def bench_holt(n: int, rates: bool = False) -> dict[str, float]:
    batch = make_batch(n, 6 * 3600)
    loads = make_rates(batch) if rates else [None] * n
    now = float(batch[0].timestamps[-1])
    det = ForecastBreachDetector({"threshold": 500})
    c0 = cpu()
    for s, r in zip(batch, loads):
        det.detect(s, now, r)
    inline = cpu() - c0
    # A poll cycle hands the detector new Series objects: the cycle reads every history afresh
    # (the detector keeps this cycle's histories by object, so reusing `batch` would skip that).
    cycle = [Series(s.labels, s.timestamps, s.values) for s in batch]
    beside = [None if r is None else Series(r.labels, r.timestamps, r.values) for r in loads]
    c0 = cpu()
    asyncio.run(det.prepare(cycle, now, inline_offload, beside if rates else None))
    prep = cpu() - c0
    c0 = cpu()
    for s, r in zip(cycle, beside):
        det.detect(s, now, r)
    det_cached = cpu() - c0
    return {"detect_inline_s": inline, "prepare_batched_s": prep, "detect_after_prepare_s": det_cached,
            "cycle_batched_s": prep + det_cached}


def bench_prophet_fits(n: int, uncertainty_samples: int) -> dict[str, float]:
    """n cold fits, then n warm-started fits, on 7 days at 15 s (downsampled to 2,000 points)."""
    batch = make_batch(n, 7 * 86400, seed=1)
    cold: list[ProphetForecast] = []
    fit_prophet_forecast(np.asarray(batch[0].timestamps), np.asarray(batch[0].values),
                         ahead_seconds=2700, step_seconds=STEP)  # one-time import and model load
    c0, w0 = cpu(), time.perf_counter()
    for s in batch:
        cold.append(fit_prophet_forecast(np.asarray(s.timestamps), np.asarray(s.values),
                                         ahead_seconds=2700, step_seconds=STEP,
                                         uncertainty_samples=uncertainty_samples))
    c1, w1 = cpu(), time.perf_counter()
    for s, f in zip(batch, cold):
        fit_prophet_forecast(np.asarray(s.timestamps) + 900, np.asarray(s.values),
                             ahead_seconds=2700, step_seconds=STEP, init=f.init,
                             uncertainty_samples=uncertainty_samples)
    c2, w2 = cpu(), time.perf_counter()
    return {"cold_fit_s": (c1 - c0) / n, "warm_fit_s": (c2 - c1) / n,
            "cold_wall_s": (w1 - w0) / n, "warm_wall_s": (w2 - w1) / n}


def bench_prophet_cycle(n: int) -> dict[str, float]:
    """Per-cycle cost once forecasts are cached: prepare (nothing due) + detect for n series."""
    batch = make_batch(n, 7 * 86400, seed=2)
    now = float(batch[0].timestamps[-1])
    one = fit_prophet_forecast(np.asarray(batch[0].timestamps), np.asarray(batch[0].values),
                               ahead_seconds=2700, step_seconds=STEP)

    async def cached(fn: Any, *args: Any) -> Any:
        return one  # every series gets the same real forecast: this measures detect, not fits

    det = ForecastBreachDetector({"model": "prophet", "threshold": 500, "lookback_seconds": "7d",
                                  "max_fits_per_cycle": n})
    asyncio.run(det.prepare(batch, now, cached))
    c0 = cpu()
    asyncio.run(det.prepare(batch, now + 1, cached))  # nothing due: schedule check only
    prep = cpu() - c0
    c0 = cpu()
    fired = sum(det.detect(s, now + 1).fired for s in batch)
    return {"prepare_nothing_due_s": prep, "detect_s": cpu() - c0, "fired": fired}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--prophet-sample", type=int, default=100,
                    help="Prophet fits measured per variant; 100/1,000 series are extrapolated")
    args = ap.parse_args()
    print("## Holt (6h lookback at 15 s = 1,440 points, fit on the last 360)\n")
    print("| series | detect inline (fit per series) | prepare (one batched fit) | "
          "detect after prepare | cycle total, batched |")
    print("|---|---|---|---|---|")
    for n, rates in ((1, False), (100, False), (1000, False), (100, True), (1000, True)):
        r = bench_holt(n, rates)
        name = f"{n}, each with its request rate (the knee)" if rates else f"{n}"
        print(f"| {name} | {r['detect_inline_s']:.3f} s | {r['prepare_batched_s']:.3f} s | "
              f"{r['detect_after_prepare_s']:.3f} s | {r['cycle_batched_s']:.3f} s |")
    print(f"\npeak RSS self/children: {maxrss_mib()[0]:.0f} / {maxrss_mib()[1]:.0f} MiB\n")

    print(f"## Prophet fits (7d at 15 s = 40,320 points -> 2,000 means), "
          f"measured on {args.prophet_sample} series per variant\n")
    fits = {}
    for us in (0, 200):
        fits[us] = bench_prophet_fits(args.prophet_sample, us)
    print("| uncertainty_samples | cold fit CPU (wall) | warm-started fit CPU (wall) | "
          "100 series, warm CPU | 1,000 series, warm CPU |")
    print("|---|---|---|---|---|")
    for us, r in fits.items():
        how = {n: "measured" if n <= args.prophet_sample else "extrapolated" for n in (100, 1000)}
        print(f"| {us} | {r['cold_fit_s']:.3f} s ({r['cold_wall_s']:.3f} s) | "
              f"{r['warm_fit_s']:.3f} s ({r['warm_wall_s']:.3f} s) | "
              f"{100 * r['warm_fit_s']:.0f} s ({how[100]}) | {1000 * r['warm_fit_s']:.0f} s ({how[1000]}) |")
    print("\n## Prophet per-cycle cost with cached forecasts\n")
    print("| series | prepare (nothing due) | detect |")
    print("|---|---|---|")
    for n in (1, 100, 1000):
        r = bench_prophet_cycle(n)
        print(f"| {n} | {r['prepare_nothing_due_s']:.3f} s | {r['detect_s']:.3f} s |")
    # The pool worker is busy for the wall time (it waits on the cmdstan process), so size
    # the schedule by the larger of CPU and wall time per fit.
    fit_s = max(fits[0]["warm_fit_s"], fits[0]["warm_wall_s"])
    print(f"\npeak RSS self/children: {maxrss_mib()[0]:.0f} / {maxrss_mib()[1]:.0f} MiB\n")
    print("## Refit schedule for 1,000 series on one core\n")
    for util in (1.0, 0.5):
        print(f"- at {util:.0%} of a core: refit_interval_seconds >= 1000 * {fit_s:.3f} / {util} "
              f"= {1000 * fit_s / util:.0f} s")
    print(f"- max_fits_per_cycle >= 1000 * poll_interval / refit_interval: with a 15 s poll and a "
          f"900 s interval, >= {1000 * 15 / 900:.0f}")


if __name__ == "__main__":
    main()
