"""The capacity knee: with the request rate beside the latency (the trigger's companion query),
Holt forecasts latency as the rate's forecast put through the fitted knee, so a load growing toward
capacity is signalled minutes before the breach; a rate that does not explain the latency changes
nothing; the batched cycle gives what the one-series path gives."""
from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import numpy as np
import pytest

from core.query import Series
from detectors.forecast import ForecastBreachDetector
from detectors.forecast.load_knee import (KNEE_MIN_T, SATURATION_LINE_MULTIPLE, fit_knee, knee_latency, knee_rows,
                                          log_rate)
from daemon.wiring.registries import action_registry, detector_registry
from policies.loader import PolicyLoadError, load_policies_text

T0 = 1_700_000_000.0
STEP = 30.0
LINE = 500.0


def knee_trace(seed: int, grow: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """Three quiet hours at half capacity (load wobbling 3% per scrape and 5% over an hour), then
    the request rate grows 1% a minute: latency ``s / (1 - load)`` with 10% log-normal noise.
    Returns timestamps, latency, rate, and when the noise-free latency's 5-minute mean crosses 500."""
    rng = np.random.default_rng(seed)
    n = 360 + 120
    t = np.arange(n) * STEP
    growth = 1.01 ** (np.maximum(t - 360 * STEP, 0.0) / 60.0) if grow else np.ones(n)
    wave = 1.0 + 0.05 * np.sin(2 * np.pi * t / 3600.0 + rng.uniform(0, 2 * np.pi))
    load = np.minimum(0.5 * growth * wave * np.exp(rng.normal(0, 0.03, n)), 0.999)
    service, capacity = 100.0, 200.0
    level = service / (1.0 - load)
    latency = level * np.exp(rng.normal(0, 0.10, n))
    smooth = np.convolve(level, np.ones(11) / 11, mode="same")
    over = np.nonzero(smooth[5:-5] >= LINE)[0]
    crossing = T0 + float(t[over[0] + 5]) if over.size else np.inf
    return T0 + t, latency, load * capacity, crossing


def first_fire(det: ForecastBreachDetector, ts: np.ndarray, latency: np.ndarray, rate: np.ndarray | None,
               since: float, until: float) -> float | None:
    """When the detector, asked every minute between `since` and `until`, first fires."""
    for i in np.nonzero((ts >= since) & (ts < until))[0][::2]:
        s = Series({"model": "m"}, ts[: i + 1], latency[: i + 1])
        c = Series({"model": "m"}, ts[: i + 1], rate[: i + 1]) if rate is not None else None
        if det.detect(s, float(ts[i]), c).fired:
            return float(ts[i])
    return None


def test_the_knee_fit_finds_the_capacity_the_rate_and_latency_imply() -> None:
    """1/latency falls in a line with the rate; its zero is the capacity (200 req/s here)."""
    _, latency, rate, _ = knee_trace(0, grow=False)
    fit = fit_knee(latency[None], rate[None])
    assert fit.usable[0] and fit.t[0] >= KNEE_MIN_T
    assert 170.0 < float(fit.capacity[0]) < 230.0


def test_a_rate_that_does_not_explain_the_latency_is_not_a_knee() -> None:
    rng = np.random.default_rng(1)
    rate = 100.0 * np.exp(np.cumsum(rng.normal(0, 0.01, 360)))
    latency = 300.0 * np.exp(rng.normal(0, 0.1, 360))
    fit = fit_knee(latency[None], rate[None])
    assert not fit.usable[0] and abs(float(fit.t[0])) < KNEE_MIN_T
    falling = 300.0 * (rate / rate.mean()) ** -1.0  # latency that falls as traffic rises: no knee either
    assert not fit_knee(falling[None], rate[None]).usable[0]


def test_a_rate_past_the_fitted_capacity_saturates_at_a_multiple_of_the_line() -> None:
    _, latency, rate, _ = knee_trace(2, grow=False)
    fit = fit_knee(latency[None], rate[None])
    log_g = np.log(np.array([[100.0 * float(fit.intercept[0])] * 3]))  # g of a latency of 100 ms at zero load
    beyond = np.log(np.array([[0.5, 1.0, 2.0]]) * float(fit.capacity[0]))
    got = knee_latency(log_g, beyond, fit, LINE)[0]
    assert got[0] == pytest.approx(200.0, rel=1e-9)  # half capacity: twice the zero-load latency
    assert got[1] == got[2] == SATURATION_LINE_MULTIPLE * LINE


def test_a_rate_of_zero_is_floored_before_its_logarithm() -> None:
    out = log_rate(np.array([[0.0, 10.0, 100.0]]))
    assert np.isfinite(out).all() and out[0, 0] == pytest.approx(np.log(0.1))


def test_rows_without_a_rate_covering_their_window_stay_plain() -> None:
    _, latency, rate, _ = knee_trace(3, grow=False)
    rates = np.vstack([rate, rate])
    rates[1, 10] = np.nan  # a scrape of the rate missing where the latency has one
    primary, log_r, fit = knee_rows(np.vstack([latency, latency]), rates)
    assert fit.usable[0] and not fit.usable[1]
    np.testing.assert_array_equal(primary[1], latency)
    assert np.isfinite(log_r[0]).all() and np.isnan(log_r[1]).all()


def test_a_load_growing_toward_capacity_is_signalled_minutes_before_the_breach() -> None:
    """With the rate beside it the detector fires before the 5-minute latency crosses the line in
    every run, a median of more than five minutes ahead, and no later than the same detector on the
    latency alone wherever that one fires at all (it misses some: the knee's last minutes are
    steeper than any trend it has seen)."""
    leads, alone_fired = [], 0
    for seed in range(5, 13):
        ts, latency, rate, crossing = knee_trace(seed)
        assert np.isfinite(crossing)
        since = T0 + 360 * STEP
        with_rate = first_fire(ForecastBreachDetector({"threshold": LINE}), ts, latency, rate, since, crossing)
        alone = first_fire(ForecastBreachDetector({"threshold": LINE}), ts, latency, None, since, crossing)
        assert with_rate is not None, seed
        leads.append(crossing - with_rate)
        if alone is not None:
            alone_fired += 1
            assert alone >= with_rate, seed
    assert float(np.median(leads)) >= 300.0
    assert alone_fired < len(leads)


def test_traffic_that_grows_without_moving_latency_fires_nothing_and_says_why() -> None:
    rng = np.random.default_rng(7)
    n = 480
    ts = T0 + STEP * np.arange(n)
    rate = 100.0 * 1.01 ** (np.maximum(np.arange(n) - 360, 0) / 2.0) * np.exp(rng.normal(0, 0.03, n))
    latency = 420.0 * np.exp(rng.normal(0, 0.08, n))
    det = ForecastBreachDetector({"threshold": LINE})
    assert first_fire(det, ts, latency, rate, T0 + 360 * STEP, T0 + n * STEP) is None
    d = det.detect(Series({"model": "m"}, ts, latency), float(ts[-1]), Series({"model": "m"}, ts, rate))
    assert d.details["knee"]["used"] is False and abs(d.details["knee"]["slope_t"]) < KNEE_MIN_T


def test_a_knee_detection_says_the_capacity_it_fitted() -> None:
    ts, latency, rate, crossing = knee_trace(4)
    i = int(np.searchsorted(ts, crossing)) - 10
    d = ForecastBreachDetector({"threshold": LINE}).detect(
        Series({"model": "m"}, ts[: i + 1], latency[: i + 1]), float(ts[i]),
        Series({"model": "m"}, ts[: i + 1], rate[: i + 1]))
    assert d.details["knee"]["used"] is True
    assert 150.0 < d.details["knee"]["capacity_rate"] < 250.0


async def inline(fn: Any, *args: Any) -> Any:
    return fn(*args)


def test_the_batched_cycle_with_rates_equals_the_one_series_path() -> None:
    """Knee rows, rows whose rate explains nothing, rows without a rate and a rate with a hole:
    `prepare`'s pool job and `detect` alone give the same Detections, field for field."""
    series, rates = [], []
    for i in range(20):
        ts, latency, rate, _ = knee_trace(10 + i, grow=i % 2 == 0)
        if i % 4 == 1:
            rate = rate[::-1].copy()  # a rate that falls while this latency rises: no knee
        if i % 5 == 3:
            rate = rate.copy()
            rate[200] = np.nan
        series.append(Series({"pod": str(i)}, ts[:400], latency[:400]))
        rates.append(None if i % 6 == 5 else Series({"pod": str(i)}, ts[:400], rate[:400]))
    now = float(series[0].timestamps[-1])
    batched, alone = ForecastBreachDetector({"threshold": LINE}), ForecastBreachDetector({"threshold": LINE})
    for s, c in zip(series, rates):  # the same parameters on both sides: fitted once, then filtered
        batched.detect(s, now - STEP, c)
        alone.detect(s, now - STEP, c)
    asyncio.run(batched.prepare(series, now, inline, rates))
    assert len(batched._forecaster._prepared) == len(series)  # type: ignore[attr-defined]
    got = [dataclasses.asdict(batched.detect(s, now, c)) for s, c in zip(series, rates)]
    want = [dataclasses.asdict(alone.detect(s, now, c)) for s, c in zip(series, rates)]
    assert got == want
    used = [d["details"].get("knee", {}).get("used") for d in want]
    assert used.count(True) >= 5 and used.count(False) >= 2 and used.count(None) >= 3


POLICY = """
name: p
target: {{model: m}}
triggers:
  - detector:
      type: forecast_breach
      query: q
      companionQuery: rate_q
      params: {{threshold: 500, {extra}}}
actions: [{{type: notify, url: "http://127.0.0.1:9/hook"}}]
"""


@pytest.mark.parametrize("extra, problem", [
    ("model: prophet", "model: holt only"),
    ("direction: below", "needs direction: above"),
])
def test_a_rate_beside_a_forecast_that_cannot_read_it_fails_to_load(extra: str, problem: str) -> None:
    with pytest.raises(PolicyLoadError) as err:
        load_policies_text(POLICY.format(extra=extra), "p.yaml", action_registry(), detector_registry())
    assert any(problem in e.message and "companionQuery" in e.message for e in err.value.errors)


def test_a_holt_forecast_with_a_rate_beside_it_loads() -> None:
    (policy,) = load_policies_text(POLICY.format(extra="model: holt"), "p.yaml", action_registry(),
                                   detector_registry()).policies
    assert policy.spec.triggers[0].detector is not None
