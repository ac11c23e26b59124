"""TailExcessDetector: "P99.9 < L" tested as "at most 0.1% of requests above L", by a bank of CUSUMs
at a stated false-alarm rate (detectors/sequential; docs/detectors.md, "tail_excess").

Two kinds of evidence, one series per model version, both raw cumulative counters (no `rate()`):
- `evidence: counters` (default): `query` a latency counter (Triton's
  `nv_inference_compute_infer_duration_us`), `companionQuery` its request counter
  (`nv_inference_request_success`): latency mass above what the bulk explains, in requests' worth.
- `evidence: histogram`: `query` the histogram's bucket at the line (`..._bucket{le="500"}`),
  `companionQuery` its count (`..._count`, or the `le="+Inf"` bucket): requests above L, exactly.

One latency series that is not a counter (a recorded P99.9, a histogram quantile) is the case of
`value_cusum` (detectors/value_cusum.py).
"""
from __future__ import annotations

import math
import re
from dataclasses import replace
from typing import Any, ClassVar, Literal, Mapping, Sequence

import numpy as np
from numpy.typing import NDArray
from pydantic import Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from core.detection import Detection, DetectorStatus
from core.query import Series
from detectors._slow_counts import counting_design
from detectors.base import DetectorParams, Offload
from detectors.grid_detector import paired_grid, with_blindness, with_statuses
from detectors.histogram_shape import unit_problem
from detectors.sequential.design import DEFAULT_SIZES, MEMBER_RATE_SHARE, BankDesign
from detectors.sequential.thresholds import STORE, Promise
from detectors.tail_excess_batch import OK, SLOWEST_COUNTED, ExcessBatch, Test, batch_detections, evaluate_excess_batch
from detectors.sequential.start_test import START_ALPHA, bank_days, start_alpha
from detectors.tail_excess_start import StartBook, StartRule, frame_starts, run_start_tests, settle, without_label

VALUES_MOVED = ("tail_excess: `input: values` moved to its own detector: use `type: value_cusum` with the "
                "`values:` parameters at the top level")
"""The load error of a policy written for the value path tail_excess had (one line)."""
INPUT_GONE = ("tail_excess: `input` is gone: tail_excess takes counters only (delete the `input:` line); one "
              "value series is `type: value_cusum`")
"""The load error of a policy that still names tail_excess's input (one line)."""


REPLACED = ("tail_excess: rate_ratio and decision_threshold were replaced by false_alarm_days (one false "
            "alarm per version per that many days at half budget; the thresholds follow from it at the observed "
            "traffic, docs/detectors.md)")
"""The load error of a policy that still sets the bare operating point (one line)."""

LOOKBACK_DELAYS = 3.0
"""The lookback grows to this many times the smallest regression's expected detection delay at the
slowest series' traffic: a run of evidence older than the lookback is not seen."""


