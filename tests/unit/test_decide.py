"""The one decision ladder (`daemon.workers.decide`) with its evidence faked: which rung says no, that
a no stops the climb (nothing further is asked, no target observed), the verdict each plan gives,
that only a live decision commits to the guards' memory; what a shadow trigger journals for each
verdict (`shadow_row`), and the HTTP status of each approval outcome."""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone

import pytest

from actions.base import Step
from core.decision import DecisionState
from core.outcome import ActionError, Declined
from core.signal import Signal, SignalSource
from daemon.http.api import approval_status
from daemon.storage.records import Approval
from daemon.wiring.registries import action_registry
from daemon.workers.approvals import ApprovalOutcome
from daemon.workers.decide import decide
from daemon.workers.shadow import ShadowOrigin, shadow_row
from daemon.workers.silences import Matcher, Silence, SilenceVerdict
from daemon.workers.verdicts import Blocked, DryRun, Execute, Mode, NeedsApproval, NoOp, Unplanned, Verdict
from policies.blast_radius import CommonCauseDecision
from policies.governance import Ruling, Standing
from policies.guards import GuardDecision
from policies.loader import LoadedPolicy, load_policies_text
from tests.support.helpers import notify_policy

HOOK = "http://127.0.0.1:9/hook"
DEADLINE = 1_900_000_000.0  # 2030-03-17T17:46:40+00:00
STEP = Step("notify", "default/ranker", f"notify {HOOK}")


def _policy(guards: str = "cooldown: 0s", extra: str = "") -> LoadedPolicy:
    (policy,) = load_policies_text(notify_policy(HOOK, guards, extra), "p.yaml", action_registry(), {}).policies
    return policy


def _signal(source: SignalSource = SignalSource.ALERT) -> Signal:
    return Signal(source, "TritonTailLatencyHigh", {"model": "ranker"}, datetime.now(timezone.utc), "k")


@dataclass
class FakeEvidence:
    """Answers each rung as told and records what was asked (and whether the guards were committed)."""

    guard: GuardDecision = GuardDecision(True, "guards passed")
    waiting: Approval | None = None
    silence: SilenceVerdict | None = None
    planned: list[Step] | ActionError = field(default_factory=lambda: [STEP])
    ruled: Ruling | None = None  # None: the signal is not an alert (not asked about)
    asked: list[str] = field(default_factory=list)
    commits: list[bool] = field(default_factory=list)

    async def guards(self, policy: LoadedPolicy, *, commit: bool, arrived_at: float | None = None) -> GuardDecision:
        self.asked.append("guards")
        self.commits.append(commit)
        return self.guard

    async def pending_approval(self, policy: LoadedPolicy) -> Approval | None:
        self.asked.append("approval")
        return self.waiting

    async def silences(self, policy: LoadedPolicy, signal: Signal) -> SilenceVerdict | None:
        self.asked.append("silences")
        return self.silence

    async def governance(self, policy: LoadedPolicy, signal: Signal) -> Ruling | None:
        if self.ruled is not None:
            self.asked.append("governance")
        return self.ruled

    async def steps(self, policy: LoadedPolicy, signal: Signal) -> list[Step]:
        self.asked.append("steps")
        if isinstance(self.planned, ActionError):
            raise self.planned
        return self.planned


SILENCE = Silence("s-1", (Matcher("model", "ranker"),), 0.0, DEADLINE, "active", "ops", "maintenance")
WAITING = Approval(3, 7, "ranker-notify", "default/ranker", 0.0, DEADLINE, "pending")


# ---- the ladder ------------------------------------------------------------------------------------

async def test_a_governed_alert_that_notifies_stops_the_climb_before_the_target_is_observed():
    """A governed alert whose detector sees the target is journaled notify-only with the ruling's
    reason in the note, and no target is observed; the backstop's ruling is noted and the ladder goes on."""
    fresh = FakeEvidence(ruled=Ruling(False, "notify only: the governing detector judged fresh data", Standing.GOVERNED))
    verdict = await decide(_policy(), _signal(), Mode.LIVE, fresh)
    assert isinstance(verdict, Blocked) and verdict.notify_only and not verdict.silenced
    assert verdict.reason == verdict.plan.blocked == "notify only: the governing detector judged fresh data"
    assert verdict.note["governance"] == {"acts": False, "outcome": "notify", "standing": "governed",
                                          "trigger": None, "reason": verdict.reason}
    assert fresh.asked == ["guards", "silences", "governance"]
    blind = FakeEvidence(ruled=Ruling(True, "backstop: no fresh evidence for 400 s", Standing.GOVERNED, backstop=True))
    verdict = await decide(_policy(), _signal(), Mode.LIVE, blind)
    assert isinstance(verdict, Execute) and verdict.note["governance"]["outcome"] == "backstop"
    assert blind.asked == ["guards", "silences", "governance", "steps"]


