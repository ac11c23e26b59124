"""`tailguard simulate`: what the daemon would do with an Alertmanager payload right now.

Policies are matched, guards read from the journal (if one exists), targets observed read-only and
plans computed; nothing is journaled and nothing is applied. A plan of a shadow trigger (`shadow:
true`, daemon.workers.shadow) is shown as the live daemon would journal it: `would act (shadow)`,
never executed, never counted as acting."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from actions.base import Action
from daemon.common.config import Settings
from daemon.common.metrics import Metrics
from daemon.http.intake import alert_signals, parse_payload
from daemon.storage.journal import Journal
from daemon.wiring.parts import build_parts
from daemon.workers.shadow import shadow_origin
from detectors.base import Detector
from policies.loader import LoadedPolicy, load_policies
from policies.matching import matching_policies
from policies.planning import Plan

ACTS = "act"
"""The outcome of a plan the daemon would apply now (a live trigger's; the only one `executed`)."""


def outcome(policy: LoadedPolicy, plan: Plan) -> str:
    """What the daemon would do with `plan`, one word: act, approval, dry_run, blocked, noop or fail."""
    if plan.blocked is not None:
        if plan.blocked.startswith("planning failed"):
            return "fail"
        return "noop" if plan.steps else "blocked"
    if plan.dry_run:
        return "dry_run"
    return "approval" if policy.spec.approval == "required" else ACTS


_SAYS = {ACTS: "would act", "approval": "would ask for approval", "dry_run": "would only plan (dryRun)",
         "blocked": "would be blocked", "noop": "nothing to do", "fail": "would fail"}


def describe(policy: LoadedPolicy, plan: Plan, signal: Any) -> dict[str, Any]:
    """The plan as JSON with what would happen: `outcome` (one line: `would act`, `would act (shadow)`
    ...), `executed` (whether the daemon would journal it executed: applied, counted for cooldown and
    rate limit; never for a shadow trigger) and `shadow` (the trigger and what it would do, or None)."""
    would = outcome(policy, plan)
    origin = shadow_origin(policy, signal)
    if origin is None:
        return {**plan.as_dict(), "outcome": _SAYS[would], "executed": would == ACTS, "shadow": None}
    # The live path journals every shadow plan that is not blocked, noop or failed as would "act"
    # (dryRun and approval included: daemon.workers.executor._run_shadow), applied never.
    shadow_would = would if would in ("blocked", "noop", "fail") else ACTS
    return {**plan.as_dict(), "outcome": f"{_SAYS[would]} (shadow)", "executed": False,
            "shadow": {**origin.as_dict(), "would": shadow_would}}


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
            by_name = {p.name: p for p in matching_policies(policies.policies, signal)}
            plans = await parts.executor.preview(signal)
            out.append({"signal": signal.summary(),
                         "plans": [describe(by_name[p.policy], p, signal) for p in plans]})
        return out
    finally:
        await parts.close()
