"""The backlog: the in-memory side of the journal's pending signals, bounded, matching first."""
from __future__ import annotations

import asyncio
import collections
import time
from typing import Any, Awaitable, Callable, Sequence

import structlog

from core.decision import DecisionState
from core.signal import Signal, SignalHead
from daemon.common.metrics import Metrics
from daemon.storage.errors import JournalError, JournalFenced, JournalValueError
from daemon.storage.journal import Journal
from daemon.storage.records import NewSignal
from policies.guards import GuardDecision
from policies.loader import LoadedPolicy
from policies.matching import Matchable, matching_policies
from policies.planning import blocked_plan

log = structlog.get_logger("tailguard.backlog")

DEFAULT_CACHE_SIZE = 10_000
MATCHING, UNMATCHED = 0, 1  # the two classes of the backlog
CLASSES = (MATCHING, UNMATCHED)
MEMO_SIZE = 4_096  # kinds of signal a read keeps the class of
JOURNAL_RETRY_MAX_SECONDS = 30.0
"""The longest wait between retries of a signal whose processing met a journal error."""


def signal_class(policies: Sequence[LoadedPolicy], signal: Matchable) -> int:
    """MATCHING when some policy takes `signal`, else UNMATCHED."""
    return MATCHING if matching_policies(policies, signal) else UNMATCHED


class ClassMemo:
    """Classes of journaled signals by what matching reads of them, for one policy set at a time.
    Alerts of one rule about one target repeat those fields (their fingerprints and times differ),
    so a read of a large pending set matches each kind once, and builds no Signal for it."""

    def __init__(self, size: int = MEMO_SIZE) -> None:
        self._size = size
        self._policies: Sequence[LoadedPolicy] | None = None
        self._classes: dict[tuple[object, ...], int] = {}

    def summary_class(self, policies: Sequence[LoadedPolicy], summary: dict[str, Any]) -> int:
        """signal_class of a journaled summary; raises as SignalHead.from_summary does."""
        if policies is not self._policies:  # another policy set: what was known no longer holds
            self._policies, self._classes = policies, {}
        labels = summary.get("labels", {})
        key = (summary["source"], summary["name"], summary.get("status"), summary.get("policy"), *labels.items())
        cls = self._classes.get(key)
        if cls is None:
            cls = signal_class(policies, SignalHead.from_summary(summary))
            if len(self._classes) >= self._size:
                self._classes.clear()
            self._classes[key] = cls
        return cls