class TailExcessParams(DetectorParams):
    """Parameters of `tail_excess`. Defaults are the production ones (docs/detectors.md)."""

    gives_budget_evidence: ClassVar[bool] = True

    line: float = Field(gt=0)
    """L: the latency the quantile must stay under, in the counter's unit per request (500000
    for Triton's `_us` counters and 500 ms; a histogram's bucket bound). Required: a line that
    carries a unit has no default."""
    line_unit: Literal["us", "ms", "s"] | None = None
    """The unit `line` is written in, checked against the unit the query's metric states in its
    name (`_us`, `_ms`/`_milliseconds`, `_seconds`): a mismatch fails to load with the line in the
    metric's unit (nothing is converted). None: the line is in the metric's unit, unchecked."""
    evidence: Literal["counters", "histogram"] = "counters"
    """`counters`: latency and request counters; `histogram`: the bucket at the line and the count."""
    quantile: float = Field(0.999, gt=0.5, lt=1.0)
    """The quantile the line is for; its budget is 1 - quantile of requests above L."""
    false_alarm_days: float = Field(30.0, gt=0)
    """The rate the operator accepts: one false alarm per version per this many days, at
    `null_share` of the budget (in the evidence's own terms: latency mass for counters)."""
    null_share: float = Field(0.5, gt=0, lt=1)
    """The share of the budget the rate is stated at: half budget (0.05% above L for P99.9)."""
    sizes: tuple[float, ...] = DEFAULT_SIZES
    """The regressions the bank is quickest on, as multiples of the budget."""
    heaviest_slow: float = Field(2.0, ge=1.0)
    """Counters: the promise covers slow requests up to this multiple of the line. Latency mass
    cannot tell one request at 2L from two at L; the thresholds are derived for the heaviest."""
    version_label: str = "version"
    """The series label that names the model version (`destination_version` for Istio)."""
    lookback_seconds_: float = Field(900.0, gt=0, alias="lookback_seconds")
    """The least history each cycle recomputes the test from; it grows for slow traffic."""
    max_lookback_seconds: float = Field(7200.0, gt=0)
    """The most it grows to."""
    bulk_window_seconds: float = Field(60.0, gt=0)
    """Counters: the bulk's per-request latency is the lowest step mean of this trailing window."""
    bulk_slack: float = Field(0.25, ge=0)
    """Counters: each request may take (1 + this) x the bulk before it counts as excess: a bulk
    that slows down by less than this (3x traffic, a slightly slower version) is not a tail."""
    max_staleness_seconds: float = Field(30.0, gt=0)
    """Newest sample older than this: stale data, never read as healthy or as firing."""
    shared_hold_seconds: float = Field(300.0, ge=0)
    """A version that fires while another serving version's evidence since the episode began is
    too thin to say whether it is slow too (shared cause) or not waits up to this long into its
    episode before its alarm stands alone (0: never). The busier version fires first in a shared
    slowdown; a version serving a tenth of the traffic needs minutes to show it."""
    start_false_alarms: float | None = Field(None, ge=0.0, le=0.05)
    """The start test's false alarms per deploy (detectors/tail_excess_start.py): from a version's
    first request, its life so far is tested beside the bank; the bank keeps what is left of the
    rate per version-day. 0 turns it off; unset, 0.001. On counters it counts slow requests per
    step, never latency mass (one healthy request at 6x the line weighs one, not six:
    detectors/tail_excess_start_evidence.py); where steps are too long to count, it does not run."""
    start_horizon_seconds: float = Field(900.0, gt=0)
    """How long after its settle a version's start test runs."""
    start_settle_seconds: float = Field(5.0, ge=0)
    """The longest settle: requests held by the deploy's own model load (~1.5 s on Triton, more on a
    busy node) are not evidence. A settle ends with the first step after the version's first
    request whose requests were mostly not held, or this long after that request
    (detectors/tail_excess_settle.py); steps that begin before its end are not scored."""
    start_below_requests: float = Field(1000.0, gt=0)
    """A version is starting only when its request counter at its first sample is below this, or
    the other versions served this many requests before its first sample."""

    @model_validator(mode="before")
    @classmethod
    def _moved_keys(cls, data: Any) -> Any:
        """Keys of earlier versions fail in one line naming what replaced them, and a missing line
        says what it is."""
        if isinstance(data, Mapping):
            if data.get("input") == "values" or "values" in data:
                raise PydanticCustomError("moved_to_value_cusum", VALUES_MOVED)
            if "input" in data:
                raise PydanticCustomError("input_gone", INPUT_GONE)
            if "rate_ratio" in data or "decision_threshold" in data:
                raise PydanticCustomError("replaced_by_rate", REPLACED)
            if "line" not in data:
                raise PydanticCustomError(
                    "line_required", "'line' is required (the latency line in the counter's unit per "
                                     "request, e.g. 500000 for 500 ms in microseconds)")
        return data

    @field_validator("sizes")
    @classmethod
    def _sizes(cls, sizes: tuple[float, ...]) -> tuple[float, ...]:
        if not sizes or len(sizes) > 12 or any(s <= 0 for s in sizes) or sorted(set(sizes)) != list(sizes):
            raise ValueError("sizes: 1 to 12 positive multiples of the budget, ascending, each once")
        return sizes

    @model_validator(mode="after")
    def _sizes_above_null(self) -> "TailExcessParams":
        if self.sizes[0] <= self.null_share:
            raise ValueError(f"sizes: the smallest ({self.sizes[0]:g}x the budget) must exceed null_share "
                             f"({self.null_share:g}): a regression is more than the share the rate is stated at")
        if self.max_lookback_seconds < self.lookback_seconds_:
            raise ValueError("max_lookback_seconds must be at least lookback_seconds")
        return self

    @property
    def recovery_rule(self) -> None:
        """Counters are not a level a Prometheus check could hold: no detection draws a line."""
        return None

    def query_problem(self, query: str, companion_query: str | None) -> str | None:
        """A histogram trigger names the bucket at (or above) the line and the count beside it."""
        unit = unit_problem(query, self.line, self.line_unit)
        if unit is not None:
            return unit
        if self.evidence != "histogram":
            return None
        if not companion_query:
            return ("evidence: histogram needs companionQuery: the histogram's count (`..._count`, or its "
                    "`le=\"+Inf\"` bucket) with the same labels")
        bound = bucket_bound(query)
        if bound is None:
            return ('evidence: histogram needs the query to select the bucket at the line, e.g. '
                    f'`..._bucket{{le="{self.line:g}"}}` (a regex or no `le` selects buckets the test cannot tell apart)')
        if bound < self.line:
            return (f"the bucket le={bound:g} is below the line {self.line:g}: it counts requests faster than "
                    "the line, never the ones above it; select the bucket at the line or the nearest above")
        if math.isinf(bound):
            return ('the bucket le="+Inf" holds every request: no request is ever above it, so nothing is counted; '
                    f"the histogram needs a bound at the line ({self.line:g}) or the nearest above it")
        return None

    @property
    def budget(self) -> float:
        return 1.0 - self.quantile

    def count_design(self) -> BankDesign | None:
        """Counters: the bank on slow requests counted per step (detectors/_slow_counts.py), which
        the detector uses where steps are short enough; None for a histogram."""
        return counting_design(self.budget, self.null_share, self.sizes) if self.evidence == "counters" else None

    def test(self) -> Test:
        """What each evaluation needs besides the data."""
        lump = self.heaviest_slow if self.evidence == "counters" else 1.0
        return Test(BankDesign.for_budget(self.budget, self.null_share, self.sizes, lump), self.budget,
                    self.false_alarm_days, self.line, self.evidence, self.lookback_seconds_,
                    self.bulk_window_seconds, self.bulk_slack, self.max_staleness_seconds, self.sizes,
                    recent_seconds=self.lookback_seconds_, shared_hold_seconds=self.shared_hold_seconds,
                    bank_days=bank_days(self.false_alarm_days, self.start_alpha) if self.start_alpha > 0 else None,
                    start_assumed=tuple(rule.describe().items()) if (rule := self.start_rule()) is not None else ())

    @property
    def start_alpha(self) -> float:
        """The start test's probability per deploy: `start_false_alarms`, at most half a version-day's share."""
        wanted = START_ALPHA if self.start_false_alarms is None else self.start_false_alarms
        return start_alpha(self.false_alarm_days, wanted) if wanted > 0 else 0.0

    def start_rule(self) -> StartRule | None:
        """What the start test assumes (None: it is off)."""
        if self.start_alpha <= 0:
            return None
        return StartRule(self.start_alpha, self.start_horizon_seconds, self.start_settle_seconds,
                         self.start_below_requests)


