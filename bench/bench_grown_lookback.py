"""CPU cost of scoring a grown lookback: `tail_excess` detect_many on N latency counters and their
request counters holding 1440 points at 5 s (2 h, what the poller fetches once the slowest series
of a trigger has grown the window to 7200 s), scored over the least lookback (900 s) and over the
grown one, alternately, each after a warm-up call that derives the traffic cells' thresholds.
CPU seconds (process_time) of one call; a ratio in the same run. Prints a table; not a test.
Run: python bench/bench_grown_lookback.py [--series N] [--repeats R]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(os.environ.get("TAILGUARD_SRC", Path(__file__).resolve().parents[1]))))

from core.query import Series  # noqa: E402
from detectors.tail_excess import TailExcessDetector  # noqa: E402

POINTS = 1440
STEP = 5.0


def counters(rows: int, seed: int = 1) -> tuple[list[Series], list[Series]]:
    """Busy healthy series: ~40 req/s, latency around 100 ms per request (mass far below the line)."""
    rng = np.random.default_rng(seed)
    ts = tuple(1e9 + STEP * np.arange(POINTS))
    latency, requests = [], []
    for i in range(rows):
        labels = {"model": f"m{i}", "version": "1"}
        n = rng.poisson(200, POINTS)
        requests.append(Series(labels, ts, tuple(np.cumsum(n).astype(float))))
        latency.append(Series(labels, ts, tuple(np.cumsum(rng.gamma(np.maximum(n, 1), 1e5)))))
    return latency, requests


def cost(latency: list[Series], requests: list[Series], lookback: float) -> float:
    det = TailExcessDetector({"line": 500})
    now = latency[0].timestamps[-1]
    det.detect_many(latency, now, requests)  # derives the cells' thresholds
    det._lookback = lookback  # what the poller fetched: the window the slowest series grew
    start = time.process_time()
    det.detect_many(latency, now, requests)
    return time.process_time() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--series", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    latency, requests = counters(a.series)
    least, grown = [], []
    for _ in range(a.repeats):
        least.append(cost(latency, requests, 900.0))
        grown.append(cost(latency, requests, 7200.0))
    print(f"python bench/bench_grown_lookback.py --series {a.series} --repeats {a.repeats}")
    print("| scored lookback | detect_many CPU-s (each run) | best |")
    print("|---|---|---|")
    print(f"| 900 s | {' / '.join(f'{x:.3f}' for x in least)} | {min(least):.3f} |")
    print(f"| 7200 s | {' / '.join(f'{x:.3f}' for x in grown)} | {min(grown):.3f} |")
    print(f"ratio of the best: {min(grown) / min(least):.2f}x at {a.series} series x {POINTS} points")


if __name__ == "__main__":
    main()
