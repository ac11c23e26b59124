"""The executor: revert across steps, retries of transient applies (the wait a TemporaryError asks
for), leadership lost mid-plan, exceptions from actions (never retried), noop steps, decisions resumed after a crash between an apply and its
record, notify steps that never stop a plan, frozen targets, the recovery watch after a plan
(verdicts, escalate / revert / none, resumed after a restart), what approving answers and approved
plans resumed, and preview on the same ladder; on a real journal with policies loaded from YAML."""
from __future__ import annotations

import asyncio
import sqlite3
import time
from contextlib import closing
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, AsyncIterator, Callable, ClassVar, Mapping

import pytest
import structlog

from actions.base import ActionDeps, ActionParams, Step
from core.outcome import Declined, Outcome, PermanentError, TemporaryError
from core.query import QueryResult, Sample
from core.signal import Signal, SignalSource
from core.target import Target
from daemon.common.config import BlastRadiusSettings, Settings
from daemon.common.metrics import Metrics
from daemon.storage.journal import Journal
from daemon.storage.errors import JournalError
from daemon.storage.records import StepRecord, StepRow
from daemon.storage.step_kinds import StepPhase
from daemon.workers.approvals import ApprovalOutcome
from daemon.workers.backlog import Backlog
from daemon.workers.context import ActContext
from daemon.workers.executor import Executor, ExecutorLimits
from daemon.workers.progress import INTENT, MAX_APPLY_ATTEMPTS
from daemon.workers.steps import MAX_RETRY_DELAY_SECONDS
from daemon.workers.state import ExecutorState
from daemon.workers.verdicts import Blocked, NeedsApproval
from policies.loader import load_policies_text
from policies.planning import Plan
from tests.support.helpers import FakeTimer, wait_for

ALERT = "TailLatencyHigh"
MODEL = "ranker"


# ---- test actions ------------------------------------------------------------------------------

class ScriptParams(ActionParams):
    """What a test action does, written in the policy next to its `type`."""

    observe: str = "ok"  # ok | raise
    plan: str = "change"  # change | noop | raise | decline
    # per attempt, the last one repeats: ok|retry|fail|temporary|permanent|raise, or a crash of the
    # process between the call and its record: crash (the change landed) | crash_before (it did not)
    apply: tuple[str, ...] = ("ok",)
    # ok | fail | observe (OK when a change of this action landed, else failure) | blind (NOOP: cannot observe)
    # | reapply_once (the first verify asks to apply again)
    verify: str = "ok"
    revert: str = "ok"  # ok | fail
    delay: float = 1.0  # the delay_seconds of a `temporary` apply's TemporaryError
    pin: bool = False  # a verified apply asks the daemon to remember a pin (as triton.rollback does)
    precondition: str = "ok"  # test.guarded only: ok | changed (the target is no longer as planned)


class Crash(BaseException):
    """The process dies here (nothing catches a BaseException on the way out, as with SIGKILL)."""


@dataclass(frozen=True)
class Call:
    phase: str  # observe | plan | apply | verify | revert
    kind: str
    step: Step | None = None


class ScriptedAction:
    """Does what its params say and records every call, in order, in the shared `calls`, and every
    change that landed in the shared `effects`."""

    kind: ClassVar[str]
    Params: ClassVar[type[ActionParams]] = ScriptParams
    advisory: ClassVar[bool] = False
    calls: ClassVar[list[Call]]
    effects: ClassVar[list[Step]]

    def __init__(self, deps: ActionDeps) -> None:
        self.deps = deps

    async def observe(self, target: Target, params: ScriptParams) -> Mapping[str, Any]:
        self.calls.append(Call("observe", self.kind))
        if params.observe == "raise":
            raise RuntimeError("observe boom")
        return {"value": "old"}

    def plan(self, target: Target, params: ScriptParams, observed: Mapping[str, Any], signal: Signal) -> Step:
        self.calls.append(Call("plan", self.kind))
        if params.plan == "raise":
            raise RuntimeError("plan boom")
        if params.plan == "decline":
            raise Declined(f"{target.key}: requireAttribution: the anomaly is on version 1")
        return Step(self.kind, target.key, f"{self.kind}: old -> new", before=dict(observed),
                    after={"value": "new"}, noop=params.plan == "noop")

    async def apply(self, step: Step, target: Target, params: ScriptParams) -> Outcome:
        self.calls.append(Call("apply", self.kind, step))
        attempt = sum(1 for c in self.calls if c.phase == "apply" and c.kind == self.kind)
        what = params.apply[min(attempt, len(params.apply)) - 1]
        if what in ("ok", "crash"):
            self.effects.append(step)
        if what in ("crash", "crash_before"):
            raise Crash(f"{self.kind} crashed in apply")
        if what == "retry":
            return Outcome.failure("transient failure", retryable=True)
        if what == "fail":
            return Outcome.failure("permanent failure")
        if what == "temporary":
            raise TemporaryError("transient error", delay_seconds=params.delay)
        if what == "permanent":
            raise PermanentError("permanent error")
        if what == "raise":
            raise RuntimeError("boom")
        return Outcome.success("applied")

    async def verify(self, step: Step, target: Target, params: ScriptParams) -> Outcome:
        self.calls.append(Call("verify", self.kind, step))
        if params.verify == "blind":
            return Outcome.noop("cannot be observed")
        if params.verify == "reapply_once":  # a part the apply could not settle yet, the first time only
            if sum(1 for c in self.calls if c.phase == "verify" and c.kind == self.kind) == 1:
                return Outcome.failure("replica-c back on the old version", retryable=True, reapply=True)
            return Outcome.success("verified")
        if params.verify == "observe":
            landed = any(e.action == self.kind for e in self.effects)
            pin = {"pin": {"model": MODEL, "version": 1}} if params.pin else {}
            return Outcome.success("new value in place", **pin) if landed else Outcome.failure("old value in place")
        if params.verify != "ok":
            return Outcome.failure("not as wanted")
        return Outcome.success("verified", **({"pin": {"model": MODEL, "version": 1}} if params.pin else {}))

    async def revert(self, step: Step, target: Target, params: ScriptParams) -> Outcome:
        self.calls.append(Call("revert", self.kind, step))
        return Outcome.success("reverted") if params.revert == "ok" else Outcome.failure("revert refused")


class GuardedAction(ScriptedAction):
    """A scripted action that offers preconditions (`actions.base.Preconditions`), as triton.rollback does."""

    async def preconditions(self, step: Step, target: Target, params: ScriptParams) -> Outcome:
        self.calls.append(Call("preconditions", self.kind, step))
        if params.precondition == "changed":
            return Outcome.failure("not as planned", changed={"replica-a": "serves [3], planned at [2]"})
        return Outcome.success("as planned")


def _registry(calls: list[Call], effects: list[Step],
              advisory: tuple[str, ...] = ("notify",)) -> dict[str, type[ScriptedAction]]:
    """Scripted actions of five kinds; those in `advisory` say so (notify, as Notify does);
    test.guarded offers preconditions."""
    kinds = ("test.step_a", "test.step_b", "test.step_c", "notify", "test.guarded")
    return {k: type(f"Action_{k.split('.')[-1]}", (GuardedAction if k == "test.guarded" else ScriptedAction,),
                    {"kind": k, "calls": calls, "effects": effects, "advisory": k in advisory})
            for k in kinds}


# An alert-only policy must have a verify block; this one's outcome is irrelevant to the tests that do
# not give their own: the harness lends no Prometheus unless a test asks (`query`), so the check
# settles `unknown` at once, and `none` follows: journaled, nothing else.
NO_CHECK = "{query: up, below: 1, onNotRecovered: none}"


def _policy(*actions: str, name: str = "remediate", on_failure: str | None = None, verify: str = NO_CHECK,
            cooldown: str | None = None) -> str:
    """One policy document: a TailLatencyHigh alert on model `ranker` runs `actions` (YAML flow maps)."""
    lines = [f"name: {name}", f"target: {{model: {MODEL}}}", "triggers:", f"  - alert: {{name: {ALERT}}}",
             "actions:", *(f"  - {a}" for a in actions)]
    guards = [f"onFailure: {on_failure}"] * (on_failure is not None) + [f"cooldown: {cooldown}"] * (cooldown is not None)
    if guards:
        lines.append(f"guards: {{{', '.join(guards)}}}")
    lines.append(f"verify: {verify}")
    return "\n".join(lines) + "\n"


# ---- harness -----------------------------------------------------------------------------------

