"""One simulated deploy through the live code: the cumulative counters a poll cycle would read,
the live detector's `detect_many` on them, and an alert's ruling as the live EvidenceReader makes
it (the evidence gate, `policies.gate.gate_verdict`, or the governed rule, `policies.governance`).

A row's time is seconds from the deploy (v2's first request); column c of its per-second arrays
spans c - pre .. c - pre + 1. v1 serves before the deploy and is unloaded at it (its series ends
there); v2 serves from it. A poll at time t reads every sample on the interval's grid up to t.
"""
from __future__ import annotations

import importlib
import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
from numpy.typing import NDArray

from core.detection import BudgetEvidence, Detection
from core.query import Series
from detectors.tail_excess import TailExcessDetector
from evaluation.operating_curve.policy_models import PolicyModel
from policies.gate import gate_verdict

UNIX0 = 1.7e9  # the deploy's unix time: the live code reads unix seconds
RULINGS = ("gate", "governed", "live")


@dataclass(frozen=True)
class Row:
    """One deploy's per-second counts of the model's requests, [N] each (column 0 at -pre s)."""

    pre: int
    requests: NDArray[np.float64]
    slow: NDArray[np.float64]  # requests above the line
    latency: NDArray[np.float64] | None  # summed latency, in the counter's unit (counters only)

    def cumulative(self) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64] | None]:
        zero = np.zeros(1)
        lat = None if self.latency is None else np.concatenate([zero, np.cumsum(self.latency)])
        return np.concatenate([zero, np.cumsum(self.requests)]), np.concatenate([zero, np.cumsum(self.slow)]), lat


class LiveRow:
    """The live detector over one row, polled at chosen times (each poll reads the history it
    would have: the detector's lookback, from `history_from` on)."""

    def __init__(self, model: PolicyModel, row: Row, history_from: float) -> None:
        self.model = model
        self.row = row
        self.history_from = history_from
        self.detector = TailExcessDetector(model.params)
        self._req, self._slow, self._lat = row.cumulative()
        self.calls = 0

    def _at(self, cum: NDArray[np.float64], t: NDArray[np.float64]) -> NDArray[np.float64]:
        """A cumulative count at times t (whole seconds from the deploy)."""
        return cum[np.clip(np.rint(t).astype(np.int64) + self.row.pre, 0, cum.size - 1)]

    def series(self, now: float, span: float) -> tuple[list[Series], list[Series]]:
        """The primary and companion series a poll at `now` fetches over `span` seconds."""
        m, step = self.model, self.model.interval
        first = max(self.history_from, now - span, -float(self.row.pre))
        grid = np.arange(math.ceil(first / step) * step, now + 1e-9, step)
        primaries: list[Series] = []
        companions: list[Series] = []
        for version, keep in (("1", grid <= 0.0), ("2", grid >= 0.0)):
            t = grid[keep]
            if t.size == 0:
                continue
            base = 0.0 if version == "1" else None
            req, slow = self._at(self._req, t), self._at(self._slow, t)
            lat = self._at(self._lat, t) if self._lat is not None else None
            if base is None:  # v2 counts from the deploy
                d0 = float(self._req[self.row.pre]), float(self._slow[self.row.pre])
                req, slow = req - d0[0], slow - d0[1]
                if lat is not None:
                    lat = lat - float(self._lat[self.row.pre])  # type: ignore[index]
            labels = {m.detector.trigger.model_label if m.detector else "model": "ranker", m.version_label: version}
            if m.params.evidence == "histogram":
                primary = Series({**labels, "le": f"{m.params.line:g}"}, (t + UNIX0).tolist(), (req - slow).tolist())
            else:
                assert lat is not None
                primary = Series(labels, (t + UNIX0).tolist(), lat.tolist())
            primaries.append(primary)
            companions.append(Series(labels, (t + UNIX0).tolist(), req.tolist()))
        return primaries, companions

    def poll(self, now: float) -> tuple[list[Series], list[Detection]]:
        """The live detector's verdicts at `now` on what it would fetch (its lookback)."""
        span = self.detector.lookback_seconds + 2 * self.model.interval
        primaries, companions = self.series(now, span)
        self.calls += 1
        return primaries, self.detector.detect_many(primaries, now + UNIX0, list(companions))

    def fired(self, now: float) -> bool:
        """Whether v2 fires at `now` (the action requires attribution: the served version)."""
        primaries, found = self.poll(now)
        return any(d.fired and s.labels.get(self.model.version_label) == "2" for s, d in zip(primaries, found))

    def budgets(self, now: float) -> list[tuple[Mapping[str, str], BudgetEvidence]]:
        """What the poller's Latest hands a gate after a cycle at `now`."""
        primaries, found = self.poll(now)
        return [(s.labels, d.budget) for s, d in zip(primaries, found) if d.budget is not None]


