"""The evaluation's bars on a run without the predict_linear columns: a statement, not a crash
(a `--models holt` run over NAB failed in bars() after five minutes of work)."""
from __future__ import annotations

import numpy as np

from evaluation.forecast_eval import DEFAULT_MODEL, StreamResult, bars


def _nab_series() -> StreamResult:
    n = 200
    rise = np.r_[np.zeros(n - 20), np.linspace(0.1, 0.99, 20)]
    return StreamResult(name="s", dataset="nab", shape="nab", kind="rise", step=300.0, threshold=1.0,
                        decide=np.ones(n, dtype=bool), outcome=np.r_[np.zeros(n - 6, bool), np.ones(6, bool)],
                        horizon=3, rise_crossings=np.array([n - 1]), all_crossings=1, incident=None, crossing=None,
                        probability={DEFAULT_MODEL: rise}, median_step={DEFAULT_MODEL: np.full(n, 2.0)})


def test_nab_bars_without_predict_linear_say_it_was_not_run() -> None:
    lines = bars([_nab_series()])
    compared = [line for line in lines if "NAB at precision" in line]
    assert len(compared) == 3 and all("predict_linear not run" in line for line in compared)
    assert any("NAB at the default" in line for line in lines)  # the bars that need no rule still print
