"""The operator backend: what the operator verbs ask of the daemon's state, answered either by the
running daemon's API (`api_backend`) or by the journal on the pod itself (`journal_backend`).

Targets are passed as the operator wrote them (`ranker`, `serving/ranker`); each backend resolves
them as it always has (the API checks them, the journal takes a bare model as `default/model`). A
refusal raises CommandFailed with the line to print and the exit code."""
from __future__ import annotations

from typing import Protocol, Sequence

from daemon.wiring.cli.records import Approved, BadVersion, Cleared, Frozen, Lifted, Marked, Status, Unpinned


class OperatorBackend(Protocol):
    """The operator calls, one per verb (and three for bad versions: list, mark and clear)."""

    def freeze(self, target: str | None, reason: str, seconds: float | None) -> Frozen:
        """Freeze `target` (None: the whole daemon) for `seconds` (None: until lifted)."""
        ...

    def unfreeze(self, target: str | None, reason: str) -> Sequence[Lifted]:
        """Lift the freezes in force on `target` (None: the whole daemon); the ones lifted (at least one)."""
        ...

    def unpin(self, target: str, reason: str) -> Unpinned:
        """End the rollback pin of `target`."""
        ...

    def bad_versions(self, target: str) -> Sequence[BadVersion]:
        """The versions of `target` marked bad and not cleared, oldest first."""
        ...

    def mark_bad_version(self, target: str, version: int, reason: str) -> Marked:
        """Mark `version` of `target` bad (refused when it already is)."""
        ...

    def clear_bad_version(self, target: str, version: int, reason: str) -> Cleared:
        """Clear the mark on `version` of `target`."""
        ...

    def status(self) -> Status:
        """The leader's status document."""
        ...

    def approve(self, approval: int, reason: str) -> Approved:
        """Approve the plan waiting as `approval`."""
        ...
