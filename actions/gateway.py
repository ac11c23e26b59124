"""`gateway.retune_timeout`: set a gateway's request timeout from live P99.9, max(floor, p999 x factor).

The decision is pure (`compute_timeout_ms`, `should_write`, `plan_retune`); where the timeout
lives is a TimeoutSink (actions/timeout_sinks). Writes go through the one compare-and-swap loop
(actions/_compare_and_swap.py): bounded conflict retries from a fresh read, and a value changed by
someone else in between is never overwritten.
No P99.9 data means no change: silence is not a latency.

Delivery: Kubernetes sinks are exactly-once by re-observation (the write stamps the object with the
step's effect key, and a decision resumed after a crash reads the timeout before writing again);
the HTTP endpoint sink is at-least-once with `Idempotency-Key` (actions/timeout_sinks/http_endpoint.py).

A Kubernetes sink's object that Flagger, Argo Rollouts or a GitOps controller owns is refused (plan,
and the compare-and-swap right before each write) unless the sink's `allowOwnedBy` names that owner
(actions/_ownership.py). When verify finds the timeout changed since our write, it says who changed
it last if managedFields tell, and does not fight it (not retryable).
"""
from __future__ import annotations

import math
from typing import Annotated, Any, ClassVar, Literal, Mapping, Sequence, Union

import structlog
from pydantic import Field, model_validator

from actions._compare_and_swap import compare_and_swap
from actions._kube import marked_by, stamp_note
from actions._ownership import changed_by_note, last_writer, refusal, refuse_owned
from actions.base import ActionDeps, ActionParams, Step
from actions.timeout_sinks.base import KubeSinkParams, TimeoutReading, TimeoutSink
from actions.timeout_sinks.configmap import ConfigMapSinkParams
from actions.timeout_sinks.http_endpoint import HttpSinkParams
from actions.timeout_sinks.httproute import HTTPRouteSinkParams
from actions.timeout_sinks.istio_route import IstioRouteSinkParams
from actions.timeout_sinks.registry import sink_class
from core.outcome import ActionError, Outcome, PermanentError, TemporaryError
from core.promql import render_query
from core.query import MultipleValuesError, NoDataError, QueryResult, single_value
from core.signal import Signal
from core.target import Target

KIND = "gateway.retune_timeout"
log = structlog.get_logger("tailguard.actions.gateway")

_MS_PER_UNIT = {"s": 1000.0, "ms": 1.0, "us": 0.001}

SinkSpec = Annotated[
    Union[IstioRouteSinkParams, HTTPRouteSinkParams, ConfigMapSinkParams, HttpSinkParams],
    Field(discriminator="kind"),
]


class RetuneTimeoutParams(ActionParams):
    """The P99.9 query, the rule max(floor, p999 x factor) clamped to [minMs, maxMs], and the sink."""

    query: str = Field(min_length=1)
    """Instant PromQL returning exactly one series: the live P99.9; `$model` / `$namespace` are the target's."""
    unit: Literal["s", "ms", "us"] = "s"
    floor_ms: float = Field(2000.0, ge=0, alias="floorMs")
    factor: float = Field(1.5, gt=0, le=100)
    min_ms: float = Field(1.0, ge=1, alias="minMs")
    max_ms: float = Field(alias="maxMs", gt=0)
    """Required: the ceiling a runaway P99.9 can never push the timeout past."""
    hysteresis: float = Field(0.10, ge=0, lt=1)
    """Relative change below which nothing is written (0.10: changes under 10% are ignored)."""
    sink: SinkSpec
    max_conflict_retries: int = Field(3, ge=0, le=10, alias="maxConflictRetries")

    @model_validator(mode="after")
    def _bounds(self) -> "RetuneTimeoutParams":
        if self.min_ms > self.max_ms:
            raise ValueError(f"minMs {self.min_ms} is above maxMs {self.max_ms}")
        sink_class(self.sink.kind)  # the explicit registry must know every kind the union accepts
        return self


# ---- pure decisions -------------------------------------------------------------------------


def allowed_owners(params: RetuneTimeoutParams) -> Sequence[str]:
    """The sink's `allowOwnedBy` (the HTTP sink writes no Kubernetes object: none)."""
    return params.sink.allow_owned_by if isinstance(params.sink, KubeSinkParams) else ()


