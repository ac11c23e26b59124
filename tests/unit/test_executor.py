"""The executor: revert across steps, retries of transient applies (the wait a TemporaryError asks
for), leadership lost mid-plan, exceptions from actions (never retried), noop steps, decisions resumed after a crash between an apply and its
record, notify steps that never stop a plan, frozen targets, and the recovery watch after a plan
(verdicts, escalate / revert / none, resumed after a restart); on a real journal with policies
loaded from YAML."""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, AsyncIterator, Callable, ClassVar, Mapping

import pytest
import structlog

from actions.base import ActionDeps, ActionParams, Step
from core.outcome import Outcome, PermanentError, TemporaryError
from core.query import QueryResult, Sample
from core.signal import Signal, SignalSource
from core.target import Target
from daemon.common.config import BlastRadiusSettings
from daemon.common.metrics import Metrics
from daemon.storage.journal import AsyncJournal, Journal
from daemon.workers.executor import Executor
from daemon.workers.progress import INTENT, MAX_APPLY_ATTEMPTS
from daemon.workers.steps import MAX_RETRY_DELAY_SECONDS
from daemon.workers.state import ExecutorState
from policies.loader import load_policies_text
from policies.planning import Plan
from tests.support.helpers import wait_for

ALERT = "TailLatencyHigh"
MODEL = "ranker"


# ---- test actions ------------------------------------------------------------------------------

class ScriptParams(ActionParams):
    """What a test action does, written in the policy next to its `type`."""

    observe: str = "ok"  # ok | raise
    plan: str = "change"  # change | noop | raise
    # per attempt, the last one repeats: ok|retry|fail|temporary|permanent|raise, or a crash of the
    # process between the call and its record: crash (the change landed) | crash_before (it did not)
    apply: tuple[str, ...] = ("ok",)
    # ok | fail | observe (OK when a change of this action landed, else failure) | blind (NOOP: cannot observe)
    verify: str = "ok"
    revert: str = "ok"  # ok | fail
    delay: float = 1.0  # the delay_seconds of a `temporary` apply's TemporaryError
    pin: bool = False  # a verified apply asks the daemon to remember a pin (as triton.rollback does)


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
        if params.verify == "observe":
            landed = any(e.action == self.kind for e in self.effects)
            return Outcome.success("new value in place") if landed else Outcome.failure("old value in place")
        if params.verify != "ok":
            return Outcome.failure("not as wanted")
        return Outcome.success("verified", **({"pin": {"model": MODEL, "version": 1}} if params.pin else {}))

    async def revert(self, step: Step, target: Target, params: ScriptParams) -> Outcome:
        self.calls.append(Call("revert", self.kind, step))
        return Outcome.success("reverted") if params.revert == "ok" else Outcome.failure("revert refused")


