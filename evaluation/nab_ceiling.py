"""How much of a NAB rise crossing its own recent past shows: an optimistic ceiling for any forecast
that reads the level and its trend (issue #24's NAB bars: precision 0.85, and 30% of rise
crossings predicted at least one step ahead).

The rules: fire while the series is within `k` noise units of the line, `(L - y_t) / sigma_t <= k`,
and it rose over each of its last `m` steps; `sigma_t` is the robust spread (MAD) of the one-step
changes over the trailing day. A trend forecaster's probability is a function of exactly these (how
far below the line, how many noise units, how fast rising), so its precision-recall curve cannot
beat the best of them by much. The sweep picks `k` and `m` on the same data it scores (in-sample:
the ceiling is optimistic), scored as `evaluation.forecast_eval` scores NAB.

Run: ``python -m evaluation.nab_ceiling``. docs/forecasting.md quotes its output.
"""
from __future__ import annotations

import sys
import warnings
from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from numpy.typing import NDArray

from evaluation.forecast_eval import StreamResult, evaluate_stream, score, stream_nab
from evaluation.nab_data import load_series

FLOAT = NDArray[np.float64]
RULE = "proximity"
GAPS = tuple(float(k) for k in np.r_[np.linspace(0.005, 0.1, 20), np.linspace(0.12, 2.0, 40),
                                     np.linspace(2.2, 10.0, 30)])
RISES = (0, 1, 2, 3)
TARGETS = (0.5, 0.7, 0.85)
MIN_EPISODES = 5  # a precision from fewer episodes is chance, not a ceiling


def noise_units(y: FLOAT, line: float, window: int) -> FLOAT:
    """(line - y) in units of the robust spread of one-step changes over the trailing `window`
    (MAD, scaled to a normal's sigma; the std where the MAD is 0; NaN before 10 changes)."""
    padded = np.concatenate([np.full(window, np.nan), np.diff(y)])
    rows = sliding_window_view(padded, window)
    with warnings.catch_warnings():  # the first rows hold no change yet: NaN, as stated
        warnings.simplefilter("ignore", RuntimeWarning)
        med = np.nanmedian(rows, axis=1)
        mad = 1.4826 * np.nanmedian(np.abs(rows - med[:, None]), axis=1)
        std = np.nanstd(rows, axis=1)
    sigma = np.where(mad > 0, mad, np.where(std > 0, std, 1e-9))
    sigma[np.sum(np.isfinite(rows), axis=1) < 10] = np.nan
    out: FLOAT = (line - y) / sigma
    return out


def rise_runs(y: FLOAT) -> NDArray[np.intp]:
    """How many steps in a row the series has risen, at each step."""
    up = np.diff(y, prepend=y[0]) > 0
    runs = np.zeros(y.size, dtype=np.intp)
    for i in range(1, y.size):
        runs[i] = runs[i - 1] + 1 if up[i] else 0
    return runs


def with_rule(r: StreamResult, units: FLOAT, runs: NDArray[np.intp], k: float, m: int) -> StreamResult:
    """`r` with the proximity rule at (k, m) as a rule column that fires at margin 0."""
    fire = np.nan_to_num(units, nan=np.inf) <= k
    fire &= runs >= m
    r.rule[RULE] = np.where(fire, r.threshold, -np.inf)
    return r


def sweep(streams: Sequence[tuple[StreamResult, FLOAT, NDArray[np.intp]]]) -> list[str]:
    lines = []
    best: dict[float, tuple[int, int, int, int, float, int]] = {}
    top = 0.0
    for m in RISES:
        for k in GAPS:
            sc = score([with_rule(r, u, runs, k, m) for r, u, runs in streams], RULE, 0.0)
            if sc.episodes >= MIN_EPISODES:
                top = max(top, sc.precision)
            for target in TARGETS:
                if sc.episodes >= MIN_EPISODES and sc.precision >= target and sc.predicted > best.get(target, (0,))[0]:
                    best[target] = (sc.predicted, sc.crossings, sc.hits, sc.episodes, k, m)
    for target in TARGETS:
        if target not in best:
            lines.append(f"| {target:g} | none | | | |")
            continue
        pred, crossings, hits, episodes, k, m = best[target]
        lines.append(f"| {target:g} | {pred}/{crossings} ({pred / crossings:.1%}) | {hits}/{episodes} | {k:.2f} | {m} |")
    return ["| precision at least | rise crossings with a fire before them | precision | k | m |",
            "|---|---|---|---|---|", *lines, "",
            f"Highest precision of any rule with at least {MIN_EPISODES} episodes: {top:.3f}."]


def main(argv: list[str] | None = None) -> int:
    streams = []
    for s in load_series():
        st, setup = stream_nab(s)
        r = evaluate_stream(st, setup, [])
        window = max(int(86400 / st.step), 50)
        streams.append((r, noise_units(st.y, r.threshold, window), rise_runs(st.y)))
    gaps = np.concatenate([u[r.rise_crossings - 1] for r, u, _ in streams if r.rise_crossings.size])
    q = np.nanpercentile(gaps, [10, 25, 50, 75, 90])
    print(f"{sum(r.rise_crossings.size for r, _, _ in streams)} rise crossings in {len(streams)} series; "
          "one step before each, the gap to the line in noise units (10/25/50/75/90%): "
          + ", ".join(f"{v:.2f}" for v in q))
    print()
    print("\n".join(sweep(streams)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
