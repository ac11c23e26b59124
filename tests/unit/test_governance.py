"""The governed alert (policies/governance.py): an alert trigger on a policy with a rollback-class
action starts the rollback only as the liveness backstop; while the detector sees the target it
notifies. The rule's truth table, each trigger's standing when the policy loads, and the ladder with
the live evidence reader (`EvidenceReader.governance`) over a fake poller."""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest

from core.signal import Signal, SignalSource
from daemon.common.metrics import Metrics
from daemon.wiring.registries import action_registry, detector_registry
from daemon.workers.evidence import EvidenceReader
from daemon.workers.poller import Latest
from policies.governance import Ruling, Standing, alert_governance, matched_alert, policy_warnings, rule
from policies.loader import LoadedPolicy, PolicyLoadError, load_policies_text

START = 1_000_000.0
BACKSTOP = 300.0

DETECTOR = """  - detector: {type: tail_excess, query: lat, companionQuery: req, params: {line: 500000}}
"""
POLICY = """
name: p
target: {{model: ranker, triton: {{endpoints: ["http://127.0.0.1:9"]}}}}
triggers:
{triggers}actions:
  - {action}
verify: {{query: up, below: 1}}
"""
ROLLBACK = "{type: triton.rollback, to: previous}"
NOTIFY = "{type: notify, url: 'http://127.0.0.1:9/hook'}"


def _load(triggers: str, action: str = ROLLBACK) -> LoadedPolicy:
    (policy,) = load_policies_text(POLICY.format(triggers=triggers, action=action), "p.yaml", action_registry(),
                                   detector_registry()).policies
    return policy


def _governed(backstop: float = BACKSTOP) -> Any:
    policy = _load(DETECTOR + f"  - alert: {{name: TritonTailLatencyHigh, backstopAfter: {backstop:g}s}}\n")
    return alert_governance(policy, 1)


# ---- the rule's truth table ---------------------------------------------------------------------

@pytest.mark.parametrize("fresh_at, now, acts, words", [
    # the detector judged fresh data a second ago: its test keeps the promise, the alert notifies
    (START + 3_599.0, START + 3_600.0, False, "judged fresh data of the target 1 s ago"),
    # fresh evidence within backstopAfter (a scrape outage of four minutes is no blind detector)
    (START + 3_360.0, START + 3_600.0, False, "240 s ago"),
    # evidence missing for longer than backstopAfter: the backstop acts
    (START + 3_000.0, START + 3_600.0, True, "no fresh evidence from the governing detector (trigger 0) for 600 s"),
    # a restart's first minutes: the detector has not run yet, which is not missing evidence
    (None, START + 120.0, False, "started 120 s ago"),
    (None, START + BACKSTOP, False, "started 300 s ago"),
    # never evaluated since the start, and the daemon has been up longer than backstopAfter: blind
    (None, START + BACKSTOP + 1.0, True, "in the 301 s since the start"),
    # evidence from before the start (a replay's poller state) does not count as fresh
    (START - 10.0, START + 60.0, False, "started 60 s ago"),
])
def test_the_rule_acts_only_when_the_detector_has_been_blind_past_backstop_after(
        fresh_at: float | None, now: float, acts: bool, words: str):
    ruling = rule(_governed(), fresh_at, START, now)
    assert ruling.acts is acts and ruling.backstop is acts and words in ruling.reason, ruling.reason
    assert ruling.trigger == 1 and ruling.as_note()["trigger"] == 1  # journaled: which alert trigger spoke
    assert ruling.outcome == ("backstop" if acts else "notify")
    assert ruling.reason.startswith("backstop:" if acts else "notify only:")


def test_backstop_after_is_the_alert_trigger_s_own():
    """A longer backstopAfter keeps a ten-minute outage of the detector a notification."""
    assert not rule(_governed(900.0), START + 3_000.0, START, START + 3_600.0).acts
    assert rule(_governed(900.0), START + 2_600.0, START, START + 3_600.0).acts


def test_backstop_after_below_a_minute_fails_to_load():
    with pytest.raises(PolicyLoadError) as caught:
        _governed(30.0)
    assert "backstopAfter must be at least 60s" in str(caught.value)


# ---- standings, fixed when the policy loads ---------------------------------------------------------

def test_an_alert_beside_a_detector_on_a_rollback_is_governed_and_the_policy_keeps_its_promise():
    policy = _load(DETECTOR + "  - alert: {name: TritonTailLatencyHigh, gate: {error: 0.01}}\n")
    governance = alert_governance(policy, 1)
    assert governance.standing is Standing.GOVERNED and governance.detectors == (0,)
    assert governance.backstop_after == 300.0 and policy_warnings(policy) == []


