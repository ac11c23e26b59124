"""The `Forecaster` protocol: what the breach detector asks of a backend (Holt, Prophet). A backend
returns the outlook read from a predictive distribution (`PathForecast`: its point path and the
series' own past error paths), never a bare curve: the probability of crossing, its time, the band."""
from __future__ import annotations

from typing import Protocol, Sequence

from core.query import Series
from detectors.base import Offload
from detectors.forecast.arrays import History
from detectors.forecast.outlook import Outlook


class Forecaster(Protocol):
    """A forecasting backend. Heavy fits happen only in `prepare`, through `offload`."""

    async def prepare(self, batch: Sequence[Series], now: float, offload: Offload,
                      loads: Sequence[Series | None] | None = None) -> None:
        """Refresh cached fits for this cycle's series; a failure only costs freshness or speed.
        `loads[i]` is the request rate beside `batch[i]` (None: none), for a backend that reads it."""

    def forecast(self, key: str, history: History, now: float, load: History | None = None) -> Outlook | str:
        """The outlook of the series' level from the end of ``history`` to ``now`` plus the
        horizon (its distribution calibrated on its own recent errors), or why there is none.
        `load` is the request rate beside the series, for a backend that reads it (Holt's knee)."""
