"""ForecastBreachDetector: lead time on ramps, silence on noise, bad data, staggered Prophet refits."""
from __future__ import annotations

import asyncio
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Callable

import numpy as np
import pytest
from pydantic import ValidationError

from core.query import Series
from detectors.forecast import (
    ForecastBreachDetector,
    ForecastBreachParams,
    first_crossing,
    fit_prophet_forecast,
    next_refit_time,
    refit_due,
    refit_phase_seconds,
)

T0 = 1_700_000_000.0
STEP = 15.0
LABELS = {"model": "resnet", "pod": "a"}


def ramp_series(seed: int, ramp: bool = True, slope_per_min: float = 10.0,
                direction: str = "above") -> tuple[np.ndarray, np.ndarray, float]:
    """6h of noisy flat 200 ms at 15 s, then (optionally) a ramp crossing 500 ms at a known time."""
    rng = np.random.default_rng(seed)
    n_flat, n_ramp = 6 * 240, 45 * 4
    ts = T0 + STEP * np.arange(n_flat + n_ramp)
    vs = 200.0 + rng.normal(0, 15, ts.size)
    start = ts[n_flat]
    if ramp:
        vs[n_flat:] += slope_per_min * (ts[n_flat:] - start) / 60.0
    if direction == "below":
        vs = 1000.0 - vs  # flat 800, falling through 500
    return ts, vs, start + 300.0 / slope_per_min * 60.0


def stream(det: ForecastBreachDetector, ts: np.ndarray, vs: np.ndarray, first: int,
           labels: dict[str, str] = LABELS) -> list[tuple[float, Any]]:
    """Run detect every cycle with only data up to `now` (no look-ahead)."""
    out = []
    for i in range(first, ts.size):
        lo = np.searchsorted(ts, ts[i] - det.lookback_seconds)
        out.append((ts[i], det.detect(Series(labels, ts[lo : i + 1], vs[lo : i + 1]), ts[i])))
    return out


@pytest.mark.parametrize("bound", ["point", "upper"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_holt_fires_at_least_five_minutes_before_the_breach(seed: int, bound: str) -> None:
    """Holt sees a 10 ms/min ramp to 500 ms at least 5 minutes ahead, with a stable episode key."""
    ts, vs, breach = ramp_series(seed)
    det = ForecastBreachDetector({"threshold": 500, "bound": bound})
    fired = [(t, d) for t, d in stream(det, ts, vs, 6 * 240 - 20) if d.fired]
    assert fired, "never fired"
    first_t, first = fired[0]
    assert breach - first_t >= 300
    assert first.details["lead_time_seconds"] > 0
    assert first.details["predicted_breach_time"] <= first_t + 900
    assert {d.episode_start for t, d in fired if t < breach} == {first_t}


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("bound", ["point", "upper"])
def test_holt_silent_on_stationary_noise(seed: int, bound: str) -> None:
    """The same noisy flat series without a ramp never fires."""
    ts, vs, _ = ramp_series(seed, ramp=False)
    det = ForecastBreachDetector({"threshold": 500, "bound": bound})
    assert not any(d.fired for _, d in stream(det, ts, vs, 6 * 240 - 20))


def test_direction_below() -> None:
    """A falling series is caught before it drops under a `below` threshold."""
    ts, vs, breach = ramp_series(0, direction="below")
    det = ForecastBreachDetector({"threshold": 500, "direction": "below"})
    fired = [t for t, d in stream(det, ts, vs, 6 * 240 - 20) if d.fired]
    assert fired and breach - fired[0] >= 300


def test_already_breaching_is_left_to_the_tail_detector() -> None:
    """A current value over the threshold does not fire, and says why."""
    ts, vs, _ = ramp_series(0)
    vs = vs.copy()
    vs[-1] = 900.0
    d = ForecastBreachDetector({"threshold": 500}).detect(Series(LABELS, ts, vs), ts[-1])
    assert not d.fired and "already breaching" in d.reason


def test_irregular_timestamps_are_resampled() -> None:
    """Jittered sampling (Prometheus scrape skew) still yields an early signal."""
    ts, vs, breach = ramp_series(3)
    ts = ts + np.random.default_rng(3).uniform(-4, 4, ts.size)
    det = ForecastBreachDetector({"threshold": 500, "step_seconds": 15})
    fired = [t for t, d in stream(det, ts, vs, 6 * 240 - 20) if d.fired]
    assert fired and breach - fired[0] >= 300


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda ts, vs: (ts[-30:], vs[-30:]), "too little history"),
        (lambda ts, vs: (ts, np.full_like(vs, np.nan)), "too little history"),
        (lambda ts, vs: (ts, np.full_like(vs, 200.0)), "constant series"),
        (lambda ts, vs: (ts[:-100], vs[:-100]), "stale data"),
        (lambda ts, vs: (np.delete(ts, slice(-70, -40)), np.delete(vs, slice(-70, -40))), "gap"),
        (lambda ts, vs: (ts, vs[:-1]), "forecast failed"),
        (lambda ts, vs: (ts, np.where(np.arange(vs.size) % 7 == 0, np.inf, vs)), "stays below"),
    ],
)
def test_bad_data_gives_a_reason_not_an_exception(
    make: Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]], reason: str
) -> None:
    """Short, NaN, constant, stale, gapped, malformed or inf-ridden data: fired=False with a reason."""
    ts, vs, _ = ramp_series(0, ramp=False)
    now = ts[-1]
    t2, v2 = make(ts, vs)
    d = ForecastBreachDetector({"threshold": 500}).detect(Series(LABELS, t2, v2), now)
    assert not d.fired
    assert reason in d.reason