@dataclass
class Harness:
    journal: Journal
    journal_path: Path | None = None
    calls: list[Call] = field(default_factory=list)
    effects: list[Step] = field(default_factory=list)
    sleeps: list[float] = field(default_factory=list)
    metrics: Metrics = field(default_factory=Metrics)  # of the last executor made
    made: list[Executor] = field(default_factory=list)  # every executor made, settled at teardown
    now: float = field(default_factory=time.time)
    events: list[dict[str, Any]] = field(default_factory=list)  # outcome notifications handed over
    advance: bool = False  # sleeping moves `now` (recovery watches)
    gate: asyncio.Event | None = None  # when set, sleeps wait for it (a watch caught mid-wait)
    timer: FakeTimer | None = None  # when set, the executors' time and sleeps (concurrent sleepers)

    def executor(self, policies_yaml: str, may_act: Callable[[], bool] = lambda: True,
                 query: Callable[[float], float | None] | None = None, notify: Any = None,
                 blast_radius: BlastRadiusSettings | None = None,
                 advisory: tuple[str, ...] = ("notify",), max_signal_age: float | None = None) -> Executor:
        """An executor on the journal; `query` gives the verify query's value at a time since the
        first fire (None: no data); the action kinds in `advisory` say they are."""
        registry = _registry(self.calls, self.effects, advisory)
        policies = load_policies_text(policies_yaml, "test.yaml", registry, {})
        started = self.now

        async def sleep(delay: float) -> None:
            self.sleeps.append(delay)
            if self.timer is not None:
                return await self.timer.sleep(delay)
            if self.gate is not None:
                await self.gate.wait()
            if self.advance:
                self.now += delay

        async def prometheus(promql: str) -> QueryResult:
            assert query is not None
            value = query(self.now - started)
            return QueryResult(promql, () if value is None else (Sample({"model": MODEL}, value),))

        self.metrics = Metrics()
        ctx = ActContext(self.journal, ExecutorState(policies),
                         ActionDeps(query=prometheus if query is not None else None), self.metrics, registry,
                         may_act=may_act, clock=self.clock, sleep=sleep, notify=notify or self.events.append)
        self.made.append(Executor(ctx, limits=ExecutorLimits(blast_radius=blast_radius,
                                                             max_signal_age_seconds=max_signal_age)))
        return self.made[-1]

    def clock(self) -> float:
        return self.timer.now if self.timer is not None else self.now

    async def settle(self) -> None:
        """Let every recovery watch still running end (NO_CHECK's settle at once), then stop the
        executors: a test leaves no task behind."""
        if self.gate is not None:
            self.gate.set()
        for executor in self.made:
            await asyncio.wait_for(executor.wait_recoveries(), timeout=10)
            await executor.close()

    async def fire(self, executor: Executor, key: str = "alert-1") -> list[Plan]:
        """Journal one firing alert about `ranker` and process it, as a worker does."""
        return await executor.process(*await self._journaled(key))

    async def _journaled(self, key: str) -> tuple[int, Signal]:
        signal = Signal(SignalSource.ALERT, ALERT, {"model": MODEL}, datetime.now(timezone.utc), key)
        ((signal_id, stored),), duplicates = await self.journal.signals.intake([signal])
        assert duplicates == 0
        return signal_id, stored

    async def crash_and_restart(self, policies_yaml: str, after_restart: str | None = None) -> int:
        """Fire an alert into an executor that dies mid-plan (an action's apply raises Crash), then
        process the still-pending signal again with a new executor (policies `after_restart`, by
        default the same), as the daemon does after a restart. Returns the number of calls made
        before the restart."""
        signal_id, signal = await self._journaled("alert-1")
        with pytest.raises(Crash):
            await self.executor(policies_yaml).process(signal_id, signal)
        (decision,) = await self.journal.decisions.all.in_thread()
        assert decision.state == "executing"
        before = len(self.calls)
        await self.executor(after_restart or policies_yaml).process(signal_id, signal)
        return before

    def trace(self) -> list[tuple[str, str]]:
        return [(c.phase, c.kind) for c in self.calls]

    def trace_of(self, *phases: str) -> list[tuple[str, str]]:
        return [(c.phase, c.kind) for c in self.calls if c.phase in phases]

    async def results(self, decision_id: int, recovery: bool = False) -> list[StepRow]:
        """The decision's step rows without the intents journaled before each apply and, unless
        `recovery`, without the rows of its recovery check (about the decision as a whole, not a
        step: section 9 checks them; elsewhere they are NO_CHECK's, whose outcome is irrelevant)."""
        skip = (INTENT,) if recovery else (INTENT, "recovery")
        return [s for s in await self.journal.decisions.steps.in_thread(decision_id) if s.phase not in skip]

    async def step_rows(self, decision_id: int) -> list[StepRow]:
        """The decision's step rows, intents included, without its recovery check's (see `results`)."""
        return [s for s in await self.journal.decisions.steps.in_thread(decision_id) if s.phase != "recovery"]

    async def steps(self, decision_id: int, recovery: bool = False) -> list[tuple[int, str, str]]:
        return [(s.idx, s.phase, s.status) for s in await self.results(decision_id, recovery)]


@pytest.fixture
async def h(tmp_path: Path) -> AsyncIterator[Harness]:
    journal = Journal(tmp_path / "journal.db")
    harness = Harness(journal, tmp_path / "journal.db")
    yield harness
    await harness.settle()
    journal.close()


A, B, C = "test.step_a", "test.step_b", "test.step_c"
PLANNING = [("observe", A), ("plan", A), ("observe", B), ("plan", B), ("observe", C), ("plan", C)]


# ---- 1. revert across steps --------------------------------------------------------------------

async def test_failed_step_reverts_the_applied_steps_in_reverse_order(h: Harness):
    """onFailure: revert undoes steps 1 then 0 (never the failed step 2) and ends `reverted`."""
    ex = h.executor(_policy(f"{{type: {A}}}", f"{{type: {B}}}", f"{{type: {C}, apply: [fail]}}",
                            on_failure="revert"))

    await h.fire(ex)

    assert h.trace() == PLANNING + [
        ("apply", A), ("verify", A), ("apply", B), ("verify", B), ("apply", C),
        ("revert", B), ("revert", A),
    ]
    planned = {c.kind: c.step for c in h.calls if c.phase == "apply"}
    assert [c.step for c in h.calls if c.phase == "revert"] == [planned[B], planned[A]]
    assert planned[A] is not None and planned[A].before == {"value": "old"}  # what revert restores
    (decision,) = await h.journal.decisions.all.in_thread()
    assert decision.state == "reverted" and decision.executed
    assert decision.reason.startswith(f"step 2 ({C}) failed: permanent failure")
    assert await h.steps(decision.id) == [
        (0, "apply", "ok"), (0, "verify", "ok"),
        (1, "apply", "ok"), (1, "verify", "ok"),
        (2, "apply", "failed"),
        (1, "revert", "ok"), (0, "revert", "ok"),
    ]
    (signal,) = await h.journal.signals.all.in_thread()
    assert signal.state == "processed"


async def test_failed_step_with_default_on_failure_stops_without_revert(h: Harness):
    """The default onFailure (stop) reverts nothing and ends `failed`."""
    ex = h.executor(_policy(f"{{type: {A}}}", f"{{type: {B}}}", f"{{type: {C}, apply: [fail]}}"))

    await h.fire(ex)

    assert h.trace_of("apply", "verify", "revert") == [
        ("apply", A), ("verify", A), ("apply", B), ("verify", B), ("apply", C)]
    (decision,) = await h.journal.decisions.all.in_thread()
    assert decision.state == "failed"
    assert decision.reason == f"step 2 ({C}) failed: permanent failure"
    assert [phase for _, phase, _ in await h.steps(decision.id)] == ["apply", "verify", "apply", "verify", "apply"]


async def test_step_that_applied_but_failed_verify_is_reverted_too(h: Harness):
    """A step whose apply landed but whose verify failed is undone with the steps before it."""
    ex = h.executor(_policy(f"{{type: {A}}}", f"{{type: {B}, verify: fail}}", on_failure="revert"))

    await h.fire(ex)

    assert h.trace_of("apply", "verify", "revert") == [
        ("apply", A), ("verify", A), ("apply", B), ("verify", B), ("revert", B), ("revert", A)]
    (decision,) = await h.journal.decisions.all.in_thread()
    assert decision.state == "reverted"


async def test_failed_revert_leaves_the_decision_failed(h: Harness):
    """A revert that fails is not reported as reverted: the decision is `failed` and names the step."""
    ex = h.executor(_policy(f"{{type: {A}, revert: fail}}", f"{{type: {B}}}", f"{{type: {C}, apply: [fail]}}",
                            on_failure="revert"))

    await h.fire(ex)

    assert h.trace_of("revert") == [("revert", B), ("revert", A)]
    (decision,) = await h.journal.decisions.all.in_thread()
    assert decision.state == "failed"
    assert decision.reason == f"step 2 ({C}) failed: permanent failure; revert failed for step(s) [0]"


# ---- 2. retries of a retryable apply -----------------------------------------------------------

@pytest.mark.parametrize("transient", ["retry", "temporary"])
async def test_retryable_apply_is_retried_with_backoff_until_it_succeeds(h: Harness, transient: str):
    """A retryable failure (an Outcome or a TemporaryError) twice, then success: 3 attempts,
    sleeps of 1 s and 2 s, each attempt journaled with its number, then one verify."""
    ex = h.executor(_policy(f"{{type: {A}, apply: [{transient}, {transient}, ok]}}"))

    await h.fire(ex)

    assert h.trace_of("apply", "verify") == [("apply", A)] * 3 + [("verify", A)]
    assert h.sleeps == [1, 2]
    (decision,) = await h.journal.decisions.all.in_thread()
    assert decision.state == "succeeded"
    steps = await h.results(decision.id)
    assert [(s.phase, s.status, s.data.get("attempt")) for s in steps] == [
        ("apply", "failed", 1), ("apply", "failed", 2), ("apply", "ok", 3), ("verify", "ok", None)]


@pytest.mark.parametrize("permanent", ["fail", "permanent"])
async def test_non_retryable_apply_is_attempted_once(h: Harness, permanent: str):
    """A non-retryable failure (an Outcome or a PermanentError) is attempted once, with no sleep."""
    ex = h.executor(_policy(f"{{type: {A}, apply: [{permanent}, ok]}}"))

    await h.fire(ex)

    assert h.trace_of("apply", "verify") == [("apply", A)]
    assert h.sleeps == []
    (decision,) = await h.journal.decisions.all.in_thread()
    assert decision.state == "failed"
    steps = await h.results(decision.id)
    assert [(s.phase, s.status, s.data["attempt"]) for s in steps] == [("apply", "failed", 1)]


async def test_apply_that_keeps_failing_retryably_stops_at_max_attempts(h: Harness):
    """A retryable failure every time: MAX_APPLY_ATTEMPTS attempts, then the decision fails."""
    ex = h.executor(_policy(f"{{type: {A}, apply: [retry]}}"))

    await h.fire(ex)

    assert h.trace_of("apply", "verify") == [("apply", A)] * MAX_APPLY_ATTEMPTS
    # The backoff between attempts: 1 s, 2 s, ...; none after the last one (the target stays locked).
    assert h.sleeps == [2 ** i for i in range(MAX_APPLY_ATTEMPTS - 1)]
    (decision,) = await h.journal.decisions.all.in_thread()
    assert decision.state == "failed"
    assert decision.reason == f"step 0 ({A}) failed: transient failure"
    steps = await h.results(decision.id)
    assert [(s.phase, s.data["attempt"]) for s in steps] == [
        ("apply", n) for n in range(1, MAX_APPLY_ATTEMPTS + 1)]


# ---- 3. leadership lost between steps ----------------------------------------------------------

async def test_leadership_lost_between_steps_stops_before_the_next_apply(h: Harness):
    """may_act turning False after step 0 applied: step 1 is never applied, the decision fails."""
    def may_act() -> bool:
        return not any(c.phase == "apply" for c in h.calls)

    ex = h.executor(_policy(f"{{type: {A}}}", f"{{type: {B}}}", on_failure="revert"), may_act=may_act)

    await h.fire(ex)

    assert h.trace_of("apply", "verify", "revert") == [("apply", A), ("verify", A)]
    (decision,) = await h.journal.decisions.all.in_thread()
    assert decision.state == "failed"
    assert "step 1" in decision.reason and "this replica may no longer act" in decision.reason
    assert await h.steps(decision.id) == [(0, "apply", "ok"), (0, "verify", "ok")]


