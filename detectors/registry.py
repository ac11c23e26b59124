"""The explicit list of detectors: trigger `type:` -> class. An unknown type is a load error."""
from __future__ import annotations

from types import MappingProxyType
from typing import Mapping

from detectors.base import Detector
from detectors.canary import TailCanaryDetector
from detectors.forecast import ForecastBreachDetector
from detectors.tail import TailAnomalyDetector
from detectors.tail_excess import TailExcessDetector
from detectors.threshold import ThresholdDetector
from detectors.value_cusum import ValueCusumDetector

DETECTORS: Mapping[str, type[Detector]] = MappingProxyType({
    TailAnomalyDetector.kind: TailAnomalyDetector,
    TailExcessDetector.kind: TailExcessDetector,
    TailCanaryDetector.kind: TailCanaryDetector,
    ThresholdDetector.kind: ThresholdDetector,
    ValueCusumDetector.kind: ValueCusumDetector,
    ForecastBreachDetector.kind: ForecastBreachDetector,
})
