"""The warm keeper: the previous good version loaded beside the served one, where a policy asks.

A policy whose `triton.rollback` says `keepWarm: previous` wants its rollback to be a switch, not a
load (actions/triton_warm.py). After every deploy the served version changes and a pod that starts
later loads only the newest version, so the pin reconciler's passes (every `interval_seconds`, and at
once for targets whose replica turned ready) call `once` too: every replica of such a target that
lacks its warm version gets it, one load per replica through the door as writer "warm" (a freeze,
a lost Lease or a bad mark on the warm version refuses it).

A target with a live pin is not warmed: it is held on its known-good version after a rollback, and
a version kept warm below that one would let a repeated rollback walk further into the past (the
rollback's "already pinned" rule reads a single pinned version).

A warm load that failed on a replica (journaled by the door) is read back from the journal every pass
(daemon/workers/warm_failures.py): not tried there again for an hour while it is the version to warm,
across restarts and leader changes.
"""
from __future__ import annotations

import asyncio
from typing import Callable

import structlog

from actions.base import Effect
from actions.triton import KIND, TritonRollback, TritonRollbackParams
from actions.triton_warm import NOT_PROMISED, keep_warm, warm_params
from core.outcome import Outcome
from core.target import Target
from daemon.workers.context import ActContext
from daemon.workers.door import acting
from daemon.workers.warm_failures import journaled_failures

log = structlog.get_logger("tailguard.warm")

ACTION = "warm.keep"
WARM = "warm"  # the writer the door journals


class WarmKeeper:
    """Keeps the warm version of every `keepWarm: previous` target loaded (see the module doc).

    Args:
        ctx: The pin reconciler's plumbing: live pins (a pinned target is not warmed), the active
            policy set and freeze, the clients and the door, metrics
            (`tailguard_actions_total{action="warm.keep"}`), leadership, the per-target locks the
            executor and the pin reconciler take, and the action registry (its `triton.rollback`).
        owns: Whether this replica leads the target's shard (sharding; the pin reconciler's `owns`).
    """

    def __init__(self, ctx: ActContext, *, owns: Callable[[str], bool] = lambda key: True) -> None:
        self._ctx = ctx
        self._owns = owns
        cls = ctx.actions.get(KIND)
        self._rollback = cls(ctx.deps) if cls is not None and issubclass(cls, TritonRollback) else None
        self._refused: dict[str, str] = {}  # target -> the refusal logged last (logged once while it holds)
        self._cold: dict[str, str] = {}  # target -> why its release gets no warm version (logged once)

    async def once(self, only: set[str] | None = None) -> dict[str, Outcome]:
        """One pass over the targets that ask for warmth (or those in `only`); the outcome per target."""
        if self._rollback is None or not self._ctx.may_act() or self._ctx.state.frozen:
            return {}
        wanted = [(policy, params) for policy in self._ctx.state.policies.policies if policy.spec.enabled
                  for bound in policy.actions if (params := warm_params(bound.params)) is not None]
        if not wanted:
            return {}
        pinned = {pin.target for pin in await self._ctx.journal.pins.live.in_thread()}
        results: dict[str, Outcome] = {}
        for policy, params in wanted:
            target = policy.target
            key = target.key
            if key in results or (only is not None and key not in only) or key in pinned or not self._owns(key):
                continue
            if target.triton_service is None and not target.triton_endpoints:
                continue
            async with self._ctx.lock_for(key):
                with structlog.contextvars.bound_contextvars(target=key), acting(WARM, key):
                    outcome = await self._one(target, params)
            results[key] = outcome
            self._ctx.metrics.actions.labels(ACTION, outcome.status.value).inc()
        return results

    async def _one(self, target: Target, params: TritonRollbackParams) -> Outcome:
        assert self._rollback is not None  # once() returns before without one
        key = target.key
        # Asked before reading the replicas: a freeze that holds pass after pass is logged once, not
        # journaled as a refused write every pass (the door journals a write it refuses).
        refused = await self._ctx.deps.actuator.ask(Effect("triton.load", f"keep {target.model} warm", target=key))
        if refused is not None:
            if self._refused.get(key) != refused.reason:
                log.info("warm version not loaded: refused", check=refused.check, reason=refused.reason)
                self._refused[key] = refused.reason
            return Outcome.skipped(f"not warmed: {refused}", refused=refused.check)
        self._refused.pop(key, None)
        try:
            # Failed warm loads come from the journal, not memory: a restart or a new leader forgets none.
            failed = await journaled_failures(self._ctx.journal, key, WARM)
            outcome = await keep_warm(self._rollback, target, params, failed)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # one target's failure never stops another's warmth
            self._ctx.metrics.faults.labels("warm").inc()
            log.warning("keeping the previous version warm failed", error=str(exc))
            return Outcome.failure(f"{type(exc).__name__}: {exc}", retryable=True)
        cold = next((why for why in outcome.data.get("skipped", {}).values() if why.startswith(NOT_PROMISED)), None)
        if cold is not None and self._cold.get(key) != cold:
            # keepWarm asked, yet inert here: said once, not every pass (docs/stack-facts.md).
            log.warning("no version kept warm: the Triton release does not promise a reload without loss of "
                        "availability; the rollback makes today's load", reason=cold)
        self._cold[key] = cold or ""
        if outcome.status.value in ("ok", "failed"):
            log.info("warm version loaded" if outcome.ok else "warm version not loaded", message=outcome.message,
                     **{k: v for k, v in outcome.data.items() if k in ("warmed", "errors")})
        return outcome
