"""The pin reconciler: keep every Triton replica on the version a successful rollback pinned.

A pod that starts after a rollback loads the newest version from the model repository; the
journal remembers the pin (`pins()`), and this loop re-applies it to replicas that do not serve
exactly the pinned version, through the pinning action of the registry it is given
(`actions.base.Pinning`: triton.rollback's pure planning and its apply/verify).

When it runs: a full pass every `interval_seconds` (the backstop), and at once for the targets
`follow` names (the EndpointSlice watch, daemon/cluster/endpoint_watch.py, calls it when a replica
of a target's Service turns ready: a new or restarted pod serves the pinned version a load later,
not a pass later). A replica that is ready but cannot be read is not counted in sync: the pass
records it as `unreachable` (tailguard_actions_total{action="pin.reconcile",result="unreachable"})
and the target is looked at again after UNREACHABLE_RETRY_SECONDS.

Pins have a life cycle: only live pins of enabled policies are re-applied. A pin ends (moved to the
journal's pin history with the reason, and a Kubernetes Event when a recorder is lent) when its
policy is disabled or removed, or when a replica serves a READY version newer than the version the
pin rolled back from: the operator rolled forward, and that is not fought. `tailguard unpin` and
the executor's revert end pins too. A pin outlives a rename: when the policy it names is gone but
another policy still targets its target, that policy carries it on (until unpinned); it ends only
when no policy targets the target any more.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any, Callable, Iterable, Mapping

import structlog

from actions.base import Action, ActionDeps, PinCheck, pinning_action
from core.outcome import ActionError, Outcome, OutcomeStatus
from daemon.workers.state import ExecutorState
from daemon.storage.journal import Journal
from daemon.common.lifecycle import wait_or_stop
from daemon.common.metrics import Metrics
from policies.loader import LoadedPolicy

log = structlog.get_logger("tailguard.pins")

ACTION = "pin.reconcile"
UNREACHABLE_RETRY_SECONDS = 5.0
"""A target with a ready replica that could not be read is looked at again this soon."""


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
        actions: The action registry; its pinning action (`actions.base.pinning_action`) re-applies
            pins. Without one, no pin is re-applied (pins still end with their policies).
    """

    def __init__(self, journal: Journal, state: ExecutorState, deps: ActionDeps, metrics: Metrics,
                 may_act: Callable[[], bool], lock_for: Callable[[str], asyncio.Lock],
                 interval_seconds: float = 30.0, on_recorded: Callable[[], None] = lambda: None, *,
                 actions: Mapping[str, type[Action]]) -> None:
        self._journal = journal
        self._on_recorded = on_recorded  # an ended pin is shared state (cluster state publish)
        self._state = state
        self._deps = deps
        self._metrics = metrics
        self._may_act = may_act
        self._lock_for = lock_for
        self.interval_seconds = interval_seconds
        pinning = pinning_action(actions)
        self._pinning = pinning(deps) if pinning is not None else None
        self._followed: set[str] = set()  # targets to look at now (follow)
        self._retry: dict[str, float] = {}  # target -> when (monotonic) to look again (unreachable)
        self._wake = asyncio.Event()
        self.passes = 0  # full periodic passes run (tests, the benchmark)
        self.next_pass_at = 0.0  # when (monotonic) the next full pass runs

    def follow(self, target_keys: Iterable[str]) -> None:
        """Look at these targets' pins now, before the next full pass (a replica became ready)."""
        keys = set(target_keys)
        if keys:
            self._followed |= keys
            self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        """A full pass every `interval_seconds`, and the targets `follow` names in between, until `stop`."""
        self.next_pass_at = time.monotonic()
        while not stop.is_set():
            self._wake.clear()  # before taking the work: a follow during it cuts the next wait short
            now = time.monotonic()
            due = {key for key, at in self._retry.items() if at <= now}
            if now >= self.next_pass_at:
                self.next_pass_at = now + self.interval_seconds
                self._followed.clear()
                await self._pass(None)
                self.passes += 1
            elif self._followed or due:
                keys, self._followed = self._followed | due, set()
                await self._pass(keys)
            nearest = min([self.next_pass_at, *self._retry.values()])
            await wait_or_stop(stop, max(0.0, nearest - time.monotonic()), self._wake)

    async def _pass(self, only: set[str] | None) -> None:
        try:
            results = await self.reconcile_once(only)
        except Exception:  # one bad pass (journal, API) must not end the loop; the next retries
            self._metrics.faults.labels("pins").inc()
            log.exception("pin reconcile pass failed")
            return
        for key in (only if only is not None else set(self._retry)):
            self._retry.pop(key, None)
        for key, outcome in results.items():
            # A replica not read, or a check or load that failed: looked at again soon, not a pass later.
            if outcome.data.get("unreachable") or outcome.status is OutcomeStatus.FAILED:
                self._retry[key] = time.monotonic() + UNREACHABLE_RETRY_SECONDS

    async def reconcile_once(self, only: set[str] | None = None) -> dict[str, Outcome]:
        """One pass over every pin (or only those of the target keys in `only`); returns the
        outcome per target key (for tests and logs).

        A pin of a disabled or removed policy ends (not in the result); a pin whose target rolled
        forward ends with a NOOP outcome (`ended` in its data) and nothing is loaded. A replica
        that could not be read is named in the outcome's `unreachable` data and counted as
        result `unreachable`, never as in sync.
        """
        if not self._may_act():
            return {}
        policies = self._state.policies.policies
        results: dict[str, Outcome] = {}
        for pin in await self._journal.pins.live.in_thread():
            key = pin["target"]
            if only is not None and key not in only:
                continue
            policy, gone, named = _policy_of(pin, policies)
            if policy is None:
                if gone is not None and policies:  # an empty set (nothing loaded yet) ends nothing
                    await self._end(pin, gone, named)
                continue
            target = policy.target
            if self._pinning is None or (target.triton_service is None and not target.triton_endpoints):
                continue
            async with self._lock_for(key):
                with structlog.contextvars.bound_contextvars(target=key, pinned_version=pin["version"]):
                    try:
                        outcome = await self._reconcile(pin, policy)
                    except asyncio.CancelledError:
                        raise
                    except Exception as exc:  # one target's failure never stops another's pins
                        self._metrics.faults.labels("pins").inc()
                        log.exception("pin reconcile of one target failed; the others go on")
                        outcome = Outcome.failure(f"{type(exc).__name__}: {exc}", retryable=True)
            results[key] = outcome
            if outcome.data.get("ended"):
                result = "ended"
            elif outcome.data.get("unreachable"):
                result = "unreachable"
            else:
                result = {"ok": "reapplied", "noop": "in_sync"}.get(outcome.status.value, outcome.status.value)
            self._metrics.actions.labels(ACTION, result).inc()
        return results

    async def _end(self, pin: Mapping[str, Any], reason: str, policy: LoadedPolicy | None) -> None:
        """End `pin` in the journal with `reason`; an Event on the policy's target when one can be recorded."""
        ended = await self._journal.pins.end.in_thread(pin["target"], reason)
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
        pinning = self._pinning
        assert pinning is not None  # reconcile_once skips every pin without one
        target, version = policy.target, int(pin["version"])
        params = pinning.pin_params(version)
        try:
            check: PinCheck = pinning.plan_pin(target, params, await pinning.observe(target, params))
        except ActionError as exc:
            log.warning("pin check failed", error=str(exc))
            return Outcome.failure(str(exc), retryable=exc.retryable)
        step = check.step
        forward = rolled_forward(check.ready_versions, pin.get("from_version"))
        if forward:
            reason = (f"rolled forward: version {max(forward)} is served, newer than version "
                      f"{pin['from_version']} the pin rolled back from")
            await self._end(pin, reason, policy)
            return Outcome.noop(f"pin of {target.model} to version {version} ended: {reason}", ended=reason)
        unreachable = dict(check.unreachable)
        if step.noop:
            if unreachable:
                log.warning("pin holds on the replicas read; some ready replicas could not be read",
                            replicas=check.replicas, unreachable=unreachable)
            else:
                log.debug("pin holds", replicas=check.replicas)
            return Outcome.noop(step.summary, unreachable=unreachable)
        if self._state.frozen or not self._may_act():
            log.info("pin drift seen; not re-applied (frozen or not leader)", summary=step.summary)
            return Outcome.skipped(f"frozen or not leader: {step.summary}")
        drifted = dict(check.drifted)
        outcome = await pinning.apply(step, target, params)
        if outcome.ok:
            outcome = await pinning.verify(step, target, params)
        log.info("pin re-applied" if outcome.ok else "pin re-apply failed", drifted=drifted,
                 result=outcome.status.value, message=outcome.message, unreachable=unreachable)
        if outcome.ok:
            return Outcome.success(f"re-pinned {target.model} to version {version} on "
                                   f"{len(drifted)} replica(s)", drifted=drifted, unreachable=unreachable)
        return outcome