class TailExcessDetector:
    """Sequential tail detector on counters or a histogram. Stateless in its decisions: each cycle
    recomputes the test from the queried range, so restarts and failovers lose nothing and one
    episode keeps one start. What it keeps is a hint (how far back to query, from the traffic it
    saw last) and the thresholds derived so far (a process-wide cache)."""

    kind: ClassVar[str] = "tail_excess"
    Params: ClassVar[type[DetectorParams]] = TailExcessParams
    JUDGES_TOGETHER: ClassVar[bool] = True  # the shared-slowdown rule weighs every version of the answer

    def __init__(self, params: TailExcessParams | Mapping[str, Any]) -> None:
        self.params = (params if isinstance(params, TailExcessParams)
                       else TailExcessParams.model_validate(params))
        self._test = replace(self.params.test(), count_design=self.params.count_design())
        self._tests = {self._test.lookback_seconds: self._test}  # by scored lookback: a few doublings
        self._lookback = self.params.lookback_seconds_
        rule = self.params.start_rule()
        self._starts = StartBook(rule) if rule is not None else None

    @property
    def lookback_seconds(self) -> float:
        """The bank's lookback, or longer while a start test needs its whole span in the answer."""
        book = self._starts
        if book is not None and book.starts:
            return max(self._lookback, book.rule.span_seconds(60.0))
        return self._lookback

    def restore_starts(self, starts: Mapping[str, float]) -> None:
        """Known start times of versions (the journal's): their start tests resume, never restart."""
        if self._starts is not None:
            self._starts.restore(starts)

    def take_new_starts(self) -> list[tuple[str, float]]:
        """The versions' starts found since the last call, for the caller to journal."""
        return self._starts.take_new() if self._starts is not None else []

    async def prepare(self, batch: Sequence[Series], now: float, offload: Offload,
                      companions: Sequence[Series | None] | None = None) -> None:
        """Nothing to prepare: everything comes from the queried range (thresholds are derived in
        the background as traffic cells first appear)."""
        return None

    def detect(self, series: Series, now: float, companion: Series | None = None) -> Detection:
        """Decide on one latency counter (or bucket), its request counter (or count) as `companion`.
        Never raises for bad data."""
        if companion is None:
            return Detection(self.kind, False, "no request count: tail_excess needs companionQuery (the "
                                               "request counter, or the histogram's _count) with the same labels",
                             status=DetectorStatus.NO_COUNTS)
        try:
            return self._detect_many([series], now, [companion], starts=False)[0]
        except (TypeError, ValueError) as exc:
            return Detection(self.kind, False, f"malformed series: {exc}", status=DetectorStatus.NO_DATA)

    def detect_many(self, series: Sequence[Series], now: float,
                    companions: Sequence[Series | None] | None = None) -> list[Detection]:
        """Aligns the series (each with its companion) on one grid and decides all rows at once,
        the start tests with them (the whole answer: a version's start is judged beside the others).
        Raises on malformed series (see `align`)."""
        return self._detect_many(series, now, companions, starts=True)

    def _detect_many(self, series: Sequence[Series], now: float, companions: Sequence[Series | None] | None,
                     starts: bool) -> list[Detection]:
        """`detect_many`; `starts`: run the start tests (never on one series alone: a lone series
        would read every other version as gone, and its own as new)."""
        head = paired_grid(self.detect, series, now, companions)
        if isinstance(head, list):
            return head
        grid, counters, n = head.grid, head.counters, head.n
        labels = [s.labels for s in series]
        book = self._starts if starts else None
        frame = None
        if book is not None:
            frame = frame_starts(book, grid, counters[n:], labels, self.params.version_label)
            counters = settle(book, frame, grid, counters, n, self.params.evidence, self.params.line)
        batch = self.evaluate(grid, counters[:n], counters[n:], now)
        out = with_statuses(batch_detections(batch, self.kind, labels, self.params.version_label), batch.status)
        counting = batch.counting
        out = with_blindness(out, counting.counts_above if counting is not None and counting.counted else None,
                             self.params.line)
        if book is None or frame is None:
            if self._starts is None:
                return out
            return [d if lab.get(self.params.version_label) else without_label(d, self.params.version_label)
                    for lab, d in zip(labels, out)]
        return run_start_tests(book, frame, self._test, grid, counters[:n], counters[n:],
                               self.params.version_label, now, batch, out)

    def evaluate(self, grid: NDArray[np.float64], primary: NDArray[np.float64], totals: NDArray[np.float64],
                 now: float) -> ExcessBatch:
        """The batch evaluation with this detector's thresholds over the lookback it reported last
        cycle (what the poller was asked to fetch), and the lookback this cycle implies."""
        test = self._tests.get(self._lookback)
        if test is None:
            test = self._tests[self._lookback] = replace(self._test, lookback_seconds=self._lookback)
        promises: dict[float, Promise] = {}

        def thresholds(requests_per_step: float, step: float) -> tuple[tuple[float, ...], bool]:
            promise = promises.get(step)
            if promise is None:
                promise = promises[step] = test.promise(step)
            return STORE.get(test.design, promise, requests_per_step)

        def count_thresholds(requests_per_step: float, step: float) -> tuple[tuple[float, ...], bool]:
            assert test.count_design is not None  # asked for only when the test counts
            return STORE.get(test.count_design, promises.get(step) or test.promise(step), requests_per_step)

        batch = evaluate_excess_batch(test, grid, primary, totals, now, thresholds, count_thresholds)
        self._lookback = implied_lookback(self.params, batch)
        return batch


