"""The cyclic garbage collector paused while a batch builds many objects that hold no cycles."""
from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause automatic collections inside the block, restoring the collector's state after it.

    Building 10,000 Detections triggers dozens of young collections, each walking everything built
    so far, and the full collections among them the whole cycle's live heap; with the collector
    paused the next collection after the block walks them once. Only for blocks that build objects
    and end: nothing is collected inside."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()
