"""The evaluation's bars on a run without the predict_linear columns: a statement, not a crash
(a `--models holt` run over NAB failed in bars() after five minutes of work); and the precision
at an episode's first fire, which a rule firing at every step cannot game."""
from __future__ import annotations

import numpy as np

from evaluation.forecast_eval import DEFAULT_MODEL, StreamResult, bars, score


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


def test_a_rule_firing_at_every_step_is_precise_by_episodes_but_not_at_its_first_fire() -> None:
    n, h = 200, 3
    crossings = [60, 130, 199]  # the level reaches the line at these steps only
    outcome = np.zeros(n, dtype=bool)
    for c in crossings:
        outcome[c - h:c] = True
    decide = ~np.isin(np.arange(n), crossings)  # decisions only under the line
    r = StreamResult(name="s", dataset="nab", shape="nab", kind="rise", step=300.0, threshold=1.0,
                     decide=decide, outcome=outcome, horizon=h, rise_crossings=np.array(crossings),
                     all_crossings=len(crossings), incident=None, crossing=None,
                     rule={"always": np.full(n, 2.0)})
    sc = score([r], "always", 0.0)
    assert sc.episodes == 1  # one step between fires is within the horizon: one long episode
    assert sc.precision == 1.0 and sc.first_fire_precision == 0.0
