"""Traffic shapes: requests per second over time, constant or diurnal."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

DAY = 86_400.0


@dataclass(frozen=True)
class Traffic:
    """`mean` req/s, swinging by +/- `swing` of it over a day (0: constant)."""

    mean: float
    swing: float = 0.0

    @property
    def name(self) -> str:
        return f"{self.mean:g} req/s" if self.swing == 0 else f"diurnal {self.mean:g} req/s +/-{self.swing:.0%}"

    def rate(self, t: NDArray[np.float64], phase: NDArray[np.float64] | float = 0.0) -> NDArray[np.float64]:
        """Requests per second at times `t` (seconds) of a day that starts at `phase` (seconds)."""
        if self.swing == 0:
            return np.full(np.broadcast(np.asarray(t), np.asarray(phase)).shape, self.mean)
        return self.mean * (1.0 + self.swing * np.sin(2 * math.pi * (np.asarray(t) + phase) / DAY))

    def send_times(self, duration: float, phase: float = 0.0) -> NDArray[np.float64]:
        """When an open-loop client sends each request over `duration` seconds: evenly spaced at
        the rate (the lab's and the rig's load generators send on a fixed schedule)."""
        if self.swing == 0:
            return np.arange(int(duration * self.mean)) / self.mean
        grid = np.arange(0.0, duration + 1.0, 1.0)
        sent = np.concatenate([[0.0], np.cumsum(self.rate(grid[:-1], phase))])
        return np.interp(np.arange(int(sent[-1])), sent, grid)
