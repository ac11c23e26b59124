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

Every load goes through the door (`ActionDeps.actuator`, daemon/workers/door.py) as writer "pins":
a runtime freeze of the daemon or the target, an escalation's freeze, a pinned version an operator
marked bad, or a lost Lease refuses it. The reconciler asks the door before it plans a write
(`Actuator.ask`), so a refusal that holds pass after pass is journaled once (effects, status
refused), not every pass, and the target is not retried before the next pass.

No silent tug of war: a drifted replica serving the very version the pin rolled back from (the
deploy pipeline redeployed it) is re-pinned, and that re-pin is announced once per version (a
Kubernetes Event `PinTugOfWar` and an `acted` notification), journaled (effects kind `pin.repin`)
and counted (`tailguard_pin_repins_total`). After `repin_escalate_after` such re-pins within
`repin_window_seconds` the target escalates (effects kind `pin.escalated`, an Event, an `escalated`
notification) and re-pinning waits for an operator: `tailguard unpin` ends the pin, and
`tailguard bad-versions TARGET --clear N` says the version is good, which ends the pin as a roll
forward does (the operator's answer is not fought either).

The warm keeper (daemon/workers/warm.py, `keepWarm: previous`) rides the same passes; a replica serving
the pinned version with one older good version warm beside it is in place, not drift
(`actions._triton_versions.in_place`).
"""
from __future__ import annotations

import asyncio
import time
from typing import Any, Callable, Iterable, Mapping

import structlog

from prometheus_client import Counter

from actions.base import Effect, PinCheck, pinning_action
from core.outcome import ActionError, Outcome, OutcomeStatus
from core.timestamps import iso_utc
from daemon.storage.effects import DONE, REFUSED
from daemon.storage.records import Pin
from daemon.workers.context import ActContext
from daemon.workers.door import PINS, acting
from daemon.workers.warm import WarmKeeper
from daemon.common.lifecycle import wait_or_stop
from policies.loader import LoadedPolicy

log = structlog.get_logger("tailguard.pins")

ACTION = "pin.reconcile"
UNREACHABLE_RETRY_SECONDS = 5.0
"""A target with a ready replica that could not be read is looked at again this soon."""
REPIN = "pin.repin"  # effects kind: a re-pin over a redeployed rolled-back version
ESCALATED = "pin.escalated"  # effects kind: re-pinning of the pin waits for an operator


class PinReconciler:
    """Periodically re-applies journaled pins, each load through the door (writer "pins"): only while
    `may_act()`, no freeze covers the target and the pinned version is not marked bad.

    Args:
        ctx: The executor's plumbing: the journal (pins, effects), the state (a pin whose target no
            policy names is left alone; the freeze), the clients (`deps.endpoints` resolves a target's
            replicas) and the door, metrics (`tailguard_actions_total{action="pin.reconcile"}`),
            leadership, the per-target locks (a pin never races a remediation), on_recorded (an ended
            pin is shared state), notify (a tug of war's first re-pin per version, `acted`, and its
            escalation, `escalated`) and the action registry, whose pinning action
            (`actions.base.pinning_action`) re-applies pins (without one, no pin is re-applied; pins
            still end with their policies).
        interval_seconds: Time between passes.
        repin_escalate_after, repin_window_seconds: Re-pins of a redeployed rolled-back version within
            the window after which the target escalates (settings `executor.repinEscalateAfter`,
            `executor.repinWindowSeconds`).
    """

    def __init__(self, ctx: ActContext, interval_seconds: float = 30.0, *, repin_escalate_after: int = 3,
                 repin_window_seconds: float = 3600.0) -> None:
        self._ctx = ctx
        self.owns: Callable[[str], bool] | None = None  # sharding: the targets of the shards led here
        self.interval_seconds = interval_seconds
        pinning = pinning_action(ctx.actions)
        self._pinning = pinning(ctx.deps) if pinning is not None else None
        self.repin_escalate_after = repin_escalate_after
        self.repin_window_seconds = repin_window_seconds
        # The re-pin window's time is the journal's, not the context's: pins and effects are stamped with it.
        self._clock = ctx.journal.clock
        self._refused: dict[str, str] = {}  # target -> the refusal journaled last (journaled once while it holds)
        self._repins = Counter("tailguard_pin_repins", "Re-pins over a redeployed version the pin rolled back from "
                               "(a tug of war with the deploy pipeline), by target.", ["target"],
                               registry=ctx.metrics.registry)
        self._followed: set[str] = set()  # targets to look at now (follow)
        self._retry: dict[str, float] = {}  # target -> when (monotonic) to look again (unreachable)
        self._wake = asyncio.Event()
        self.passes = 0  # full periodic passes run (tests, the benchmark)
        self.next_pass_at = 0.0  # when (monotonic) the next full pass runs
        # Rides the same passes: a deploy or a pod that appears later gets its warm version (keepWarm).
        self.warm = WarmKeeper(ctx, owns=lambda key: self.owns is None or self.owns(key))

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
            self._ctx.metrics.faults.labels("pins").inc()
            log.exception("pin reconcile pass failed")
            return
        for key in (only if only is not None else set(self._retry)):
            self._retry.pop(key, None)
        for key, outcome in results.items():
            # A replica not read, or a check or load that failed: looked at again soon, not a pass later.
            if outcome.data.get("unreachable") or outcome.status is OutcomeStatus.FAILED:
                self._retry[key] = time.monotonic() + UNREACHABLE_RETRY_SECONDS
        try:
            await self.warm.once(only)
        except Exception:  # a failed warm pass is retried on the next pass; pins are not held up
            self._ctx.metrics.faults.labels("warm").inc()
            log.exception("warm pass failed")

    async def reconcile_once(self, only: set[str] | None = None) -> dict[str, Outcome]:
        """One pass over every pin (or only those of the target keys in `only`); returns the
        outcome per target key (for tests and logs).

        A pin of a disabled or removed policy ends (not in the result); a pin whose target rolled
        forward ends with a NOOP outcome (`ended` in its data) and nothing is loaded. A replica
        that could not be read is named in the outcome's `unreachable` data and counted as
        result `unreachable`, never as in sync.
        """
        if not self._ctx.may_act():
            return {}
        policies = self._ctx.state.policies.policies
        results: dict[str, Outcome] = {}
        for pin in await self._ctx.journal.pins.live.in_thread():
            key = pin.target
            if only is not None and key not in only:
                continue
            if self.owns is not None and not self.owns(key):
                continue  # another replica leads this target's shard (and reconciles its pin)
            policy, gone, named = _policy_of(pin, policies)
            if policy is None:
                if gone is not None and policies:  # an empty set (nothing loaded yet) ends nothing
                    await self._end(pin, gone, named)
                continue
            target = policy.target
            if self._pinning is None or (target.triton_service is None and not target.triton_endpoints):
                continue
            async with self._ctx.lock_for(key):
                with structlog.contextvars.bound_contextvars(target=key, pinned_version=pin.version), \
                        acting(PINS, key):
                    try:
                        outcome = await self._reconcile(pin, policy)
                    except asyncio.CancelledError:
                        raise
                    except Exception as exc:  # one target's failure never stops another's pins
                        self._ctx.metrics.faults.labels("pins").inc()
                        log.exception("pin reconcile of one target failed; the others go on")
                        outcome = Outcome.failure(f"{type(exc).__name__}: {exc}", retryable=True)
            results[key] = outcome
            if outcome.data.get("ended"):
                result = "ended"
            elif outcome.data.get("refused") or outcome.data.get("held"):
                result = "refused"
            elif outcome.data.get("unreachable"):
                result = "unreachable"
            else:
                result = {"ok": "reapplied", "noop": "in_sync"}.get(outcome.status.value, outcome.status.value)
            self._ctx.metrics.actions.labels(ACTION, result).inc()
        return results

    async def _end(self, pin: Pin, reason: str, policy: LoadedPolicy | None) -> None:
        """End `pin` in the journal with `reason`; an Event on the policy's target when one can be recorded."""
        ended = await self._ctx.journal.pins.end.in_thread(pin.target, reason)
        if ended is None:
            return
        log.info("pin ended", target=pin.target, version=pin.version, reason=reason)
        self._ctx.on_recorded()
        if policy is None or self._ctx.deps.record_event is None:
            return
        try:
            await self._ctx.deps.record_event(policy=policy, reason="PinEnded",
                                          message=f"pin of {pin.model} to version {pin.version} ended: "
                                                  f"{reason}", warning=False)
        except Exception as exc:  # an Event is a courtesy: its failure is recorded, never fatal
            self._ctx.metrics.faults.labels("events").inc()
            log.warning("could not record Kubernetes event", error=str(exc))

    async def _reconcile(self, pin: Pin, policy: LoadedPolicy) -> Outcome:
        pinning = self._pinning
        assert pinning is not None  # reconcile_once skips every pin without one
        target, version = policy.target, int(pin.version)
        params = pinning.pin_params(version)
        try:
            check: PinCheck = pinning.plan_pin(target, params, await pinning.observe(target, params))
        except ActionError as exc:
            log.warning("pin check failed", error=str(exc))
            return Outcome.failure(str(exc), retryable=exc.retryable)
        step = check.step
        forward = rolled_forward(check.ready_versions, pin.from_version)
        if forward:
            reason = (f"rolled forward: version {max(forward)} is served, newer than version "
                      f"{pin.from_version} the pin rolled back from")
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
        if self._ctx.state.frozen or not self._ctx.may_act():
            log.info("pin drift seen; not re-applied (frozen or not leader)", summary=step.summary)
            return Outcome.skipped(f"frozen or not leader: {step.summary}")
        drifted = dict(check.drifted)
        key = pin.target
        from_version = pin.from_version
        # The version the pin rolled back from, when a drifted replica serves it again (redeployed).
        bad = int(from_version) if from_version is not None else None
        redeployed = bad if bad is not None and any(bad in vs for vs in drifted.values()) else None
        if redeployed is not None:
            settled = await self._tug_of_war(pin, policy, redeployed, step.summary)
            if settled is not None:
                return settled
        refused = await self._ctx.deps.actuator.ask(Effect("triton.load", step.summary, target=key, loads=version))
        if refused is not None:
            await self._journal_refusal(key, refused.check, refused.reason, version)
            return Outcome.skipped(f"not re-applied: {refused}", refused=refused.check, unreachable=unreachable)
        self._refused.pop(key, None)
        outcome = await pinning.apply(step, target, params)
        if outcome.ok:
            outcome = await pinning.verify(step, target, params)
        log.info("pin re-applied" if outcome.ok else "pin re-apply failed", drifted=drifted,
                 result=outcome.status.value, message=outcome.message, unreachable=unreachable)
        if outcome.ok and redeployed is not None:
            await self._repinned(pin, policy, redeployed, drifted)
        if outcome.ok:
            return Outcome.success(f"re-pinned {target.model} to version {version} on "
                                   f"{len(drifted)} replica(s)", drifted=drifted, unreachable=unreachable)
        return outcome

    async def _journal_refusal(self, key: str, check: str, reason: str, version: int) -> None:
        """Journal why the pin of `key` is not re-applied, once while the same refusal holds."""
        if self._refused.get(key) == reason:
            return
        await self._ctx.journal.effects.record.in_thread(PINS, key, "triton.load", REFUSED, reason,
                                                     {"check": check, "loads": version})
        self._refused[key] = reason
        log.warning("pin not re-applied: refused", check=check, reason=reason)

    async def _tug_of_war(self, pin: Pin, policy: LoadedPolicy, bad: int,
                          summary: str) -> Outcome | None:
        """A replica serves `bad`, the version the pin rolled back from, again (redeployed). The Outcome
        that settles this pass without a load (the pin ends: an operator cleared the mark; or it is
        held: escalated), else None: re-pin."""
        key, since = pin.target, float(pin.at)
        if bad not in await self._ctx.journal.bad_versions.known.in_thread(key):
            reason = f"version {bad} the pin rolled back from is served again and no longer marked bad (cleared)"
            await self._end(pin, reason, policy)
            return Outcome.noop(f"pin of {pin.model} to version {pin.version} ended: {reason}", ended=reason)
        waiting = (f"re-pinning waits for an operator: `tailguard bad-versions {key} --clear {bad}` (the version is "
                   f"good) or `tailguard unpin {key}`")
        if await self._ctx.journal.effects.of.in_thread(key, ESCALATED, since):
            await self._journal_refusal(key, "escalated", f"escalated tug of war over version {bad}; {waiting}",
                                        int(pin.version))
            return Outcome.skipped(f"held: {summary}; {waiting}", held=True)
        now = self._clock()
        count = await self._ctx.journal.effects.count.in_thread(key, REPIN, DONE,
                                                             max(since, now - self.repin_window_seconds))
        if count < self.repin_escalate_after:
            return None
        message = (f"{pin.model}: version {bad}, rolled back from, was redeployed and re-pinned to version "
                   f"{pin.version} {count} time(s) within {self.repin_window_seconds:g}s; escalated: {waiting}")
        await self._ctx.journal.effects.record.in_thread(PINS, key, ESCALATED, DONE, message,
                                                     {"version": bad, "repins": count, "pin_at": since})
        log.warning("pin tug of war escalated", version=bad, repins=count)
        await self._event(policy, "PinTugOfWarEscalated", message)
        self._ctx.notify({"event": "escalated", "policy": policy.name, "target": key, "message": message,
                        "at": iso_utc(now), "version": bad, "repins": count})
        return Outcome.skipped(f"held: {summary}; {waiting}", held=True)

    async def _repinned(self, pin: Pin, policy: LoadedPolicy, bad: int,
                        drifted: Mapping[str, Any]) -> None:
        """Journal and count a re-pin over the redeployed version `bad`; announce the first one per version."""
        key = pin.target
        earlier = [r for r in await self._ctx.journal.effects.of.in_thread(key, REPIN, float(pin.at))
                   if r.data.get("version") == bad]
        message = (f"{pin.model}: version {bad}, rolled back from and marked bad, was redeployed; re-pinned to "
                   f"version {pin.version} on {len(drifted)} replica(s). Past {self.repin_escalate_after} re-pins "
                   f"within {self.repin_window_seconds:g}s the target escalates")
        await self._ctx.journal.effects.record.in_thread(PINS, key, REPIN, DONE, message,
                                                     {"version": bad, "pinned": int(pin.version),
                                                      "replicas": sorted(drifted)})
        self._repins.labels(key).inc()
        log.warning("redeployed rolled-back version re-pinned", version=bad, replicas=sorted(drifted))
        if not earlier:
            await self._event(policy, "PinTugOfWar", message)
            self._ctx.notify({"event": "acted", "policy": policy.name, "target": key, "message": message,
                            "at": iso_utc(self._clock()), "version": bad})

    async def _event(self, policy: LoadedPolicy, reason: str, message: str) -> None:
        """A Warning Event on the policy's target; a courtesy: its failure is counted, never fatal."""
        if self._ctx.deps.record_event is None:
            return
        try:
            await self._ctx.deps.record_event(policy=policy, reason=reason, message=message, warning=True)
        except Exception as exc:
            self._ctx.metrics.faults.labels("events").inc()
            log.warning("could not record Kubernetes event", error=str(exc))


