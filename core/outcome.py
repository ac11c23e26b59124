"""Outcome: the value every step of every action returns; exceptions stop at the executor."""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Mapping


class OutcomeStatus(str, Enum):
    OK = "ok"  # the change was made (or confirmed)
    NOOP = "noop"  # nothing to do: the world is already as wanted
    FAILED = "failed"  # tried and did not work
    SKIPPED = "skipped"  # not tried: a guard, dry run or missing data said no


@dataclass(frozen=True)
class Outcome:
    status: OutcomeStatus
    message: str = ""
    retryable: bool = False
    data: Mapping[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status in (OutcomeStatus.OK, OutcomeStatus.NOOP)

    @classmethod
    def success(cls, message: str = "", **data: Any) -> "Outcome":
        return cls(OutcomeStatus.OK, message, data=data)

    @classmethod
    def noop(cls, message: str = "", **data: Any) -> "Outcome":
        return cls(OutcomeStatus.NOOP, message, data=data)

    @classmethod
    def failure(cls, message: str, *, retryable: bool = False, **data: Any) -> "Outcome":
        return cls(OutcomeStatus.FAILED, message, retryable=retryable, data=data)

    @classmethod
    def skipped(cls, message: str, **data: Any) -> "Outcome":
        return cls(OutcomeStatus.SKIPPED, message, data=data)


class ActionError(Exception):
    """A failure an action reports on purpose; `retryable` says whether trying again may help."""

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable


class PermanentError(ActionError):
    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=False)


class Declined(PermanentError):
    """The action declines this signal by a rule the policy set (triton.rollback's
    `requireAttribution`: the anomaly is not on the newest version): nothing is wrong, so the
    decision is blocked with the reason, not failed (no failure event, metric or announcement)."""


class TemporaryError(ActionError):
    def __init__(self, message: str, delay_seconds: float = 1.0) -> None:
        super().__init__(message, retryable=True)
        self.delay_seconds = delay_seconds