async def test_a_guard_that_says_no_stops_the_climb():
    """Blocked by the guard's reason; no approval, silence or target is asked about."""
    evidence = FakeEvidence(guard=GuardDecision(False, "cooldown: last action 5s ago, cooldown is 60s"))
    verdict = await decide(_policy(extra="approval: required\n"), _signal(), Mode.LIVE, evidence)
    assert isinstance(verdict, Blocked) and not verdict.escalates and not verdict.silenced
    assert verdict.reason == verdict.plan.blocked == "cooldown: last action 5s ago, cooldown is 60s"
    assert verdict.plan.steps == () and verdict.note == {}
    assert evidence.asked == ["guards"]


async def test_the_first_common_cause_suppression_escalates():
    """A common-cause block that is the burst's first says so (the live recorder announces it)."""
    cause = CommonCauseDecision(False, "common cause: 5 targets", targets=5, escalate=True)
    verdict = await decide(_policy(), _signal(), Mode.LIVE, FakeEvidence(guard=cause))
    assert isinstance(verdict, Blocked) and verdict.escalates


@pytest.mark.parametrize(("mode", "commits"), [(Mode.LIVE, True), (Mode.SHADOW, False), (Mode.PREVIEW, False)])
async def test_only_a_live_decision_commits_to_the_guards(mode: Mode, commits: bool):
    """Shadow and preview read the guards without using up the escalate-once memory."""
    evidence = FakeEvidence()
    await decide(_policy(), _signal(), mode, evidence)
    assert evidence.commits == [commits]


async def test_an_approval_already_pending_blocks_before_silences_and_planning():
    """One plan waits per policy and target: the new decision is blocked naming it."""
    evidence = FakeEvidence(waiting=WAITING)
    verdict = await decide(_policy(extra="approval: required\n"), _signal(), Mode.LIVE, evidence)
    assert isinstance(verdict, Blocked) and verdict.awaiting == 3
    assert verdict.reason == "awaiting approval 3 (decision 7) until 2030-03-17T17:46:40+00:00"
    assert evidence.asked == ["guards", "approval"]


async def test_a_policy_without_approval_never_asks_about_one():
    evidence = FakeEvidence(waiting=WAITING)
    assert isinstance(await decide(_policy(), _signal(), Mode.LIVE, evidence), Execute)
    assert evidence.asked == ["guards", "silences", "steps"]


async def test_a_matching_silence_blocks_like_a_guard_and_is_noted():
    """Blocked (silenced) with the silence described in the note; the target is not observed."""
    evidence = FakeEvidence(silence=SilenceVerdict((SILENCE,)))
    verdict = await decide(_policy(), _signal(SignalSource.DETECTOR), Mode.LIVE, evidence)
    assert isinstance(verdict, Blocked) and verdict.silenced
    assert verdict.reason.startswith("silenced in Alertmanager: silence s-1 by ops until ")
    assert verdict.note == {"silences": {"checked": True, "matched": [SILENCE.describe()]}}
    assert evidence.asked == ["guards", "silences"]


async def test_silences_that_could_not_be_read_do_not_block_and_are_noted():
    verdict = await decide(_policy(), _signal(SignalSource.DETECTOR), Mode.LIVE,
                           FakeEvidence(silence=SilenceVerdict(error="timeout")))
    assert isinstance(verdict, Execute)
    assert verdict.note == {"silences": {"checked": False, "error": "timeout",
                                         "note": "acted without silences: Alertmanager did not answer"}}


async def test_planning_that_fails_is_unplanned():
    error = ActionError("notify.observe: no route")
    verdict = await decide(_policy(), _signal(), Mode.LIVE, FakeEvidence(planned=error))
    assert isinstance(verdict, Unplanned) and verdict.error is error
    assert verdict.reason == verdict.plan.blocked == "planning failed: notify.observe: no route"


async def test_an_action_declining_the_signal_blocks_and_does_not_fail():
    """requireAttribution's refusal (the anomaly is on an older version) is the policy's own no: a
    blocked decision with the reason, not a failed one (no RemediationFailed, no failure page)."""
    error = Declined("ranker: requireAttribution: the anomaly is on version 1, not on the newest served version 2")
    verdict = await decide(_policy(), _signal(SignalSource.DETECTOR), Mode.LIVE, FakeEvidence(planned=error))
    assert isinstance(verdict, Blocked) and not verdict.escalates
    assert verdict.reason == verdict.plan.blocked == str(error) and not verdict.plan.steps