def _registry(calls: list[Call], effects: list[Step]) -> dict[str, type[ScriptedAction]]:
    kinds = ("test.step_a", "test.step_b", "test.step_c", "notify")
    return {k: type(f"Action_{k.split('.')[-1]}", (ScriptedAction,), {"kind": k, "calls": calls, "effects": effects})
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
    journal: AsyncJournal
    calls: list[Call] = field(default_factory=list)
    effects: list[Step] = field(default_factory=list)
    sleeps: list[float] = field(default_factory=list)
    metrics: Metrics = field(default_factory=Metrics)  # of the last executor made
    made: list[Executor] = field(default_factory=list)  # every executor made, settled at teardown
    now: float = field(default_factory=time.time)
    events: list[dict[str, Any]] = field(default_factory=list)  # outcome notifications handed over
    advance: bool = False  # sleeping moves `now` (recovery watches)
    gate: asyncio.Event | None = None  # when set, sleeps wait for it (a watch caught mid-wait)

    def executor(self, policies_yaml: str, may_act: Callable[[], bool] = lambda: True,
                 query: Callable[[float], float | None] | None = None, notify: Any = None,
                 blast_radius: BlastRadiusSettings | None = None) -> Executor:
        """An executor on the journal; `query` gives the verify query's value at a time since the
        first fire (None: no data)."""
        registry = _registry(self.calls, self.effects)
        policies = load_policies_text(policies_yaml, "test.yaml", registry, {})
        started = self.now

        async def sleep(delay: float) -> None:
            self.sleeps.append(delay)
            if self.gate is not None:
                await self.gate.wait()
            if self.advance:
                self.now += delay

        async def prometheus(promql: str) -> QueryResult:
            assert query is not None
            value = query(self.now - started)
            return QueryResult(promql, () if value is None else (Sample({"model": MODEL}, value),))

        self.metrics = Metrics()
        self.made.append(Executor(self.journal, ExecutorState(policies), registry,
                                  ActionDeps(query=prometheus if query is not None else None), self.metrics,
                                  may_act=may_act, clock=lambda: self.now, sleep=sleep,
                                  notify=notify or self.events.append, escalation_freeze_seconds=3600,
                                  blast_radius=blast_radius))
        return self.made[-1]

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
        ((signal_id, stored),), duplicates = await self.journal.record_signals([signal])
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
        (decision,) = await self.journal.decisions()
        assert decision.state == "executing"
        before = len(self.calls)
        await self.executor(after_restart or policies_yaml).process(signal_id, signal)
        return before

    def trace(self) -> list[tuple[str, str]]:
        return [(c.phase, c.kind) for c in self.calls]

    def trace_of(self, *phases: str) -> list[tuple[str, str]]:
        return [(c.phase, c.kind) for c in self.calls if c.phase in phases]

    async def results(self, decision_id: int, recovery: bool = False) -> list[dict[str, Any]]:
        """The decision's step rows without the intents journaled before each apply and, unless
        `recovery`, without the rows of its recovery check (about the decision as a whole, not a
        step: section 9 checks them; elsewhere they are NO_CHECK's, whose outcome is irrelevant)."""
        skip = (INTENT,) if recovery else (INTENT, "recovery")
        return [s for s in await self.journal.steps(decision_id) if s["phase"] not in skip]

    async def step_rows(self, decision_id: int) -> list[dict[str, Any]]:
        """The decision's step rows, intents included, without its recovery check's (see `results`)."""
        return [s for s in await self.journal.steps(decision_id) if s["phase"] != "recovery"]

    async def steps(self, decision_id: int, recovery: bool = False) -> list[tuple[int, str, str]]:
        return [(s["idx"], s["phase"], s["status"]) for s in await self.results(decision_id, recovery)]


@pytest.fixture
async def h(tmp_path: Path) -> AsyncIterator[Harness]:
    journal = Journal(tmp_path / "journal.db")
    harness = Harness(AsyncJournal(journal))
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
    (decision,) = await h.journal.decisions()
    assert decision.state == "reverted" and decision.executed
    assert decision.reason.startswith(f"step 2 ({C}) failed: permanent failure")
    assert await h.steps(decision.id) == [
        (0, "apply", "ok"), (0, "verify", "ok"),
        (1, "apply", "ok"), (1, "verify", "ok"),
        (2, "apply", "failed"),
        (1, "revert", "ok"), (0, "revert", "ok"),
    ]
    (signal,) = await h.journal.signals()
    assert signal["state"] == "processed"


async def test_failed_step_with_default_on_failure_stops_without_revert(h: Harness):
    """The default onFailure (stop) reverts nothing and ends `failed`."""
    ex = h.executor(_policy(f"{{type: {A}}}", f"{{type: {B}}}", f"{{type: {C}, apply: [fail]}}"))

    await h.fire(ex)

    assert h.trace_of("apply", "verify", "revert") == [
        ("apply", A), ("verify", A), ("apply", B), ("verify", B), ("apply", C)]
    (decision,) = await h.journal.decisions()
    assert decision.state == "failed"
    assert decision.reason == f"step 2 ({C}) failed: permanent failure"
    assert [phase for _, phase, _ in await h.steps(decision.id)] == ["apply", "verify", "apply", "verify", "apply"]


async def test_step_that_applied_but_failed_verify_is_reverted_too(h: Harness):
    """A step whose apply landed but whose verify failed is undone with the steps before it."""
    ex = h.executor(_policy(f"{{type: {A}}}", f"{{type: {B}, verify: fail}}", on_failure="revert"))

    await h.fire(ex)

    assert h.trace_of("apply", "verify", "revert") == [
        ("apply", A), ("verify", A), ("apply", B), ("verify", B), ("revert", B), ("revert", A)]
    (decision,) = await h.journal.decisions()
    assert decision.state == "reverted"


async def test_failed_revert_leaves_the_decision_failed(h: Harness):
    """A revert that fails is not reported as reverted: the decision is `failed` and names the step."""
    ex = h.executor(_policy(f"{{type: {A}, revert: fail}}", f"{{type: {B}}}", f"{{type: {C}, apply: [fail]}}",
                            on_failure="revert"))

    await h.fire(ex)

    assert h.trace_of("revert") == [("revert", B), ("revert", A)]
    (decision,) = await h.journal.decisions()
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
    (decision,) = await h.journal.decisions()
    assert decision.state == "succeeded"
    steps = await h.results(decision.id)
    assert [(s["phase"], s["status"], s["data"].get("attempt")) for s in steps] == [
        ("apply", "failed", 1), ("apply", "failed", 2), ("apply", "ok", 3), ("verify", "ok", None)]


@pytest.mark.parametrize("permanent", ["fail", "permanent"])
async def test_non_retryable_apply_is_attempted_once(h: Harness, permanent: str):
    """A non-retryable failure (an Outcome or a PermanentError) is attempted once, with no sleep."""
    ex = h.executor(_policy(f"{{type: {A}, apply: [{permanent}, ok]}}"))

    await h.fire(ex)

    assert h.trace_of("apply", "verify") == [("apply", A)]
    assert h.sleeps == []
    (decision,) = await h.journal.decisions()
    assert decision.state == "failed"
    steps = await h.results(decision.id)
    assert [(s["phase"], s["status"], s["data"]["attempt"]) for s in steps] == [("apply", "failed", 1)]


async def test_apply_that_keeps_failing_retryably_stops_at_max_attempts(h: Harness):
    """A retryable failure every time: MAX_APPLY_ATTEMPTS attempts, then the decision fails."""
    ex = h.executor(_policy(f"{{type: {A}, apply: [retry]}}"))

    await h.fire(ex)

    assert h.trace_of("apply", "verify") == [("apply", A)] * MAX_APPLY_ATTEMPTS
    # The backoff between attempts: 1 s, 2 s, ...; none after the last one (the target stays locked).
    assert h.sleeps == [2 ** i for i in range(MAX_APPLY_ATTEMPTS - 1)]
    (decision,) = await h.journal.decisions()
    assert decision.state == "failed"
    assert decision.reason == f"step 0 ({A}) failed: transient failure"
    steps = await h.results(decision.id)
    assert [(s["phase"], s["data"]["attempt"]) for s in steps] == [
        ("apply", n) for n in range(1, MAX_APPLY_ATTEMPTS + 1)]


# ---- 3. leadership lost between steps ----------------------------------------------------------

async def test_leadership_lost_between_steps_stops_before_the_next_apply(h: Harness):
    """may_act turning False after step 0 applied: step 1 is never applied, the decision fails."""
    def may_act() -> bool:
        return not any(c.phase == "apply" for c in h.calls)

    ex = h.executor(_policy(f"{{type: {A}}}", f"{{type: {B}}}", on_failure="revert"), may_act=may_act)

    await h.fire(ex)

    assert h.trace_of("apply", "verify", "revert") == [("apply", A), ("verify", A)]
    (decision,) = await h.journal.decisions()
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
    boom, after = await h.journal.decisions()
    assert boom.state == "failed" and f"{A}.apply raised RuntimeError: boom" in boom.reason
    steps = await h.results(boom.id)
    assert steps and all(s["phase"] == "apply" and s["status"] == "failed" for s in steps)
    assert all(f"{A}.apply raised RuntimeError: boom" in s["message"] for s in steps)
    assert len(steps) == len([c for c in h.calls if c.phase == "apply" and c.kind == A])
    assert ("verify", A) not in h.trace()
    assert after.state == "succeeded"
    assert h.trace_of("apply", "verify")[-2:] == [("apply", B), ("verify", B)]
    (signal,) = await h.journal.signals()
    assert signal["state"] == "processed"
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
    (decision,) = await h.journal.decisions()
    assert decision.state == "reverted"
    assert decision.reason == f"step 1 ({B}) failed: {B}.apply raised RuntimeError: boom; reverted"
    (row,) = [s for s in await h.results(decision.id) if s["idx"] == 1]
    assert (row["phase"], row["status"], row["data"]["attempt"]) == ("apply", "failed", 1)
    assert row["data"]["retryable"] is False
    assert row["data"]["exception"] == {"type": "RuntimeError", "message": "boom"}
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
    (decision,) = await h.journal.decisions()
    assert decision.state == "succeeded"
    failed = [s for s in await h.results(decision.id) if s["status"] == "failed"]
    assert [(s["data"]["attempt"], s["data"]["retry_after_seconds"]) for s in failed] == [(1, delay), (2, delay)]


async def test_temporary_error_delay_keeps_the_attempts_bounded(h: Harness):
    """A TemporaryError with a delay every time: still MAX_APPLY_ATTEMPTS attempts, each wait the delay."""
    ex = h.executor(_policy(f"{{type: {A}, apply: [temporary], delay: 7}}"))

    await h.fire(ex)

    assert h.trace_of("apply") == [("apply", A)] * MAX_APPLY_ATTEMPTS
    assert h.sleeps == [7] * (MAX_APPLY_ATTEMPTS - 1)
    (decision,) = await h.journal.decisions()
    assert decision.state == "failed" and decision.reason == f"step 0 ({A}) failed: transient error"


async def test_temporary_error_asking_for_more_than_the_longest_wait_is_not_retried(h: Harness):
    """A delay beyond MAX_RETRY_DELAY_SECONDS (the target stays locked while waiting): one attempt,
    no sleep, the step failed saying why, journaled not retryable (a restart does not retry it)."""
    ex = h.executor(_policy(f"{{type: {A}, apply: [temporary, ok], delay: {MAX_RETRY_DELAY_SECONDS + 1:g}}}"))

    await h.fire(ex)

    assert h.trace_of("apply") == [("apply", A)]
    assert h.sleeps == []
    (decision,) = await h.journal.decisions()
    assert decision.state == "failed"
    assert decision.reason == (f"step 0 ({A}) failed: transient error; not retried: it asks to wait "
                               f"{MAX_RETRY_DELAY_SECONDS + 1:g}s, more than {MAX_RETRY_DELAY_SECONDS:g}s")
    (row,) = await h.results(decision.id)
    assert row["data"]["retryable"] is False


@pytest.mark.parametrize("phase", ["plan", "observe"])
async def test_planning_raising_becomes_a_failed_decision(h: Harness, phase: str):
    """An exception in plan (or observe) is a `failed` decision saying "planning failed"; nothing is applied."""
    ex = h.executor(_policy(f"{{type: {A}}}", f"{{type: {B}, {phase}: raise}}"))

    (plan,) = await h.fire(ex)

    assert h.trace_of("apply", "verify", "revert") == []
    (decision,) = await h.journal.decisions()
    assert decision.state == "failed" and not decision.executed
    assert decision.reason.startswith("planning failed")
    assert f"{B}.{phase} raised RuntimeError: {phase} boom" in decision.reason
    assert plan.blocked == decision.reason
    assert await h.steps(decision.id) == []
    (signal,) = await h.journal.signals()
    assert signal["state"] == "processed"


# ---- 5. noop steps -----------------------------------------------------------------------------

async def test_noop_step_is_journaled_and_not_applied(h: Harness):
    """A noop step is journaled as noop and skipped; the other steps run."""
    ex = h.executor(_policy(f"{{type: {A}, plan: noop}}", f"{{type: {B}}}"))

    await h.fire(ex)

    assert h.trace_of("apply", "verify") == [("apply", B), ("verify", B)]
    (decision,) = await h.journal.decisions()
    assert decision.state == "succeeded"
    assert decision.reason == "1 step(s) applied and verified"
    assert await h.steps(decision.id) == [(0, "apply", "noop"), (1, "apply", "ok"), (1, "verify", "ok")]


async def test_all_noop_plan_is_decided_noop_without_apply(h: Harness):
    """A plan whose every step is a noop is decided `noop`; no apply, no step, not executed."""
    ex = h.executor(_policy(f"{{type: {A}, plan: noop}}", f"{{type: {B}, plan: noop}}"))

    (plan,) = await h.fire(ex)

    assert h.trace() == [("observe", A), ("plan", A), ("observe", B), ("plan", B)]
    (decision,) = await h.journal.decisions()
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

    (decision,) = await h.journal.decisions()
    rows = await h.step_rows(decision.id)
    assert [(s["idx"], s["phase"], s["data"].get("attempt")) for s in rows] == [
        (0, INTENT, 1), (0, "apply", 1), (0, INTENT, 2), (0, "apply", 2), (0, "verify", None),
        (1, INTENT, 1), (1, "apply", 1), (1, "verify", None)]
    keys = [f"{decision.id}/0", f"{decision.id}/0", f"{decision.id}/1"]
    assert [s["data"]["effect_key"] for s in rows if s["phase"] == INTENT] == keys
    assert [c.step.effect_key for c in h.calls if c.phase == "apply" and c.step] == keys
    assert all("effect_key" not in s for s in decision.plan["steps"])  # the plan is the policy's, keys are not


async def test_resumed_step_in_doubt_whose_change_landed_is_recorded_not_applied(h: Harness):
    """Crash after the change landed, before its result was journaled: after the restart the
    journaled plan is resumed (no observe, no plan), verify finds the change, the step is recorded
    as applied (recovered after restart) and apply is not called again."""
    calls_before = await h.crash_and_restart(_policy(f"{{type: {A}, apply: [crash, ok], verify: observe}}"))

    assert h.trace()[calls_before:] == [("verify", A)]
    assert len(h.effects) == 1
    (decision,) = await h.journal.decisions()
    assert decision.state == "succeeded" and decision.reason == "1 step(s) applied and verified"
    rows = await h.step_rows(decision.id)
    assert [(s["phase"], s["status"], s["data"].get("attempt")) for s in rows] == [
        (INTENT, "pending", 1), ("apply", "ok", 1), ("verify", "ok", None)]
    assert rows[1]["message"].startswith("recovered after restart: attempt 1 had landed")
    assert rows[1]["data"]["recovered"] and rows[1]["data"]["effect_key"] == f"{decision.id}/0"
    (signal,) = await h.journal.signals()
    assert signal["state"] == "processed"


async def test_resumed_step_in_doubt_whose_change_did_not_land_is_applied_once(h: Harness):
    """Crash before the change landed: verify after the restart finds the old value, so the step
    is applied once more (attempt 2, same effect key) and verified."""
    calls_before = await h.crash_and_restart(
        _policy(f"{{type: {A}, apply: [crash_before, ok], verify: observe}}"))

    assert h.trace()[calls_before:] == [("verify", A), ("apply", A), ("verify", A)]
    assert len(h.effects) == 1
    (decision,) = await h.journal.decisions()
    assert decision.state == "succeeded"
    rows = await h.step_rows(decision.id)
    assert [(s["phase"], s["status"], s["data"].get("attempt")) for s in rows] == [
        (INTENT, "pending", 1), (INTENT, "pending", 2), ("apply", "ok", 2), ("verify", "ok", None)]
    applies = [c.step for c in h.calls if c.phase == "apply" and c.step]
    assert [s.effect_key for s in applies] == [f"{decision.id}/0"] * 2


async def test_resumed_step_that_cannot_be_observed_is_sent_again_with_the_same_key(h: Harness):
    """An effect verify cannot observe (NOOP, as notify answers) is at-least-once: applied again
    after the restart, with the same effect key for the receiver to drop the repeat."""
    calls_before = await h.crash_and_restart(_policy(f"{{type: {A}, apply: [crash, ok], verify: blind}}"))

    assert h.trace()[calls_before:] == [("verify", A), ("apply", A), ("verify", A)]
    (decision,) = await h.journal.decisions()
    assert decision.state == "succeeded"
    assert [e.effect_key for e in h.effects] == [f"{decision.id}/0"] * 2


async def test_resumed_decision_skips_steps_with_a_result_and_applies_the_rest(h: Harness):
    """Steps whose result was journaled before the crash (a noop, an applied and verified one) are
    not called again; the step in doubt goes on, the step never started is applied."""
    calls_before = await h.crash_and_restart(_policy(
        f"{{type: {A}, plan: noop}}", f"{{type: {B}}}", f"{{type: {C}, apply: [crash_before, ok], verify: observe}}"))

    assert h.trace()[calls_before:] == [("verify", C), ("apply", C), ("verify", C)]
    (decision,) = await h.journal.decisions()
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
    (decision,) = await h.journal.decisions()
    assert revert.effect_key == f"{decision.id}/0"
    assert decision.state == "reverted"
    assert decision.reason.startswith(f"step 1 ({B}) failed: permanent failure")


async def test_resumed_decision_whose_policy_changed_its_actions_is_failed_not_run(h: Harness):
    """A plan journaled for other actions than the policy now names is not resumed: `failed`, no call."""
    calls_before = await h.crash_and_restart(_policy(f"{{type: {A}, apply: [crash]}}"),
                                             after_restart=_policy(f"{{type: {B}}}"))

    assert h.trace()[calls_before:] == []
    (decision,) = await h.journal.decisions()
    assert decision.state == "failed" and decision.reason.startswith("not resumed after restart")


# ---- 7. notify steps never stop a plan ---------------------------------------------------------

@pytest.mark.parametrize("on_failure", ["stop", "revert"])
async def test_failed_notify_step_is_journaled_failed_and_the_plan_goes_on(h: Harness, on_failure: str):
    """A notify step that fails (after its retries) does not stop the rollback behind it, under
    either onFailure; nothing is reverted and the decision succeeds, naming the failed notify."""
    ex = h.executor(_policy("{type: notify, apply: [fail]}", f"{{type: {A}}}", on_failure=on_failure))

    await h.fire(ex)

    assert h.trace_of("apply", "verify", "revert") == [("apply", "notify"), ("apply", A), ("verify", A)]
    (decision,) = await h.journal.decisions()
    assert decision.state == "succeeded"
    assert decision.reason == "1 step(s) applied and verified; notify step(s) [0] failed (a notification never " \
                              "stops a plan)"
    assert await h.steps(decision.id) == [(0, "apply", "failed"), (1, "apply", "ok"), (1, "verify", "ok")]


# ---- 8. frozen targets -------------------------------------------------------------------------

async def test_frozen_target_is_blocked_until_the_freeze_expires(h: Harness):
    """A freeze in force blocks every policy on the target with its reason; an expired one does not."""
    ex = h.executor(_policy(f"{{type: {A}}}", cooldown="0s"))
    await h.journal.record_freeze(f"default/{MODEL}", "decision 1 did not recover", h.now + 60, 1)

    await h.fire(ex, "alert-1")
    h.now += 61
    await h.fire(ex, "alert-2")

    first, second = await h.journal.decisions()
    assert first.state == "blocked" and not first.executed
    assert first.reason.startswith("target frozen: decision 1 did not recover (until ")
    assert "tailguard unfreeze default/ranker" in first.reason
    assert second.state == "succeeded"
    assert h.trace_of("apply") == [("apply", A)]


async def test_lifted_freeze_no_longer_blocks_and_the_global_freeze_speaks_first(h: Harness):
    """The global freeze is reported before a target's; a lifted target freeze blocks nothing."""
    ex = h.executor(_policy(f"{{type: {A}}}", cooldown="0s"))
    await h.journal.record_freeze(f"default/{MODEL}", "escalated", h.now + 3600)
    ex.state.frozen = True
    await h.fire(ex, "alert-1")
    ex.state.frozen = False
    (lifted,) = await h.journal.lift_freezes(f"default/{MODEL}", "fixed", h.now)
    await h.fire(ex, "alert-2")

    first, second = await h.journal.decisions()
    assert first.state == "blocked" and first.reason == "global freeze is on"
    assert lifted.reason == "escalated" and second.state == "succeeded"


# ---- 9. the recovery watch after a plan ----------------------------------------------------------

VERIFY = "{{query: 'p999{{model=\"$model\"}}', below: 500, for: 2s, within: 8s, interval: 1s, onNotRecovered: {then}}}"


def _verified(*actions: str, then: str = "escalate", **kw: Any) -> str:
    return _policy(*actions, verify=VERIFY.format(then=then), **kw)


async def _recovery_rows(h: Harness, decision_id: int) -> list[tuple[str, str]]:
    return [(s["status"], s["message"]) for s in await h.journal.steps(decision_id) if s["phase"] == "recovery"]


async def test_plan_that_helped_is_journaled_pending_then_recovered(h: Harness):
    """The check is journaled in flight with the decision, watched without the target lock, and
    settles recovered; `acted` and `recovered` are handed to notify; nothing is frozen."""
    h.advance, h.gate = True, asyncio.Event()
    ex = h.executor(_verified(f"{{type: {A}}}"), query=lambda t: 900.0 if t < 3 else 100.0)

    await h.fire(ex)
    await wait_for(lambda: h.sleeps, timeout=10)  # the watch took its first sample and waits at the gate
    (decision,) = await h.journal.decisions()
    assert decision.state == "succeeded"
    ((status, message),) = await _recovery_rows(h, decision.id)
    assert status == "pending" and message.startswith('checking: p999{model="ranker"} below 500 for 2s within 8s')
    assert h.sleeps == [1.0]
    assert not ex.lock_for(f"default/{MODEL}").locked()  # the watch waits unlocked
    h.gate.set()
    await ex.wait_recoveries()

    rows = [s for s in await h.journal.steps(decision.id) if s["phase"] == "recovery"]
    assert [r["status"] for r in rows] == ["pending", "recovered"]
    assert rows[1]["data"]["follow_up"] is None and rows[1]["data"]["samples"] >= 3
    assert [e["event"] for e in h.events] == ["acted", "recovered"]
    assert h.events[0]["decision"] == decision.id and h.events[1]["verdict"] == "recovered"
    assert await h.journal.freezes() == []
    assert await h.journal.open_recoveries() == []


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

    first, second = await h.journal.decisions()
    rows = await _recovery_rows(h, first.id)
    assert [status for status, _ in rows] == ["pending", verdict]
    assert "escalated: default/ranker frozen until" in rows[1][1]
    (freeze,) = await h.journal.freezes()
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
    assert [p["version"] for p in await h.journal.pins()] == [1]
    await ex.wait_recoveries()

    assert h.trace_of("revert") == [("revert", C), ("revert", A)]
    (decision,) = await h.journal.decisions()
    assert decision.state == "reverted"
    assert decision.reason == "2 step(s) applied and verified; did not recover (not_recovered); reverted"
    assert await h.journal.pins() == []
    assert await h.journal.freezes() == []
    assert [(i, p, st) for i, p, st in await h.steps(decision.id, recovery=True) if p in ("revert", "recovery")] == [
        (-1, "recovery", "pending"), (-1, "recovery", "not_recovered"), (2, "revert", "ok"), (0, "revert", "ok")]
    assert await h.journal.open_recoveries() == []


async def test_none_follow_up_only_journals(h: Harness):
    """onNotRecovered: none journals the verdict; no revert, no freeze, the decision stays succeeded."""
    h.advance = True
    ex = h.executor(_verified(f"{{type: {A}}}", then="none"), query=lambda t: 900.0)

    await h.fire(ex)
    await ex.wait_recoveries()

    (decision,) = await h.journal.decisions()
    assert decision.state == "succeeded"
    assert [status for status, _ in await _recovery_rows(h, decision.id)] == ["pending", "not_recovered"]
    assert h.trace_of("revert") == [] and await h.journal.freezes() == []


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
    (decision,) = await h.journal.decisions()
    assert [status for status, _ in await _recovery_rows(h, decision.id)] == ["pending"]
    assert len(await h.journal.open_recoveries()) == 1

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
    (decision,) = await h.journal.decisions()
    assert decision.state == "succeeded" and h.trace_of("revert") == []
    (opened,) = await h.journal.open_recoveries()
    assert opened.row["status"] == "not_recovered"

    second = h.executor(policy, query=lambda t: 900.0)
    assert await second.resume_verifications() == 1
    await second.wait_recoveries()

    assert h.trace_of("revert") == [("revert", A)]
    (decision,) = await h.journal.decisions()
    assert decision.state == "reverted"


async def test_a_notify_callback_that_raises_never_fails_a_remediation(h: Harness):
    """The outcome callback raising is counted and logged; the decision and its watch go on."""
    def broken(event: Mapping[str, Any]) -> None:
        raise RuntimeError("receiver bug")

    h.advance = True
    ex = h.executor(_verified(f"{{type: {A}}}"), query=lambda t: 100.0, notify=broken)

    await h.fire(ex)
    await ex.wait_recoveries()

    (decision,) = await h.journal.decisions()
    assert decision.state == "succeeded"
    assert [status for status, _ in await _recovery_rows(h, decision.id)] == ["pending", "recovered"]


# ---- blast radius across targets -----------------------------------------------------------------

def _policies_on(models: list[str]) -> str:
    """One policy per model, each acting on the TailLatencyHigh alert about its model."""
    return "---\n".join(_policy(f"{{type: {A}}}", name=f"p-{m}").replace(f"model: {MODEL}", f"model: {m}")
                         for m in models)


async def _journal_alerts(h: Harness, models: list[str]) -> list[tuple[int, Signal]]:
    signals = [Signal(SignalSource.ALERT, ALERT, {"model": m}, datetime.now(timezone.utc), f"alert-{m}")
               for m in models]
    new, _ = await h.journal.record_signals(signals)
    return new


async def test_common_cause_burst_acts_on_none_and_escalates_once(h: Harness):
    """Six targets signal within the span, limit three: every decision is blocked as a common
    cause, nothing is applied, and exactly one escalation is handed over."""
    models = [f"m{i}" for i in range(6)]
    ex = h.executor(_policies_on(models), blast_radius=BlastRadiusSettings(commonCauseTargets=3,
                                                                           commonCauseSpanSeconds=30))
    for signal_id, signal in await _journal_alerts(h, models):  # the burst lands while each waits
        await ex.process(signal_id, signal)

    assert h.trace_of("apply") == []
    assert h.sleeps == [30] * 6  # each matching signal was held for the span first
    decisions = await h.journal.decisions()
    assert len(decisions) == 6 and all(d.state == "blocked" for d in decisions)
    assert all("common cause" in d.reason for d in decisions), [d.reason for d in decisions]
    assert [e["event"] for e in h.events] == ["escalated"]


async def test_signals_on_few_targets_are_not_suppressed(h: Harness):
    """Three targets within the span at a limit of three is not a common cause: all act."""
    models = ["m0", "m1", "m2"]
    ex = h.executor(_policies_on(models), blast_radius=BlastRadiusSettings(commonCauseTargets=3))
    for signal_id, signal in await _journal_alerts(h, models):
        await ex.process(signal_id, signal)

    assert len(h.trace_of("apply")) == 3
    assert {d.state for d in await h.journal.decisions()} == {"succeeded"}


async def test_target_budget_blocks_one_target_too_many(h: Harness):
    """maxTargetsPerWindow 2: two targets are changed, the third is blocked, and a target already
    changed may act again (it does not widen the blast radius). No hold without common cause."""
    models = ["m0", "m1", "m2"]
    ex = h.executor(_policies_on(models).replace("actions:", "guards: {cooldown: 0s}\nactions:"),
                    blast_radius=BlastRadiusSettings(maxTargetsPerWindow=2))
    for signal_id, signal in await _journal_alerts(h, models):
        await ex.process(signal_id, signal)
    h.now += 10  # past the (zero) cooldown of m0's own policy
    (again_id, again), = (await h.journal.record_signals(
        [Signal(SignalSource.ALERT, ALERT, {"model": "m0"}, datetime.now(timezone.utc), "alert-m0-again")]))[0]
    await ex.process(again_id, again)

    assert h.sleeps == []
    states = [(d.policy, d.state) for d in await h.journal.decisions()]
    assert states == [("p-m0", "succeeded"), ("p-m1", "succeeded"), ("p-m2", "blocked"), ("p-m0", "succeeded")]
    (blocked,) = [d for d in await h.journal.decisions() if d.state == "blocked"]
    assert "m0" in blocked.reason and "m1" in blocked.reason


async def test_flapping_signals_cause_at_most_max_actions(h: Harness):
    """An alert that fires and resolves every 5 s for 5 minutes (a new startsAt each time) leads to
    at most guards.maxActions actions in the window; the rest are blocked by cooldown or the limit."""
    ex = h.executor(_policy(f"{{type: {A}}}") + "guards: {cooldown: 20s, maxActions: 3, maxActionsWindow: 1h}\n")
    for i in range(60):
        await h.fire(ex, key=f"alert-{i}")
        h.now += 5

    decisions = await h.journal.decisions()
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

    (decision,) = await h.journal.decisions()
    assert decision.state == "succeeded"
    assert h.trace_of("apply", "verify") == [("apply", A), ("verify", A)]
