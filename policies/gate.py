"""The former evidence gate on an alert trigger: a pure verdict from the latest detections of the
gating detector on the alert's target. It weighs only on an alert trigger that `actsUngoverned`
(`policies.governance.rule` takes its verdict); a governed alert acts only as the liveness backstop
(docs/detectors.md, "The alert backstop")."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from core.detection import BudgetEvidence
from detectors.sequential.acceptance import accept_null, shown_above


@dataclass(frozen=True)
class GateVerdict:
    veto: bool
    reason: str


def gate_verdict(budgets: Sequence[tuple[Mapping[str, str], BudgetEvidence]] | None, at: float | None,
                 stale_after: float, now: float, error: float, version_label: str = "version") -> GateVerdict:
    """Veto when every series of the target with evidence is shown within its budget at `error`,
    or when two or more versions are each shown above it (a shared slowdown: rolling one back
    is no remedy, and the canary would be rolled back for a cause it shares with its stable); act
    when any is not shown within it otherwise, or when there is no fresh evidence to weigh.

    `stale_after` is the detector's own staleness horizon (the age of data it still judges on):
    evidence that old says the detector stopped evaluating. A few intervals would be too tight:
    a slow cycle on a loaded node is no outage, and the evidence spans minutes of the lookback."""
    if budgets is None or at is None:
        return GateVerdict(False, "gate: the detector has not evaluated the target yet; the alert acts")
    if now - at > stale_after:
        return GateVerdict(False, f"gate: the detector's evidence is {now - at:.0f} s old (older than its "
                           f"{stale_after:g} s horizon); the alert acts")
    if not budgets:
        return GateVerdict(False, "gate: no series of the target with evidence to weigh; the alert acts")
    above: dict[str, list[float]] = {}
    for labels, budget in budgets:
        version = labels.get(version_label)
        if version is not None and budget.allowed is not None:
            sums = above.setdefault(version, [0.0, 0.0, budget.allowed])
            sums[0] += budget.above
            sums[1] += budget.requests
    slow = sorted(v for v, (units, requests, allowed) in above.items() if shown_above(units, requests, allowed))
    if len(slow) >= 2:
        shares = "; ".join(f"{v}: {above[v][0]:.1f} above the line in {above[v][1]:.0f} requests "
                           f"({above[v][0] / above[v][1]:.3%})" for v in slow)
        return GateVerdict(True, f"gate: shared slowdown: versions {', '.join(slow)} are each above budget at once "
                           f"({shares}), so it is not one version's defect; the alert is not acted on")
    shown: list[str] = []
    not_shown: list[str] = []
    for labels, budget in budgets:
        name = labels.get(version_label) or ",".join(f"{k}={v}" for k, v in sorted(labels.items())
                                                     if k != "__name__") or "the series"
        verdict = accept_null(budget.above, budget.requests, budget.null, budget.alternative, error)
        (shown if verdict.accepted else not_shown).append(f"{name}: {verdict.describe()}")
    if not_shown:
        return GateVerdict(False, "gate: not every version is shown within budget (" + "; ".join(not_shown)
                           + "); the alert acts")
    return GateVerdict(True, f"gate: every version shown within budget at error {error:g} ("
                       + "; ".join(shown) + "); the alert is not acted on")
