"""What the journal hands out and takes in: its record types, with named fields, and the few
constants its rows use. Times are unix seconds."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

from core.decision import DecisionState
from core.signal import Signal
from daemon.storage.step_kinds import StepPhase, StepStatus

DAEMON_SCOPE = "*"  # the freezes row `target` of a freeze on the whole daemon (every target)
FOREVER = 253402300799.0  # 9999-12-31T23:59:59Z: the `until` of a freeze that lasts until lifted

RECOVERY = "recovery"  # the action of a decision's recovery rows (phase StepPhase.RECOVERY: pending, then the verdict)



class NewSignal(NamedTuple):
    """A signal just inserted, with the id the journal gave it. Unpacks as (id, signal): the intake's
    hot path builds thousands of these, and its readers unpack them."""

    id: int
    signal: Signal


class SignalsRecorded(NamedTuple):
    """What recording signals returns (not daemon/workers/signal_intake.py's Recorded, the intake's
    answer to a sender): the new ones, and how many were duplicates. Unpacks as (new, duplicates)."""

    new: list[NewSignal]
    """The signals inserted, in the order given."""
    duplicates: int

# Called with the new ones once they are committed.
OnCommit = Callable[[list[NewSignal]], None]


@dataclass(frozen=True)
class StoredSignal:
    id: int
    dedup_key: str
    payload: dict[str, Any]
    state: str
    received_at: float = 0.0  # unix time it was journaled (the age that expires it)


@dataclass(frozen=True)
class Decision:
    id: int
    signal_id: int
    policy: str
    target: str
    at: float
    state: DecisionState
    reason: str
    plan: dict[str, Any]
    executed: bool


class GuardHistory(NamedTuple):
    """What the guards count of one (policy, target): its executed plans, local or imported."""

    last: float | None  # when the last one was executed (None: never)
    executed: int  # how many within the window asked for


class ExecutedMark(NamedTuple):
    """An executed plan of `policy` on `target` at `at`, local or imported (guard_marks)."""

    policy: str
    target: str
    at: float


@dataclass(frozen=True)
class LatestDecision:
    """The latest decision of one (policy, target), with the signal it answered (operator status)."""

    id: int
    policy: str
    target: str
    at: float
    state: str  # as DecisionState's values, `expired` included
    reason: str
    signal_name: str
    signal_source: str
    signal_at: float


@dataclass(frozen=True)
class StepRecord:
    """What `Decisions.record_step` journals: one step row of a decision (the journal stamps `at`)."""

    decision_id: int
    idx: int  # the action's index in the plan (-1: the decision's recovery)
    action: str
    phase: StepPhase
    status: StepStatus
    message: str
    data: dict[str, Any]
    duration_seconds: float | None = None


@dataclass(frozen=True)
class StepRow:
    """One row of a decision's steps: an action's phase (intent, apply, verify, revert) and how
    it went, or a recovery row (phase RECOVERY: pending, then the verdict)."""

    id: int
    decision_id: int
    idx: int  # the action's index in the plan (-1: the decision's recovery)
    action: str
    phase: StepPhase
    status: StepStatus
    message: str
    data: dict[str, Any]
    at: float
    duration_seconds: float | None


@dataclass(frozen=True)
class RecoveryRow:
    """A decision's last recovery row (phase RECOVERY): `status` pending while its check is in
    flight, else the verdict (recovered, not_recovered, unknown)."""

    id: int
    status: StepStatus
    message: str
    data: dict[str, Any]
    at: float


@dataclass(frozen=True)
class CheckInFlight:
    """A recovery check put in flight as its decision ends (Decisions.finish): the pending
    recovery row's message and data."""

    message: str
    data: dict[str, Any]


@dataclass(frozen=True)
class FreezeRequest:
    """The freeze of `target` until `until` that escalates a recovery verdict, journaled in the
    verdict's transaction (Decisions.record_verdict)."""

    target: str
    reason: str
    until: float


@dataclass(frozen=True)
class OpenRecovery:
    """A decision whose recovery is not settled: its check is in flight (`row` is the pending row),
    or its verdict asked for a revert that has not finished (`row` is the verdict)."""

    decision: Decision
    row: RecoveryRow


@dataclass(frozen=True)
class Freeze:
    id: int
    target: str
    reason: str
    at: float
    until: float
    decision_id: int | None
    lifted_at: float | None = None
    lifted_reason: str | None = None
    by: str | None = None  # who froze: a token name, a ConfigMap's field manager; None: tailguard itself
    source: str | None = None  # api | cli | configmap | escalation (None: escalation or imported)
    lifted_by: str | None = None


