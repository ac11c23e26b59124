"""Compare-and-swap of one value in one object: the single write loop of every action that writes.

read -> compare what is there with what was expected -> write guarded by the read's version token
(JSON-patch `test` ops on resourceVersion and the old value, or If-Match) -> on a conflict re-read
and decide again. The decisions are pure (`decide`, `backoff_seconds`):

- the value is already as wanted: noop (someone, or our own earlier try, got there first; a write
  of ours carries the step's effect key, so the noop says when the value is our own landed write);
- the value is neither expected nor wanted: someone else changed it: refused, never overwritten
  (re-planning would make the journaled `before` untrue and revert would restore the wrong thing);
- the value is as expected: write it; except on apply when the object carries this step's own
  stamp: our write had landed and someone changed the value back (a resumed decision, or an
  executor retry after a lost answer, would otherwise fight them): refused, not retryable.

Before any write (and before refusing a changed value) the object as read is checked for an owner
that is not us (`Swap.refusal`: Flagger, Argo Rollouts, a GitOps controller; actions/_ownership.py):
such an object is refused, not retryable, whatever its value. The guarded write makes the check hold
at the moment of the write: an owner added since the reading changed the object's version.

Who owns retries (also in docs/design-notes.md):

- Conflicts (`Conflict`: a 409, a failed `test` op answered 422, an HTTP 412) are retried here and
  only here, at most `max_retries` times after the first write, with one backoff policy. When they
  are exhausted the Outcome is a failure that is NOT retryable: the executor retrying the whole
  apply would multiply the writes under the target lock (MAX_APPLY_ATTEMPTS x (retries + 1)).
- Transient failures (5xx, 429, network: a retryable ActionError) are never retried here: they end
  the loop as a retryable Outcome, and only the executor retries them.
- Permanent failures (403, 404, invalid) end the loop as a non-retryable Outcome.
"""
from __future__ import annotations

import asyncio
import enum
from typing import Any, Mapping, Protocol, TypeVar

from core.outcome import ActionError, Outcome

# Before conflict retry n (1, 2, ...): 0.05 s, 0.1 s, 0.2 s ... at most 1 s; a conflict clears
# as soon as we re-read, the pause only spreads out writers racing for the same object.
BACKOFF_BASE_SECONDS = 0.05
BACKOFF_MAX_SECONDS = 1.0

R = TypeVar("R")  # one read of the object: the value with its version token and location
T = TypeVar("T")  # the value swapped: route weights, a timeout


class Conflict(Exception):
    """The precondition of a write did not hold (409, failed `test` op, 412): re-read and decide again."""


class Decision(enum.Enum):
    WRITE = "write"
    NOOP = "noop"
    REFUSE = "refuse"


def decide(found: T, expected: T, wanted: T) -> Decision:
    """What to do with the value `found`, given the `expected` one we planned from and the `wanted` one."""
    if found == wanted:
        return Decision.NOOP
    if found != expected:
        return Decision.REFUSE
    return Decision.WRITE


def backoff_seconds(retry: int) -> float:
    """The pause before conflict retry number `retry` (1 for the first retry)."""
    return float(min(BACKOFF_MAX_SECONDS, BACKOFF_BASE_SECONDS * 2 ** (retry - 1)))


class Swap(Protocol[R, T]):
    """One value in one object, as compare_and_swap reads, compares and writes it."""

    @property
    def what(self) -> str:
        """The value in a word ("weights", "timeout"): in messages, and its key in the journal data."""

    async def read(self) -> R:
        """A fresh read. Raises ActionError."""

    def value(self, reading: R) -> T:
        """The swapped value as read (compared with ==)."""

    def where(self, reading: R) -> str:
        """Where the value lives, in words."""

    def show(self, value: T) -> str:
        """A value in words."""

    def ours(self, reading: R) -> bool:
        """Whether the object as read was last written by this very step (its effect key)."""

    def refusal(self, reading: R) -> str | None:
        """Why the object as read is not ours to write at all (someone else owns it), or None."""

    async def write(self, reading: R, wanted: T) -> Mapping[str, Any]:
        """Store `wanted` if the object is still as `reading`; Conflict if not. Returns journal data.
        The write carries the step's effect key where the object can hold it (see actions/_kube.py)."""


async def compare_and_swap(swap: Swap[R, T], *, expected: T, wanted: T, purpose: str, max_retries: int,
                           seen: R | None = None) -> Outcome:
    """Swap the value from `expected` to `wanted`, re-reading after each conflict (see the module doc).

    Args:
        swap: The value and its object.
        expected: The value the step was planned from; anything else found is someone else's.
        wanted: The value to store.
        purpose: "apply" or "revert", first word of every message.
        max_retries: Conflict retries after the first write (maxConflictRetries).
        seen: A reading to trust for the first try (the one plan saw; the guarded write checks it
            server-side); None reads fresh first.

    Returns:
        OK (written; data: the value, `attempts` and the write's data), NOOP, or FAILED: refused
        (someone else's value or object), conflicts exhausted (not retryable), or an ActionError
        (retryable as it says).
    """
    try:
        return await _swap(swap, expected, wanted, purpose, max_retries, seen)
    except ActionError as exc:
        return Outcome.failure(str(exc), retryable=exc.retryable)


async def _swap(swap: Swap[R, T], expected: T, wanted: T, purpose: str, max_retries: int,
                seen: R | None) -> Outcome:
    label, last = f"{purpose}: {swap.what}", ""
    for attempt in range(1, max_retries + 2):
        if attempt > 1:
            await asyncio.sleep(backoff_seconds(attempt - 1))
        reading = seen if seen is not None else await swap.read()
        seen = None
        found = swap.value(reading)
        label = f"{purpose}: {swap.where(reading)} {swap.what}"
        decision = decide(found, expected, wanted)
        if decision is Decision.NOOP:
            if swap.ours(reading):
                return Outcome.noop(f"{label} already {swap.show(wanted)}: this step's own write had landed",
                                    **{swap.what: wanted, "ours": True})
            return Outcome.noop(f"{label} already {swap.show(wanted)}", **{swap.what: wanted})
        refused = swap.refusal(reading)
        if refused is not None:
            return Outcome.failure(f"{purpose}: {refused}", retryable=False)
        if decision is Decision.WRITE and purpose == "apply" and swap.ours(reading):
            return Outcome.failure(
                f"{label} is {swap.show(found)} again after this step's own write had landed (its stamp "
                f"is on the object): changed back by someone else; not writing it again", found=found)
        if decision is Decision.REFUSE:
            return Outcome.failure(
                f"{label} was changed by someone else (expected {swap.show(expected)}, found "
                f"{swap.show(found)}); not overwriting", expected=expected, found=found)
        try:
            written = await swap.write(reading, wanted)
        except Conflict as exc:
            last = str(exc)
            continue
        return Outcome.success(f"{label} {swap.show(expected)} -> {swap.show(wanted)}",
                               **{swap.what: wanted, "attempts": attempt, **written})
    return Outcome.failure(f"{label}: still conflicting after {max_retries + 1} attempt(s), not retried "
                           f"further: {last}", retryable=False, attempts=max_retries + 1)
