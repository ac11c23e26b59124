"""The `Forecaster` protocol: what the breach detector asks of a backend (Holt, Prophet), and the
`Curves` it gets back for a series' `History`."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Protocol, Sequence

import numpy as np
from numpy.typing import NDArray

from core.query import Series
from detectors.base import Offload
from detectors.forecast.arrays import History


@dataclass(frozen=True)
class Curves:
    """A forecast on its own time grid; the detector keeps the part inside the horizon."""

    times: NDArray[np.float64]
    point: NDArray[np.float64]
    outer: NDArray[np.float64]  # the interval edge on the breach side
    info: Mapping[str, Any]  # the fit's figures, copied into Detection.details


class Forecaster(Protocol):
    """A forecasting backend. Heavy fits happen only in `prepare`, through `offload`."""

    async def prepare(self, batch: Sequence[Series], now: float, offload: Offload) -> None:
        """Refresh cached fits for this cycle's series; a failure only costs freshness or speed."""

    def curves(self, key: str, history: History, now: float) -> Curves | str:
        """The forecast after ``history`` for the series ``key``, or why there is none."""
