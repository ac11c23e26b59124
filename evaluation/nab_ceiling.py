"""How much of a NAB rise crossing its own recent past shows: an optimistic ceiling for any forecast
that reads the level and its trend (issue #24's NAB bars: precision 0.85, and 30% of rise
crossings predicted at least one step ahead).

The rules: fire while the series is within `k` noise units of the line, `(L - y_t) / sigma_t <= k`,
and it rose over each of its last `m` steps; `sigma_t` is the robust spread (MAD) of the one-step
changes over the trailing day. A trend forecaster's probability is a function of exactly these (how
far below the line, how many noise units, how fast rising), so its precision-recall curve cannot
beat the best of them by much. The sweep picks `k` and `m` on the same data it scores (in-sample:
the ceiling is optimistic), scored as `evaluation.forecast_eval` scores NAB.

A model that knows the series' calendar (Prophet's daily and weekly seasonality) reads one more
feature: whether the series crossed the line at this time of day yesterday, or of the week a week
ago, within the horizon ahead. The sweep also requires that (`calendar`: none, day, week, either),
with no proximity bound among the choices, so a seasonal forecast's ceiling is measured too.

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
GAPS_ANY = (*GAPS, float("inf"))
RISES = (0, 1, 2, 3)
CALENDARS = ("none", "day", "week", "either")
DAY, WEEK = 86400.0, 7 * 86400.0
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


def crossed_a_period_ago(y: FLOAT, line: float, period_points: int, horizon: int) -> NDArray[np.bool_]:
    """At each step t, whether the series was at or over the line at some step of
    (t - period, t - period + horizon]: what a seasonal-naive forecast of the horizon ahead sees.
    False where that span is not all in the past or before the series began."""
    over = y >= line
    seen = np.zeros(y.size, dtype=bool)
    if period_points < horizon:
        return seen
    for j in range(1, horizon + 1):
        lag = period_points - j
        if 0 < lag < y.size:
            seen[lag:] |= over[: y.size - lag]
    return seen


Calendar = dict[str, NDArray[np.bool_]]


def calendar_for(y: FLOAT, line: float, step: float, horizon: int) -> Calendar:
    """Each calendar choice of the sweep as a mask of steps; "none" allows every step."""
    day = crossed_a_period_ago(y, line, int(round(DAY / step)), horizon)
    week = crossed_a_period_ago(y, line, int(round(WEEK / step)), horizon)
    return {"none": np.ones(y.size, dtype=bool), "day": day, "week": week, "either": day | week}


def with_rule(r: StreamResult, units: FLOAT, runs: NDArray[np.intp], k: float, m: int,
              seen: NDArray[np.bool_]) -> StreamResult:
    """`r` with the proximity rule at (k, m), where the calendar's `seen` allows it, as a rule
    column that fires at margin 0."""
    fire = (np.nan_to_num(units, nan=np.inf) <= k) & (runs >= m) & seen
    r.rule[RULE] = np.where(fire, r.threshold, -np.inf)
    return r


Stream = tuple[StreamResult, FLOAT, NDArray[np.intp], Calendar]


def sweep(streams: Sequence[Stream], calendars: Sequence[str] = ("none",), gaps: Sequence[float] = GAPS
          ) -> list[str]:
    """The best rule at each precision target over (calendar, m, k), as markdown lines."""
    lines = []
    best: dict[float, tuple[int, int, int, int, float, int, str]] = {}
    top = 0.0
    for cal in calendars:
        for m in RISES:
            for k in gaps:
                if cal == "none" and not np.isfinite(k):
                    continue  # firing at every step: one episode per crossing, each a "hit"
                sc = score([with_rule(r, u, runs, k, m, c[cal]) for r, u, runs, c in streams], RULE, 0.0)
                if sc.episodes >= MIN_EPISODES:
                    top = max(top, sc.precision)
                for target in TARGETS:
                    if (sc.episodes >= MIN_EPISODES and sc.precision >= target
                            and sc.predicted > best.get(target, (0,))[0]):
                        best[target] = (sc.predicted, sc.crossings, sc.hits, sc.episodes, k, m, cal)
    for target in TARGETS:
        if target not in best:
            lines.append(f"| {target:g} | none | | | | |")
            continue
        pred, crossings, hits, episodes, k, m, cal = best[target]
        lines.append(f"| {target:g} | {pred}/{crossings} ({pred / crossings:.1%}) | {hits}/{episodes} "
                     f"| {k:.2f} | {m} | {cal} |")
    return ["| precision at least | rise crossings with a fire before them | precision | k | m | calendar |",
            "|---|---|---|---|---|---|", *lines, "",
            f"Highest precision of any rule with at least {MIN_EPISODES} episodes: {top:.3f}."]


def main(argv: list[str] | None = None) -> int:
    streams: list[Stream] = []
    for s in load_series():
        st, setup = stream_nab(s)
        r = evaluate_stream(st, setup, [])
        window = max(int(86400 / st.step), 50)
        streams.append((r, noise_units(st.y, r.threshold, window), rise_runs(st.y),
                        calendar_for(st.y, r.threshold, st.step, r.horizon)))
    gaps = np.concatenate([u[r.rise_crossings - 1] for r, u, _, _ in streams if r.rise_crossings.size])
    q = np.nanpercentile(gaps, [10, 25, 50, 75, 90])
    print(f"{sum(r.rise_crossings.size for r, _, _, _ in streams)} rise crossings in {len(streams)} series; "
          "one step before each, the gap to the line in noise units (10/25/50/75/90%): "
          + ", ".join(f"{v:.2f}" for v in q))
    for cal, when in (("day", "a day"), ("week", "a week"), ("either", "a day or a week")):
        seen = sum(int(c[cal][r.rise_crossings - 1].sum()) for r, _, _, c in streams if r.rise_crossings.size)
        print(f"rise crossings whose series crossed within the horizon {when} before: {seen}")
    print("\nLevel and trend:\n")
    print("\n".join(sweep(streams)))
    print("\nLevel, trend and the calendar:\n")
    print("\n".join(sweep(streams, CALENDARS, GAPS_ANY)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