_LE = re.compile(r'\ble\s*=\s*"([^"]*)"')


def bucket_bound(query: str) -> float | None:
    """The bound of the bucket a query selects with `le="..."` (None: none, or not a number)."""
    found = _LE.findall(query)
    if len(found) != 1:
        return None
    try:
        return float(found[0])
    except ValueError:
        return None


def implied_lookback(p: TailExcessParams, b: ExcessBatch) -> float:
    """The lookback the thresholds imply: LOOKBACK_DELAYS times the smallest regression's expected
    delay at the slowest counted series' traffic, in doublings of the least lookback, capped."""
    counted = (b.status == OK) & (b.traffic / b.step_seconds >= SLOWEST_COUNTED)
    if not counted.any():
        return p.lookback_seconds_
    slowest = int(np.flatnonzero(counted)[np.argmin(b.traffic[counted])])
    return lookback_at(p.lookback_seconds_, p.max_lookback_seconds, b.test.design, float(b.traffic[slowest]),
                       float(b.thresholds[0, slowest]), b.step_seconds)


def lookback_at(least: float, most: float, design: BankDesign, requests_per_step: float, threshold: float,
                step_seconds: float) -> float:
    """LOOKBACK_DELAYS times the expected delay of `design`'s smallest member (its `threshold` over
    its drift at its own alternative, `requests_per_step` a step), in doublings of `least`, capped
    at `most`: the rule `implied_lookback` applies at the slowest series and the canary judge at
    the slowest canary (detectors/canary.py `canary_lookback`)."""
    r = design.ratios[0]
    drift = requests_per_step * design.null * (r * math.log(r) - r + 1.0)  # nats per step at its own size
    needed = LOOKBACK_DELAYS * threshold / drift * step_seconds if drift > 0 else math.inf
    if needed <= least:
        return least
    doublings = math.ceil(math.log2(needed / least))
    return min(most, least * 2.0 ** doublings)


__all__ = ["MEMBER_RATE_SHARE", "REPLACED", "TailExcessDetector", "TailExcessParams", "implied_lookback", "lookback_at"]
