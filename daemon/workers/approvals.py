"""Approvals: plans of policies with `approval: required` wait for an operator until a deadline.

The executor journals such a plan (decision `blocked`, "awaiting approval N") and announces it; an
operator approves it with `tailguard approve N` or `POST /api/v1/approvals/N/approve` (a token with
the `write` scope); `ApprovalExpiry` expires the ones whose deadline passed and announces that.
The notification carries the command and the call, never a link that approves by itself.
"""
from __future__ import annotations

import asyncio
import time
from datetime import datetime, timezone
from typing import Any, Callable, Mapping

import structlog

from daemon.common.metrics import Metrics
from daemon.storage.journal import Approval, AsyncJournal, JournalError

log = structlog.get_logger("tailguard.approvals")

Notify = Callable[[Mapping[str, Any]], None]


def _iso(unix: float) -> str:
    return datetime.fromtimestamp(unix, timezone.utc).isoformat(timespec="seconds")


def approval_instructions(approval_id: int, base_url: str) -> dict[str, str]:
    """How an operator approves: the CLI command and the authenticated API call (no link that acts)."""
    url = base_url.rstrip("/")
    return {
        "command": f"tailguard approve {approval_id} --url {url} --reason '...'",
        "call": (f"curl -X POST -H 'Authorization: Bearer <a token with the write scope>' "
                 f"-d '{{\"reason\": \"...\"}}' {url}/api/v1/approvals/{approval_id}/approve"),
    }


def approval_event(event: str, approval: Approval, base_url: str, message: str, **extra: Any) -> dict[str, Any]:
    """An approval notification: what waits (or waited), until when, and how to approve it."""
    return {"event": event, "policy": approval.policy, "target": approval.target, "message": message,
            "decision": approval.decision_id, "approval": approval.id, "deadline": _iso(approval.deadline),
            "at": _iso(time.time()), **approval_instructions(approval.id, base_url), **extra}


def approval_view(approval: Approval, now: float) -> dict[str, Any]:
    """An approval as the API and `tailguard status` show it."""
    return {"id": approval.id, "decision": approval.decision_id, "policy": approval.policy,
            "target": approval.target, "status": approval.status, "requestedAt": _iso(approval.requested_at),
            "deadline": _iso(approval.deadline), "secondsLeft": max(0.0, round(approval.deadline - now, 1))
            if approval.status == "pending" else None,
            "decidedAt": _iso(approval.decided_at) if approval.decided_at else None,
            "decidedBy": approval.decided_by, "reason": approval.reason}


class ApprovalExpiry:
    """Expires pending approvals at their deadline (journaled, announced), on the replica that may act.

    Args:
        journal: Where approvals are.
        notify: Sends an outcome event; never blocks.
        base_url: Named in the notification's command and call.
        may_act: Only the leader expires (its journal holds the approvals).
        interval_seconds: Longest wait between checks (a new approval's deadline is never sooner).
    """

    def __init__(self, journal: AsyncJournal, notify: Notify, metrics: Metrics, base_url: str,
                 may_act: Callable[[], bool], clock: Callable[[], float] = time.time,
                 interval_seconds: float = 1.0) -> None:
        self._journal = journal
        self._notify = notify
        self._metrics = metrics
        self.base_url = base_url
        self._may_act = may_act
        self._clock = clock
        self.interval_seconds = interval_seconds

    async def expire_due(self) -> list[Approval]:
        """Expire what is due now; each one announced as `approval_expired`."""
        expired = await self._journal.expire_approvals(self._clock())
        for approval in expired:
            log.info("approval expired", approval=approval.id, decision=approval.decision_id,
                     policy=approval.policy, target=approval.target)
            self._notify(approval_event(
                "approval_expired", approval, self.base_url,
                f"approval {approval.id} expired at {_iso(approval.deadline)}; the plan was not applied"))
        return expired

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            if self._may_act():
                try:
                    await self.expire_due()
                except JournalError as exc:  # tried again next interval
                    self._metrics.faults.labels("journal").inc()
                    log.warning("could not expire approvals", error=str(exc))
            try:
                await asyncio.wait_for(stop.wait(), timeout=self.interval_seconds)
            except asyncio.TimeoutError:
                pass