def start_fire(model: PolicyModel, row: Row, history_from: float = -math.inf) -> tuple[float, dict[str, float]]:
    """When v2's start test fires (inf: not within its horizon), and the start the live detector
    recorded (to hand to other instances, as the journal does). The detector polls before the
    deploy (it has seen v1 serve), finds v2's start at its first samples, and is asked once at the
    horizon's end: a start test that crossed says when (`fired_at`), as it does every cycle after."""
    live = LiveRow(model, row, history_from)
    rule = model.params.start_rule() if hasattr(model.params, "start_rule") else None
    if rule is None:  # no start test (off, or a detector that has none)
        return math.inf, {}
    step = model.interval
    live.poll(-step)
    live.poll(2 * step)
    starts = dict(live.detector.take_new_starts())
    if "2" not in starts:
        return math.inf, starts
    end = starts["2"] - UNIX0 + rule.settle_seconds + rule.horizon_seconds + 2 * step
    if end > row.requests.size - row.pre - 1:
        end = float(row.requests.size - row.pre - 1)
    primaries, found = live.poll(math.floor(end / step) * step)
    for s, d in zip(primaries, found):
        test = d.details.get("start_test") if s.labels.get(model.version_label) == "2" else None
        if isinstance(test, Mapping) and test.get("status") == "fired" and "fired_at" in test:
            return float(test["fired_at"]) - UNIX0, starts
    return math.inf, starts


def live_ruling() -> str:
    """What the checkout's EvidenceReader applies to an alert: the governed rule or the gate."""
    from daemon.workers.evidence import EvidenceReader

    return "governed" if hasattr(EvidenceReader, "governance") else "gate"


def alert_acts(mode: str, model: PolicyModel, alert_index: int, live: LiveRow, now: float,
               started_at: float, first_cycle: float) -> tuple[bool, str]:
    """Whether an alert webhook arriving at `now` starts the rollback, and why, as the live
    EvidenceReader rules it on the detector's last cycle (at or before `now`, none before
    `first_cycle`, the first cycle after the daemon started at `started_at`)."""
    if mode == "live":
        mode = live_ruling()
    step = model.interval
    at = math.floor(now / step) * step
    has_cycle = at >= first_cycle
    alert = model.policy.spec.triggers[alert_index].alert
    assert alert is not None
    if mode == "gate":
        if alert.gate is None:
            return True, "no gate: the alert acts"
        budgets = live.budgets(at) if has_cycle else None
        verdict = gate_verdict(budgets, at if has_cycle else None, model.params.max_staleness_seconds, now,
                               alert.gate.error, model.version_label)
        return not verdict.veto, verdict.reason
    if mode != "governed":
        raise ValueError(f"unknown ruling {mode!r}: one of {', '.join(RULINGS)}")
    gov: Any = importlib.import_module("policies.governance")
    governance = gov.alert_governance(model.policy, alert_index)
    gate = None
    if governance.standing is gov.Standing.UNGOVERNED and alert.gate is not None:
        budgets = live.budgets(at) if has_cycle else None
        gate = gate_verdict(budgets, at if has_cycle else None, model.params.max_staleness_seconds, now,
                            alert.gate.error, model.version_label)
    # The poller marks a cycle fresh when its answer holds a point within the staleness horizon:
    # every cycle of a simulated deploy does (v2 serves throughout).
    fresh_at = at + UNIX0 if has_cycle else None
    ruling = gov.rule(governance, fresh_at, started_at + UNIX0, now + UNIX0, gate)
    return bool(ruling.acts), str(ruling.reason)