# ---- 4. unexpected exceptions from actions -----------------------------------------------------

async def test_apply_raising_becomes_a_failed_outcome_and_the_worker_goes_on(h: Harness):
    """An exception in apply is journaled as a failed apply; process returns and the next
    policy on the same signal (same target lock) still runs."""
    ex = h.executor(_policy(f"{{type: {A}, apply: [raise]}}", name="boom") + "---\n"
                    + _policy(f"{{type: {B}}}", name="after"))

    plans = await h.fire(ex)

    assert [p.policy for p in plans] == ["boom", "after"]
    boom, after = await h.journal.decisions.all.in_thread()
    assert boom.state == "failed" and f"{A}.apply raised RuntimeError: boom" in boom.reason
    steps = await h.results(boom.id)
    assert steps and all(s.phase == "apply" and s.status == "failed" for s in steps)
    assert all(f"{A}.apply raised RuntimeError: boom" in s.message for s in steps)
    assert len(steps) == len([c for c in h.calls if c.phase == "apply" and c.kind == A])
    assert ("verify", A) not in h.trace()
    assert after.state == "succeeded"
    assert h.trace_of("apply", "verify")[-2:] == [("apply", B), ("verify", B)]
    (signal,) = await h.journal.signals.all.in_thread()
    assert signal.state == "processed"
    assert not ex.lock_for(f"default/{MODEL}").locked()


async def test_unexpected_exception_in_apply_fails_the_step_at_once(h: Harness):
    """An exception that is no ActionError (a bug) is not retried: one attempt, no sleep, the apply row
    journaled failed with the exception's type and message and not retryable, a fault counted, the
    traceback logged; onFailure then applies as for any failed step (here: revert step 0)."""
    ex = h.executor(_policy(f"{{type: {A}}}", f"{{type: {B}, apply: [raise, ok]}}", on_failure="revert"))

    with structlog.testing.capture_logs() as logs:
        await h.fire(ex)

    assert h.trace_of("apply", "verify", "revert") == [("apply", A), ("verify", A), ("apply", B), ("revert", A)]
    assert h.sleeps == []
    (decision,) = await h.journal.decisions.all.in_thread()
    assert decision.state == "reverted"
    assert decision.reason == f"step 1 ({B}) failed: {B}.apply raised RuntimeError: boom; reverted"
    (row,) = [s for s in await h.results(decision.id) if s.idx == 1]
    assert (row.phase, row.status, row.data["attempt"]) == ("apply", "failed", 1)
    assert row.data["retryable"] is False
    assert row.data["exception"] == {"type": "RuntimeError", "message": "boom"}
    assert h.metrics.registry.get_sample_value("tailguard_faults_total", {"component": "actions"}) == 1
    (raised,) = [e for e in logs if e["event"] == "action raised"]
    assert raised["log_level"] == "error" and raised["exc_info"] is True  # logged with its traceback
    assert (raised["action"], raised["phase"], raised["error_type"]) == (B, "apply", "RuntimeError")


@pytest.mark.parametrize("delay, sleeps", [(0.5, [1, 2]), (1.5, [1.5, 2]), (5, [5, 5])])
async def test_temporary_error_delay_is_waited_before_the_next_attempt(h: Harness, delay: float,
                                                                       sleeps: list[float]):
    """TemporaryError(delay_seconds=d) twice, then success: each retry waits at least d (the backoff
    1 s, 2 s when it is longer); the asked delay is journaled with the attempt."""
    ex = h.executor(_policy(f"{{type: {A}, apply: [temporary, temporary, ok], delay: {delay}}}"))

    await h.fire(ex)

    assert h.trace_of("apply", "verify") == [("apply", A)] * 3 + [("verify", A)]
    assert h.sleeps == sleeps
    (decision,) = await h.journal.decisions.all.in_thread()
    assert decision.state == "succeeded"
    failed = [s for s in await h.results(decision.id) if s.status == "failed"]
    assert [(s.data["attempt"], s.data["retry_after_seconds"]) for s in failed] == [(1, delay), (2, delay)]


async def test_temporary_error_delay_keeps_the_attempts_bounded(h: Harness):
    """A TemporaryError with a delay every time: still MAX_APPLY_ATTEMPTS attempts, each wait the delay."""
    ex = h.executor(_policy(f"{{type: {A}, apply: [temporary], delay: 7}}"))

    await h.fire(ex)

    assert h.trace_of("apply") == [("apply", A)] * MAX_APPLY_ATTEMPTS
    assert h.sleeps == [7] * (MAX_APPLY_ATTEMPTS - 1)
    (decision,) = await h.journal.decisions.all.in_thread()
    assert decision.state == "failed" and decision.reason == f"step 0 ({A}) failed: transient error"


async def test_temporary_error_asking_for_more_than_the_longest_wait_is_not_retried(h: Harness):
    """A delay beyond MAX_RETRY_DELAY_SECONDS (the target stays locked while waiting): one attempt,
    no sleep, the step failed saying why, journaled not retryable (a restart does not retry it)."""
    ex = h.executor(_policy(f"{{type: {A}, apply: [temporary, ok], delay: {MAX_RETRY_DELAY_SECONDS + 1:g}}}"))

    await h.fire(ex)

    assert h.trace_of("apply") == [("apply", A)]
    assert h.sleeps == []
    (decision,) = await h.journal.decisions.all.in_thread()
    assert decision.state == "failed"
    assert decision.reason == (f"step 0 ({A}) failed: transient error; not retried: it asks to wait "
                               f"{MAX_RETRY_DELAY_SECONDS + 1:g}s, more than {MAX_RETRY_DELAY_SECONDS:g}s")
    (row,) = await h.results(decision.id)
    assert row.data["retryable"] is False


@pytest.mark.parametrize("phase", ["plan", "observe"])
async def test_planning_raising_becomes_a_failed_decision(h: Harness, phase: str):
    """An exception in plan (or observe) is a `failed` decision saying "planning failed"; nothing is applied."""
    ex = h.executor(_policy(f"{{type: {A}}}", f"{{type: {B}, {phase}: raise}}"))

    (plan,) = await h.fire(ex)

    assert h.trace_of("apply", "verify", "revert") == []
    (decision,) = await h.journal.decisions.all.in_thread()
    assert decision.state == "failed" and not decision.executed
    assert decision.reason.startswith("planning failed")
    assert f"{B}.{phase} raised RuntimeError: {phase} boom" in decision.reason
    assert plan.blocked == decision.reason
    assert await h.steps(decision.id) == []
    (signal,) = await h.journal.signals.all.in_thread()
    assert signal.state == "processed"


async def test_an_action_declining_is_a_blocked_decision_not_a_failure(h: Harness):
    """An action's own rule saying no (requireAttribution) journals `blocked` with its reason: no
    failure announced, nothing applied."""
    ex = h.executor(_policy(f"{{type: {A}, plan: decline}}"))

    await h.fire(ex)

    assert h.trace_of("apply", "verify", "revert") == []
    (decision,) = await h.journal.decisions.all.in_thread()
    assert decision.state == "blocked" and not decision.executed
    assert decision.reason.endswith("requireAttribution: the anomaly is on version 1")
    assert [e["event"] for e in h.events] == []


# ---- 5. noop steps -----------------------------------------------------------------------------

async def test_noop_step_is_journaled_and_not_applied(h: Harness):
    """A noop step is journaled as noop and skipped; the other steps run."""
    ex = h.executor(_policy(f"{{type: {A}, plan: noop}}", f"{{type: {B}}}"))

    await h.fire(ex)

    assert h.trace_of("apply", "verify") == [("apply", B), ("verify", B)]
    (decision,) = await h.journal.decisions.all.in_thread()
    assert decision.state == "succeeded"
    assert decision.reason == "1 step(s) applied and verified"
    assert await h.steps(decision.id) == [(0, "apply", "noop"), (1, "apply", "ok"), (1, "verify", "ok")]


async def test_all_noop_plan_is_decided_noop_without_apply(h: Harness):
    """A plan whose every step is a noop is decided `noop`; no apply, no step, not executed."""
    ex = h.executor(_policy(f"{{type: {A}, plan: noop}}", f"{{type: {B}, plan: noop}}"))

    (plan,) = await h.fire(ex)

    assert h.trace() == [("observe", A), ("plan", A), ("observe", B), ("plan", B)]
    (decision,) = await h.journal.decisions.all.in_thread()
    assert decision.state == "noop" and not decision.executed
    assert "nothing to do" in decision.reason
    assert plan.blocked == decision.reason
    assert await h.steps(decision.id) == []


# ---- 6. intents, and decisions resumed after a crash between an apply and its record -------------

async def test_each_apply_attempt_journals_its_intent_first_with_the_effect_key(h: Harness):
    """An intent row (step, attempt, effect key "<decision>/<step>") before every apply attempt;
    the action gets the step with that key, the same on every attempt."""
    ex = h.executor(_policy(f"{{type: {A}, apply: [retry, ok]}}", f"{{type: {B}}}"))

    await h.fire(ex)

    (decision,) = await h.journal.decisions.all.in_thread()
    rows = await h.step_rows(decision.id)
    assert [(s.idx, s.phase, s.data.get("attempt")) for s in rows] == [
        (0, INTENT, 1), (0, "apply", 1), (0, INTENT, 2), (0, "apply", 2), (0, "verify", None),
        (1, INTENT, 1), (1, "apply", 1), (1, "verify", None)]
    keys = [f"{decision.id}/0", f"{decision.id}/0", f"{decision.id}/1"]
    assert [s.data["effect_key"] for s in rows if s.phase == INTENT] == keys
    assert [c.step.effect_key for c in h.calls if c.phase == "apply" and c.step] == keys
    assert all("effect_key" not in s for s in decision.plan["steps"])  # the plan is the policy's, keys are not


