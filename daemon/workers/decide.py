"""The one decision ladder: guards -> an approval already pending -> silences -> the governed alert rule
(`policies.governance`) -> observe and plan -> what the plan says, as a typed verdict (`daemon.workers.verdicts`).

Live, shadow and preview decisions all climb this ladder (`Mode`); they differ only in what they
record (`daemon.workers.executor`, `daemon.workers.shadow.shadow_row`, `daemon.wiring.simulate`).
The ladder reads nothing itself: it asks `Evidence` (`daemon.workers.evidence.EvidenceReader` reads
the journal, the blast-radius checks, Alertmanager and the targets) and stops at the first no, so a
blocked decision never observes its target. The rules it applies are pure (`policies.guards`,
`policies.planning`).
"""
from __future__ import annotations

from typing import Protocol

from actions.base import Step
from core.outcome import ActionError, Declined
from core.signal import Signal
from daemon.storage.records import Approval
from daemon.workers.approvals import awaiting_reason
from daemon.workers.blast_guard import escalates
from daemon.workers.silences import SilenceVerdict, silence_note
from daemon.workers.verdicts import Blocked, DryRun, Execute, Mode, NeedsApproval, NoOp, Unplanned, Verdict
from policies.governance import Ruling
from policies.guards import GuardDecision
from policies.loader import LoadedPolicy
from policies.planning import blocked_plan, build_plan, unplanned


class Evidence(Protocol):
    """What the ladder asks about the world, one question per rung (each one I/O)."""

    async def guards(self, policy: LoadedPolicy, *, commit: bool, arrived_at: float | None = None) -> GuardDecision:
        """Freezes, blast radius, cooldown and rate limit: the first that says no, else allowed.
        `commit` False leaves the guards' memory (common cause's escalate-once) as it is;
        `arrived_at` is when the journal received the signal (None: now), which its burst is counted around."""

    async def pending_approval(self, policy: LoadedPolicy) -> Approval | None:
        """The approval already waiting for `policy` on its target, if any."""

    async def silences(self, policy: LoadedPolicy, signal: Signal) -> SilenceVerdict | None:
        """What Alertmanager's silences say about the signal's target; None when not asked."""

    async def governance(self, policy: LoadedPolicy, signal: Signal) -> Ruling | None:
        """The governed alert rule's ruling on an alert signal (None: not an alert)."""

    async def steps(self, policy: LoadedPolicy, signal: Signal) -> list[Step]:
        """Each action's step, observed and planned in order. Raises ActionError."""


async def decide(policy: LoadedPolicy, signal: Signal, mode: Mode, evidence: Evidence,
                 arrived_at: float | None = None) -> Verdict:
    """What `policy` decides for `signal` now.

    Args:
        policy: A policy the signal matched.
        signal: The signal, journaled (live, shadow) or not (preview).
        mode: Only a live decision commits to the guards' memory (`Mode.commits`).
        evidence: Answers each rung's question.
        arrived_at: When the journal received the signal (None: now, a preview).

    Returns:
        The verdict: Blocked, Unplanned, NoOp, DryRun, NeedsApproval or Execute.
    """
    guard = await evidence.guards(policy, commit=mode.commits, arrived_at=arrived_at)
    if not guard.allowed:
        return Blocked(blocked_plan(policy, signal, guard), guard.reason, escalates=escalates(guard))
    needs_approval = policy.spec.approval == "required"
    if needs_approval:
        waiting = await evidence.pending_approval(policy)
        if waiting is not None:  # one plan waits per policy and target; flapping signals add none
            reason = awaiting_reason(waiting)
            return Blocked(blocked_plan(policy, signal, GuardDecision(False, reason)), reason, awaiting=waiting.id)
    silences = await evidence.silences(policy, signal)
    note = silence_note(silences)
    if silences is not None and silences.silenced:  # a matching silence blocks, like a guard
        return Blocked(blocked_plan(policy, signal, GuardDecision(False, silences.reason)), silences.reason,
                       silenced=True, note=note)
    ruling = await evidence.governance(policy, signal)
    if ruling is not None:
        note = {**note, "governance": ruling.as_note()}
        if not ruling.acts:  # the detector keeps the promise (or nothing can): the alert only notifies
            return Blocked(blocked_plan(policy, signal, GuardDecision(False, ruling.reason)), ruling.reason,
                           note=note, notify_only=True)
    try:
        steps = await evidence.steps(policy, signal)
    except Declined as exc:  # the policy's own rule said no: a block, not a failure
        return Blocked(blocked_plan(policy, signal, GuardDecision(False, str(exc))), str(exc), note=note)
    except ActionError as exc:
        return Unplanned(unplanned(policy, signal, exc), exc, note)
    plan = build_plan(policy, signal, steps)
    if plan.blocked:
        return NoOp(plan, note)
    if plan.dry_run:
        return DryRun(plan, note)
    if needs_approval:
        return NeedsApproval(plan, note)
    return Execute(plan, note)
