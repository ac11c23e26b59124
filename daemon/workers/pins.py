"""The pin reconciler: keep every Triton replica on the version a successful rollback pinned.

A pod that starts after a rollback loads the newest version from the model repository; the
journal remembers the pin (`pins()`), and this loop re-applies it to replicas that do not serve
exactly the pinned version. It reuses triton.rollback's pure planning and its apply/verify.

Pins have a life cycle: only live pins of enabled policies are re-applied. A pin ends (moved to the
journal's pin history with the reason, and a Kubernetes Event when a recorder is lent) when its
policy is disabled or removed, or when a replica serves a READY version newer than the version the
pin rolled back from: the operator rolled forward, and that is not fought. `tailguard unpin` and
the executor's revert end pins too.
"""
from __future__ import annotations

import asyncio
from typing import Any, Callable, Mapping

import structlog

from actions.base import ActionDeps
from actions.triton import TritonRollback, TritonRollbackParams, plan_rollback, ready_versions
from core.outcome import ActionError, Outcome
from daemon.workers.state import ExecutorState
from daemon.storage.journal import AsyncJournal
from daemon.common.metrics import Metrics
from policies.loader import LoadedPolicy

log = structlog.get_logger("tailguard.pins")

ACTION = "pin.reconcile"


class PinReconciler:
    """Periodically re-applies journaled pins. Acts only while `may_act()` and not frozen.

    Args:
        journal: Holds the pins (target key, model, version).
        state: The active policy set (a pin whose target no policy names is left alone) and freeze.
        deps: Shared clients; `deps.endpoints` resolves the replicas of a target.
        metrics: `tailguard_actions_total{action="pin.reconcile"}` counts results.
        may_act: False on a replica that is not the leader.
        lock_for: The per-target lock the executor uses, so a pin never races a remediation.
        interval_seconds: Time between passes.
    """

    def __init__(self, journal: AsyncJournal, state: ExecutorState, deps: ActionDeps, metrics: Metrics,
                 may_act: Callable[[], bool], lock_for: Callable[[str], asyncio.Lock],
                 interval_seconds: float = 30.0, on_recorded: Callable[[], None] = lambda: None) -> None:
        self._journal = journal
        self._on_recorded = on_recorded  # an ended pin is shared state (cluster state publish)
        self._state = state
        self._deps = deps
        self._metrics = metrics
        self._may_act = may_act
        self._lock_for = lock_for
        self.interval_seconds = interval_seconds
        self._rollback = TritonRollback(deps)

    async def run(self, stop: asyncio.Event) -> None:
        """Reconcile every `interval_seconds` until `stop` is set."""
        while not stop.is_set():
            try:
                await self.reconcile_once()
            except Exception:  # one bad pass (journal, API) must not end the loop; the next retries
                self._metrics.faults.labels("pins").inc()
                log.exception("pin reconcile pass failed")
            try:
                await asyncio.wait_for(stop.wait(), timeout=self.interval_seconds)
            except asyncio.TimeoutError:
                pass

    async def reconcile_once(self) -> dict[str, Outcome]:
        """One pass over every pin; returns the outcome per target key (for tests and logs).

        A pin of a disabled or removed policy ends (not in the result); a pin whose target rolled
        forward ends with a NOOP outcome (`ended` in its data) and nothing is loaded.
        """
        if not self._may_act():
            return {}
        policies = self._state.policies.policies
        results: dict[str, Outcome] = {}
        for pin in await self._journal.pins():
            key = pin["target"]
            policy, gone, named = _policy_of(pin, policies)
            if policy is None:
                if gone is not None and policies:  # an empty set (nothing loaded yet) ends nothing
                    await self._end(pin, gone, named)
                continue
            target = policy.target
            if target.triton_service is None and not target.triton_endpoints:
                continue
            async with self._lock_for(key):
                with structlog.contextvars.bound_contextvars(target=key, pinned_version=pin["version"]):
                    outcome = await self._reconcile(pin, policy)
            results[key] = outcome
            if outcome.data.get("ended"):
                result = "ended"
            else:
                result = {"ok": "reapplied", "noop": "in_sync"}.get(outcome.status.value, outcome.status.value)
            self._metrics.actions.labels(ACTION, result).inc()
        return results

    async def _end(self, pin: Mapping[str, Any], reason: str, policy: LoadedPolicy | None) -> None:
        """End `pin` in the journal with `reason`; an Event on the policy's target when one can be recorded."""
        ended = await self._journal.end_pin(pin["target"], reason)
        if ended is None:
            return
        log.info("pin ended", target=pin["target"], version=pin["version"], reason=reason)
        self._on_recorded()
        if policy is None or self._deps.record_event is None:
            return
        try:
            await self._deps.record_event(policy=policy, reason="PinEnded",
                                          message=f"pin of {pin['model']} to version {pin['version']} ended: "
                                                  f"{reason}", warning=False)
        except Exception as exc:  # an Event is a courtesy: its failure is recorded, never fatal
            self._metrics.faults.labels("events").inc()
            log.warning("could not record Kubernetes event", error=str(exc))

    async def _reconcile(self, pin: Mapping[str, Any], policy: LoadedPolicy) -> Outcome:
        target, version = policy.target, int(pin["version"])
        params = TritonRollbackParams(to=version)
        try:
            observed: Mapping[str, Any] = await self._rollback.observe(target, params)
            step = plan_rollback(target, params, observed)
        except ActionError as exc:
            log.warning("pin check failed", error=str(exc))
            return Outcome.failure(str(exc), retryable=exc.retryable)
        forward = rolled_forward(observed, target.model, pin.get("from_version"))
        if forward:
            reason = (f"rolled forward: version {max(forward)} is served, newer than version "
                      f"{pin['from_version']} the pin rolled back from")
            await self._end(pin, reason, policy)
            return Outcome.noop(f"pin of {target.model} to version {version} ended: {reason}", ended=reason)
        unreachable = dict(observed.get("unreachable", {}))
        if step.noop:
            log.debug("pin holds", replicas=len(observed["replicas"]), unreachable=unreachable)
            return Outcome.noop(step.summary, unreachable=unreachable)
        if self._state.frozen or not self._may_act():
            log.info("pin drift seen; not re-applied (frozen or not leader)", summary=step.summary)
            return Outcome.skipped(f"frozen or not leader: {step.summary}")
        drifted = {u: r["from"] for u, r in step.after["replicas"].items()}
        outcome = await self._rollback.apply(step, target, params)
        if outcome.ok:
            outcome = await self._rollback.verify(step, target, params)
        log.info("pin re-applied" if outcome.ok else "pin re-apply failed", drifted=drifted,
                 result=outcome.status.value, message=outcome.message, unreachable=unreachable)
        if outcome.ok:
            return Outcome.success(f"re-pinned {target.model} to version {version} on "
                                   f"{len(drifted)} replica(s)", drifted=drifted)
        return outcome


def rolled_forward(observed: Mapping[str, Any], model: str, from_version: Any) -> list[int]:
    """READY versions newer than the version a pin rolled back from: the reconciler only ever loads
    the pinned (older) version, so someone else deployed them. Empty when `from_version` is unknown."""
    if from_version is None:
        return []
    return sorted({v for r in observed["replicas"].values() for v in ready_versions(r["index"], model)
                   if v > int(from_version)})


def _policy_of(pin: Mapping[str, Any], policies: tuple[LoadedPolicy, ...] | list[LoadedPolicy]
               ) -> tuple[LoadedPolicy | None, str | None, LoadedPolicy | None]:
    """(the enabled policy a pin belongs to, or None with why the pin must end, and the disabled
    policy it belonged to, for the Event).

    A pin that names its policy belongs to it (on the same target); an older pin belongs to the
    policies naming its target.
    """
    key, name = pin["target"], pin.get("policy")
    mine = [p for p in policies if p.target.key == key and (name is None or p.name == name)]
    if not mine:
        return None, f"policy {name} removed" if name else f"no policy targets {key} any more", None
    enabled = [p for p in mine if p.spec.enabled]
    if not enabled:
        return None, f"policy {name or mine[0].name} disabled", mine[0]
    return enabled[0], None, None
