"""Forecast breach detection: `ForecastBreachDetector` and the names that tests, benchmarks and
the offline evaluation use. The package's modules, one job each:

- `params`: the policy parameters;
- `arrays`: raw series to cleaned history and a regular grid;
- `calibration`: the predictive distribution (`PathForecast`) every backend returns, calibrated on
  the series' own past errors, and the first-passage probability read from it;
- `protocol`: the `Forecaster` a backend implements;
- `outlook`: what the detector reads of a distribution (probability, crossing, band), per series or batched;
- `history_memo`: each series' history read once per cycle, shared by `prepare` and `detect`;
- `holt_fit` / `holt_paths` / `holt_cycle` / `holt`: the Holt filter and fit, its batched
  distribution, the cycle's pool job (every series' outlook at once), the backend;
- `prophet` / `prophet_fit`: the Prophet backend and its picklable fit for the process pool;
- `refit_schedule`: when each series refits (Holt's parameters, Prophet);
- `breach`: episodes (the dedup key);
- `detector`: the detector that ties them together.
"""
from detectors.forecast.arrays import History, clean_history, infer_step, regularize
from detectors.forecast.calibration import FirstPassage, PathForecast, first_passage_batch, level_points
from detectors.forecast.detector import ForecastBreachDetector
from detectors.forecast.holt_fit import HoltFit, fit_holt, holt_forecast, holt_states
from detectors.forecast.holt_paths import HoltBatch, HoltParams, holt_batch, holt_paths, holt_prepare
from detectors.forecast.params import ForecastBreachParams
from detectors.forecast.prophet import anchor_offset
from detectors.forecast.prophet_fit import ProphetForecast, fit_prophet_forecast
from detectors.forecast.protocol import Forecaster
from detectors.forecast.refit_schedule import next_refit_time, refit_due, refit_phase_seconds

__all__ = [
    "FirstPassage", "ForecastBreachDetector", "ForecastBreachParams", "Forecaster", "History", "HoltBatch",
    "HoltFit", "HoltParams", "PathForecast", "ProphetForecast", "anchor_offset", "clean_history",
    "first_passage_batch", "fit_holt", "fit_prophet_forecast", "holt_batch", "holt_forecast", "holt_paths",
    "holt_prepare", "holt_states", "infer_step", "level_points", "next_refit_time", "refit_due",
    "refit_phase_seconds", "regularize",
]
