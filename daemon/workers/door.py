"""The door: the one way any worker's write reaches the world (Triton, Kubernetes, timeout sinks).

Actions build each request from their client and hand it to `Door.write` (the `actions.base.Actuator`
lent in `ActionDeps.actuator`) instead of sending it. At the moment of the write the door asks the
journal, not a cache, everything that may forbid it:

- who writes: the worker that declared itself with `acting` (the executor's steps and reverts, the
  pin reconciler, the warm keeper, the recovery revert); a write with no declared writer is refused;
- leadership: `may_act()`, and the journal's term: the intent is journaled as a fenced write, so it
  is refused once another replica took a newer term; with sharding on (`shards`), this replica must
  hold the Lease of the target's shard and the shard's term in the journal (checked in the intent's
  own transaction: daemon/storage/shard_terms.py), else the write is refused (check `shard`);
- every freeze covering the target: the settings file's `freeze`, a runtime freeze of the whole
  daemon (API, CLI, control ConfigMap), of the target, and an escalation's freeze of the target;
- known-bad versions: a Triton load of a version marked bad for the target is refused;
- right before the request, the write fence (`ActionDeps.write_fence`: a new leader waits out an old
  one's in-flight Triton writes; this replica must still hold its Lease; with sharding, per shard). Triton takes no
  precondition, so this re-check is the last word; docs/operations.md states the window left.

The blast radius is not asked again here: it is an admission rule on decisions across targets (how
many targets may start acting in a window), counted once when the executor admits a decision; a
write of an admitted decision, a pin re-applied and a revert restoring what was there are not new
targets joining a burst, and counting each write would count one decision many times.

Each write is journaled twice (`journal.effects`): its intent before `send` and its result after
(done or failed); a refusal is one row (refused, with the check that said no) and raises
`actions.base.Refused`, which the action turns into a failed Outcome: never a write, never a crash.
"""
from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Iterator, NoReturn, Protocol, TypeVar

import structlog
from prometheus_client import Counter

from actions.base import ActionDeps, Effect, Refused
from daemon.common.metrics import Metrics
from daemon.storage.effects import DONE, FAILED, INTENT, REFUSED
from daemon.storage.errors import JournalError, JournalFenced
from daemon.storage.journal import Journal
from daemon.storage.records import DAEMON_SCOPE
from daemon.storage.shard_terms import ShardFenced
from daemon.workers.freezes import blocking_reason
from daemon.workers.state import ExecutorState

log = structlog.get_logger("tailguard.door")

T = TypeVar("T")

EXECUTOR = "executor"
PINS = "pins"
REVERT = "revert"


class ShardGate(Protocol):
    """What the door asks about shards (daemon/cluster/shards.py's ShardManager)."""

    def shard_of(self, target: str) -> int:
        """The target's shard."""
        ...

    def may_write(self, shard: int) -> bool:
        """Whether this replica leads `shard` now (its Lease held, its renew deadline not passed)."""
        ...

    def write_fence_seconds(self, shard: int, request_timeout_seconds: float) -> float:
        """How long a write must still wait after `shard` was taken over (the old holder's writes land)."""
        ...


@dataclass(frozen=True)
class Acting:
    """Who is writing now, on which target, for which decision (None: the pin reconciler)."""

    writer: str
    target: str
    decision_id: int | None = None


_acting: contextvars.ContextVar[Acting | None] = contextvars.ContextVar("tailguard_acting", default=None)


@contextlib.contextmanager
def acting(writer: str, target: str, decision_id: int | None = None) -> Iterator[Acting]:
    """Declare the writer of every write made inside the block (tasks it starts inherit it)."""
    who = Acting(writer, target, decision_id)
    token = _acting.set(who)
    try:
        yield who
    finally:
        _acting.reset(token)


def current() -> Acting | None:
    """The writer declared here, if any."""
    return _acting.get()


