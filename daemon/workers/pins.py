"""The pin reconciler: keep every Triton replica on the version a successful rollback pinned.

A pod that starts after a rollback loads the newest version from the model repository; the
journal remembers the pin (`pins()`), and this loop re-applies it to replicas that do not serve
exactly the pinned version. It reuses triton.rollback's pure planning and its apply/verify.
"""
from __future__ import annotations

import asyncio
from typing import Any, Callable, Mapping

import structlog

from actions.base import ActionDeps
from actions.triton import TritonRollback, TritonRollbackParams, plan_rollback
from core.outcome import ActionError, Outcome
from daemon.workers.executor import ExecutorState
from daemon.storage.journal import AsyncJournal
from daemon.common.metrics import Metrics

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
                 interval_seconds: float = 30.0) -> None:
        self._journal = journal
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
        """One pass over every pin; returns the outcome per target key (for tests and logs)."""
        if not self._may_act():
            return {}
        targets = {p.target.key: p.target for p in self._state.policies.policies}
        results: dict[str, Outcome] = {}
        for pin in await self._journal.pins():
            key = pin["target"]
            target = targets.get(key)
            if target is None:
                log.debug("pin has no policy target any more; left alone", target=key)
                continue
            if target.triton_service is None and not target.triton_endpoints:
                continue
            async with self._lock_for(key):
                with structlog.contextvars.bound_contextvars(target=key, pinned_version=pin["version"]):
                    outcome = await self._reconcile(target, int(pin["version"]))
            results[key] = outcome
            result = {"ok": "reapplied", "noop": "in_sync"}.get(outcome.status.value, outcome.status.value)
            self._metrics.actions.labels(ACTION, result).inc()
        return results

    async def _reconcile(self, target: Any, version: int) -> Outcome:
        params = TritonRollbackParams(to=version)
        try:
            observed: Mapping[str, Any] = await self._rollback.observe(target, params)
            step = plan_rollback(target, params, observed)
        except ActionError as exc:
            log.warning("pin check failed", error=str(exc))
            return Outcome.failure(str(exc), retryable=exc.retryable)
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