def rolled_forward(ready_versions: Iterable[int], from_version: Any) -> list[int]:
    """The READY versions newer than the version a pin rolled back from: the reconciler only ever
    loads the pinned (older) version, so someone else deployed them. Empty when `from_version` is
    unknown."""
    if from_version is None:
        return []
    return sorted({v for v in ready_versions if v > int(from_version)})


def _policy_of(pin: Pin, policies: tuple[LoadedPolicy, ...] | list[LoadedPolicy]
               ) -> tuple[LoadedPolicy | None, str | None, LoadedPolicy | None]:
    """(the enabled policy a pin belongs to, or None with why the pin must end, and the disabled
    policy it belonged to, for the Event).

    A pin that names its policy belongs to it (on the same target); an older pin, or one whose policy
    is gone while others still target its target (a rename), belongs to the policies naming its target.
    """
    key, name = pin.target, pin.policy
    on_target = sorted((p for p in policies if p.target.key == key), key=lambda p: p.name)
    mine = [p for p in on_target if name is None or p.name == name] or on_target  # renamed: carried on
    if not mine:
        return None, f"policy {name} removed" if name else f"no policy targets {key} any more", None
    enabled = [p for p in mine if p.spec.enabled]
    if not enabled:
        return None, f"policy {name or mine[0].name} disabled", mine[0]
    return enabled[0], None, None
