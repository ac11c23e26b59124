"""What an operator backend answers: one small record per answer, the same whichever backend (the
daemon's API or the local journal) gave it, and the one error a command ends with."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping


class CommandFailed(Exception):
    """A command ends with one line on stderr and an exit code: 1 when refused or failing (a call
    the daemon answers with an error, a journal that cannot be opened), 2 for bad arguments or
    settings."""

    def __init__(self, line: str, exit_code: int = 1) -> None:
        super().__init__(line)
        self.line = line
        self.exit_code = exit_code


@dataclass(frozen=True)
class Frozen:
    """A freeze just journaled."""

    scope: str  # DAEMON_SCOPE (the whole daemon) or a target key
    reason: str  # as journaled: the operator's words and who froze, "(by alice via api)"
    until: str | None  # ISO 8601; None: until lifted

    @classmethod
    def from_view(cls, view: Mapping[str, Any]) -> Frozen:
        """From a freeze as the API shows it (`freeze_as_dict`)."""
        return cls(scope=view["scope"], reason=view["reason"], until=view.get("until"))


@dataclass(frozen=True)
class Lifted:
    """A freeze just lifted."""

    id: int
    scope: str  # DAEMON_SCOPE or a target key
    reason: str  # the freeze's own reason (why it was frozen)
    decision: int | None  # the decision whose escalation froze it; None: an operator's freeze

    @classmethod
    def from_view(cls, view: Mapping[str, Any]) -> Lifted:
        """From a freeze as the API shows it (`freeze_as_dict`)."""
        return cls(id=view["id"], scope=view["scope"], reason=view["reason"], decision=view.get("decision"))


@dataclass(frozen=True)
class Unpinned:
    """A rollback pin just ended."""

    target: str
    version: int  # the version it was pinned to
    from_version: int | None  # the version it rolled back from, when known
    decision: int | None  # the decision that pinned it; None: pinned by hand or imported


@dataclass(frozen=True)
class BadVersion:
    """A version of a target marked bad (rolled back from), which `to: previous` skips."""

    target: str
    version: int
    reason: str
    decision: int | None
    at: float  # unix seconds, as journaled


@dataclass(frozen=True)
class Cleared:
    """A bad-version mark just cleared."""

    target: str
    version: int


@dataclass(frozen=True)
class Marked:
    """A version just marked bad by an operator."""

    target: str
    version: int
    reason: str  # as journaled: the operator's words and who marked, "(by alice via api)"


@dataclass(frozen=True)
class Approved:
    """An approval taken: the daemon's one-line answer (the plan runs in the background)."""

    message: str


@dataclass(frozen=True)
class Status:
    """The leader's status document (`GET /api/v1/status`), as `render_table` reads it."""

    document: Mapping[str, Any]