def test_an_alert_with_no_detector_to_govern_it_only_notifies_and_the_policy_warns():
    policy = _load("  - alert: {name: TritonTailLatencyHigh}\n")
    governance = alert_governance(policy, 0)
    assert governance.standing is Standing.NOTIFY_ONLY
    (warning,) = policy_warnings(policy)
    assert "cannot keep the policy's promise" in warning and "actsUngoverned: true" in warning
    ruling = rule(governance, None, START, START + 86_400.0)  # a day up: still only notifies
    assert not ruling.acts and ruling.outcome == "notify" and "no detector trigger" in ruling.reason


def test_a_shadow_detector_governs_nothing():
    policy = _load(DETECTOR + "    shadow: true\n  - alert: {name: TritonTailLatencyHigh}\n")
    assert alert_governance(policy, 1).standing is Standing.NOTIFY_ONLY


def test_opting_out_acts_ungoverned_with_a_warning_and_the_former_gate_still_vetoes():
    from policies.gate import GateVerdict

    policy = _load("  - alert: {name: TritonTailLatencyHigh, actsUngoverned: true}\n")
    governance = alert_governance(policy, 0)
    assert governance.standing is Standing.UNGOVERNED
    (warning,) = policy_warnings(policy)
    assert "acts ungoverned" in warning and "outside the policy's false-alarm rate" in warning
    assert rule(governance, None, START, START + 1.0).acts
    vetoed = rule(governance, None, START, START + 1.0, GateVerdict(True, "gate: every version shown within budget"))
    assert not vetoed.acts and vetoed.outcome == "vetoed" and vetoed.reason.startswith("gate:")


def test_an_alert_on_a_policy_without_a_rollback_class_action_is_free():
    policy = _load("  - alert: {name: TritonTailLatencyHigh}\n", action=NOTIFY)
    governance = alert_governance(policy, 0)
    assert governance.standing is Standing.FREE and policy_warnings(policy) == []
    assert rule(governance, None, START, START).acts


def test_governed_by_names_a_detector_trigger_or_the_policy_fails_to_load():
    value = """  - detector: {type: value_cusum, query: p999}
"""
    policy = _load(value + DETECTOR + "  - alert: {name: TritonTailLatencyHigh, governedBy: 1}\n")
    assert alert_governance(policy, 2).detectors == (1,)
    assert alert_governance(_load(value + DETECTOR + "  - alert: {name: TritonTailLatencyHigh}\n"),
                            2).detectors == (0, 1)
    with pytest.raises(PolicyLoadError) as caught:
        _load(DETECTOR + "  - alert: {name: TritonTailLatencyHigh, governedBy: 1}\n")
    assert "governedBy" in str(caught.value) and "not a detector trigger" in str(caught.value)


def test_an_alert_is_resolved_to_the_trigger_it_matched():
    policy = _load(DETECTOR + "  - alert: {name: Other}\n  - alert: {name: TritonTailLatencyHigh}\n")
    signal = _alert()
    ref = matched_alert(policy, signal)
    assert ref is not None and (ref.kind, ref.index, ref.name) == (SignalSource.ALERT, 2, "TritonTailLatencyHigh")
    assert signal.trigger_ref().index is None  # unresolved until matched: one alert can match several policies
    assert matched_alert(policy, _alert("Unknown")) is None


# ---- the live reader over a fake poller --------------------------------------------------------------

def _alert(name: str = "TritonTailLatencyHigh") -> Signal:
    return Signal(SignalSource.ALERT, name, {"model": "ranker"}, datetime.now(timezone.utc), "k")


def _latest(at: float, fresh_at: float | None) -> Latest:
    return Latest(at, 30.0, (), (), None, fresh_at)


async def _ruling(latest: Latest | None, now: float, metrics: Metrics) -> Ruling | None:
    policy = _load(DETECTOR + "  - alert: {name: TritonTailLatencyHigh, gate: {error: 0.01}}\n")
    clock = [START]
    reader = EvidenceReader(None, None, None, None, metrics, lambda: clock[0],  # type: ignore[arg-type]
                            latest=lambda name, index: latest if (name, index) == ("p", 0) else None)
    clock[0] = now
    return await reader.governance(policy, _alert())


@pytest.mark.parametrize("latest, now, outcome", [
    (_latest(START + 3_599.0, START + 3_599.0), START + 3_600.0, "notify"),
    # the poller still cycles, but on stale points only (the model's series vanished 10 minutes ago)
    (_latest(START + 3_599.0, START + 3_000.0), START + 3_600.0, "backstop"),
    (None, START + 60.0, "notify"),  # just started: the detector has not run yet
    (None, START + 3_600.0, "backstop"),  # an hour up, and the detector never saw the target
])
async def test_the_reader_rules_on_the_poller_s_last_fresh_cycle_and_counts(
        latest: Latest | None, now: float, outcome: str):
    metrics = Metrics()
    ruling = await _ruling(latest, now, metrics)
    assert ruling is not None and ruling.outcome == outcome, ruling
    assert metrics.governed_alerts.labels("p", outcome)._value.get() == 1.0