class Door:
    """The daemon's `Actuator`.

    Args:
        journal: Freezes, bad marks, the term (fenced intents) and the effects journaled.
        state: The settings file's freeze (`state.frozen`).
        deps: Its `write_fence` is read at each write (leader election sets it after wiring).
        may_act: False on a replica that is not the leader.
        metrics: `tailguard_door_writes_total{writer,kind,result}` counts each write and refusal.
        clock: Unix time (freezes expire on it).
        shards: With sharding on, who leads the target's shard; None: one leader for every target.
    """

    def __init__(self, journal: Journal, state: ExecutorState, deps: ActionDeps, may_act: Callable[[], bool],
                 metrics: Metrics, clock: Callable[[], float] = time.time, shards: ShardGate | None = None) -> None:
        self.shards = shards
        self._journal = journal
        self._state = state
        self._deps = deps
        self._may_act = may_act
        self._clock = clock
        self._writes = Counter("tailguard_door_writes", "Writes to the world through the door, by writer, kind "
                               "and result (sent, failed, or refused_<check>).", ["writer", "kind", "result"],
                               registry=metrics.registry)

    async def refusal(self, who: Acting, effect: Effect) -> tuple[str, str] | None:
        """(check, reason) when the write may not be made now, else None. Reads the journal."""
        if effect.target is not None and effect.target != who.target:
            return "writer", f"{who.writer} acts on {who.target}, not on {effect.target}"
        if not self._may_act():
            return "leader", "this replica may not act (not the leader, or no term held)"
        if self.shards is not None:
            shard = self.shards.shard_of(who.target)
            if not self.shards.may_write(shard):
                return "shard", f"this replica does not lead shard {shard} of {who.target}"
        if self._state.frozen:
            return "freeze", "daemon frozen by the settings file (`freeze: true`)"
        now = self._clock()
        for freeze in await self._journal.freezes.active.in_thread(now):
            if freeze.target in (DAEMON_SCOPE, who.target):
                return "freeze", blocking_reason(freeze)
        if effect.loads is not None:
            marks = await self._journal.bad_versions.of.in_thread(who.target)
            # A revert may put back the version its own decision's rollback marked bad (it undoes that rollback).
            bad = [m for m in marks if int(m.version) == effect.loads
                   and not (who.writer == REVERT and m.decision_id is not None and m.decision_id == who.decision_id)]
            if bad:
                return "bad_version", (f"version {effect.loads} is marked bad for {who.target} ({bad[0].reason}); "
                                       f"not loaded (`tailguard bad-versions {who.target} --clear {effect.loads}` "
                                       "once it is good)")
        return None

    async def ask(self, effect: Effect) -> Refused | None:
        who = current()
        if who is None:
            return Refused("writer", "no writer declared")
        try:
            refused = await self.refusal(who, effect)
        except JournalError as exc:
            return Refused("journal", f"the checks could not be read: {exc}", retryable=True)
        return Refused(*refused) if refused is not None else None

    async def write(self, effect: Effect, send: Callable[[], Awaitable[T]]) -> T:
        who = current()
        if who is None:
            self._writes.labels("none", effect.kind, "refused_writer").inc()
            log.error("write refused: no writer declared", kind=effect.kind, summary=effect.summary)
            raise Refused("writer", "no writer declared for this write (only the executor, the pin reconciler "
                                    "and the recovery revert write)")
        try:
            refused = await self.refusal(who, effect)
        except JournalError as exc:
            # What may forbid the write cannot be read: no write (a journal outage passes; retryable).
            await self._refuse(who, effect, "journal", f"the checks could not be read: {exc}", journal=False)
        if refused is not None:
            await self._refuse(who, effect, *refused)
        also_check = None
        if self.shards is not None:  # the shard's term, checked in the intent's own transaction
            also_check = functools.partial(self._journal.shard_terms.check, self.shards.shard_of(who.target))
        try:
            intent = await self._journal.effects.record.in_thread(
                who.writer, who.target, effect.kind, INTENT, effect.summary, self._data(effect), who.decision_id,
                fenced=True, also_check=also_check)
        except ShardFenced as exc:
            await self._refuse(who, effect, "shard", str(exc), journal=False)
        except JournalFenced as exc:
            await self._refuse(who, effect, "fence", str(exc), journal=False)
        except JournalError as exc:
            # Not journaled, not sent: a write the journal cannot announce is no write.
            await self._refuse(who, effect, "journal", f"intent not journaled: {exc}", journal=False)
        if self.shards is not None:
            await self._shard_fence(who, effect, intent)
        if self._deps.write_fence is not None:
            # Right before the request: Triton takes no precondition, so this is the last word.
            fenced = await self._deps.write_fence(effect.timeout_seconds)
            if fenced is not None:
                await self._refuse(who, effect, "fence", fenced, intent=intent)
        try:
            result = await send()
        except Exception as exc:
            self._writes.labels(who.writer, effect.kind, "failed").inc()
            await self._record(who, effect, FAILED, f"{type(exc).__name__}: {exc}", {"intent": intent})
            raise
        self._writes.labels(who.writer, effect.kind, "sent").inc()
        await self._record(who, effect, DONE, effect.summary, {"intent": intent})
        return result

    async def _shard_fence(self, who: Acting, effect: Effect, intent: int) -> None:
        """Sharding: right after the target's shard was taken over, wait out its old holder's in-flight
        writes (the Lease duration it wrote plus the request timeout), then re-check the shard is still
        led here; refuse (check `shard`) if not."""
        assert self.shards is not None
        shard = self.shards.shard_of(who.target)
        wait = self.shards.write_fence_seconds(shard, effect.timeout_seconds)
        if wait > 0:
            log.info("waiting out the shard's takeover fence before the write", shard=shard, seconds=round(wait, 1))
            await asyncio.sleep(wait)
        if not self.shards.may_write(shard):
            await self._refuse(who, effect, "shard", f"this replica no longer leads shard {shard} of {who.target}",
                               intent=intent)

    @staticmethod
    def _data(effect: Effect) -> dict[str, Any]:
        return {**dict(effect.data), "loads": effect.loads} if effect.loads is not None else dict(effect.data)

    async def _refuse(self, who: Acting, effect: Effect, check: str, reason: str, *, journal: bool = True,
                      intent: int | None = None) -> NoReturn:
        """Journal the refusal (unless the journal itself refused) and raise it: nothing is sent."""
        self._writes.labels(who.writer, effect.kind, f"refused_{check}").inc()
        retryable = check == "journal"
        log.warning("write refused", writer=who.writer, target=who.target, kind=effect.kind, check=check,
                    reason=reason, summary=effect.summary)
        if journal:
            data = {**self._data(effect), "check": check, **({"intent": intent} if intent is not None else {})}
            await self._record(who, effect, REFUSED, reason, data)
        raise Refused(check, reason, retryable)

    async def _record(self, who: Acting, effect: Effect, status: str, message: str, data: dict[str, Any]) -> None:
        """A result or refusal row, not fenced (what happened is journaled even after a takeover); a
        journal failure here is logged: the write happened (or did not) whatever the journal says.
        While the journal's writes are failing it is not attempted: the intent without a result says
        "in doubt", as the executor's own intent row does, and the caller's record of the outcome (a
        step row) is not kept waiting behind this one for a connection."""
        health = self._journal.write_health()
        if health.failing_seconds > 0:
            log.warning("write's result not journaled: the journal is failing", status=status, error=health.error)
            return
        try:
            await self._journal.effects.record.in_thread(who.writer, who.target, effect.kind, status, message,
                                                         {**data, "summary": effect.summary}, who.decision_id)
        except JournalError as exc:
            log.warning("could not journal a write's result", status=status, error=str(exc))