class Backlog:
    """The in-memory side of the journal's pending signals: a bounded cache the workers take from.

    The journal is the queue of record. A signal that matches a policy waits in the matching class,
    whose workers run it through the executor (one lock per target); a signal that matches none
    waits in the unmatched class, marked processed in batches, so it never delays a matching one.
    A class holds at most `capacity` signals: past that, its new signals stay pending in the journal
    only (the class is in overflow) and a refill reads them back in id order once half of it is
    free, from where its last read left off. Memory stays bounded whatever the intake; a signal is
    taken at most once (`_known`: in a class or being processed), and every pending one is taken (a
    class leaves overflow only when a read reached the end of the pending set leaving none of it).

    Nothing is taken, processed or marked while `may_take()` is false (a follower, a new leader that
    has not imported the shared state, no valid policies yet): the signals wait in the journal, and
    when it turns true (`acting_changed`) the pending set is read from the start. A signal older than
    `max_age_seconds` (since it was journaled) when a worker takes it is not acted on: its matching
    policies get a `blocked` decision saying it expired (which counts for no guard) and it is marked
    processed; one a crash left mid-decision goes to the executor, which resumes it only while young
    and as planned (else `expired`).

    A journal error while a signal is processed (PostgreSQL restarting, a full disk, a dropped
    connection mid-decision) is retried by the worker holding it, after 1 s, 2 s, 4 s ... up to
    JOURNAL_RETRY_MAX_SECONDS, while this replica may take signals: the executor then resumes the
    decision from what the journal has (an apply whose result was not recorded is re-observed). It is
    never parked until the next start. A value the journal cannot store (JournalValueError) fails
    again and is not retried; nor is a fenced write (another replica leads: the signal is its).

    Args:
        journal: The queue of record.
        policies: The active policies (a signal's class, an expired signal's decisions).
        process: The executor: decide, act and mark processed.
        metrics: faults (journal, executor) and the decisions of expired signals.
        capacity: Signals held in memory per class.
        page: Rows per read of the pending set.
        may_take: Whether signals may go to the executor now (checked on every take).
        max_age_seconds: Age past which a signal is expired instead of processed; None: no bound.
        clock: Unix time, compared with the journal's `received_at`.
        sleep: Waits between retries after a journal error.
    """

    def __init__(self, journal: Journal, policies: Callable[[], Sequence[LoadedPolicy]],
                 process: Callable[[int, Signal], Awaitable[object]], metrics: Metrics,
                 capacity: int = DEFAULT_CACHE_SIZE, page: int = 1_000, *,
                 may_take: Callable[[], bool] = lambda: True, max_age_seconds: float | None = None,
                 clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self._journal = journal
        self._policies = policies
        self._process = process
        self._metrics = metrics
        self._capacity = max(1, capacity)
        self._page = page
        self._may_take = may_take
        self._max_age = max_age_seconds
        self._clock = clock
        self._sleep = sleep
        # (id, signal, when it was journaled) in id order
        self._matching: collections.deque[tuple[int, Signal, float]] = collections.deque()
        self._unmatched: collections.deque[int] = collections.deque()
        self._known: set[int] = set()  # in a class, being processed or being marked processed
        self._failed: set[int] = set()  # processing raised: left pending until the next start
        # Whether pending signals of a class may be in the journal only; at start, whatever the
        # journal holds from before (acknowledged, not yet processed) is read back this way.
        self._overflow = [True, True]
        # Per class: no pending signal of it below this id is left to the journal (held, processed
        # or failed), so its next read starts there. Valid for one policy set (`_generation`).
        self._resume = [0, 0]
        self._generation = 0
        self._dropped = [0, 0]  # signals of each class left to the journal by `admit`
        self._busy = 0  # signals being processed, batches being marked
        self._reading = False
        self._finished_while_reading: set[int] = set()
        self._changed = asyncio.Event()

    # ---- intake -----------------------------------------------------------------------------

    def admit(self, new: list[NewSignal]) -> None:
        """The journal's listener: signals just committed, in id order. A class in overflow
        takes none directly (its older signals in the journal go first); while nothing may be
        taken, every class is (the journal keeps them)."""
        now, taking = self._clock(), self._may_take()
        for signal_id, signal in new:
            cls = self._class(signal)
            if not taking or self._overflow[cls] or not self._take(signal_id, cls, now, signal):
                self._overflow[cls] = True
                self._dropped[cls] += 1
        self._wake()

    def policies_changed(self) -> None:
        """A new policy set may move pending signals from one class to the other: read them all again."""
        self._generation += 1
        self._overflow, self._resume = [True, True], [0, 0]
        self._wake()

    def look_again(self, pending_in_journal: int) -> bool:
        """On a journal several replicas share, signals another replica journaled never reach this
        one's listener: when the journal holds more pending signals than this backlog knows of, read
        the pending set again from the start (ids need not commit in order across processes, so a
        read from where the last one ended could skip one). Returns whether a read was started."""
        if not self._may_take() or any(self._overflow):
            return False  # nothing may be taken, or a read is due anyway
        if pending_in_journal <= len(self._known) + len(self._failed):
            return False
        self.policies_changed()
        return True

    def acting_changed(self) -> None:
        """`may_take` may have flipped. Now false: the signals held go back to the journal (nothing
        is taken until it is true again, and then the pending set is read from the start); what a
        worker has in hand finishes, or the executor's own check stops it between steps."""
        if not self._may_take():
            held = [signal_id for signal_id, _, _ in self._matching] + list(self._unmatched)
            self._matching.clear()
            self._unmatched.clear()
            self._known.difference_update(held)
            self.policies_changed()  # a new generation: every class is read again from the start
        self._wake()

    def _class(self, signal: Matchable) -> int:
        return signal_class(self._policies(), signal)

    def _room(self, cls: int) -> int:
        held = len(self._matching) if cls == MATCHING else len(self._unmatched)
        return self._capacity - held

    def _take(self, signal_id: int, cls: int, received_at: float, signal: Signal | None) -> bool:
        """Hold a signal in its class if there is room. Only the matching class keeps the Signal
        (its workers hand it to the executor); the unmatched one keeps the id, and may get None."""
        if self._room(cls) <= 0:
            return False
        if cls == MATCHING:
            if signal is None:
                raise ValueError("a matching signal is held with its Signal")
            self._matching.append((signal_id, signal, received_at))
            self._wake()  # a worker may start on it while the read goes on
        else:
            self._unmatched.append(signal_id)
        self._known.add(signal_id)
        return True

    def _forget(self, signal_ids: Sequence[int]) -> None:
        """Processed (or failed): no longer held. A read of the journal running now may still
        have seen them pending, so it must not take them again."""
        self._known.difference_update(signal_ids)
        if self._reading:
            self._finished_while_reading.update(signal_ids)
        self._wake()

    # ---- refill from the journal ------------------------------------------------------------

    def _to_refill(self) -> int | None:
        """A class in overflow with half of it free (the matching one first), if any, while signals may be taken."""
        if not self._may_take():
            return None
        return next((c for c in CLASSES if self._overflow[c] and self._room(c) >= max(1, self._capacity // 2)), None)

    async def refill(self) -> None:
        """Read signals left in the journal back into their class, whenever it has room."""
        while True:
            await self._until(lambda: self._to_refill() is not None)
            cls = self._to_refill()
            if cls is None:
                continue
            try:
                await self._read_pending(cls)
            except JournalError as exc:
                self._metrics.faults.labels("journal").inc()
                log.warning("could not read pending signals; retrying", error=str(exc))
                await asyncio.sleep(1.0)

    async def _read_pending(self, cls: int) -> None:
        """One read for class `cls`: pending signals in id order from where its last read left off,
        taking its signals not held until it is full. It leaves overflow when the read reached
        the end of the pending set leaving none behind, and none was left to the journal meanwhile."""
        dropped, generation = self._dropped[cls], self._generation
        last = self._resume[cls] - 1  # the last id looked at
        left: int | None = None  # the first signal of the class left behind (the class is full)
        end = False
        memo = ClassMemo()
        self._reading = True
        try:
            while left is None and not end and generation == self._generation:
                rows = await self._journal.signals.pending.in_thread(limit=self._page, after_id=last)
                end = len(rows) < self._page
                if generation != self._generation:
                    break  # the policies changed or signals may no longer be taken: read again later
                for row in rows:
                    last = row.id
                    if row.id in self._known or row.id in self._failed or row.id in self._finished_while_reading:
                        continue
                    try:
                        # Sorted by its head; the Signal is built only for a row the executor gets
                        # (a read of the matching class passes over every unmatched row).
                        kind = memo.summary_class(self._policies(), row.payload)
                        signal = Signal.from_summary(row.payload) if kind == cls == MATCHING and left is None else None
                    except Exception:  # a row this version cannot read: left pending, not retried
                        self._failed.add(row.id)
                        self._metrics.faults.labels("journal").inc()
                        log.exception("unreadable pending signal left pending", signal_id=row.id)
                        continue
                    if kind != cls:  # the other class's read takes it, in its order
                        if not self._overflow[kind]:  # only after a policy change: read that class again
                            self._overflow[kind] = True
                            self._resume[kind] = min(self._resume[kind], row.id)
                    elif left is None and not self._take(row.id, cls, row.received_at, signal):
                        left = row.id
            if generation != self._generation:
                return  # the policy set changed meanwhile: every class is read again from the start
            self._resume[cls] = left if left is not None else last + 1
            if end and left is None and self._dropped[cls] == dropped:
                self._overflow[cls] = False
        finally:
            self._reading = False
            self._finished_while_reading.clear()
            self._wake()

    # ---- processing -------------------------------------------------------------------------

    async def work(self) -> None:
        """A worker: matching signals through the executor, one at a time, while they may be taken."""
        while True:
            await self._until(lambda: bool(self._matching) and self._may_take())
            signal_id, signal, received_at = self._matching.popleft()
            self._busy += 1
            try:
                await self._take_one(signal_id, signal, received_at)
            finally:
                self._busy -= 1
                self._forget([signal_id])

    async def _take_one(self, signal_id: int, signal: Signal, received_at: float) -> None:
        """Process one signal (or expire it), retrying after journal errors with backoff."""
        attempt = 0
        while True:
            try:
                age = self._clock() - received_at
                if self._max_age is not None and age > self._max_age:
                    await self._expire(signal_id, signal, age)
                else:
                    await self._process(signal_id, signal)
                return
            except JournalFenced as exc:  # another replica took over: the signal is its to finish
                self._metrics.faults.labels("journal").inc()
                log.warning("replaced as leader while processing; signal left to the new leader",
                            signal=signal.dedup_key, error=str(exc))
                return
            except JournalValueError:  # the same value fails again: left pending, as a bug
                self._failed.add(signal_id)
                self._metrics.faults.labels("journal").inc()
                log.exception("a value of this signal's decision cannot be journaled; left pending",
                              signal=signal.dedup_key)
                return
            except JournalError as exc:  # the journal went away mid-decision: resumed once it is back
                self._metrics.faults.labels("journal").inc()
                if not self._may_take():
                    log.warning("journal failed mid-decision and this replica may no longer act; signal "
                                "left in the journal", signal=signal.dedup_key, error=str(exc))
                    return
                attempt += 1
                delay = min(JOURNAL_RETRY_MAX_SECONDS, 2.0 ** (attempt - 1))
                log.warning("journal failed mid-decision; retrying", signal=signal.dedup_key, attempt=attempt,
                            retry_in_seconds=delay, error=str(exc))
                await self._sleep(delay)
            except Exception:  # one bad signal must not stop the worker; it stays pending in the journal
                self._failed.add(signal_id)
                self._metrics.faults.labels("executor").inc()
                log.exception("processing failed; signal left pending", signal=signal.dedup_key)
                return

    async def mark_unmatched(self, batch: int = 5_000) -> None:
        """Mark signals that match no policy processed, up to `batch` per transaction, without
        the executor's per-target path."""
        while True:
            await self._until(lambda: bool(self._unmatched) and self._may_take())
            ids = [self._unmatched.popleft() for _ in range(min(batch, len(self._unmatched)))]
            self._busy += 1
            try:
                await self._journal.signals.mark_processed.in_thread(ids)
            except JournalError as exc:  # still pending and still held: retried after a pause
                self._unmatched.extendleft(reversed(ids))
                self._metrics.faults.labels("journal").inc()
                log.warning("could not mark unmatched signals processed; retrying", error=str(exc))
                await asyncio.sleep(1.0)
                continue
            except BaseException:  # cancelled: still held (marking them again later changes nothing)
                self._unmatched.extendleft(reversed(ids))
                raise
            finally:
                self._busy -= 1
            log.info("signals matched no policy", count=len(ids))
            self._forget(ids)

    async def _expire(self, signal_id: int, signal: Signal, age: float) -> None:
        """Journal that a signal is too old to act on: a `blocked` decision per matching policy
        (executed=False: it counts for no cooldown or rate limit), then processed. A decision the
        signal already has is kept: one left `executing` by a crash goes to the executor, which
        finishes its journaled plan (never abandoned half applied)."""
        reason = f"expired: signal is {age:.0f}s old (max {self._max_age:.0f}s); not acted on"
        policies = matching_policies(self._policies(), signal)
        # Decisions a crash left executing, of a policy that matches still or not (renamed since).
        unfinished = bool(await self._journal.decisions.unfinished_for_signal.in_thread(signal_id))
        for policy in policies:
            existing = await self._journal.decisions.for_signal.in_thread(signal_id, policy.name)
            if existing is not None:
                continue
            plan = blocked_plan(policy, signal, GuardDecision(False, reason))
            await self._journal.decisions.record.in_thread(signal_id, policy.name, policy.target.key,
                                                           DecisionState.BLOCKED, reason, plan.as_dict(), False)
            self._metrics.decisions.labels(policy.name, DecisionState.BLOCKED).inc()
        log.warning("signal expired; not acted on", signal=signal.dedup_key, signal_id=signal_id,
                    age_seconds=round(age), max_age_seconds=self._max_age, policies=[p.name for p in policies])
        if unfinished:
            await self._process(signal_id, signal)
        else:
            await self._journal.signals.mark_processed.in_thread([signal_id])

    # ---- waiting ----------------------------------------------------------------------------

    def _idle(self) -> bool:
        return (not self._matching and not self._unmatched and self._busy == 0 and not self._reading
                and not any(self._overflow))

    async def drain(self) -> None:
        """Wait until every signal journaled so far was taken and processed (or failed)."""
        await self._until(self._idle)

    def _wake(self) -> None:
        self._changed.set()

    async def _until(self, ready: Callable[[], bool]) -> None:
        while not ready():
            self._changed.clear()
            await self._changed.wait()
