"""collector_paused: no automatic collection inside, the collector's state as it was after."""
from __future__ import annotations

import gc

import pytest

from core.collector import collector_paused


def test_paused_inside_and_enabled_after():
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_an_error_inside_still_restores_the_collector():
    with pytest.raises(RuntimeError), collector_paused():
        raise RuntimeError("boom")
    assert gc.isenabled()


def test_a_collector_disabled_before_stays_disabled():
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
