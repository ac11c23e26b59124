"""The executor: journaled signal -> matching policies -> one decision each -> recorded -> apply/verify.

One lock per target: events for one target run in order, different targets in parallel.
Everything except cancellation becomes an Outcome in the journal.

Each policy's verdict comes from the one decision ladder (`daemon.workers.decide`: guards, freezes,
an approval already pending, silences, plan), whatever the mode; this module records it: a live
trigger's verdict is journaled, announced and acted on, a shadow trigger's journaled as what would
have been done (`daemon.workers.shadow.shadow_row`), a preview's only returned (`tailguard simulate`).
A decision's plan runs through `steps.StepRunner` (intent, apply, verify, retry, revert: how each
step is journaled and retried is described there). A plan that succeeded has its recovery check
journaled as in flight with the decision's final state and watched by
`recovery_watch.RecoveryWatches` (verdicts, onNotRecovered). Plans that need an operator wait in
`approvals.ApprovalGate`.

A decision found `executing` after a restart is resumed, never re-planned: its journaled plan (with the
true `before` a revert needs) and step rows say how far each step got. Outcomes (acted, failed,
recovered, not_recovered, escalated) go to `notify`, a callback that never blocks.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import structlog

from actions.base import Action
from core.timestamps import iso_utc
from core.decision import DecisionState
from core.signal import Signal
from daemon.common.config import BLAST_RADIUS_OFF, BlastRadiusSettings
from daemon.common.lifecycle import Spawn
from daemon.storage.records import RECOVERY, CheckInFlight, Decision, StepRecord
from daemon.storage.shard_terms import ShardFenced
from daemon.storage.step_kinds import StepPhase, StepStatus
from daemon.workers.decision_events import decision_event
from daemon.workers.approvals import ApprovalGate, ApprovalResult, BaseUrl
from daemon.workers.blast_guard import BlastGuard
from daemon.workers.context import ActContext
from daemon.workers.decide import decide
from daemon.workers.evidence import EvidenceReader, LatestVerdicts
from daemon.workers.progress import (STARTED_WITH, RecoveryPlan, StepProgress, journaled_plan, runs_on,
                                     started_with_document, step_progress)
from daemon.workers.recovery_watch import RecoveryWatches
from daemon.workers.shadow import ShadowOrigin, shadow_origin, shadow_row
from daemon.workers.silences import SilenceCheck
from daemon.workers.steps import StepRunner
from daemon.workers.verdicts import Blocked, DryRun, Execute, Mode, NeedsApproval, NoOp, Unplanned, Verdict
from daemon.workers.verifier import RangeFn
from policies.loader import LoadedPolicy
from policies.matching import matching_policies
from policies.guards import GuardDecision
from policies.planning import Plan, RecoveryCheck, blocked_plan, recovery_check


log = structlog.get_logger("tailguard.executor")

DEFAULT_BASE_URL = "http://127.0.0.1:8080"


@dataclass(frozen=True)
class ExecutorLimits:
    """How far the executor goes (settings `executor.*` and `blastRadius`).

    Args:
        escalation_freeze_seconds: How long onNotRecovered: escalate freezes the target.
        blast_radius: The daemon-wide guards across targets (default: off).
        max_signal_age_seconds: A decision left executing (a crash, a journal outage) is resumed only
            while its signal is younger than this, and its target still as planned; else it ends
            `expired`. None: no age bound (the preconditions still hold it).
    """

    escalation_freeze_seconds: float = 3600.0
    blast_radius: BlastRadiusSettings | None = None
    max_signal_age_seconds: float | None = None


class Executor:
    """Decides and acts for journaled signals; resumes what a restart interrupted.

    Args:
        ctx: The plumbing it shares with the pin reconciler (journal, state, the action registry and
            the clients lent to actions, metrics, leadership, clock, sleep, locks, notify, on_recorded).
        silences: Asks Alertmanager whether a silence covers a detector signal's target (None: no
            silences are consulted; alertmanager.url unset).
        query_range: Reads back what a recovery watch resumed after a restart missed (Prometheus
            range query; None: nothing is read back).
        latest: The poller's last verdicts of a detector trigger, weighed by gated alert triggers.
        approval_base_url: How operators reach the API, named in approval notifications; read when
            one is sent (the port is known only once the API listens).
        limits: Escalation freezes, the blast radius, the age past which a decision is not resumed.
    """

    def __init__(
        self,
        ctx: ActContext,
        *,
        silences: SilenceCheck | None = None,
        query_range: RangeFn | None = None,
        latest: LatestVerdicts | None = None,
        approval_base_url: BaseUrl = lambda: DEFAULT_BASE_URL,
        limits: ExecutorLimits = ExecutorLimits(),
    ) -> None:
        self._ctx = ctx
        self.state = ctx.state
        self._max_signal_age = limits.max_signal_age_seconds
        self._actions: dict[str, Action] = {}
        self._blast = BlastGuard(ctx.journal, ctx.state, limits.blast_radius or BLAST_RADIUS_OFF, ctx.clock, ctx.sleep)
        # What the decision ladder reads; running a decision's steps, watching its recovery after,
        # and plans that wait for an operator: each in a class of its own.
        self._evidence = EvidenceReader(ctx.journal, ctx.state, self._blast, self._action, ctx.metrics, ctx.clock,
                                        silences, latest)
        self._steps = StepRunner(ctx, self._action, self._event)
        self._watches = RecoveryWatches(ctx, self._steps, self._announce, limits.escalation_freeze_seconds,
                                        query_range)
        self._approvals = ApprovalGate(ctx, self._evidence.frozen, self._finish, self._send, approval_base_url)
        self._owns: Callable[[str], bool] | None = None

    @property
    def owns(self) -> Callable[[str], bool] | None:
        """With sharding on (daemon/wiring/sharding.py): whether this replica leads a target's shard.
        A signal whose target's shard it does not lead is left pending for the replica that does; a
        decision whose shard is lost before it applied everything is left executing for the new leader
        (`StepRunner.owns`); open recovery checks and approved plans are resumed only on the targets of
        the shards led here (`RecoveryWatches.owns`, `ApprovalGate.owns`)."""
        return self._owns

    @owns.setter
    def owns(self, owns: Callable[[str], bool] | None) -> None:
        self._owns = self._steps.owns = self._watches.owns = self._approvals.owns = owns

    def lock_for(self, target_key: str) -> asyncio.Lock:
        """The lock that keeps one actor at a time on a target (the context's: shared with the pin reconciler)."""
        return self._ctx.lock_for(target_key)

    def _action(self, kind: str) -> Action:
        if kind not in self._actions:
            self._actions[kind] = self._ctx.actions[kind](self._ctx.deps)
        return self._actions[kind]

    # ---- deciding --------------------------------------------------------------------------------

    async def process(self, signal_id: int, signal: Signal) -> list[Plan]:
        """Decide and act for one journaled signal, then mark it processed."""
        plans: list[Plan] = []
        policies = matching_policies(self.state.policies.policies, signal)
        owner = min((p.target.key for p in policies), default="")
        if policies and self.owns is not None:
            # One owner per signal: the shard of its first matching target (a signal matching targets of
            # several shards is acted on there, on the targets of the shards led there: `_led_elsewhere`).
            if not self.owns(owner):
                log.debug("signal left pending for its shard's leader", signal=signal.dedup_key, target=owner)
                return plans
        with structlog.contextvars.bound_contextvars(signal=signal.dedup_key, signal_name=signal.name):
            arrived_at = None
            if not policies:
                log.info("signal matched no policy", labels=dict(signal.labels))
            else:
                # With common-cause suppression on: let the burst it arrived in show first.
                arrived_at = await self._blast.hold(signal_id, {p.target.key for p in policies})
            # Decisions a crash left executing under a policy the signal no longer matches (renamed,
            # removed, retargeted since): finished on the policy they started with, not stranded.
            matched = {p.name for p in policies}
            stranded = [d for d in await self._ctx.journal.decisions.unfinished_for_signal.in_thread(signal_id)
                        if d.policy not in matched]
            for left in stranded:
                async with self._ctx.locks[left.target]:
                    with structlog.contextvars.bound_contextvars(policy=left.policy, target=left.target):
                        plans.append(await self._resume(left, None, signal))
            for policy in policies:
                self._ctx.metrics.matched.labels(policy.name).inc()
                former = _former_name(policy, stranded)
                if former is not None:  # the same remedy under a new name: the signal is not acted on twice
                    plans.append(await self._decided_before(signal_id, signal, policy, former))
                    continue
                async with self._ctx.locks[policy.target.key]:
                    with structlog.contextvars.bound_contextvars(policy=policy.name,
                                                                 target=policy.target.key):
                        if self._led_elsewhere(policy, owner):
                            continue
                        plans.append(await self._run_policy(signal_id, signal, policy, arrived_at))
            await self._ctx.journal.signals.mark_processed.in_thread([signal_id])
        return plans

    def _led_elsewhere(self, policy: LoadedPolicy, owner: str) -> bool:
        """Sharding, right before a policy's decision: True when its target's shard is not led here and
        the signal's owner's is (a signal matching targets of several shards): it is not decided here,
        since its decision rows, like its writes, are fenced by that shard's term. The owner's shard
        lost since the signal was taken raises ShardFenced: the signal stays pending for the shard's
        new leader, nothing more journaled."""
        if self.owns is None or self.owns(policy.target.key):
            return False
        if not self.owns(owner):
            raise ShardFenced(f"this replica no longer leads the shard of {owner}; the signal is left pending "
                              "for the shard's new leader")
        log.warning("signal's policy on a target of a shard led by another replica: not decided here (a signal "
                    "is acted on by the leader of its first target's shard, on the targets of the shards it leads)")
        return True

    async def preview(self, signal: Signal) -> list[tuple[LoadedPolicy, Verdict]]:
        """What `process` would decide for `signal` now, per matching policy: the same ladder (guards
        read from the journal, not committed; targets observed); nothing journaled, nothing applied
        (`tailguard simulate`)."""
        return [(policy, await decide(policy, signal, Mode.PREVIEW, self._evidence))
                for policy in matching_policies(self.state.policies.policies, signal)]

    async def _run_policy(self, signal_id: int, signal: Signal, policy: LoadedPolicy,
                          arrived_at: float | None = None) -> Plan:
        existing = await self._ctx.journal.decisions.for_signal.in_thread(signal_id, policy.name)
        if existing is not None and existing.state.final:
            log.info("already decided", state=existing.state)
            return Plan(policy.name, policy.target.key, signal.dedup_key, (), False,
                        blocked=f"already decided: {existing.state}")
        if existing is not None:
            # Crashed mid-execution: finish the journaled plan; guards already passed, and a new plan
            # would be made from a world our own landed steps changed (a false `before`).
            return await self._resume(existing, policy, signal)
        shadow = shadow_origin(policy, signal)
        verdict = await decide(policy, signal, Mode.LIVE if shadow is None else Mode.SHADOW, self._evidence,
                               arrived_at)
        if shadow is not None:
            return await self._record_shadow(signal_id, policy, verdict, shadow)
        return await self._record_live(signal_id, policy, signal, verdict)

    async def _record_live(self, signal_id: int, policy: LoadedPolicy, signal: Signal, verdict: Verdict) -> Plan:
        """Journal a live verdict and do what it says: announce, ask for approval, or apply."""
        plan, note = verdict.plan, verdict.note
        if isinstance(verdict, Blocked):
            blocked_id = await self._decide(signal_id, policy, plan, DecisionState.BLOCKED, verdict.reason,
                                            executed=False, extra=note)
            if verdict.escalates:
                self._announce("escalated", policy.name, policy.target.key, verdict.reason,
                               decision=blocked_id, signal=signal.dedup_key)
            elif verdict.notify_only:  # a governed alert notifies (policies.governance); a Warning if it never can act
                standing = verdict.note.get("governance", {}).get("standing")
                await self._event(policy, "AlertNotified", verdict.reason, warning=standing == "notify_only")
        elif isinstance(verdict, Unplanned):
            failed_id = await self._decide(signal_id, policy, plan, DecisionState.FAILED, verdict.reason,
                                           executed=False, extra=note)
            for bound in policy.actions:
                self._ctx.metrics.actions.labels(bound.kind, "failed").inc()
            await self._event(policy, "RemediationFailed", verdict.reason, warning=True)
            self._announce("failed", policy.name, policy.target.key, verdict.reason, decision=failed_id,
                           state=DecisionState.FAILED.value, signal=signal.dedup_key)
        elif isinstance(verdict, NoOp):
            await self._decide(signal_id, policy, plan, DecisionState.NOOP, plan.blocked or "", executed=False,
                               extra=note)
        elif isinstance(verdict, DryRun):
            await self._decide(signal_id, policy, plan, DecisionState.DRY_RUN, "dryRun: planned, not applied",
                               executed=False, extra=note)
        elif isinstance(verdict, NeedsApproval):
            await self._approvals.request(signal_id, policy, plan)
        else:
            assert isinstance(verdict, Execute)
            # Journaled as executed before the first write: a crash mid-way still counts for cooldown.
            # With it the policy it starts with and its recovery check: a resume or a revert after a
            # reload runs on them, never on the reloaded policy (`progress.runs_on`).
            recovery = self._recovery_plan(policy, signal)
            decision_id = await self._decide(signal_id, policy, plan, DecisionState.EXECUTING, "applying",
                                             executed=True,
                                             extra={**note, STARTED_WITH: started_with_document(policy, recovery)})
            self._ctx.on_recorded()
            await self._finish(decision_id, policy, plan, {}, signal, recovery)
        return plan

    async def _decided_before(self, signal_id: int, signal: Signal, policy: LoadedPolicy, former: Decision) -> Plan:
        """Journal (blocked) that the signal was already acted on for this target under the policy's
        former name, once: a second pass over the signal finds this decision and stops there."""
        existing = await self._ctx.journal.decisions.for_signal.in_thread(signal_id, policy.name)
        if existing is not None:
            return Plan(policy.name, policy.target.key, signal.dedup_key, (), False,
                        blocked=f"already decided: {existing.state}")
        reason = (f"already acted on for {policy.target.key} by decision {former.id} of policy {former.policy} "
                  "(renamed or removed since; finished on the policy it started with)")
        plan = blocked_plan(policy, signal, GuardDecision(False, reason))
        await self._decide(signal_id, policy, plan, DecisionState.BLOCKED, reason, executed=False)
        return plan

    async def _record_shadow(self, signal_id: int, policy: LoadedPolicy, verdict: Verdict,
                             origin: ShadowOrigin) -> Plan:
        """Journal what a shadow trigger's signal would have done; never applied, not `executed`, so
        it never counts toward cooldown or rate limit."""
        row = shadow_row(verdict, origin)
        self._ctx.metrics.shadow_decisions.labels(policy.name, row.would).inc()
        await self._decide(signal_id, policy, row.plan, row.state, row.reason, executed=False,
                           extra={**row.note, "shadow": {**origin.as_dict(), "would": row.would}})
        return row.plan

    async def _decide(self, signal_id: int, policy: LoadedPolicy, plan: Plan, state: DecisionState, reason: str,
                      executed: bool, extra: Mapping[str, Any] | None = None) -> int:
        """Journal the decision; `extra` keys go into its journaled plan (shadow, silences)."""
        decision_id = await self._ctx.journal.decisions.record.in_thread(
            signal_id, policy.name, policy.target.key, state, reason, {**plan.as_dict(), **(extra or {})}, executed)
        if state.final:
            self._ctx.metrics.decisions.labels(policy.name, state).inc()
        log.info("decision", state=state, reason=reason, plan=[s.summary for s in plan.steps],
                 dry_run=plan.dry_run)
        if state.final and not (extra or {}).get("shadow"):  # decided without running: blocked, dry run, noop
            await self._decision_event(policy, state, reason)
        return decision_id

    async def _decision_event(self, policy: LoadedPolicy, state: DecisionState, reason: str) -> None:
        event = decision_event(state)
        if event is not None:
            await self._event(policy, event[0], reason, warning=event[1])

    # ---- acting ----------------------------------------------------------------------------------

    async def _resume(self, decision: Decision, current: LoadedPolicy | None, signal: Signal) -> Plan:
        """Go on with a decision left `executing` by a crash, from its journaled plan and steps, on the
        policy it started with (`current`: the active policy of its name, None when gone)."""
        plan = journaled_plan(decision.plan)
        runs = runs_on(decision.plan, current, self._ctx.actions)
        if runs.policy is None:
            reason = (f"not resumed after restart: {runs.why}; steps applied before the restart are left as "
                      "they are")
            await self._ctx.journal.decisions.finish.in_thread(decision.id, DecisionState.FAILED, reason)
            self._ctx.metrics.decisions.labels(decision.policy, DecisionState.FAILED).inc()
            log.warning("decision not resumed", decision=decision.id, reason=reason)
            return plan
        progress = step_progress(await self._ctx.journal.decisions.steps.in_thread(decision.id))
        why, age = await self._stale(decision, runs.policy, plan, progress)
        if why is not None:
            await self._expired(decision, runs.policy, plan, progress, why, age)
            return plan
        log.info("resuming decision", decision=decision.id, plan=[s.summary for s in plan.steps], runs_on=runs.why)
        await self._finish(decision.id, runs.policy, plan, progress, signal, runs.recovery,
                           note=f"resumed on {runs.why}" if runs.reloaded else None)
        return plan

    async def _stale(self, decision: Decision, policy: LoadedPolicy, plan: Plan,
                     progress: Mapping[int, StepProgress]) -> tuple[str | None, float | None]:
        """(why a resumed decision must not go on, or None; its signal's age). It goes on only while
        its signal is younger than maxSignalAgeSeconds and its target is still as planned (re-observed)."""
        stored = await self._ctx.journal.signals.get.in_thread(decision.signal_id)
        age = self._ctx.clock() - stored.received_at if stored is not None else None
        if self._max_signal_age is not None and age is not None and age > self._max_signal_age:
            return (f"its signal is {age:.0f}s old (executor.maxSignalAgeSeconds {self._max_signal_age:.0f}s): the "
                    "incident it answered has moved on"), age
        changed = await self._steps.changed_since_plan(decision.id, policy, plan, progress)
        if changed is not None:
            return f"the target changed since the plan: {changed}", age
        return None, age

    async def _expired(self, decision: Decision, policy: LoadedPolicy, plan: Plan,
                       progress: Mapping[int, StepProgress], why: str, age: float | None) -> None:
        """End a resumed decision `expired`: nothing more is applied and nothing is reverted (a revert
        on stale knowledge is a change too); what had landed is named, and it is reported loudly."""
        landed = [idx for idx, done in sorted(progress.items()) if idx >= 0 and done.landed]
        doubt = [idx for idx, done in sorted(progress.items()) if idx >= 0 and done.in_doubt]
        reason = f"expired: not resumed: {why}; nothing more applied, nothing reverted"
        if landed:
            reason += f"; step(s) {landed} had landed and stay"
        if doubt:
            reason += f"; step(s) {doubt} may have landed (an apply without its result)"
        await self._ctx.journal.decisions.finish.in_thread(
            decision.id, DecisionState.EXPIRED, reason,
            expired={"why": why, "age_seconds": age, "landed": landed, "in_doubt": doubt})
        self._ctx.metrics.decisions.labels(decision.policy, DecisionState.EXPIRED).inc()
        log.warning("decision expired", decision=decision.id, reason=reason)
        await self._event(policy, "RemediationExpired", reason, warning=True)
        self._announce("failed", decision.policy, decision.target, reason, decision=decision.id,
                       state=DecisionState.EXPIRED.value, signal=plan.signal_key)

    async def _finish(self, decision_id: int, policy: LoadedPolicy, plan: Plan,
                      progress: Mapping[int, StepProgress], signal: Signal, recovery: RecoveryPlan | None = None,
                      note: str | None = None) -> None:
        """Run the plan's steps and journal the end; `recovery` (None: made from `policy` and
        `signal` now) is watched when it succeeded; `note` is added to the decision's reason."""
        state, reason = await self._steps.run_plan(decision_id, policy, plan, progress)
        if note:
            reason = f"{reason}; {note}"
        if recovery is None:
            recovery = self._recovery_plan(policy, signal)
        check = recovery.check if state is DecisionState.SUCCEEDED else None
        acted_at = self._ctx.clock()
        pending = None
        if check is not None:
            pending = CheckInFlight(f"checking: {check.query} {check.condition.describe()} ({check.source})",
                                    {"check": check.as_dict(), "acted_at": acted_at, "signal": signal.dedup_key})
        # One transaction: a restart finds the check in flight with the decision, or neither.
        await self._ctx.journal.decisions.finish.in_thread(decision_id, state, reason, pending)
        self._ctx.metrics.decisions.labels(policy.name, state).inc()
        log.info("plan finished", state=state, reason=reason, recovery=check.as_dict() if check else None)
        await self._decision_event(policy, state, reason)
        acted = state is DecisionState.SUCCEEDED
        self._announce("acted" if acted else "failed", policy.name, policy.target.key, reason,
                       decision=decision_id, state=state.value, signal=signal.dedup_key)
        if check is not None:
            self._watches.start(decision_id, policy.name, policy.target.key, check, acted_at)
        elif acted and recovery.skipped is not None:
            await self._ctx.journal.decisions.record_step.in_thread(StepRecord(
                decision_id, -1, RECOVERY, StepPhase.RECOVERY, StepStatus.SKIPPED, recovery.skipped,
                {"signal": signal.dedup_key}))

    def _recovery_plan(self, policy: LoadedPolicy, signal: Signal) -> RecoveryPlan:
        """How the decision's recovery will be judged, made before it acts (and journaled with it)."""
        check = self._recovery_check(policy, signal)
        skipped = None
        if check is None and policy.detectors and policy.spec.verify is None:
            skipped = (f"no recovery check: {signal.source.value} signal {signal.name} carries no detector line "
                       "and the policy has no verify block")
        return RecoveryPlan(check, skipped)

    def _recovery_check(self, policy: LoadedPolicy, signal: Signal) -> RecoveryCheck | None:
        try:
            return recovery_check(policy, signal)
        except Exception:  # a query that cannot be rendered: acting stands, only the check is lost
            self._ctx.metrics.faults.labels("recovery").inc()
            log.exception("recovery check could not be built")
            return None

    # ---- approvals -------------------------------------------------------------------------------

    async def approve(self, approval_id: int, by: str, reason: str) -> ApprovalResult:
        """Approve a pending plan and start applying it (in the background); what came of it
        (`ApprovalResult`: started, or why not)."""
        return await self._approvals.approve(approval_id, by, reason)

    async def resume_approved(self) -> int:
        """Go on with approved plans a restart interrupted (decision still `executing`); how many."""
        return await self._approvals.resume()

    async def wait_approved(self) -> None:
        """Wait until every approved plan being applied now has finished (tests, demo)."""
        await self._approvals.wait()

    # ---- recovery --------------------------------------------------------------------------------

    async def resume_verifications(self) -> int:
        """Go on with every recovery the journal says is unsettled (a restart): watches in flight
        (with what they missed read back) and reverts a verdict asked for that did not finish.
        Returns how many were started; ones already running are left alone (safe to call again,
        e.g. when this replica becomes the leader). Raises JournalError when the journal cannot be read."""
        return await self._watches.resume()

    def spawn_under(self, spawn_watch: Spawn, spawn_approved: Spawn) -> None:
        """Start the recovery watches and the approved plans being applied with these (the daemon's
        supervisor): their crashes are counted like a loop's."""
        self._watches.spawn = spawn_watch
        self._approvals.spawn = spawn_approved

    async def wait_recoveries(self) -> None:
        """Wait until every recovery watch running now has settled (tests, demo)."""
        await self._watches.wait()

    async def close(self) -> None:
        """Stop the recovery watches and approved plans being applied; what they did not settle stays
        in the journal (resumed at the next start)."""
        approved = self._approvals.cancel()
        await self._watches.close()
        await asyncio.gather(*approved, return_exceptions=True)

    # ---- outlets ---------------------------------------------------------------------------------

    def _send(self, event: Mapping[str, Any]) -> None:
        try:
            self._ctx.notify(event)
        except Exception as exc:  # a notification never fails the caller
            self._ctx.metrics.faults.labels("notifications").inc()
            log.warning("could not hand over notification", error=repr(exc))

    def _announce(self, event: str, policy: str, target: str, message: str, **extra: Any) -> None:
        """Hand an outcome event to `notify`; never blocks, never fails the caller."""
        self._send({"event": event, "policy": policy, "target": target, "message": message,
                    "at": iso_utc(self._ctx.clock()), **extra})

    async def _event(self, policy: LoadedPolicy, reason: str, message: str, warning: bool) -> None:
        if self._ctx.deps.record_event is None:
            return
        try:
            await self._ctx.deps.record_event(policy=policy, reason=reason, message=message, warning=warning)
        except Exception as exc:  # an Event is a courtesy: its failure is recorded, never fatal
            self._ctx.metrics.faults.labels("events").inc()
            log.warning("could not record Kubernetes event", error=str(exc))


def _former_name(policy: LoadedPolicy, stranded: list[Decision]) -> Decision | None:
    """The decision a crash left executing under a name no policy has any more, on `policy`'s target
    with `policy`'s actions: `policy` is that policy renamed."""
    kinds = [b.kind for b in policy.actions]
    return next((d for d in stranded if d.target == policy.target.key
                 and [s["action"] for s in d.plan.get("steps", [])] == kinds), None)