async def test_resumed_step_in_doubt_whose_change_landed_is_recorded_not_applied(h: Harness):
    """Crash after the change landed, before its result was journaled: after the restart the
    journaled plan is resumed (no observe, no plan), verify finds the change, the step is recorded
    as applied (recovered after restart) and apply is not called again."""
    calls_before = await h.crash_and_restart(_policy(f"{{type: {A}, apply: [crash, ok], verify: observe}}"))

    assert h.trace()[calls_before:] == [("verify", A)]
    assert len(h.effects) == 1
    (decision,) = await h.journal.decisions.all.in_thread()
    assert decision.state == "succeeded" and decision.reason == "1 step(s) applied and verified"
    rows = await h.step_rows(decision.id)
    assert [(s.phase, s.status, s.data.get("attempt")) for s in rows] == [
        (INTENT, "pending", 1), ("apply", "ok", 1), ("verify", "ok", None)]
    assert rows[1].message.startswith("recovered after restart: attempt 1 had landed")
    assert rows[1].data["recovered"] and rows[1].data["effect_key"] == f"{decision.id}/0"
    (signal,) = await h.journal.signals.all.in_thread()
    assert signal.state == "processed"


async def test_resumed_step_in_doubt_whose_change_did_not_land_is_applied_once(h: Harness):
    """Crash before the change landed: verify after the restart finds the old value, so the step
    is applied once more (attempt 2, same effect key) and verified."""
    calls_before = await h.crash_and_restart(
        _policy(f"{{type: {A}, apply: [crash_before, ok], verify: observe}}"))

    assert h.trace()[calls_before:] == [("verify", A), ("apply", A), ("verify", A)]
    assert len(h.effects) == 1
    (decision,) = await h.journal.decisions.all.in_thread()
    assert decision.state == "succeeded"
    rows = await h.step_rows(decision.id)
    assert [(s.phase, s.status, s.data.get("attempt")) for s in rows] == [
        (INTENT, "pending", 1), (INTENT, "pending", 2), ("apply", "ok", 2), ("verify", "ok", None)]
    applies = [c.step for c in h.calls if c.phase == "apply" and c.step]
    assert [s.effect_key for s in applies] == [f"{decision.id}/0"] * 2


async def test_resumed_step_that_cannot_be_observed_is_sent_again_with_the_same_key(h: Harness):
    """An effect verify cannot observe (NOOP, as notify answers) is at-least-once: applied again
    after the restart, with the same effect key for the receiver to drop the repeat."""
    calls_before = await h.crash_and_restart(_policy(f"{{type: {A}, apply: [crash, ok], verify: blind}}"))

    assert h.trace()[calls_before:] == [("verify", A), ("apply", A), ("verify", A)]
    (decision,) = await h.journal.decisions.all.in_thread()
    assert decision.state == "succeeded"
    assert [e.effect_key for e in h.effects] == [f"{decision.id}/0"] * 2


async def test_resumed_decision_skips_steps_with_a_result_and_applies_the_rest(h: Harness):
    """Steps whose result was journaled before the crash (a noop, an applied and verified one) are
    not called again; the step in doubt goes on, the step never started is applied."""
    calls_before = await h.crash_and_restart(_policy(
        f"{{type: {A}, plan: noop}}", f"{{type: {B}}}", f"{{type: {C}, apply: [crash_before, ok], verify: observe}}"))

    assert h.trace()[calls_before:] == [("verify", C), ("apply", C), ("verify", C)]
    (decision,) = await h.journal.decisions.all.in_thread()
    assert decision.state == "succeeded" and decision.reason == "2 step(s) applied and verified"
    assert await h.steps(decision.id) == [
        (0, "apply", "noop"), (1, "apply", "ok"), (1, "verify", "ok"), (2, "apply", "ok"), (2, "verify", "ok")]


async def test_step_applied_before_the_crash_counts_for_revert_with_its_journaled_before(h: Harness):
    """onFailure: revert after a restart undoes the step applied before the crash, with the step
    as journaled (its true `before`), though it was not called again."""
    calls_before = await h.crash_and_restart(_policy(
        f"{{type: {A}}}", f"{{type: {B}, apply: [crash_before, fail], verify: observe}}", on_failure="revert"))

    assert h.trace()[calls_before:] == [("verify", B), ("apply", B), ("revert", A)]
    (revert,) = [c.step for c in h.calls if c.phase == "revert"]
    assert revert is not None and revert.before == {"value": "old"}
    (decision,) = await h.journal.decisions.all.in_thread()
    assert revert.effect_key == f"{decision.id}/0"
    assert decision.state == "reverted"
    assert decision.reason.startswith(f"step 1 ({B}) failed: permanent failure")


async def test_resumed_decision_whose_policy_changed_its_actions_is_failed_not_run(h: Harness):
    """A plan journaled for other actions than the policy now names is not resumed: `failed`, no call."""
    calls_before = await h.crash_and_restart(_policy(f"{{type: {A}, apply: [crash]}}"),
                                             after_restart=_policy(f"{{type: {B}}}"))

    assert h.trace()[calls_before:] == []
    (decision,) = await h.journal.decisions.all.in_thread()
    assert decision.state == "failed" and decision.reason.startswith("not resumed after restart")


async def test_a_decision_resumed_after_a_reload_runs_on_the_policy_it_started_with(h: Harness):
    """The policy is reloaded with other parameters for the same action while a crash has left its
    decision mid-apply: the resume runs the parameters journaled with the decision, not the new ones,
    and says so."""
    started = _policy(f"{{type: {A}, apply: [crash_before, ok], verify: observe}}")
    calls_before = await h.crash_and_restart(started,
                                             after_restart=_policy(f"{{type: {A}, apply: [fail], verify: observe}}"))

    assert h.trace()[calls_before:] == [("verify", A), ("apply", A), ("verify", A)]
    (decision,) = await h.journal.decisions.all.in_thread()
    assert decision.state == "succeeded", decision.reason
    assert decision.reason.endswith("resumed on the policy it started with (policy remediate was reloaded since)")
    saved = decision.plan["started_with"]
    assert saved["policy"]["actions"] == [{"type": A, "apply": ["crash_before", "ok"], "verify": "observe"}]
    assert saved["recovery"]["query"] == "up"


async def test_a_decision_whose_policy_was_renamed_is_finished_and_not_acted_on_twice(h: Harness):
    """Renamed between the crash and the restart: the decision left executing under the old name is
    finished on the policy it started with; the renamed policy does not act on the same signal again."""
    started = _policy(f"{{type: {A}, apply: [crash_before, ok], verify: observe}}")
    calls_before = await h.crash_and_restart(started, after_restart=_policy(f"{{type: {A}, verify: observe}}",
                                                                            name="remediate-v2"))

    # The old decision's step, once: re-observed (not in place), applied, verified; nothing for the new name.
    assert h.trace()[calls_before:] == [("verify", A), ("apply", A), ("verify", A)]
    old, new = await h.journal.decisions.all.in_thread()
    assert (old.policy, old.state) == ("remediate", "succeeded")
    assert old.reason.endswith("resumed on the policy it started with (policy remediate is gone since)")
    assert (new.policy, new.state) == ("remediate-v2", "blocked")
    assert new.reason.startswith(f"already acted on for default/{MODEL} by decision {old.id} of policy remediate")


async def test_a_revert_after_a_reload_undoes_with_the_policy_it_started_with(h: Harness):
    """Not recovered, onNotRecovered revert; meanwhile the policy is reloaded with a revert that would
    fail, then removed altogether: the revert runs on the journaled policy and succeeds."""
    h.advance, h.gate = True, asyncio.Event()
    ex = h.executor(_verified(f"{{type: {A}}}", then="revert"), query=lambda t: 900.0)
    await h.fire(ex)
    await wait_for(lambda: h.sleeps, timeout=10)
    registry = _registry(h.calls, h.effects)
    ex.state.policies = load_policies_text(_verified(f"{{type: {A}, revert: fail}}", then="revert"), "t.yaml",
                                           registry, {})
    h.gate.set()
    await ex.wait_recoveries()

    assert h.trace_of("revert") == [("revert", A)]
    (decision,) = await h.journal.decisions.all.in_thread()
    assert decision.state == "reverted"
    assert decision.reason.endswith("reverted on the policy it started with (policy remediate was reloaded since)")


async def test_a_revert_of_a_removed_policy_still_runs(h: Harness):
    """The policy is gone when the verdict asks for the revert: it runs on the journaled policy
    (before, the revert was refused and the change stayed)."""
    h.advance = True
    acting = [True]
    first = h.executor(_verified(f"{{type: {A}}}", then="revert"), may_act=lambda: acting[0], query=lambda t: 900.0)
    await h.fire(first)
    acting[0] = False  # the verdict is reached while this replica may not act: left open
    await first.wait_recoveries()

    second = h.executor(_policy(f"{{type: {B}}}", name="other"), query=lambda t: 900.0)
    assert await second.resume_verifications() == 1
    await second.wait_recoveries()
    assert h.trace_of("revert") == [("revert", A)]
    (decision,) = await h.journal.decisions.all.in_thread()
    assert decision.state == "reverted"
    assert decision.reason.endswith("reverted on the policy it started with (policy remediate is gone since)")


async def test_a_verify_that_asks_to_apply_again_gets_one_more_apply_within_the_attempts(h: Harness):
    """Verify finds a part of the target the apply could not settle (a replica back on the old version)
    and says `reapply`: the step is applied again (attempt 2, after the backoff) and verified again."""
    ex = h.executor(_policy(f"{{type: {A}, verify: reapply_once}}"))
    await h.fire(ex)

    assert h.trace_of("apply", "verify") == [("apply", A), ("verify", A), ("apply", A), ("verify", A)]
    (decision,) = await h.journal.decisions.all.in_thread()
    assert decision.state == "succeeded"
    rows = await h.step_rows(decision.id)
    assert [(r.phase, r.status) for r in rows] == [("intent", "pending"), ("apply", "ok"), ("verify", "failed"),
                                                         ("intent", "pending"), ("apply", "ok"), ("verify", "ok")]
    assert [r.data["attempt"] for r in rows if r.phase == "apply"] == [1, 2]
    assert h.sleeps == [1.0]


# ---- a journal outage mid-decision, and what a resumed decision may still do ------------------------

G = "test.guarded"


class Outage:
    """A journal write that fails (as a PostgreSQL restart or a full disk makes it) while `failing`
    says so for its arguments, then works again; put in place of the repository's method."""

    def __init__(self, real: Any, failing: Callable[..., bool]) -> None:
        self.real, self.failing, self.failures = real, failing, 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.real(*args, **kwargs)

    async def in_thread(self, *args: Any, **kwargs: Any) -> Any:
        if self.failing(*args, **kwargs):
            self.failures += 1
            raise JournalError("journal postgres://tailguard@db/tailguard: OperationalError: the connection is lost")
        return await self.real.in_thread(*args, **kwargs)


