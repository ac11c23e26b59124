"""The remediation policy schema: strict pydantic models, one YAML document per policy.

Action and detector parameters are validated separately against each plugin's own model
(see `policies.loader`), so this module knows no plugin.
"""
from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from core.durations import parse_duration

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
# A Kubernetes Service's cluster DNS name (<service>.<namespace>.svc[.<cluster domain>]): one virtual
# address in front of every pod. A pod's own name under a headless Service has one label more.
_SERVICE_NAME = re.compile(r"^https?://[^./:]+\.[^./:]+\.svc(\.cluster\.local)?\.?(:\d+)?/?$", re.IGNORECASE)


def _seconds(value: Any) -> float:
    return parse_duration(value)


_DURATION_JSON = {"anyOf": [{"type": "number", "minimum": 0},
                            {"type": "string", "pattern": r"^(\d+(\.\d+)?(ms|s|m|h|d|w))+$"}]}
# A duration written as `30s`, `5m`, `1h30m` or seconds; stored as float seconds.
Seconds = Annotated[float, BeforeValidator(_seconds), WithJsonSchema(_DURATION_JSON)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class ServiceSpec(Strict):
    namespace: str
    name: str
    port: int = Field(8000, ge=1, le=65535)
    scheme: str = Field("http", pattern="^https?$")


class TritonSpec(Strict):
    """Where the target's Triton replicas are: a static list, or a Service's EndpointSlices."""

    endpoints: list[str] = Field(default_factory=list)
    service: ServiceSpec | None = None
    # Where detectors with `source: triton` read /metrics; default: each static endpoint's host on
    # Triton's metrics port 8002.
    metrics_endpoints: list[str] = Field(default_factory=list, alias="metricsEndpoints")

    @model_validator(mode="after")
    def _one_source(self) -> "TritonSpec":
        if bool(self.endpoints) == bool(self.service):
            raise ValueError("give exactly one of 'endpoints' (static URLs) or 'service'")
        for url in self.endpoints:
            if not re.match(r"^https?://[^/\s]+/?$", url):
                raise ValueError(f"endpoint {url!r} must look like http://host:port")
            if _SERVICE_NAME.match(url):
                raise ValueError(f"endpoint {url!r} is a Service's load-balanced name: a load and the verify after "
                                 "it would reach different pods; name each pod (a StatefulSet's "
                                 "<pod>.<service>.<namespace>.svc, or its address), or use `service:` (its "
                                 "EndpointSlices)")
        for url in self.metrics_endpoints:
            if not re.match(r"^https?://[^/\s]+(/\S*)?$", url):
                raise ValueError(f"metrics endpoint {url!r} must look like http://host:8002/metrics")
        return self


class TargetSpec(Strict):
    model: str = Field(min_length=1)
    namespace: str = "default"
    triton: TritonSpec | None = None


class GateSpec(Strict):
    """The evidence gate of the former rule (before the governed alert, `policies.governance`): on an
    alert trigger that `actsUngoverned`, a veto, journaled with why, when every version of the target
    is shown within budget at `error` (the detector's lookback, Wald's acceptance). On a governed
    alert trigger (the default) `detector` names the trigger that governs it and `error` weighs
    nothing: the alert starts a rollback only as the liveness backstop (docs/detectors.md, "The
    alert backstop")."""

    detector: int | None = None
    """The index of the detector trigger whose evidence gates (default: the policy's only one
    that counts requests above a line, tail_excess)."""
    error: float = Field(0.01, gt=0, lt=0.5)
    """How often a veto may be wrong: a version really at the smallest regression the detector
    watches (2x the budget) is shown within budget at most this often."""


class AlertTrigger(Strict):
    """Fires on an Alertmanager alert with this name whose labels match."""

    name: str = Field(min_length=1)
    matchers: dict[str, str] = Field(default_factory=dict)
    # The alert label that names the model; when set, it must equal target.model so that an
    # alert about another model never acts on this target.
    target_label: str | None = Field("model", alias="targetLabel")
    include_resolved: bool = Field(False, alias="includeResolved")
    gate: GateSpec | None = None
    # On a policy with a rollback-class action the alert is governed (`policies.governance`): it starts
    # the rollback only when no detector trigger of the policy has judged fresh data of the target for
    # longer than this (a restart's first `backstopAfter` are not missing evidence); otherwise it is
    # journaled notify-only. 5 min: ten times tail_excess's staleness horizon, so a slow cycle or a
    # scrape outage of a few minutes is not read as a blind detector.
    backstop_after: Seconds = Field(300.0, alias="backstopAfter")
    # The detector trigger (its index) whose evidence governs the alert; default: every live
    # detector trigger of the policy (`gate.detector` when a gate names one).
    governed_by: int | None = Field(None, alias="governedBy", ge=0)
    # true: the alert starts the policy's actions on its own, outside the policy's stated false-alarm
    # rate (the policy loads with a warning; a `gate` then vetoes as it did before the governed rule).
    acts_ungoverned: bool = Field(False, alias="actsUngoverned")

    @field_validator("backstop_after")
    @classmethod
    def _backstop_floor(cls, value: float) -> float:
        if value < 60:
            raise ValueError("backstopAfter must be at least 60s: shorter reads a slow detector cycle or a "
                             "brief scrape outage as a blind detector")
        return value


class DetectorTrigger(Strict):
    """Runs a detector over a PromQL query on a schedule."""

    type: str = Field(min_length=1)
    query: str = Field(min_length=1)
    # Optional P99 query for tail-divergence (P99.9 rises while P99 stays put).
    companion_query: str | None = Field(None, alias="companionQuery")
    interval: Seconds = 15.0
    # The series label that names the model; series of other models are ignored.
    model_label: str = Field("model", alias="modelLabel")
    # prometheus: range queries (PromQL). triton: the target's Triton /metrics read directly at
    # `interval` (queries are plain selectors), for when the scrape interval is the bottleneck.
    source: Literal["prometheus", "triton"] = "prometheus"
    params: dict[str, Any] = Field(default_factory=dict)

    @field_validator("interval")
    @classmethod
    def _interval_floor(cls, value: float) -> float:
        if value < 1:
            raise ValueError("interval must be at least 1s")
        return value


class ScheduleTrigger(Strict):
    """Runs the actions every `every`, e.g. to retune a breaker timeout from live P99.9."""

    every: Seconds

    @field_validator("every")
    @classmethod
    def _every_floor(cls, value: float) -> float:
        if value < 5:
            raise ValueError("every must be at least 5s")
        return value


class Trigger(Strict):
    alert: AlertTrigger | None = None
    detector: DetectorTrigger | None = None
    schedule: ScheduleTrigger | None = None
    # Shadow: its signals are decided and journaled as what would have been done, never applied, and
    # never count toward the policy's cooldown or rate limit (try a trigger beside live ones).
    shadow: bool = False

    @model_validator(mode="after")
    def _exactly_one(self) -> "Trigger":
        given = [k for k in ("alert", "detector", "schedule") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                f"a trigger has exactly one of 'alert', 'detector', 'schedule' (got {given or 'none'})"
            )
        return self


class Guards(Strict):
    """Bounds on blast radius, per policy and target."""

    cooldown: Seconds = 600.0
    dry_run: bool = Field(False, alias="dryRun")
    max_actions: int = Field(3, ge=1, alias="maxActions")
    max_actions_window: Seconds = Field(3600.0, alias="maxActionsWindow")
    on_failure: str = Field("stop", pattern="^(stop|revert)$", alias="onFailure")


class VerifySpec(Strict):
    """Did acting help? After a plan succeeds, `query` (PromQL; `$model` / `$namespace` escaped as in
    detector queries) must stay below (or above) a line for `for` within `within`, sampled every
    `interval`; else `onNotRecovered` follows: escalate (notify and freeze the target), revert (undo
    the decision's steps) or none (journal only). No data is never read as recovered."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, populate_by_name=True, allow_inf_nan=False,
        json_schema_extra={"oneOf": [{"required": ["below"]}, {"required": ["above"]}]})

    query: str = Field(min_length=1)
    below: float | None = None
    above: float | None = None
    hold: Seconds = Field(60.0, alias="for")
    within: Seconds = 180.0
    interval: Seconds = 15.0
    on_not_recovered: Literal["escalate", "revert", "none"] = Field("escalate", alias="onNotRecovered")

    @model_validator(mode="after")
    def _consistent(self) -> "VerifySpec":
        if (self.below is None) == (self.above is None):
            raise ValueError("give exactly one of 'below' and 'above'")
        if self.interval < 1:
            raise ValueError("interval must be at least 1s")
        if self.within <= 0 or self.hold > self.within:
            raise ValueError("need 'for' <= 'within' and 'within' > 0")
        if self.interval > self.within:
            raise ValueError("'interval' must not be longer than 'within'")
        return self


class ActionSpec(BaseModel):
    """`type` picks the action; every other key is that action's parameter (checked by the loader)."""

    model_config = ConfigDict(extra="allow", frozen=True)
    type: str = Field(min_length=1)

    def params(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class Policy(Strict):
    name: str
    description: str = ""
    enabled: bool = True
    target: TargetSpec
    triggers: list[Trigger] = Field(min_length=1)
    actions: list[ActionSpec] = Field(min_length=1)
    guards: Guards = Field(default_factory=Guards)
    # None: a policy with a detector trigger checks the detector's own line; others check nothing.
    verify: VerifySpec | None = None
    # required: each plan is journaled and waits for `tailguard approve <id>` (or the API) until
    # approvalTimeoutSeconds have passed, then expires unapplied.
    approval: Literal["none", "required"] = "none"
    approval_timeout_seconds: Seconds = Field(3600.0, alias="approvalTimeoutSeconds", gt=0)

    @model_validator(mode="after")
    def _triton_source_has_endpoints(self) -> "Policy":
        reads_triton = any(t.detector is not None and t.detector.source == "triton" for t in self.triggers)
        triton = self.target.triton
        if reads_triton and (triton is None or not (triton.metrics_endpoints or triton.endpoints)):
            raise ValueError("a detector with source: triton needs target.triton.metricsEndpoints "
                             "(or static target.triton.endpoints)")
        return self

    @field_validator("name")
    @classmethod
    def _dns_name(cls, value: str) -> str:
        if not _NAME.match(value) or len(value) > 253:
            raise ValueError("name must be lower-case letters, digits, '-' and '.' (DNS-1123)")
        return value
