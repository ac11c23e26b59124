"""Forecast breach detection: `ForecastBreachDetector` and the names that tests, benchmarks and
the offline evaluation use. The package's modules, one job each:

- `params`: the policy parameters;
- `arrays`: raw series to cleaned history and a regular grid;
- `protocol`: the `Forecaster` a backend implements, and the `Curves` it returns;
- `holt` / `holt_fit`: the Holt backend and its pure-numpy fit;
- `prophet` / `prophet_fit`: the Prophet backend and its picklable fit for the process pool;
- `refit_schedule`: when each series refits (Prophet);
- `breach`: first crossing of the threshold, and episodes;
- `detector`: the detector that ties them together.
"""
from detectors.forecast.arrays import History, clean_history, infer_step, regularize
from detectors.forecast.breach import first_crossing
from detectors.forecast.detector import ForecastBreachDetector
from detectors.forecast.holt_fit import HoltFit, fit_holt, holt_forecast
from detectors.forecast.params import ForecastBreachParams
from detectors.forecast.prophet import anchor_offset
from detectors.forecast.prophet_fit import ProphetForecast, fit_prophet_forecast
from detectors.forecast.protocol import Curves, Forecaster
from detectors.forecast.refit_schedule import next_refit_time, refit_due, refit_phase_seconds

__all__ = [
    "Curves", "ForecastBreachDetector", "ForecastBreachParams", "Forecaster", "History", "HoltFit",
    "ProphetForecast", "anchor_offset", "clean_history", "first_crossing", "fit_holt",
    "fit_prophet_forecast", "holt_forecast", "infer_step", "next_refit_time", "refit_due",
    "refit_phase_seconds", "regularize",
]
