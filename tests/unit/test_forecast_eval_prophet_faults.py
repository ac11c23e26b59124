"""A Prophet fit that fails in the evaluation keeps the previous curve, as the detector does, and
is reported on stderr with the series and the error, not swallowed."""
from __future__ import annotations

import numpy as np
import pytest

import evaluation.forecast_eval as fe
from evaluation.nab_data import load_series


def test_failed_prophet_fits_are_reported_and_leave_no_probability(monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    def failing_fit(*args: object, **kwargs: object) -> None:
        raise RuntimeError("cmdstan exited with 70")

    monkeypatch.setattr(fe, "prophet_curve", failing_fit)
    st, setup = fe.stream_nab(load_series()[0])
    r = fe.evaluate_stream(st, setup, ["prophet"])
    err = capsys.readouterr().err
    assert f"fits failed on {st.name}" in err and "RuntimeError: cmdstan exited with 70" in err
    assert np.isnan(r.probability["prophet"]).all()  # no curve ever: no probability, no fire
