"""`tailguard simulate`: what the daemon would do with an Alertmanager payload right now.

Each matching policy is decided by the daemon's own ladder (`daemon.workers.decide`, preview mode:
guards and pending approvals read from the journal if one exists, nothing committed; targets
observed read-only; plans computed); nothing is journaled and nothing is applied. A plan of a shadow trigger (`shadow:
true`, daemon.workers.shadow) is shown as the live daemon would journal it: `would act (shadow)`,
never executed, never counted as acting. An alert on a policy with a rollback-class action is ruled by
the governed alert rule as live (`policies.governance.rule`, through the same ladder): `would only
notify` unless it is the liveness backstop."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from actions.base import Action
from core.signal import Signal
from daemon.common.config import Settings
from daemon.common.metrics import Metrics
from daemon.http.intake import alert_signals, parse_payload
from daemon.storage.journal import Journal
from daemon.wiring.parts import build_parts
from daemon.workers.shadow import shadow_origin, shadow_row
from daemon.workers.verdicts import Blocked, DryRun, Execute, NeedsApproval, NoOp, Unplanned, Verdict
from detectors.base import Detector
from policies.loader import LoadedPolicy, load_policies

ACTS = "act"
"""The outcome of a plan the daemon would apply now (a live trigger's; the only one `executed`)."""


def outcome(verdict: Verdict) -> str:
    """What the daemon would do, one word: act, approval, dry_run, notify (a governed alert that only
    notifies: `policies.governance`), blocked, noop or fail."""
    if isinstance(verdict, Blocked):
        return "notify" if verdict.notify_only else "blocked"
    if isinstance(verdict, Unplanned):
        return "fail"
    if isinstance(verdict, NoOp):
        return "noop"
    if isinstance(verdict, DryRun):
        return "dry_run"
    if isinstance(verdict, NeedsApproval):
        return "approval"
    assert isinstance(verdict, Execute)
    return ACTS


_SAYS = {ACTS: "would act", "approval": "would ask for approval", "dry_run": "would only plan (dryRun)",
         "notify": "would only notify (governed alert)", "blocked": "would be blocked", "noop": "nothing to do", "fail": "would fail"}


def describe(policy: LoadedPolicy, verdict: Verdict, signal: Signal) -> dict[str, Any]:
    """The verdict's plan as JSON with what would happen: `outcome` (one line: `would act`, `would act
    (shadow)` ...), `executed` (whether the daemon would journal it executed: applied, counted for
    cooldown and rate limit; never for a shadow trigger) and `shadow` (the trigger and what it would
    do, as the live daemon journals it: `daemon.workers.shadow.shadow_row`; or None)."""
    would = outcome(verdict)
    plan = verdict.plan
    origin = shadow_origin(policy, signal)
    if origin is None:
        return {**plan.as_dict(), "outcome": _SAYS[would], "executed": would == ACTS, "shadow": None}
    return {**plan.as_dict(), "outcome": f"{_SAYS[would]} (shadow)", "executed": False,
            "shadow": {**origin.as_dict(), "would": shadow_row(verdict, origin).would}}


def summary(results: list[dict[str, Any]]) -> str:
    """One line counting the plans: how many would act (live), how many only a shadow trigger
    would act on, and the rest."""
    plans = [p for r in results for p in r["plans"]]
    acting = sum(1 for p in plans if p["executed"])
    shadow = sum(1 for p in plans if p["shadow"] is not None)
    return (f"{len(results)} signal(s), {len(plans)} plan(s): {acting} would act, "
            f"{shadow} shadow (never applied), {len(plans) - acting - shadow} would not act")


async def simulate(settings: Settings, payload_path: Path, actions: Mapping[str, type[Action]],
                   detectors: Mapping[str, type[Detector]]) -> list[dict[str, Any]]:
    """Plans per alert in the payload, as JSON-able dicts (each plan with its `outcome`, `executed`
    and `shadow`: `describe`).

    Raises:
        PolicyLoadError, PayloadError, ValueError: bad policies or payload (nothing is touched).
    """
    policies = load_policies(settings.policies.path, actions, detectors)
    signals = alert_signals(parse_payload(json.loads(payload_path.read_text(encoding="utf-8"))))
    journal_path = settings.journal.path
    # An existing journal gives real cooldown history; none means a first action would be allowed.
    journal = Journal(journal_path if journal_path.exists() else ":memory:")
    parts = build_parts(settings, actions, journal, Metrics(), policies=policies)
    try:
        await parts.connect(events_as=None, http=False)
        out = []
        for signal in signals:
            verdicts = await parts.executor.preview(signal)
            out.append({"signal": signal.summary(),
                         "plans": [describe(policy, verdict, signal) for policy, verdict in verdicts]})
        return out
    finally:
        await parts.close()