async def test_a_detector_signal_is_not_ruled():
    policy = _load(DETECTOR + "  - alert: {name: TritonTailLatencyHigh}\n")
    reader = EvidenceReader(None, None, None, None, Metrics(), lambda: START)  # type: ignore[arg-type]
    detector = Signal(SignalSource.DETECTOR, "tail_excess", {"model": "ranker"}, datetime.now(timezone.utc),
                      "detector:p:0:abc", policy="p")
    assert await reader.governance(policy, detector) is None


# ---- where the warning is seen --------------------------------------------------------------------

def test_validate_and_status_show_a_policy_that_cannot_keep_its_promise(tmp_path, capsys):
    from daemon.http.status import StatusInputs, build_status, render_table
    from daemon.wiring.cli import main
    from daemon.workers.freezes import FreezeView
    from policies.loader import PolicySet

    (tmp_path / "p.yaml").write_text(POLICY.format(triggers="  - alert: {name: TritonTailLatencyHigh}\n",
                                                   action=ROLLBACK))
    assert main(["validate", str(tmp_path / "p.yaml")]) == 0  # it loads: its alert only notifies
    out = capsys.readouterr().out
    assert "warning: p: alert trigger 0 cannot keep the policy's promise" in out, out
    policy = _load("  - alert: {name: TritonTailLatencyHigh}\n")
    doc = build_status(StatusInputs(now=1000.0, replica="r", leader=True, acting=True, policies=PolicySet((policy,)),
                                    policies_loaded=True, last_reload_at=None, last_reload_error=None,
                                    freezes=FreezeView(config=False)))
    (item,) = doc["policies"]["items"]
    assert item["warnings"] == policy_warnings(policy) and len(item["warnings"]) == 1
    assert "warning: p: alert trigger 0 cannot keep the policy's promise" in render_table(doc)


# ---- backtest and simulate rule the same way ---------------------------------------------------------

class _ReplayedPoller:
    """What the backtest's ruling reads of its poller: each watch's last replayed cycle."""

    def __init__(self, latest: dict[tuple[str, int], Latest]) -> None:
        self._latest = latest
        self.groups: dict[Any, Any] = {}

    def latest(self, policy: str, index: int) -> Latest | None:
        return self._latest.get((policy, index))


def test_backtest_rules_with_the_same_function_and_after_the_guards():
    """The replay's start is the daemon's; a notify-only ruling is said after the guards, as the
    ladder does (a cooldown the detector's own rollback started reads as the cooldown)."""
    from daemon.wiring.backtest import _rulings
    from daemon.workers.replay import ReplayGuards
    from policies.loader import PolicySet

    policy = _load(DETECTOR + "  - alert: {name: TritonTailLatencyHigh}\n")
    policies = PolicySet((policy,))
    seeing = _ReplayedPoller({("p", 0): _latest(START + 600.0, START + 600.0)})
    (ruling,) = _rulings(policies, seeing, _alert(), START + 601.0, START).values()  # type: ignore[arg-type]
    assert ruling == rule(alert_governance(policy, 1), START + 600.0, START, START + 601.0) and not ruling.acts
    early = _rulings(policies, _ReplayedPoller({}), _alert(), START + 60.0, START)["p"]  # type: ignore[arg-type]
    assert not early.acts and "started 60 s ago" in early.reason
    blind = _rulings(policies, _ReplayedPoller({}), _alert(), START + 900.0, START)["p"]  # type: ignore[arg-type]
    assert blind.acts and blind.backstop

    guards = ReplayGuards()
    notified = guards.decide(policy, _alert(), START + 601.0, ruling.reason)
    assert (notified.outcome, notified.reason) == ("blocked", ruling.reason) and not guards.acted
    acted = guards.decide(policy, _alert(), START + 900.0, None)  # the backstop: the guards pass, it acts
    assert acted.outcome == "act"
    again = guards.decide(policy, _alert(), START + 960.0, ruling.reason)
    assert again.outcome == "blocked" and again.reason.startswith("cooldown")


def test_simulate_says_a_notify_only_verdict_in_its_own_words():
    from daemon.wiring.simulate import describe, outcome
    from daemon.workers.verdicts import Blocked
    from policies.guards import GuardDecision
    from policies.planning import blocked_plan

    policy = _load(DETECTOR + "  - alert: {name: TritonTailLatencyHigh}\n")
    reason = "notify only: started 0 s ago"
    verdict = Blocked(blocked_plan(policy, _alert(), GuardDecision(False, reason)), reason, notify_only=True)
    assert outcome(verdict) == "notify"
    shown = describe(policy, verdict, _alert())
    assert shown["outcome"] == "would only notify (governed alert)" and not shown["executed"]
    assert shown["blocked"] == reason