def rolled_forward(ready_versions: Iterable[int], from_version: Any) -> list[int]:
    """The READY versions newer than the version a pin rolled back from: the reconciler only ever
    loads the pinned (older) version, so someone else deployed them. Empty when `from_version` is
    unknown."""
    if from_version is None:
        return []
    return sorted({v for v in ready_versions if v > int(from_version)})


def _policy_of(pin: Mapping[str, Any], policies: tuple[LoadedPolicy, ...] | list[LoadedPolicy]
               ) -> tuple[LoadedPolicy | None, str | None, LoadedPolicy | None]:
    """(the enabled policy a pin belongs to, or None with why the pin must end, and the disabled
    policy it belonged to, for the Event).

    A pin that names its policy belongs to it (on the same target); an older pin, or one whose policy
    is gone while others still target its target (a rename), belongs to the policies naming its target.
    """
    key, name = pin["target"], pin.get("policy")
    on_target = sorted((p for p in policies if p.target.key == key), key=lambda p: p.name)
    mine = [p for p in on_target if name is None or p.name == name] or on_target  # renamed: carried on
    if not mine:
        return None, f"policy {name} removed" if name else f"no policy targets {key} any more", None
    enabled = [p for p in mine if p.spec.enabled]
    if not enabled:
        return None, f"policy {name or mine[0].name} disabled", mine[0]
    return enabled[0], None, None
