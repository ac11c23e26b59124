"""`Scratch`: work arrays reused by the chunks of one Holt cycle. A fresh multi-megabyte temporary
is new memory from the kernel every time (its page faults cost about a quarter of a cycle's CPU,
measured at 1,000 series); the chunks of a cycle have a few shapes, so one buffer each does."""
from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray


class Scratch:
    """Named flat buffers, grown as needed. A view is valid until the next request for its name
    (one chunk's arrays use distinct names); what is handed out is uninitialised."""

    def __init__(self) -> None:
        self._buffers: dict[str, NDArray[Any]] = {}

    def _view(self, name: str, shape: tuple[int, ...], dtype: type[np.generic]) -> NDArray[Any]:
        size = int(np.prod(shape))
        buffer = self._buffers.get(name)
        if buffer is None or buffer.size < size or buffer.dtype != dtype:
            buffer = np.empty(size, dtype=dtype)
            self._buffers[name] = buffer
        return buffer[:size].reshape(shape)

    def floats(self, name: str, shape: tuple[int, ...]) -> NDArray[np.float64]:
        return self._view(name, shape, np.float64)

    def flags(self, name: str, shape: tuple[int, ...]) -> NDArray[np.bool_]:
        return self._view(name, shape, np.bool_)