def test_params_are_strict_and_accept_durations() -> None:
    """Unknown keys fail; durations parse; the horizon must fit in the lookback."""
    p = ForecastBreachParams.model_validate({"threshold": 1, "horizon_seconds": "15m",
                                             "lookback_seconds": "7d"})
    assert (p.horizon_seconds, p.lookback_seconds, p.model, p.bound) == (900, 604800, "holt", "point")
    with pytest.raises(ValidationError):
        ForecastBreachParams.model_validate({"threshold": 1, "treshold": 2})
    with pytest.raises(ValidationError):
        ForecastBreachParams.model_validate({"threshold": 1, "horizon_seconds": "1d",
                                             "lookback_seconds": "6h"})


def test_first_crossing_interpolates() -> None:
    """The breach time sits between the last safe and the first breaching forecast point."""
    t = np.array([10.0, 20.0, 30.0])
    assert first_crossing(t, np.array([1.0, 3.0, 5.0]), 4.0, "above", 0.0, 0.0) == pytest.approx(25.0)
    assert first_crossing(t, np.array([1.0, 2.0, 3.0]), 4.0, "above", 0.0, 0.0) is None
    assert first_crossing(t, np.array([5.0, 3.0, 1.0]), 2.0, "below", 0.0, 6.0) == pytest.approx(25.0)


def test_refit_phases_spread_keys_over_the_interval() -> None:
    """1,000 keys land roughly evenly over the refit interval, and a slot comes once per interval."""
    interval = 900.0
    phases = np.array([refit_phase_seconds(f"pod={i}", interval) for i in range(1000)])
    counts, _ = np.histogram(phases, bins=10, range=(0, interval))
    assert counts.min() > 60 and counts.max() < 140
    assert refit_phase_seconds("pod=1", interval) == refit_phase_seconds("pod=1", interval)
    assert next_refit_time(1000.0, 100.0, interval) == 1900.0
    assert not refit_due(1000.0, 100.0, interval, 1899.0)
    assert refit_due(1000.0, 100.0, interval, 1900.0)
    assert refit_due(None, 100.0, interval, 0.0)