def _apply_result(times: int) -> Callable[..., bool]:
    """Fails the journaling of an apply's result (phase apply) `times` times: the call landed, its record did not."""
    left = [times]

    def failing(step: StepRecord) -> bool:
        if step.phase == StepPhase.APPLY and left[0] > 0:
            left[0] -= 1
            return True
        return False
    return failing


async def _through_a_worker(h: Harness, ex: Executor, max_age: float | None = None,
                            advance_per_retry: float = 0.0) -> list[float]:
    """Journal one alert and let one backlog worker take it until it is processed; the backoff waits
    it asked for (each moving the clock by `advance_per_retry` times the wait)."""
    waits: list[float] = []

    async def sleep(delay: float) -> None:
        waits.append(delay)
        h.now += delay * advance_per_retry

    backlog = Backlog(h.journal, lambda: ex.state.policies.policies, ex.process, h.metrics, max_age_seconds=max_age,
                      clock=h.clock, sleep=sleep)
    h.journal.signals.on_intake(backlog.admit)
    tasks = [asyncio.create_task(backlog.work()), asyncio.create_task(backlog.refill())]
    try:
        await h._journaled("alert-1")
        await asyncio.wait_for(backlog.drain(), timeout=20)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        h.journal.signals.on_intake(None)
    return waits


async def test_a_journal_error_mid_decision_is_retried_with_backoff_not_parked(h: Harness):
    """The apply lands, then journaling its result fails twice (the database restarting): the worker
    waits 1 s, then 2 s, and processes the signal again; the decision resumes, re-observes the landed
    change and records it (not applied again), and ends succeeded with its pin: no restart needed."""
    ex = h.executor(_policy(f"{{type: {A}, verify: observe, pin: true}}"))
    outage = Outage(h.journal.decisions.record_step, _apply_result(2))
    h.journal.decisions.record_step = outage  # type: ignore[method-assign]

    waits = await _through_a_worker(h, ex)

    assert outage.failures == 2 and waits == [1.0, 2.0]
    assert h.trace_of("apply") == [("apply", A)]
    (decision,) = await h.journal.decisions.all.in_thread()
    assert decision.state == "succeeded", decision.reason
    applies = [s for s in await h.results(decision.id) if s.phase == "apply"]
    assert [a.data.get("recovered") for a in applies] == [True]  # re-observed after the outage
    assert [p.version for p in await h.journal.pins.live.in_thread()] == [1]
    assert [s.state for s in await h.journal.signals.all.in_thread()] == ["processed"]
    assert h.metrics.registry.get_sample_value("tailguard_faults_total", {"component": "journal"}) == 2


async def test_a_decision_resumed_after_its_signal_grew_too_old_ends_expired(h: Harness):
    """The journal stays down for longer than executor.maxSignalAgeSeconds: once it is back, the
    decision is not resumed (no verify, no apply, no revert): it ends `expired`, names the step that
    may have landed, and is reported; older readers see a `failed` decision."""
    ex = h.executor(_policy(f"{{type: {A}, verify: observe}}"), max_signal_age=60)
    h.journal.decisions.record_step = Outage(h.journal.decisions.record_step,  # type: ignore[method-assign]
                                             _apply_result(4))

    waits = await _through_a_worker(h, ex, max_age=60, advance_per_retry=10)  # 10+20+40 s of outage

    assert waits == [1.0, 2.0, 4.0]  # the 4th time the signal is 70 s old
    assert h.trace_of("apply", "revert") == [("apply", A)]
    (decision,) = await h.journal.decisions.all.in_thread()
    assert decision.state == "expired"
    assert decision.reason.startswith("expired: not resumed: its signal is 70s old (executor.maxSignalAgeSeconds 60s)")
    assert decision.reason.endswith("nothing more applied, nothing reverted; step(s) [0] may have landed "
                                    "(an apply without its result)")
    assert decision.plan["expired"]["in_doubt"] == [0] and decision.executed
    with closing(sqlite3.connect(h.journal_path)) as db:  # what a version that knows no `expired` reads
        assert [state for (state,) in db.execute("SELECT state FROM decisions")] == ["failed"]
    assert [row.state for row in await h.journal.decisions.latest.in_thread()] == ["expired"]
    assert [(e["event"], e["state"]) for e in h.events] == [("failed", "expired")]
    assert h.metrics.registry.get_sample_value("tailguard_decisions_total",
                                               {"policy": "remediate", "state": "expired"}) == 1


async def test_a_resumed_decision_whose_target_changed_since_the_plan_ends_expired(h: Harness):
    """A restart finds the decision mid-apply, young, but the action re-observes the target and finds
    it no longer as planned (someone deployed meanwhile): expired, nothing applied."""
    calls_before = await h.crash_and_restart(_policy(f"{{type: {G}, apply: [crash_before, ok], precondition: changed}}"))

    assert h.trace()[calls_before:] == [("preconditions", G)]
    (decision,) = await h.journal.decisions.all.in_thread()
    assert decision.state == "expired"
    assert decision.reason == ("expired: not resumed: the target changed since the plan: step 0 (test.guarded): "
                               "not as planned: {'replica-a': 'serves [3], planned at [2]'}; nothing more applied, "
                               "nothing reverted; step(s) [0] may have landed (an apply without its result)")


async def test_a_resumed_decision_young_and_as_planned_goes_on(h: Harness):
    """Young, and the preconditions hold: resumed as before (re-observed, applied, verified)."""
    calls_before = await h.crash_and_restart(_policy(f"{{type: {G}, apply: [crash_before, ok], verify: observe}}"))

    assert h.trace()[calls_before:] == [("preconditions", G), ("verify", G), ("apply", G), ("verify", G)]
    (decision,) = await h.journal.decisions.all.in_thread()
    assert decision.state == "succeeded"


# ---- 7. notify steps never stop a plan ---------------------------------------------------------

@pytest.mark.parametrize("on_failure", ["stop", "revert"])
async def test_failed_notify_step_is_journaled_failed_and_the_plan_goes_on(h: Harness, on_failure: str):
    """A notify step that fails (after its retries) does not stop the rollback behind it, under
    either onFailure; nothing is reverted and the decision succeeds, naming the failed notify."""
    ex = h.executor(_policy("{type: notify, apply: [fail]}", f"{{type: {A}}}", on_failure=on_failure))

    await h.fire(ex)

    assert h.trace_of("apply", "verify", "revert") == [("apply", "notify"), ("apply", A), ("verify", A)]
    (decision,) = await h.journal.decisions.all.in_thread()
    assert decision.state == "succeeded"
    assert decision.reason == "1 step(s) applied and verified; notify step(s) [0] failed (a notification never " \
                              "stops a plan)"
    assert await h.steps(decision.id) == [(0, "apply", "failed"), (1, "apply", "ok"), (1, "verify", "ok")]


async def test_the_action_saying_it_is_advisory_decides_not_its_kind(h: Harness):
    """A failing action that says it is advisory never stops the plan, whatever its kind; one that
    does not say so stops it, even under the kind `notify`."""
    ex = h.executor(_policy(f"{{type: {B}, apply: [fail]}}", f"{{type: {A}}}"), advisory=(B,))
    await h.fire(ex)
    (decision,) = await h.journal.decisions.all.in_thread()
    assert decision.state == "succeeded" and decision.reason.endswith("step(s) [0] failed (a notification never "
                                                                      "stops a plan)")
    ex = h.executor(_policy("{type: notify, apply: [fail]}", f"{{type: {A}}}", name="other"), advisory=())
    await h.fire(ex, key="alert-2")
    decision = next(d for d in await h.journal.decisions.all.in_thread() if d.policy == "other")
    assert decision.state == "failed" and decision.reason.startswith("step 0 (notify) failed")


# ---- 8. frozen targets -------------------------------------------------------------------------

async def test_frozen_target_is_blocked_until_the_freeze_expires(h: Harness):
    """A freeze in force blocks every policy on the target with its reason; an expired one does not."""
    ex = h.executor(_policy(f"{{type: {A}}}", cooldown="0s"))
    await h.journal.freezes.record.in_thread(f"default/{MODEL}", "decision 1 did not recover", h.now + 60, 1)

    await h.fire(ex, "alert-1")
    h.now += 61
    await h.fire(ex, "alert-2")

    first, second = await h.journal.decisions.all.in_thread()
    assert first.state == "blocked" and not first.executed
    assert first.reason.startswith("target frozen: decision 1 did not recover (until ")
    assert "tailguard unfreeze default/ranker" in first.reason
    assert second.state == "succeeded"
    assert h.trace_of("apply") == [("apply", A)]


async def test_lifted_freeze_no_longer_blocks_and_the_global_freeze_speaks_first(h: Harness):
    """The global freeze is reported before a target's; a lifted target freeze blocks nothing."""
    ex = h.executor(_policy(f"{{type: {A}}}", cooldown="0s"))
    await h.journal.freezes.record.in_thread(f"default/{MODEL}", "escalated", h.now + 3600)
    ex.state.frozen = True
    await h.fire(ex, "alert-1")
    ex.state.frozen = False
    (lifted,) = await h.journal.freezes.lift.in_thread(f"default/{MODEL}", "fixed", h.now)
    await h.fire(ex, "alert-2")

    first, second = await h.journal.decisions.all.in_thread()
    assert first.state == "blocked" and first.reason == "global freeze is on"
    assert lifted.reason == "escalated" and second.state == "succeeded"


# ---- 9. the recovery watch after a plan ----------------------------------------------------------

VERIFY = "{{query: 'p999{{model=\"$model\"}}', below: 500, for: 2s, within: 8s, interval: 1s, onNotRecovered: {then}}}"


def _verified(*actions: str, then: str = "escalate", **kw: Any) -> str:
    return _policy(*actions, verify=VERIFY.format(then=then), **kw)


async def _recovery_rows(h: Harness, decision_id: int) -> list[tuple[str, str]]:
    return [(s.status, s.message) for s in await h.journal.decisions.steps.in_thread(decision_id)
            if s.phase == "recovery"]