def compute_timeout_ms(p999_ms: float, floor_ms: float, factor: float, min_ms: float,
                       max_ms: float) -> int:
    """clamp(max(floor, p999 x factor), min, max), rounded up to a whole millisecond.

    Args:
        p999_ms: Live P99.9 latency in milliseconds.
        floor_ms: The timeout never goes below this because the tail got faster.
        factor: Headroom over the P99.9.
        min_ms: Lower clamp.
        max_ms: Upper clamp.

    Returns:
        The proposed timeout in whole milliseconds.
    """
    if not math.isfinite(p999_ms) or p999_ms < 0:
        raise ValueError(f"P99.9 must be a finite non-negative number, got {p999_ms}")
    wanted = max(floor_ms, p999_ms * factor)
    return int(math.ceil(min(max(wanted, min_ms), max_ms)))


def should_write(current_ms: float | None, proposed_ms: float, hysteresis: float) -> bool:
    """Whether the proposed timeout differs enough from the current one to be written.

    Args:
        current_ms: The timeout now; None (unset) or 0 (disabled) always counts as different.
        proposed_ms: The new timeout.
        hysteresis: Relative change below which the write is skipped (0.10 = 10%).

    Returns:
        True when |proposed - current| / current >= hysteresis (and they differ at all).
    """
    if current_ms is None or current_ms <= 0:
        return True
    if proposed_ms == current_ms:
        return False
    return abs(proposed_ms - current_ms) / current_ms >= hysteresis


def classify_result(result: QueryResult) -> dict[str, Any]:
    """A query result as data for plan: value / no_data / error / multiple (never raises)."""
    try:
        return {"status": "value", "value": single_value(result)}
    except NoDataError as exc:
        return {"status": "no_data", "detail": str(exc)}
    except MultipleValuesError as exc:
        return {"status": "multiple", "detail": str(exc),
                "series": [dict(s.labels) for s in result.samples[:5]]}
    except RuntimeError as exc:
        return {"status": "error", "detail": str(exc)}


def plan_retune(target: Target, params: RetuneTimeoutParams, observed: Mapping[str, Any],
                encode: Any) -> Step:
    """The Step from the observed P99.9 and the sink's current value. Pure.

    Raises TemporaryError when the query failed and PermanentError when it returned several
    series or a change is due on an object someone else owns (`allowOwnedBy`); no data is a noop
    step that names the reason.
    """
    p999 = observed["p999"]
    current: Mapping[str, Any] = observed["current"]
    where = current["where"]
    before = {"timeout": dict(current), "query": observed["query"]}
    if p999["status"] == "error":
        raise TemporaryError(f"P99.9 query failed, timeout of {where} unchanged: {p999['detail']}")
    if p999["status"] == "multiple":
        raise PermanentError(f"P99.9 query must return one series (aggregate it, e.g. max(...)): "
                             f"{p999['detail']}")
    if p999["status"] == "no_data":
        return Step(KIND, target.key, f"no P99.9 data: {where} timeout left at {current['raw']} "
                    f"({observed['query']})", before=before, after=dict(before["timeout"]), noop=True)
    p999_ms = float(p999["value"]) * _MS_PER_UNIT[params.unit]
    if not math.isfinite(p999_ms) or p999_ms < 0:
        raise PermanentError(f"P99.9 query returned {p999['value']}, not a latency: {observed['query']}")
    proposed = compute_timeout_ms(p999_ms, params.floor_ms, params.factor, params.min_ms, params.max_ms)
    raw = encode(proposed)
    why = (f"P99.9 {p999_ms:.1f} ms x {params.factor:g} (floor {params.floor_ms:g} ms, "
           f"clamp {params.min_ms:g}-{params.max_ms:g} ms) -> {proposed} ms")
    after = {"raw": raw, "ms": proposed, "p999Ms": p999_ms}
    if raw == current["raw"]:
        return Step(KIND, target.key, f"{where} timeout already {raw}: {why}", before, after, noop=True)
    if not should_write(current["ms"], proposed, params.hysteresis):
        return Step(KIND, target.key, f"{where} timeout stays {current['raw']}: {why} is within "
                    f"{params.hysteresis:.0%} hysteresis", before, after, noop=True)
    extra = current.get("extra") or {}
    refuse_owned(extra.get("object", where), extra.get("owner"), allowed_owners(params))
    return Step(KIND, target.key, f"{where} timeout {current['raw']} -> {raw}: {why}", before, after)


# ---- I/O ------------------------------------------------------------------------------------


