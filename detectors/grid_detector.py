"""The shared heads of detectors that decide every series of an answer at once on one time grid:
`GridDetector`, the base of the stateless ones that read one series each (threshold, value_cusum),
and `paired_grid`, the head of those that read each series with its companion (tail_excess,
tail_canary), and `with_statuses` for a batch path that builds Detections without their status.
Each detector keeps only its decision."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from typing import Callable, ClassVar, Sequence

import numpy as np
from numpy.typing import NDArray

from core.detection import Detection, DetectorStatus
from core.query import Series
from detectors import _robust
from detectors._grid import align
from detectors.base import Offload, unpaired


class GridDetector(ABC):
    """A detector that decides from the queried range alone (nothing to prepare, nothing kept
    between cycles), S series at once on one grid: `detect` is `decide` on one series' row,
    `detect_many` on every series aligned. A companion plays no part."""

    kind: ClassVar[str]

    @abstractmethod
    def decide(self, grid: NDArray[np.float64], values: NDArray[np.float64], now: float) -> list[Detection]:
        """One Detection per row of `values` ([S x P] on `grid`, ascending; NaN marks a missing
        point), each with a one-line reason. Pure; never raises for NaN or constant data."""

    async def prepare(self, batch: Sequence[Series], now: float, offload: Offload,
                      companions: Sequence[Series | None] | None = None) -> None:
        """Nothing to prepare: everything comes from the queried range."""
        return None

    def detect(self, series: Series, now: float, companion: Series | None = None) -> Detection:
        """Decide on one series. Never raises for bad data: a series that cannot be read is
        fired=False with the reason (status NO_DATA)."""
        arrays = _robust.series_arrays(series.timestamps, series.values)
        if isinstance(arrays, str):
            return Detection(self.kind, False, arrays, status=DetectorStatus.NO_DATA)
        ts, vs = arrays
        return self.decide(ts, vs[None, :], now)[0]

    def detect_many(self, series: Sequence[Series], now: float,
                    companions: Sequence[Series | None] | None = None) -> list[Detection]:
        """Aligns the series on one grid and decides every row at once, as `detect` would on
        each. Raises on a malformed series (see `align`)."""
        if not series:
            return []
        grid, values = align(series)
        return self.decide(grid, values, now)


@dataclass(frozen=True)
class Paired:
    """Series and their companions on one grid: rows [0, n) of `counters` are the series, rows
    [n, 2n) their companions, in the same order."""

    grid: NDArray[np.float64]
    counters: NDArray[np.float64]
    n: int


def paired_grid(
    detect: Callable[[Series, float, Series | None], Detection],
    series: Sequence[Series],
    now: float,
    companions: Sequence[Series | None] | None,
) -> Paired | list[Detection]:
    """The head of a `detect_many` that judges each series with its companion on one grid: the
    answer itself when there is nothing to align (no series; a companion missing: each series
    decided alone, `unpaired`), else every series and its companion aligned. Raises on a malformed
    series (see `align`)."""
    alone = unpaired(detect, series, now, companions)
    if alone is not None or companions is None:
        return alone or []
    grid, counters = align([*series, *[c for c in companions if c is not None]])
    return Paired(grid, counters, len(series))


def with_statuses(out: list[Detection], status: NDArray[np.int8]) -> list[Detection]:
    """`out` (one Detection per row, built without its status) with each row's `status[row]` on its
    Detection, in place: only the rows not OK are copied (a batch's no-data and stale rows)."""
    for row in np.flatnonzero(status != DetectorStatus.OK).tolist():
        out[row] = replace(out[row], status=DetectorStatus(int(status[row])))
    return out


BLIND_FACTOR = 1.5
"""Counting that needs a lone slow request above this many times the line to count it (its bulk's
noise raised the bar, detectors/_slow_counts.py) cannot see a breach of 1.5x the line: such a row
is `blind_near_line`."""


def with_blindness(out: list[Detection], counts_above: NDArray[np.float64] | None, line: float) -> list[Detection]:
    """`out` with `blind_near_line` set on the rows whose count needed a lone slow request above
    BLIND_FACTOR x `line` at their last step (inf: no step could count), in place."""
    if counts_above is None:
        return out
    with np.errstate(invalid="ignore"):
        blind = np.flatnonzero(counts_above > BLIND_FACTOR * line)
    for row in blind.tolist():
        out[row] = replace(out[row], blind_near_line=True)
    return out