async def test_plan_that_helped_is_journaled_pending_then_recovered(h: Harness):
    """The check is journaled in flight with the decision, watched without the target lock, and
    settles recovered; `acted` and `recovered` are handed to notify; nothing is frozen."""
    h.advance, h.gate = True, asyncio.Event()
    ex = h.executor(_verified(f"{{type: {A}}}"), query=lambda t: 900.0 if t < 3 else 100.0)

    await h.fire(ex)
    await wait_for(lambda: h.sleeps, timeout=10)  # the watch took its first sample and waits at the gate
    (decision,) = await h.journal.decisions.all.in_thread()
    assert decision.state == "succeeded"
    ((status, message),) = await _recovery_rows(h, decision.id)
    assert status == "pending" and message.startswith('checking: p999{model="ranker"} below 500 for 2s within 8s')
    assert h.sleeps == [1.0]
    assert not ex.lock_for(f"default/{MODEL}").locked()  # the watch waits unlocked
    h.gate.set()
    await ex.wait_recoveries()

    rows = [s for s in await h.journal.decisions.steps.in_thread(decision.id) if s.phase == "recovery"]
    assert [r.status for r in rows] == ["pending", "recovered"]
    assert rows[1].data["follow_up"] is None and rows[1].data["samples"] >= 3
    assert [e["event"] for e in h.events] == ["acted", "recovered"]
    assert h.events[0]["decision"] == decision.id and h.events[1]["verdict"] == "recovered"
    assert await h.journal.freezes.all.in_thread() == []
    assert await h.journal.decisions.open_recoveries.in_thread() == []


@pytest.mark.parametrize("value, verdict", [(900.0, "not_recovered"), (None, "unknown")])
async def test_plan_that_did_not_help_escalates_freezes_and_blocks_the_next_signal(h: Harness, value: float | None,
                                                                                   verdict: str):
    """Still bad (or no data at all) when the window closes: the verdict is journaled with the freeze,
    `not_recovered` and `escalated` are handed over, and the next signal on the target is blocked."""
    h.advance = True
    ex = h.executor(_verified(f"{{type: {A}}}", cooldown="0s"), query=lambda t: value)

    await h.fire(ex, "alert-1")
    await ex.wait_recoveries()
    await h.fire(ex, "alert-2")

    first, second = await h.journal.decisions.all.in_thread()
    rows = await _recovery_rows(h, first.id)
    assert [status for status, _ in rows] == ["pending", verdict]
    assert "escalated: default/ranker frozen until" in rows[1][1]
    (freeze,) = await h.journal.freezes.all.in_thread()
    assert freeze.target == f"default/{MODEL}" and freeze.decision_id == first.id
    assert freeze.until == pytest.approx(h.now + 3600, abs=1)
    assert second.state == "blocked" and second.reason.startswith("target frozen: policy remediate, decision")
    assert [e["event"] for e in h.events] == ["acted", "not_recovered", "escalated"]
    assert h.events[1]["verdict"] == verdict and h.events[1]["follow_up"] == "escalate"
    assert h.trace_of("apply") == [("apply", A)]  # the blocked signal applied nothing


async def test_revert_follow_up_undoes_the_applied_steps_and_clears_the_pin(h: Harness):
    """onNotRecovered: revert undoes the decision's applied steps (not its noop one) in reverse,
    clears the pin its rollback recorded, and ends the decision reverted; nothing is frozen."""
    h.advance = True
    ex = h.executor(_verified(f"{{type: {A}, pin: true}}", f"{{type: {B}, plan: noop}}", f"{{type: {C}}}",
                              then="revert"), query=lambda t: 900.0)

    await h.fire(ex)
    assert [p.version for p in await h.journal.pins.live.in_thread()] == [1]
    await ex.wait_recoveries()

    assert h.trace_of("revert") == [("revert", C), ("revert", A)]
    (decision,) = await h.journal.decisions.all.in_thread()
    assert decision.state == "reverted"
    assert decision.reason == "2 step(s) applied and verified; did not recover (not_recovered); reverted"
    assert await h.journal.pins.live.in_thread() == []
    assert await h.journal.freezes.all.in_thread() == []
    assert [(i, p, st) for i, p, st in await h.steps(decision.id, recovery=True) if p in ("revert", "recovery")] == [
        (-1, "recovery", "pending"), (-1, "recovery", "not_recovered"), (2, "revert", "ok"), (0, "revert", "ok")]
    assert await h.journal.decisions.open_recoveries.in_thread() == []


def _prometheus_down(t: float) -> float | None:
    raise ConnectionError("Prometheus unreachable")


async def test_unknown_never_reverts_it_escalates_and_says_it_could_not_tell(h: Harness):
    """Prometheus is down through the whole window: the verdict is unknown. onNotRecovered: revert
    must not put the old version back on no data (the detectors are as blind): the rollback and its
    pin stay, the target is frozen and escalated, and the verdict says it could not tell."""
    h.advance = True
    ex = h.executor(_verified(f"{{type: {A}, pin: true}}", then="revert"), query=_prometheus_down)

    await h.fire(ex)
    await ex.wait_recoveries()

    assert h.trace_of("revert") == []
    (decision,) = await h.journal.decisions.all.in_thread()
    assert decision.state == "succeeded"
    assert [p.version for p in await h.journal.pins.live.in_thread()] == [1]
    (_, (status, message)) = await _recovery_rows(h, decision.id)
    assert status == "unknown"
    assert message.startswith("could not tell whether it recovered: no data in the 8s window")
    assert "not reverted: without complete data the rollback may have worked" in message
    assert "escalated: default/ranker frozen until" in message
    rows = [s for s in await h.journal.decisions.steps.in_thread(decision.id) if s.phase == "recovery"]
    assert rows[1].data["follow_up"] == "escalate" and rows[1].data["query_errors"] >= 1
    (freeze,) = await h.journal.freezes.all.in_thread()
    assert freeze.decision_id == decision.id
    assert [e["event"] for e in h.events] == ["acted", "not_recovered", "escalated"]
    assert h.events[1]["verdict"] == "unknown" and h.events[1]["follow_up"] == "escalate"
    assert await h.journal.decisions.open_recoveries.in_thread() == []


async def test_a_watch_resumed_while_prometheus_is_down_escalates_instead_of_reverting(h: Harness):
    """A restart cuts the watch short; the new process finds Prometheus down (nothing read back,
    every sample fails): unknown, escalated, nothing reverted."""
    h.advance, h.gate = True, asyncio.Event()
    policy = _verified(f"{{type: {A}}}", then="revert")
    first = h.executor(policy, query=lambda t: 100.0)
    await h.fire(first)
    await wait_for(lambda: h.sleeps, timeout=10)
    await first.close()
    h.gate.set()

    second = h.executor(policy, query=_prometheus_down)
    assert await second.resume_verifications() == 1
    await second.wait_recoveries()

    assert h.trace_of("revert") == []
    (decision,) = await h.journal.decisions.all.in_thread()
    assert decision.state == "succeeded"
    assert [status for status, _ in await _recovery_rows(h, decision.id)] == ["pending", "unknown"]
    assert len(await h.journal.freezes.all.in_thread()) == 1


def _one_good_sample_then_down(t: float) -> float | None:
    if t < 1:
        return 100.0
    raise ConnectionError("Prometheus unreachable")


async def test_one_good_sample_then_an_outage_escalates_and_does_not_revert(h: Harness):
    """Issue 42's reproduction: one good sample, then Prometheus goes down for the rest of the window.
    The evidence is incomplete (the hold could have been met in the unseen time), so the verdict is
    unknown: with onNotRecovered: revert the rollback and its pin stay, and the target is escalated."""
    h.advance = True
    ex = h.executor(_verified(f"{{type: {A}, pin: true}}", then="revert"), query=_one_good_sample_then_down)

    await h.fire(ex)
    await ex.wait_recoveries()

    assert h.trace_of("revert") == []
    (decision,) = await h.journal.decisions.all.in_thread()
    assert decision.state == "succeeded"
    assert [p.version for p in await h.journal.pins.live.in_thread()] == [1]
    (_, (status, message)) = await _recovery_rows(h, decision.id)
    assert status == "unknown" and message.startswith("could not tell whether it recovered")
    assert "escalated: default/ranker frozen until" in message
    assert len(await h.journal.freezes.all.in_thread()) == 1
    assert [e["event"] for e in h.events] == ["acted", "not_recovered", "escalated"]


async def test_an_unknown_verdict_left_waiting_for_its_revert_is_escalated_not_reverted(h: Harness):
    """A journal from a version that reverted on unknown: a verdict `unknown` with follow-up revert
    whose revert never ran. Resumed, it is escalated (a new verdict row with the freeze), not reverted,
    and nothing is left open."""
    policy = _verified(f"{{type: {A}}}", then="revert")
    ex = h.executor(policy)
    await h.fire(ex)
    await ex.wait_recoveries()  # no Prometheus lent: settles unknown, escalated (the new rule)
    (decision,) = await h.journal.decisions.all.in_thread()
    await h.journal.decisions.record_verdict.in_thread(decision.id, "unknown", "no data in the 8s window",
                                                       {"verdict": "unknown", "follow_up": "revert"})
    assert len(await h.journal.decisions.open_recoveries.in_thread()) == 1
    freezes = len(await h.journal.freezes.all.in_thread())

    after = h.executor(policy)
    assert await after.resume_verifications() == 1
    await after.wait_recoveries()

    assert h.trace_of("revert") == []
    assert (await h.journal.decisions.get.in_thread(decision.id)).state == "succeeded"
    (status, message) = (await _recovery_rows(h, decision.id))[-1]
    assert status == "unknown" and message.startswith("could not tell whether it recovered: no data")
    assert len(await h.journal.freezes.all.in_thread()) == freezes + 1
    assert await h.journal.decisions.open_recoveries.in_thread() == []


async def test_a_not_recovered_verdict_of_an_older_version_is_escalated_not_reverted(h: Harness):
    """A journal from a version that judged "not recovered" without asking for complete evidence (no
    `complete_evidence` in the verdict's data), its revert never run: resumed, it is escalated, not
    reverted (an outage may be all it saw)."""
    policy = _verified(f"{{type: {A}}}", then="revert")
    ex = h.executor(policy)
    await h.fire(ex)
    await ex.wait_recoveries()
    (decision,) = await h.journal.decisions.all.in_thread()
    await h.journal.decisions.record_verdict.in_thread(
        decision.id, "not_recovered", "did not hold below 500 for 2s within 8s (1 samples)",
        {"verdict": "not_recovered", "follow_up": "revert"})
    freezes = len(await h.journal.freezes.all.in_thread())

    after = h.executor(policy)
    assert await after.resume_verifications() == 1
    await after.wait_recoveries()

    assert h.trace_of("revert") == []
    assert (await h.journal.decisions.get.in_thread(decision.id)).state == "succeeded"
    (status, message) = (await _recovery_rows(h, decision.id))[-1]
    assert status == "unknown" and message.startswith("could not tell whether it recovered: did not hold")
    assert len(await h.journal.freezes.all.in_thread()) == freezes + 1
    assert await h.journal.decisions.open_recoveries.in_thread() == []