class SinkTimeout:
    """A sink's timeout as a compare-and-swap value (actions._compare_and_swap.Swap)."""

    what = "timeout"

    def __init__(self, sink: TimeoutSink, effect_key: str | None, allowed: Sequence[str] = ()) -> None:
        self._sink = sink
        self._effect_key = effect_key  # marks every write (annotation, Idempotency-Key)
        self._allowed = allowed  # owners whose object we write anyway (allowOwnedBy)

    async def read(self) -> TimeoutReading:
        return await self._sink.read()

    def value(self, reading: TimeoutReading) -> Any:
        return reading.raw

    def where(self, reading: TimeoutReading) -> str:
        return reading.where

    def show(self, value: Any) -> str:
        return str(value)

    def ours(self, reading: TimeoutReading) -> bool:
        return marked_by(reading.extra.get("mark"), self._effect_key)

    def refusal(self, reading: TimeoutReading) -> str | None:
        return refusal(reading.extra.get("object", reading.where), reading.extra.get("owner"), self._allowed)

    async def write(self, reading: TimeoutReading, wanted: Any) -> Mapping[str, Any]:
        written = await self._sink.write(wanted, reading, self._effect_key)
        return {"version": written.version}


class RetuneTimeout:
    """The `gateway.retune_timeout` action (see RetuneTimeoutParams)."""

    kind: ClassVar[str] = KIND
    Params: ClassVar[type[ActionParams]] = RetuneTimeoutParams
    advisory: ClassVar[bool] = False

    def __init__(self, deps: ActionDeps) -> None:
        self._deps = deps

    def _sink(self, params: RetuneTimeoutParams) -> TimeoutSink:
        sink: TimeoutSink = sink_class(params.sink.kind)(params.sink, self._deps)
        return sink

    async def observe(self, target: Target, params: RetuneTimeoutParams) -> Mapping[str, Any]:
        if self._deps.query is None:
            raise PermanentError("gateway.retune_timeout needs Prometheus (prometheus.url is not set)")
        query = render_query(params.query, {"model": target.model, "namespace": target.namespace})
        result = await self._deps.query(query)
        p999 = classify_result(result)
        current = await self._sink(params).read()
        log.info("retune observed", query=query, p999=p999, unit=params.unit, current=current.raw,
                 sink=current.where)
        return {"query": query, "p999": p999, "current": {**current.as_dict(), "extra": dict(current.extra)}}

    def plan(self, target: Target, params: RetuneTimeoutParams, observed: Mapping[str, Any],
             signal: Signal) -> Step:
        return plan_retune(target, params, observed, self._sink(params).encode)

    async def _swap(self, params: RetuneTimeoutParams, step: Step, expected_raw: Any, want_raw: Any,
                    reading: TimeoutReading | None, purpose: str) -> Outcome:
        """Compare-and-swap the sink from `expected_raw` to `want_raw` (`reading`: trust it for the first
        try), marked with the step's effect key."""
        value = SinkTimeout(self._sink(params), step.effect_key, allowed_owners(params))
        return await compare_and_swap(value, expected=expected_raw, wanted=want_raw, purpose=purpose,
                                      max_retries=params.max_conflict_retries, seen=reading)

    async def apply(self, step: Step, target: Target, params: RetuneTimeoutParams) -> Outcome:
        if step.noop:
            return Outcome.noop(step.summary)
        seen = step.before["timeout"]
        reading = TimeoutReading(seen["raw"], seen["ms"], seen["version"], seen["where"], seen.get("extra", {}))
        return await self._swap(params, step, seen["raw"], step.after["raw"], reading, "apply")

    async def verify(self, step: Step, target: Target, params: RetuneTimeoutParams) -> Outcome:
        try:
            reading = await self._sink(params).read()
        except ActionError as exc:
            return Outcome.failure(f"verify: {exc}", retryable=exc.retryable)
        if reading.raw != step.after["raw"]:
            # Changed since our write (a revert by its owner?): reported, never fought.
            owner = reading.extra.get("owner")
            return Outcome.failure(f"verify: {reading.where} timeout is {reading.raw}, expected "
                                   f"{step.after['raw']}{changed_by_note(owner)}", retryable=False,
                                   found=reading.raw, changedBy=last_writer(owner))
        mark = reading.extra.get("mark")
        return Outcome.success(f"verify: {reading.where} timeout is {reading.raw}{stamp_note(mark, step.effect_key)}",
                               ours=marked_by(mark, step.effect_key))

    async def revert(self, step: Step, target: Target, params: RetuneTimeoutParams) -> Outcome:
        """Restore exactly the value seen before (an absent timeout is removed again)."""
        if step.noop:
            return Outcome.noop("nothing was changed")
        return await self._swap(params, step, step.after["raw"], step.before["timeout"]["raw"], None, "revert")