@pytest.mark.parametrize(("guards", "extra", "steps", "kind"), [
    ("cooldown: 0s", "", [Step("notify", "default/ranker", "already so", noop=True)], NoOp),
    ("cooldown: 0s, dryRun: true", "approval: required\n", [STEP], DryRun),
    ("cooldown: 0s", "approval: required\n", [STEP], NeedsApproval),
    ("cooldown: 0s", "", [STEP], Execute),
])
async def test_what_the_plan_says(guards: str, extra: str, steps: list[Step], kind: type):
    """All no-op: NoOp; dryRun (before approval): DryRun; approval required: NeedsApproval; else Execute."""
    verdict = await decide(_policy(guards, extra), _signal(), Mode.LIVE, FakeEvidence(planned=steps))
    assert type(verdict) is kind and verdict.plan.steps == tuple(steps)


# ---- what a shadow trigger journals ----------------------------------------------------------------

ORIGIN = ShadowOrigin(0, "alert TritonTailLatencyHigh")
LABEL = "shadow trigger 0 (alert TritonTailLatencyHigh)"


async def _shadow(evidence: FakeEvidence | None = None, guards: str = "cooldown: 0s", extra: str = "") -> Verdict:
    """A shadow trigger's verdict for a detector signal on `_policy(guards, extra)`."""
    return await decide(_policy(guards, extra), _signal(SignalSource.DETECTOR), Mode.SHADOW,
                        evidence or FakeEvidence())


async def test_shadow_rows_say_what_would_have_been_done():
    """would, state and reason per verdict, as the shadow path has always journaled them."""
    cases = [
        (await _shadow(FakeEvidence(guard=GuardDecision(False, "global freeze is on"))),
         "blocked", DecisionState.BLOCKED, f"{LABEL}: would be blocked: global freeze is on"),
        (await _shadow(FakeEvidence(planned=ActionError("boom"))),
         "fail", DecisionState.DRY_RUN, f"{LABEL}: would fail: planning failed: boom"),
        (await _shadow(FakeEvidence(planned=[Step("notify", "default/ranker", "already so", noop=True)])),
         "noop", DecisionState.NOOP, f"{LABEL}: nothing to do: every step is a no-op"),
        (await _shadow(guards="cooldown: 0s, dryRun: true"),
         "act", DecisionState.DRY_RUN, f"{LABEL}: would only plan (dryRun): {STEP.summary}; not applied"),
        (await _shadow(extra="approval: required\n"),
         "act", DecisionState.DRY_RUN, f"{LABEL}: would ask for approval, then apply: {STEP.summary}; not applied"),
        (await _shadow(), "act", DecisionState.DRY_RUN, f"{LABEL}: would apply: {STEP.summary}; not applied"),
    ]
    for verdict, would, state, reason in cases:
        row = shadow_row(verdict, ORIGIN)
        assert (row.would, row.state, row.reason, row.note) == (would, state, reason, {})
        assert row.plan == verdict.plan


async def test_a_silenced_shadow_row_keeps_the_silence_note():
    row = shadow_row(await _shadow(FakeEvidence(silence=SilenceVerdict((SILENCE,)))), ORIGIN)
    assert (row.would, row.state) == ("silenced", DecisionState.BLOCKED)
    assert row.reason.startswith(f"{LABEL}: would be silenced in Alertmanager: silence s-1")
    assert row.note == {"silences": {"checked": True, "matched": [SILENCE.describe()]}}


async def test_a_shadow_row_behind_a_pending_approval_names_only_the_approval():
    """Live names the approval's decision and deadline; the shadow row (and its plan) only the id."""
    row = shadow_row(await _shadow(FakeEvidence(waiting=WAITING), extra="approval: required\n"), ORIGIN)
    assert row.reason == f"{LABEL}: would be blocked: awaiting approval 3"
    assert row.plan.blocked == "awaiting approval 3"


# ---- approval outcomes as HTTP statuses ------------------------------------------------------------

def test_every_approval_outcome_has_its_http_status():
    """202 started, 404 no such approval, 409 for every reason it cannot start now."""
    assert {o: approval_status(o) for o in ApprovalOutcome} == {
        ApprovalOutcome.STARTED: 202, ApprovalOutcome.NOT_FOUND: 404, ApprovalOutcome.NOT_PENDING: 409,
        ApprovalOutcome.EXPIRED: 409, ApprovalOutcome.POLICY_CHANGED: 409, ApprovalOutcome.FROZEN: 409}