async def test_none_follow_up_only_journals(h: Harness):
    """onNotRecovered: none journals the verdict; no revert, no freeze, the decision stays succeeded."""
    h.advance = True
    ex = h.executor(_verified(f"{{type: {A}}}", then="none"), query=lambda t: 900.0)

    await h.fire(ex)
    await ex.wait_recoveries()

    (decision,) = await h.journal.decisions.all.in_thread()
    assert decision.state == "succeeded"
    assert [status for status, _ in await _recovery_rows(h, decision.id)] == ["pending", "not_recovered"]
    assert h.trace_of("revert") == [] and await h.journal.freezes.all.in_thread() == []


async def test_watch_stopped_by_a_restart_is_resumed_from_the_journal(h: Harness):
    """A watch cut short (shutdown, crash) stays pending; a new executor's resume_verifications goes
    on with the journaled check and settles it; resuming again finds nothing open."""
    h.advance, h.gate = True, asyncio.Event()
    policy = _verified(f"{{type: {A}}}")
    first = h.executor(policy, query=lambda t: 100.0)
    await h.fire(first)
    await wait_for(lambda: h.sleeps, timeout=10)
    await first.close()
    h.gate.set()
    (decision,) = await h.journal.decisions.all.in_thread()
    assert [status for status, _ in await _recovery_rows(h, decision.id)] == ["pending"]
    assert len(await h.journal.decisions.open_recoveries.in_thread()) == 1

    second = h.executor(policy, query=lambda t: 100.0)
    assert await second.resume_verifications() == 1
    await second.wait_recoveries()

    assert [status for status, _ in await _recovery_rows(h, decision.id)] == ["pending", "recovered"]
    assert await second.resume_verifications() == 0
    assert h.trace_of("apply") == [("apply", A)]  # nothing applied again


async def test_revert_left_by_a_replica_that_may_not_act_is_resumed(h: Harness):
    """A revert verdict reached while this replica may not act stays open; the next start reverts."""
    h.advance = True
    policy = _verified(f"{{type: {A}}}", then="revert")
    acting = [True]
    first = h.executor(policy, may_act=lambda: acting[0], query=lambda t: 900.0)
    await h.fire(first)
    acting[0] = False
    await first.wait_recoveries()
    (decision,) = await h.journal.decisions.all.in_thread()
    assert decision.state == "succeeded" and h.trace_of("revert") == []
    (opened,) = await h.journal.decisions.open_recoveries.in_thread()
    assert opened.row.status == "not_recovered"

    second = h.executor(policy, query=lambda t: 900.0)
    assert await second.resume_verifications() == 1
    await second.wait_recoveries()

    assert h.trace_of("revert") == [("revert", A)]
    (decision,) = await h.journal.decisions.all.in_thread()
    assert decision.state == "reverted"


async def test_a_notify_callback_that_raises_never_fails_a_remediation(h: Harness):
    """The outcome callback raising is counted and logged; the decision and its watch go on."""
    def broken(event: Mapping[str, Any]) -> None:
        raise RuntimeError("receiver bug")

    h.advance = True
    ex = h.executor(_verified(f"{{type: {A}}}"), query=lambda t: 100.0, notify=broken)

    await h.fire(ex)
    await ex.wait_recoveries()

    (decision,) = await h.journal.decisions.all.in_thread()
    assert decision.state == "succeeded"
    assert [status for status, _ in await _recovery_rows(h, decision.id)] == ["pending", "recovered"]


# ---- blast radius across targets -----------------------------------------------------------------

def _policies_on(models: list[str]) -> str:
    """One policy per model, each acting on the TailLatencyHigh alert about its model."""
    return "---\n".join(_policy(f"{{type: {A}}}", name=f"p-{m}").replace(f"model: {MODEL}", f"model: {m}")
                         for m in models)


def _blast(**limits: Any) -> BlastRadiusSettings:
    """Only the limits given on (the daemon's defaults turn the count and the budget on), every signal
    held the whole span unless the quiet hold is given."""
    return BlastRadiusSettings(**{"maxTargetsPerWindow": None, "commonCauseTargets": None,
                                  "quietHoldSeconds": None, **limits})


async def _journal_alerts(h: Harness, models: list[str]) -> list[tuple[int, Signal]]:
    signals = [Signal(SignalSource.ALERT, ALERT, {"model": m}, datetime.now(timezone.utc), f"alert-{m}")
               for m in models]
    new, _ = await h.journal.signals.intake(signals)
    return new


async def test_common_cause_burst_acts_on_none_and_escalates_once(h: Harness):
    """Six targets signal within the span, limit three: every decision is blocked as a common
    cause, nothing is applied, and exactly one escalation is handed over."""
    models = [f"m{i}" for i in range(6)]
    ex = h.executor(_policies_on(models), blast_radius=_blast(commonCauseTargets=3,
                                                                 commonCauseSpanSeconds=30))
    for signal_id, signal in await _journal_alerts(h, models):  # the burst lands while each waits
        await ex.process(signal_id, signal)

    assert h.trace_of("apply") == []
    assert h.sleeps == [30] * 6  # each matching signal was held for the span first
    decisions = await h.journal.decisions.all.in_thread()
    assert len(decisions) == 6 and all(d.state == "blocked" for d in decisions)
    assert all("common cause" in d.reason for d in decisions), [d.reason for d in decisions]
    assert [e["event"] for e in h.events] == ["escalated"]


@pytest.mark.parametrize("settings", [_blast(commonCauseTargets=3, commonCauseSpanSeconds=60),
                                      Settings().blast_radius], ids=["limit-3-span-60", "shipped-defaults"])
async def test_a_burst_taken_four_at_a_time_while_the_clock_runs_acts_on_none(h: Harness,
                                                                               monkeypatch: pytest.MonkeyPatch,
                                                                               settings: BlastRadiusSettings):
    """The incident of a node or network: 20 targets signal within a minute (one every 3 s), four
    workers take them as they arrive, span 60 s, limit 3, and the clock runs on through the burst and
    well past it. Each signal is judged on the signals that arrived within a span of its own arrival,
    not of when a worker took it: no target is acted on, and one escalation is handed over. With the
    daemon's shipped settings (no blastRadius in the config; the chart's defaults are the same,
    tests/chart/test_helm_chart.py::test_chart_defaults_are_the_daemon_defaults) a default install
    acts on none of the burst either."""
    timer = h.timer = FakeTimer(h.now)
    monkeypatch.setattr(h.journal, "clock", timer.clock)  # arrivals on the fake clock (the journal's clock)
    models = [f"m{i:02d}" for i in range(20)]
    ex = h.executor(_policies_on(models), blast_radius=settings)
    backlog = Backlog(h.journal, lambda: ex.state.policies.policies, ex.process, h.metrics, clock=timer.clock)
    h.journal.signals.on_intake(backlog.admit)
    tasks = [asyncio.create_task(backlog.work()) for _ in range(4)] + [asyncio.create_task(backlog.refill())]
    try:
        for model in models:
            await h.journal.signals.intake([Signal(SignalSource.ALERT, ALERT, {"model": model},
                                                   datetime.now(timezone.utc), f"alert-{model}")])
            await timer.advance(3)
        await timer.run_until(asyncio.ensure_future(backlog.drain()), step=5, limit=3600)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        h.journal.signals.on_intake(None)

    assert h.trace_of("observe", "apply") == []
    decisions = await h.journal.decisions.all.in_thread()
    assert len(decisions) == 20 and {d.state for d in decisions} == {"blocked"}
    assert all(d.reason.startswith("common cause suspected: 20 targets") for d in decisions), decisions[0].reason
    assert [e["event"] for e in h.events] == ["escalated"]
    assert timer.now >= h.now + 57 + 60  # the last arrival's span passed: the clock ran through the burst
    arrivals = sorted(s.received_at for s in await h.journal.signals.all.in_thread())
    assert arrivals[-1] - arrivals[0] == pytest.approx(57)


async def test_a_lone_signal_waits_the_quiet_hold_only_and_acts(h: Harness):
    """With the shipped settings a lone signal (no other target signalled around it) is held
    quietHoldSeconds (15 s), not the whole span, and then acts: a deploy's rollback does not wait a
    minute for a burst that is not there."""
    h.advance = True
    ex = h.executor(_policies_on(["m0", "m1"]), blast_radius=Settings().blast_radius)
    ((signal_id, signal),) = await _journal_alerts(h, ["m0"])
    await ex.process(signal_id, signal)

    assert h.sleeps == [15]
    assert len(h.trace_of("apply")) == 1
    assert [d.state for d in await h.journal.decisions.all.in_thread()] == ["succeeded"]


async def test_a_second_target_within_the_quiet_hold_holds_the_whole_span(h: Harness):
    """Another target signalling within the quiet hold makes the signal wait the whole span (the
    burst may go on): held 15 s, then the rest of the 60 s span, before it is judged."""
    h.advance = True
    ex = h.executor(_policies_on(["m0", "m1"]), blast_radius=Settings().blast_radius)
    journaled = await _journal_alerts(h, ["m0", "m1"])
    signal_id, signal = journaled[0]
    await ex.process(signal_id, signal)

    assert h.sleeps[0] == 15 and sum(h.sleeps) == pytest.approx(60, abs=1)
    assert len(h.trace_of("apply")) == 1  # two targets are no common cause at the limit of three


async def test_a_signal_taken_long_after_its_burst_is_still_judged_on_it(h: Harness):
    """A worker that gets to a signal three spans after it arrived (a backlog) does not hold it again
    and judges it on the burst it arrived in, not on the quiet time it is taken in."""
    models = [f"m{i}" for i in range(6)]
    ex = h.executor(_policies_on(models), blast_radius=_blast(commonCauseTargets=3,
                                                                 commonCauseSpanSeconds=30))
    journaled = await _journal_alerts(h, models)
    h.now = time.time() + 90  # taken three spans after the burst arrived
    for signal_id, signal in journaled:
        await ex.process(signal_id, signal)

    assert h.sleeps == [] and h.trace_of("apply") == []
    assert {d.state for d in await h.journal.decisions.all.in_thread()} == {"blocked"}
    assert [e["event"] for e in h.events] == ["escalated"]


