"""The bank's closed-form Page recursion against the plain step-by-step loop it replaces."""
from __future__ import annotations

import numpy as np
import pytest

from detectors.sequential.bank import NONE, count_alarms, first_alarms, run_bank
from detectors.sequential.design import BankDesign

DESIGN = BankDesign.for_budget(0.001)
H = np.array([4.0, 5.0, 6.0, 6.0, 6.0, 5.0])


def _loop(units, requests, h, reset=False):
    """Page's recursion one step at a time: the reference."""
    a, d = np.array(DESIGN.jumps)[:, None], np.array(DESIGN.drains)[:, None]
    rows, cols = units.shape
    stat = np.zeros((len(a), rows))
    start = np.full((len(a), rows), NONE)
    first = np.full(rows, NONE)
    alarms = np.zeros(rows, dtype=int)
    for j in range(cols):
        ok = np.isfinite(units[:, j]) & np.isfinite(requests[:, j])
        stat = np.maximum(0.0, stat + np.where(ok, a * np.nan_to_num(units[:, j]) - d * np.nan_to_num(requests[:, j]), 0))
        start = np.where(stat > 0, np.where(start < 0, j, start), NONE)
        over = (stat >= h[:, None]).any(axis=0)
        first = np.where(over & (first < 0), j, first)
        if reset:
            alarms += over
            stat[:, over], start[:, over] = 0.0, NONE
    return stat, start, first, alarms


def _trace(seed=2, rows=300, cols=400):
    rng = np.random.default_rng(seed)
    units = rng.poisson(0.04, (rows, cols)).astype(float)
    units[rng.random(units.shape) < 0.01] = np.nan
    requests = rng.poisson(40, (rows, cols)).astype(float)
    return units, requests


def test_statistic_run_starts_and_first_alarms_match_the_loop():
    units, requests = _trace()
    stat, start, first, _ = _loop(units, requests, H)
    run = run_bank(DESIGN, units, requests, H)
    assert np.allclose(run.state.statistic, stat)
    assert (run.state.run_start == start).all()
    alarm, member, _ = first_alarms(DESIGN, units, requests, H)
    assert (alarm == first).all()
    assert ((alarm >= 0) == (member >= 0)).all()
    assert (first >= 0).any() and (first < 0).any()  # the trace has both kinds of row


def test_a_run_in_chunks_is_the_run_in_one_piece():
    units, requests = _trace(seed=3)
    whole = run_bank(DESIGN, units, requests, H)
    part = run_bank(DESIGN, units[:, :170], requests[:, :170], H)
    rest = run_bank(DESIGN, units[:, 170:], requests[:, 170:], H, part.state)
    assert np.allclose(rest.state.statistic, whole.state.statistic)
    assert (rest.state.run_start == whole.state.run_start).all()
    assert (rest.episode_start == whole.episode_start).all()
    assert (rest.fired == whole.fired).all()


def test_alarms_restart_the_row_as_the_loop_counts_them():
    units, requests = _trace(seed=4)
    _, _, first, alarms = _loop(units, requests, H, reset=True)
    counts, first_seen, _ = count_alarms(DESIGN, units, requests, H)
    assert (counts == alarms).all()
    assert (first_seen == first).all()
    assert alarms.max() > 1  # restarts were exercised


def test_episode_start_stays_put_while_the_episode_goes_on():
    rng = np.random.default_rng(5)
    units = np.zeros((1, 600))
    units[0, 100:] = rng.poisson(0.2, 500)  # 0.5% of 40 requests per step from column 100
    requests = np.full(units.shape, 40.0)
    starts = {int(run_bank(DESIGN, units[:, :end], requests[:, :end], H).episode_start[0]) for end in range(300, 601, 25)}
    assert len(starts) == 1 and 95 <= starts.pop() <= 110


@pytest.mark.parametrize("thresholds", [H, np.repeat(H[:, None], 300, axis=1)])
def test_thresholds_per_member_or_per_row(thresholds):
    units, requests = _trace()
    assert (run_bank(DESIGN, units, requests, thresholds).fired == run_bank(DESIGN, units, requests, H).fired).all()


def test_no_columns_keeps_the_state():
    units, requests = _trace()
    run = run_bank(DESIGN, units, requests, H)
    again = run_bank(DESIGN, units[:, :0], requests[:, :0], H, run.state)
    assert np.allclose(again.state.statistic, run.state.statistic) and (again.fired == run.fired).all()