async def test_prepare_staggers_prophet_refits_and_caps_each_cycle() -> None:
    """Over a refit interval every series refits once, spread over cycles, never above the cap."""
    fits: list[tuple[float, bool]] = []
    now_box = [0.0]

    async def fake_offload(fn: Any, ts: np.ndarray, vs: np.ndarray) -> Any:
        warm = fn.keywords["init"] is not None
        fits.append((now_box[0], warm))
        t = ts[-1] + 15.0 * np.arange(-10, 200)
        return type("F", (), dict(times=t, yhat=np.full(t.size, 1.0), yhat_lower=np.full(t.size, 1.0),
                                  yhat_upper=np.full(t.size, 1.0), fitted_at=ts[-1], n_points=ts.size,
                                  warm_started=warm, init={"k": 0.0}))()

    det = ForecastBreachDetector({"model": "prophet", "threshold": 5, "max_fits_per_cycle": 40})
    rng = np.random.default_rng(0)
    base_ts = T0 + STEP * np.arange(100)
    batch = [Series({"pod": str(i)}, base_ts, rng.normal(1, 0.1, 100)) for i in range(200)]
    cycles = np.arange(0, 2 * 900 + 1, 15.0)
    for c in cycles:
        now_box[0] = base_ts[-1] + c
        shifted = [Series(s.labels, np.asarray(s.timestamps) + c, s.values) for s in batch]
        await det.prepare(shifted, now_box[0], fake_offload)
    times = np.array([t for t, _ in fits])
    per_cycle = np.unique(times, return_counts=True)[1]
    assert per_cycle.max() <= 40
    cold = sum(1 for _, warm in fits if not warm)
    assert cold == 200  # each series fitted cold once, then warm-started
    second_round = times[times > base_ts[-1] + 900]
    assert 150 <= second_round.size <= 250
    assert np.unique(second_round).size > 30  # spread over many cycles, not one storm
    d = det.detect(shifted[0], now_box[0])
    assert not d.fired and "stays below" in d.reason


def test_prophet_warm_start_produces_a_fit() -> None:
    """A fit warm-started from the previous fit's parameters returns a forecast."""
    rng = np.random.default_rng(0)
    ts = T0 + 300.0 * np.arange(120)
    vs = 10 + 0.01 * np.arange(120) + rng.normal(0, 0.1, 120)
    cold = fit_prophet_forecast(ts, vs, ahead_seconds=3600, step_seconds=300)
    warm = fit_prophet_forecast(ts, vs + 0.05, ahead_seconds=3600, step_seconds=300, init=cold.init)
    assert warm.warm_started and not cold.warm_started
    assert warm.times[-1] >= ts[-1] + 3600
    assert np.all(np.isfinite(warm.yhat))
    assert set(warm.init) == {"k", "m", "sigma_obs", "delta", "beta"}


async def test_prophet_fires_before_breach_through_a_process_pool() -> None:
    """Prophet, fitted in a real process pool every 30 min, sees a 3h ramp to 500 ahead."""
    step = 300.0
    rng = np.random.default_rng(0)
    n_flat, n_ramp = 2 * 288, 48
    ts = T0 + step * np.arange(n_flat + n_ramp)
    vs = 200 + rng.normal(0, 10, ts.size)
    vs[n_flat:] += 300 / (3 * 3600) * (ts[n_flat:] - ts[n_flat])
    breach = ts[n_flat] + 3 * 3600
    loop = asyncio.get_running_loop()
    with ProcessPoolExecutor(1) as pool:
        async def offload(fn: Any, *args: Any) -> Any:
            return await loop.run_in_executor(pool, fn, *args)

        det = ForecastBreachDetector({"model": "prophet", "threshold": 500, "horizon_seconds": "1h",
                                      "lookback_seconds": "2d", "refit_interval_seconds": "30m"})
        first = None
        for i in range(n_flat - 12, ts.size):
            lo = np.searchsorted(ts, ts[i] - det.lookback_seconds)
            s = Series(LABELS, ts[lo : i + 1], vs[lo : i + 1])
            await det.prepare([s], ts[i], offload)
            d = det.detect(s, ts[i])
            if d.fired and first is None:
                first = ts[i]
                assert d.details["model"] == "prophet"
    assert first is not None and breach - first >= 300
