"""The words of a step row: its phase and its status, as enums whose values are the strings the
journal stores (StrEnum: they compare equal to those strings, so the on-disk format is unchanged)."""
from __future__ import annotations

from enum import StrEnum


class _Stored(StrEnum):
    """A value read back that this release does not name (written by another release) stays as
    stored instead of failing the read: a journal written elsewhere still opens."""

    @classmethod
    def _missing_(cls, value: object) -> _Stored | None:
        if not isinstance(value, str):
            return None
        member = str.__new__(cls, value)
        member._name_, member._value_ = value.upper(), value
        return member


class StepPhase(_Stored):
    """What a step row records of an action (or of the decision's recovery)."""

    PLAN = "plan"  # a step's plan, as older journals may hold it
    INTENT = "intent"  # before each apply call: the attempt and its effect key
    APPLY = "apply"
    VERIFY = "verify"
    REVERT = "revert"
    RECOVERY = "recovery"  # the decision's recovery check: pending, then the verdict (idx -1)


class StepStatus(_Stored):
    """How it went: an action's result (core.outcome.OutcomeStatus values), pending (an intent
    before its result, a recovery check in flight), or a recovery verdict."""

    OK = "ok"
    NOOP = "noop"
    FAILED = "failed"
    SKIPPED = "skipped"  # an action not tried, or a recovery not checked (no check could be made)
    PENDING = "pending"
    RECOVERED = "recovered"
    NOT_RECOVERED = "not_recovered"
    UNKNOWN = "unknown"


UNSETTLED_VERDICTS = (StepStatus.NOT_RECOVERED, StepStatus.UNKNOWN)
"""The verdicts whose follow-up revert may still be owed (a restart resumes them)."""
