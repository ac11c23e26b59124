"""The edges of the decision ladder: what `daemon.workers.decide.Evidence` asks, read from the world.

Guard history, freezes and pending approvals from the journal; the blast-radius checks
(`daemon.workers.blast_guard`); Alertmanager's silences (`daemon.workers.silences`); each action's
observe and pure plan. Nothing here decides: the rules are `policies.guards` and the ladder's.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import structlog

from actions.base import Step
from core.outcome import ActionError
from core.signal import Signal, SignalSource
from daemon.common.metrics import Metrics
from daemon.storage.journal import Journal
from daemon.storage.records import DAEMON_SCOPE, Approval
from daemon.workers.blast_guard import BlastGuard
from daemon.workers.freezes import blocking_reason
from daemon.workers.silences import SilenceCheck, SilenceVerdict, target_labels
from daemon.workers.state import ExecutorState
from daemon.workers.steps import ActionFor, UnexpectedError, guarded
from policies.gate import GateVerdict, gate_verdict
from policies.governance import Ruling, Standing, alert_governance, matched_alert, rule
from policies.guards import GuardDecision, GuardState, check_guards
from policies.loader import LoadedPolicy

if TYPE_CHECKING:
    from daemon.workers.poller import Latest

log = structlog.get_logger("tailguard.executor")

LatestVerdicts = Callable[[str, int], "Latest | None"]
"""(policy, detector trigger index) -> that watch's last cycle of verdicts (the poller's)."""  # the executor's log: its decisions are read here


class EvidenceReader:
    """Answers the ladder's questions (`daemon.workers.decide.Evidence`) for the executor.

    Args:
        journal: Guard history, freezes and approvals.
        state: The active policies and the config's global freeze.
        blast: The daemon-wide guards across targets.
        action: The action instance of a kind (shared with the step runner).
        metrics: Faults of actions that raised while observing or planning.
        clock: Unix time.
        silences: Asks Alertmanager about a target; None consults no silences (no alertmanager.url).
        latest: The last cycle's verdicts of a policy's detector trigger (the poller's), for the
            governed alert rule; None: no poller (no detector evidence ever: a governed alert acts
            only as the backstop, `backstopAfter` after the start).
        started_at: When the daemon started (default: now): evidence cannot be missing before it.
    """

    def __init__(self, journal: Journal, state: ExecutorState, blast: BlastGuard, action: ActionFor,
                 metrics: Metrics, clock: Callable[[], float], silences: SilenceCheck | None = None,
                 latest: LatestVerdicts | None = None, started_at: float | None = None) -> None:
        self._journal = journal
        self._state = state
        self._blast = blast
        self._action = action
        self._metrics = metrics
        self._clock = clock
        self._silences = silences
        self._latest = latest
        self._started_at = clock() if started_at is None else started_at

    async def guards(self, policy: LoadedPolicy, *, commit: bool, arrived_at: float | None = None) -> GuardDecision:
        """The runtime freezes and the blast radius (unless the config's global freeze says it
        first), then cooldown and rate limit from the journaled history."""
        now = self._clock()
        if not self._state.frozen:  # the config's global freeze says it first
            blocked = await self.frozen(policy, now)
            if blocked is not None:
                return blocked
            across = await self._blast.check(policy, commit=commit, arrived_at=arrived_at)
            if across is not None:
                return across
        last, count = await self._journal.decisions.guard_history.in_thread(
            policy.name, policy.target.key, policy.spec.guards.max_actions_window, now)
        return check_guards(policy.spec.guards, GuardState(last, count, self._state.frozen), now)

    async def frozen(self, policy: LoadedPolicy, now: float) -> GuardDecision | None:
        """The runtime freeze in force on the whole daemon, else on the policy's target (None: neither)."""
        for scope in (DAEMON_SCOPE, policy.target.key):
            freeze = await self._journal.freezes.active_on.in_thread(scope, now)
            if freeze is not None:
                return GuardDecision(False, blocking_reason(freeze))
        return None

    async def pending_approval(self, policy: LoadedPolicy) -> Approval | None:
        return await self._journal.approvals.pending_for.in_thread(policy.name, policy.target.key)

    async def silences(self, policy: LoadedPolicy, signal: Signal) -> SilenceVerdict | None:
        """Asks Alertmanager about a detector signal only: alerts are silenced there already, and a
        schedule tick is not an incident."""
        if self._silences is None or signal.source is not SignalSource.DETECTOR:
            return None
        verdict = await self._silences(target_labels(signal.labels, policy.target.model))
        if verdict.silenced:
            log.info("silenced", reason=verdict.reason)
        return verdict

    async def governance(self, policy: LoadedPolicy, signal: Signal) -> Ruling | None:
        """The governed alert rule (`policies.governance.rule`) on an alert signal, weighed on the
        governing detector triggers' last cycles (the poller's); counted, and logged with its reason."""
        ref = matched_alert(policy, signal)
        if ref is None or ref.index is None:
            return None
        governance = alert_governance(policy, ref.index)
        fresh = [latest.fresh_at for d in governance.detectors
                 if (latest := self._verdicts(policy, d)) is not None and latest.fresh_at is not None]
        ruling = rule(governance, max(fresh, default=None), self._started_at, self._clock(),
                      self._gate(policy, ref.index) if governance.standing is Standing.UNGOVERNED else None)
        self._metrics.governed_alerts.labels(policy.name, ruling.outcome).inc()
        log.info("alert ruled", acts=ruling.acts, outcome=ruling.outcome, reason=ruling.reason)
        return ruling

    def _verdicts(self, policy: LoadedPolicy, index: int) -> "Latest | None":
        return self._latest(policy.name, index) if self._latest is not None else None

    def _gate(self, policy: LoadedPolicy, alert_index: int) -> GateVerdict | None:
        """The former evidence gate of an ungoverned alert trigger that declares one (None: none)."""
        alert = policy.spec.triggers[alert_index].alert
        if alert is None or alert.gate is None:
            return None
        bound = policy.gate_for(alert_index)
        latest = self._verdicts(policy, bound.index) if bound is not None else None
        label = bound.params.version_label if bound is not None else "version"
        return gate_verdict(latest.budgets if latest else None, latest.at if latest else None,
                            latest.stale_after if latest else 0.0, self._clock(), alert.gate.error, label)

    async def steps(self, policy: LoadedPolicy, signal: Signal) -> list[Step]:
        steps = []
        for bound in policy.actions:
            action = self._action(bound.kind)
            try:
                observed = await guarded(action.observe(policy.target, bound.params), bound.kind, "observe")
            except UnexpectedError:
                self._metrics.faults.labels("actions").inc()
                raise
            try:
                steps.append(action.plan(policy.target, bound.params, observed, signal))
            except ActionError:
                raise
            except Exception as exc:  # a planning bug is this decision's failure, not the worker's
                self._metrics.faults.labels("actions").inc()
                log.exception("plan raised", action=bound.kind)
                raise ActionError(f"{bound.kind}.plan raised {type(exc).__name__}: {exc}") from exc
        return steps