@dataclass(frozen=True)
class Approval:
    """A plan waiting for an operator (`approval: required`), or what became of it."""

    id: int
    decision_id: int
    policy: str
    target: str
    requested_at: float
    deadline: float
    status: str  # pending | approved | expired
    decided_at: float | None = None
    decided_by: str | None = None
    reason: str | None = None


@dataclass(frozen=True)
class Pin:
    """The version `target` must serve (re-applied to new replicas), from the rollback that made it."""

    target: str
    model: str
    version: int
    at: float
    from_version: int | None = None  # the version rolled back from (None: unknown, or imported)
    decision_id: int | None = None
    signal: str | None = None  # the name of the signal the decision answered
    reason: str = ""
    policy: str | None = None


@dataclass(frozen=True, kw_only=True)
class EndedPin(Pin):
    """A pin that ended (roll-forward, policy gone, unpin, revert): its pin_history row."""

    id: int
    ended_at: float
    ended_reason: str


@dataclass(frozen=True)
class BadVersionMark:
    """`version` of `target` marked bad (rolled back from, or by hand): `to: previous` skips it
    until the mark is cleared."""

    id: int
    target: str
    version: int
    reason: str
    decision_id: int | None
    at: float
    cleared_at: float | None = None
    cleared_reason: str | None = None


@dataclass(frozen=True)
class Term:
    """The fencing token of the replica that acts: handed out by the journal on each takeover."""

    term: int
    holder: str
    since: float
    lease_transitions: int | None = None


# ---- what the cluster state shares besides live pins and guard marks ----------------------------


@dataclass(frozen=True)
class PinEnd:
    """The newest end of a target's pin: the pin made at `at` ended at `ended_at`."""

    target: str
    at: float
    ended_at: float
    reason: str


@dataclass(frozen=True)
class BadMark:
    """`version` of `target` marked bad at `at`, in force."""

    target: str
    version: int
    reason: str
    at: float


@dataclass(frozen=True)
class BadClear:
    """The marks on `version` of `target` made at or before `at` were cleared then."""

    target: str
    version: int
    at: float
    reason: str


@dataclass(frozen=True)
class FreezeMark:
    """A freeze of `target` made at `at`, in force until `until`."""

    target: str
    reason: str
    at: float
    until: float


@dataclass(frozen=True)
class Lift:
    """The freezes of `target` made at or before `at` were lifted then; `until` is the latest end
    of the freezes lifted (the lift is worth sharing while they would still be in force)."""

    target: str
    at: float
    reason: str
    until: float


@dataclass(frozen=True)
class SharedState:
    """What the cluster state shares besides live pins and guard marks (ClusterMerge.shared_state,
    ClusterMerge.merge)."""

    pin_ends: tuple[PinEnd, ...] = ()
    bad_marks: tuple[BadMark, ...] = ()  # in force
    bad_clears: tuple[BadClear, ...] = ()
    freezes: tuple[FreezeMark, ...] = ()  # in force
    lifts: tuple[Lift, ...] = ()


# ---- the signals and evaluations tables' rows, and what the cluster merge changed -----------------


@dataclass(frozen=True)
class SignalRow:
    """One signals row as journaled (Signals.all), its payload decoded: every column, where
    StoredSignal carries what the workers act on."""

    id: int
    dedup_key: str
    source: str
    name: str
    policy: str | None
    received_at: float
    payload: dict[str, Any]
    state: str  # pending | processed
    processed_at: float | None


@dataclass(frozen=True)
class Verdict:
    """A detector's verdict on one series, to journal (Evaluations.record_many; the journal stamps `at`)."""

    policy: str
    trigger_index: int
    series: str
    fired: bool
    reason: str


@dataclass(frozen=True)
class EvaluationRow:
    """The latest verdict on one series of a policy's trigger (Evaluations.all)."""

    policy: str
    trigger_index: int
    series: str
    at: float
    fired: bool
    reason: str


@dataclass(frozen=True)
class MergeCounts:
    """What ClusterMerge.merge changed: pins inserted, replaced or ended; guard marks added;
    bad-version and freeze rows added or updated."""

    pins: int
    marks: int
    other: int


@dataclass(frozen=True)
class EffectRow:
    """One effects row (Effects.of): a write the door let through or refused, its intent or its
    result, or a pin reconciler's mark; `data` is the writer's own (a JSON column)."""

    id: int
    at: float
    writer: str  # executor | pins | revert | warm: who asked the door
    target: str
    kind: str  # triton.load | kube.patch | sink.write | pin.repin | pin.escalated ...
    status: str  # intent | done | failed | refused
    message: str
    data: dict[str, Any]
    term: int | None
    decision_id: int | None
