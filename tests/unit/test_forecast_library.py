"""The committed forecast scenario library: regenerated from its seeds it matches its checksum, and it
holds what the issue asks for (20 seeds per shape, at least 100 healthy series-days, 30 s steps)."""
from __future__ import annotations

from collections import Counter

import numpy as np

from evaluation import forecast_library


def test_the_committed_library_regenerates_from_its_seeds() -> None:
    """A fresh generation has the committed arrays' checksum: the fixture is the code's output."""
    want = (forecast_library.DEFAULT_DIR / "SHA256SUMS").read_text().split()[0]
    assert forecast_library._sha_of_arrays(forecast_library.generate_all()) == want


def test_the_library_covers_the_shapes_and_the_healthy_days() -> None:
    """Every shape has 20 seeds; healthy series make at least 100 series-days; rise series cross."""
    lib = forecast_library.load()
    shapes = Counter(s.shape for s in lib)
    assert set(shapes.values()) == {forecast_library.SEEDS}
    assert {"leak_3", "leak_6", "leak_12", "leak_25", "accelerating", "knee", "step_ramp"} <= set(shapes)
    assert sum(s.days for s in lib if s.kind == "healthy") >= 100
    for s in lib:
        assert np.allclose(np.diff(s.timestamps), 30.0)
        if s.kind == "rise":
            assert s.crossing_time is not None and s.incident_start is not None
            assert s.level[s.timestamps < s.incident_start].max() < forecast_library.LINE_MS
        else:
            assert np.nanmax(s.level) < forecast_library.LINE_MS