async def test_signals_on_few_targets_are_not_suppressed(h: Harness):
    """Three targets within the span at a limit of three is not a common cause: all act."""
    models = ["m0", "m1", "m2"]
    ex = h.executor(_policies_on(models), blast_radius=_blast(commonCauseTargets=3))
    for signal_id, signal in await _journal_alerts(h, models):
        await ex.process(signal_id, signal)

    assert len(h.trace_of("apply")) == 3
    assert {d.state for d in await h.journal.decisions.all.in_thread()} == {"succeeded"}


async def test_target_budget_blocks_one_target_too_many(h: Harness):
    """maxTargetsPerWindow 2: two targets are changed, the third is blocked, and a target already
    changed may act again (it does not widen the blast radius). No hold without common cause."""
    models = ["m0", "m1", "m2"]
    ex = h.executor(_policies_on(models).replace("actions:", "guards: {cooldown: 0s}\nactions:"),
                    blast_radius=_blast(maxTargetsPerWindow=2))
    for signal_id, signal in await _journal_alerts(h, models):
        await ex.process(signal_id, signal)
    h.now += 10  # past the (zero) cooldown of m0's own policy
    (again_id, again), = (await h.journal.signals.intake(
        [Signal(SignalSource.ALERT, ALERT, {"model": "m0"}, datetime.now(timezone.utc), "alert-m0-again")]))[0]
    await ex.process(again_id, again)

    assert h.sleeps == []
    states = [(d.policy, d.state) for d in await h.journal.decisions.all.in_thread()]
    assert states == [("p-m0", "succeeded"), ("p-m1", "succeeded"), ("p-m2", "blocked"), ("p-m0", "succeeded")]
    (blocked,) = [d for d in await h.journal.decisions.all.in_thread() if d.state == "blocked"]
    assert "m0" in blocked.reason and "m1" in blocked.reason


async def test_flapping_signals_cause_at_most_max_actions(h: Harness):
    """An alert that fires and resolves every 5 s for 5 minutes (a new startsAt each time) leads to
    at most guards.maxActions actions in the window; the rest are blocked by cooldown or the limit."""
    ex = h.executor(_policy(f"{{type: {A}}}") + "guards: {cooldown: 20s, maxActions: 3, maxActionsWindow: 1h}\n")
    for i in range(60):
        await h.fire(ex, key=f"alert-{i}")
        h.now += 5

    decisions = await h.journal.decisions.all.in_thread()
    assert len(decisions) == 60
    assert sum(d.executed for d in decisions) == 3
    assert len(h.trace_of("apply")) == 3
    blocked = [d.reason.split(":")[0] for d in decisions if d.state == "blocked"]
    assert set(blocked) == {"cooldown", "rate limit"} and len(blocked) == 57


async def test_failing_notification_never_changes_the_outcome(h: Harness):
    """An outcome notifier that raises on every event leaves the remediation succeeded and counted."""
    def broken(event: dict[str, Any]) -> None:
        raise ConnectionError("receiver down")

    ex = h.executor(_policy(f"{{type: {A}}}"), notify=broken)
    await h.fire(ex)

    (decision,) = await h.journal.decisions.all.in_thread()
    assert decision.state == "succeeded"
    assert h.trace_of("apply", "verify") == [("apply", A), ("verify", A)]


# ---- approvals: what approving answers, and approved plans resumed ---------------------------------

APPROVAL = "approval: required\napprovalTimeoutSeconds: 600\n"


async def test_approve_answers_a_result_and_runs_the_plan_once(h: Harness):
    """The plan waits (nothing applied); approving it answers STARTED and applies it in the
    background; approving it again answers NOT_PENDING, an unknown id NOT_FOUND."""
    ex = h.executor(_policy(f"{{type: {A}}}") + APPROVAL)
    await h.fire(ex)
    assert h.trace_of("apply") == []
    (approval,) = await h.journal.approvals.all.in_thread("pending")

    missing = await ex.approve(99, "alice", "go")
    assert (missing.outcome, missing.message, missing.approval) == (ApprovalOutcome.NOT_FOUND, "no approval 99", None)
    started = await ex.approve(approval.id, "alice", "go")
    assert started.outcome is ApprovalOutcome.STARTED and started.approval is not None
    assert started.message == f"approval {approval.id} approved by alice; applying decision {approval.decision_id}"
    await ex.wait_approved()
    assert h.trace_of("apply") == [("apply", A)]
    again = await ex.approve(approval.id, "bob", "go")
    assert again.outcome is ApprovalOutcome.NOT_PENDING
    assert again.message == f"approval {approval.id} is approved by alice, not pending"
    assert [e["event"] for e in h.events][:2] == ["approval_requested", "approved"]


async def test_approve_refuses_a_freeze_an_expired_deadline_and_a_changed_policy(h: Harness):
    """A freeze keeps it pending (FROZEN); past its deadline it is EXPIRED; once its policy runs
    other actions it is POLICY_CHANGED; none applies anything."""
    ex = h.executor(_policy(f"{{type: {A}}}") + APPROVAL)
    await h.fire(ex)
    (approval,) = await h.journal.approvals.all.in_thread("pending")
    await h.journal.freezes.record.in_thread(f"default/{MODEL}", "hold", h.now + 60)

    frozen = await ex.approve(approval.id, "alice", "go")
    assert frozen.outcome is ApprovalOutcome.FROZEN
    assert frozen.message.startswith(f"approval {approval.id} stays pending: target frozen: hold (until ")
    h.now += 601
    expired = await ex.approve(approval.id, "alice", "go")
    assert expired.outcome is ApprovalOutcome.EXPIRED
    assert expired.message.startswith(f"approval {approval.id} passed its deadline ")
    h.now -= 601
    changed = h.executor(_policy(f"{{type: {B}}}") + APPROVAL)
    result = await changed.approve(approval.id, "alice", "go")
    assert result.outcome is ApprovalOutcome.POLICY_CHANGED
    assert result.message == (f"approval {approval.id}: policy remediate is gone or now runs other actions; "
                              "the plan is left unapplied")
    assert h.trace_of("apply") == []
    assert [a.status for a in await h.journal.approvals.all.in_thread()] == ["pending"]


async def test_an_approved_plan_a_crash_interrupted_is_resumed_once(h: Harness):
    """Approved, then the process dies mid-apply: a new executor resumes it from its steps (the
    landed change is recorded, not applied again); a second resume starts nothing."""
    policy = _policy(f"{{type: {A}, apply: [crash], verify: observe}}") + APPROVAL
    ex = h.executor(policy)
    await h.fire(ex)
    (approval,) = await h.journal.approvals.all.in_thread("pending")
    assert (await ex.approve(approval.id, "alice", "go")).outcome is ApprovalOutcome.STARTED
    await ex.wait_approved()  # its task ended with the Crash: the decision is still executing
    decision = await h.journal.decisions.get.in_thread(approval.decision_id)
    assert decision is not None and decision.state == "executing"

    after = h.executor(policy)
    assert await after.resume_approved() == 1
    assert await after.resume_approved() == 0  # already running, or done
    await after.wait_approved()
    decision = await h.journal.decisions.get.in_thread(approval.decision_id)
    assert decision is not None and decision.state == "succeeded"
    assert h.trace_of("apply") == [("apply", A)]


async def test_an_approved_plan_whose_policy_changed_is_failed_not_resumed(h: Harness):
    policy = _policy(f"{{type: {A}, apply: [crash]}}") + APPROVAL
    ex = h.executor(policy)
    await h.fire(ex)
    (approval,) = await h.journal.approvals.all.in_thread("pending")
    await ex.approve(approval.id, "alice", "go")
    await ex.wait_approved()

    after = h.executor(_policy(f"{{type: {B}}}") + APPROVAL)
    assert await after.resume_approved() == 0
    decision = await h.journal.decisions.get.in_thread(approval.decision_id)
    assert decision is not None and decision.state == "failed"
    assert decision.reason == ("approved plan not resumed after restart: policy remediate is gone or now runs "
                               "other actions")
    assert h.trace_of("apply") == [("apply", A)]


async def test_preview_climbs_the_same_ladder_and_journals_nothing(h: Harness):
    """Preview names the approval already pending as the live path does (blocked, awaiting it),
    observes the target read-only and journals no decision."""
    ex = h.executor(_policy(f"{{type: {A}}}") + APPROVAL)
    signal = Signal(SignalSource.ALERT, ALERT, {"model": MODEL}, datetime.now(timezone.utc), "preview-1")
    ((policy, verdict),) = await ex.preview(signal)
    assert policy.name == "remediate" and isinstance(verdict, NeedsApproval)
    await h.fire(ex)
    (approval,) = await h.journal.approvals.all.in_thread("pending")
    ((_, verdict),) = await ex.preview(signal)
    assert isinstance(verdict, Blocked) and verdict.awaiting == approval.id
    assert verdict.reason.startswith(f"awaiting approval {approval.id} (decision {approval.decision_id}) until ")
    assert len(await h.journal.decisions.all.in_thread()) == 1
    assert h.trace_of("apply") == []


async def test_every_decision_and_verdict_becomes_a_kubernetes_event(h: Harness):
    """An applied plan (its step, its decision, its verdict), a decision a guard blocked, and a plan
    that did not help: each ends in an Event of its own reason on the policy's target."""
    h.advance = True
    recorded: list[tuple[str, str, bool]] = []

    async def record_event(*, policy: Any, reason: str, message: str, warning: bool) -> None:
        recorded.append((policy.name, reason, warning))

    ex = h.executor(_verified(f"{{type: {A}}}", then="none", cooldown="1h"), query=lambda t: 100.0)
    ex._ctx.deps.record_event = record_event
    await h.fire(ex, "alert-1")
    await asyncio.wait_for(ex.wait_recoveries(), timeout=10)
    await h.fire(ex, "alert-2")  # within the cooldown
    reasons = [(reason, warning) for _, reason, warning in recorded]
    assert reasons == [("Remediated", False), ("RemediationSucceeded", False), ("Recovered", False),
                       ("RemediationBlocked", True)], reasons

    recorded.clear()
    late = h.executor(_verified(f"{{type: {A}}}", then="none", name="other"), query=lambda t: 900.0)
    late._ctx.deps.record_event = record_event
    await h.fire(late, "alert-3")
    await asyncio.wait_for(late.wait_recoveries(), timeout=10)
    assert [(r, w) for _, r, w in recorded][-1] == ("NotRecovered", True), recorded
