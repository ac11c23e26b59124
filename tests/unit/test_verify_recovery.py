"""The verify block: schema and defaults, the check a decision gets (its own block, or the detector's
line), the watch that samples it to a verdict, `tailguard validate` warnings and `tailguard unfreeze`."""
from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from core.detection import RecoveryLine, Side
from core.query import QueryResult, Sample, Series
from core.signal import Signal, SignalSource, UnsidedLine
from daemon.sources.prometheus import RangeResult
from daemon.storage.journal import Journal
from daemon.wiring.cli import main
from daemon.wiring.registries import action_registry, detector_registry
from daemon.workers.verifier import missed_samples, watch_recovery
from policies.json_schema import policy_json_schema
from policies.loader import LoadedPolicy, PolicyLoadError, load_policies_text
from policies.planning import RecoveryCheck, recovery_check, recovery_warning
from policies.recovery import Recovery, RecoveryCondition
from policies.schema import VerifySpec

P999 = 'max by (model) (nv_inference_request_summary_us{model="$model", quantile="0.999"})'


def _policy(model: str = "ranker", verify: str = "", detector: bool = False, alert: bool = True,
            detector_type: str = "tail_anomaly", params: str = "{min_absolute_increase: 100000}",
            dry_run: bool = False, shadow: bool = False) -> LoadedPolicy:
    lines = ["name: ranker-tail", f"target: {{model: '{model}'}}", "triggers:"]
    if detector:
        lines += [f"  - detector: {{type: {detector_type}, query: '{P999}', interval: 5s, params: {params}}}"]
    if alert:
        lines += [f"  - {{alert: {{name: TritonTailLatencyHigh}}, shadow: {str(shadow).lower()}}}"]
    lines += ["actions:", "  - {type: notify, url: 'http://127.0.0.1:1/hook'}"]
    if dry_run:
        lines += ["guards: {dryRun: true}"]
    if verify:
        lines += [f"verify: {verify}"]
    (policy,) = load_policies_text("\n".join(lines) + "\n", "test.yaml", action_registry(),
                                   detector_registry()).policies
    return policy


def _detector_signal(details: dict[str, Any], name: str = "tail_anomaly", line: RecoveryLine | None = None) -> Signal:
    return Signal(SignalSource.DETECTOR, name, {"model": "ranker"}, datetime.now(timezone.utc), "detector:k",
                  value=900_000.0, policy="ranker-tail", details={"query": P999, **details}, recovery_line=line)


def _summary_of_the_previous_version(details: dict[str, Any], name: str = "tail_anomaly") -> dict[str, Any]:
    """A detector signal's summary as the version before lines were typed journaled it: the line only
    in the details the poller wrote (`threshold`, `baseline`, tail_excess's `input`)."""
    return {"source": "detector", "name": name, "labels": {"model": "ranker"},
            "observed_at": "2026-12-01T10:00:00+00:00", "dedup_key": "detector:ranker-tail:0:abc",
            "status": "firing", "value": 900000.0, "policy": "ranker-tail",
            "details": {"reason": "3/5 recent points above 108500", "score": 7.5, "episode_start": 1.7e9,
                        "query": P999, "evidence": [[1.7e9, 900000.0]], **details}}


def _alert_signal() -> Signal:
    return Signal(SignalSource.ALERT, "TritonTailLatencyHigh", {"model": "ranker"}, datetime.now(timezone.utc), "a1")


# ---- schema --------------------------------------------------------------------------------------

def test_verify_block_defaults_and_aliases():
    """`for`, `within`, `interval` are durations with the documented defaults; escalate by default."""
    spec = VerifySpec.model_validate({"query": "up", "below": 500})
    assert (spec.hold, spec.within, spec.interval, spec.on_not_recovered) == (60.0, 180.0, 15.0, "escalate")
    spec = VerifySpec.model_validate({"query": "up", "above": 1, "for": "2s", "within": "8s", "interval": "1s",
                                      "onNotRecovered": "revert"})
    assert (spec.above, spec.hold, spec.within, spec.interval, spec.on_not_recovered) == (1, 2, 8, 1, "revert")


@pytest.mark.parametrize("bad, message", [
    ({"query": "up"}, "exactly one of 'below' and 'above'"),
    ({"query": "up", "below": 1, "above": 2}, "exactly one of 'below' and 'above'"),
    ({"query": "up", "below": 1, "for": "5m", "within": "3m"}, "'for' <= 'within'"),
    ({"query": "up", "below": 1, "interval": "500ms"}, "at least 1s"),
    ({"query": "up", "below": 1, "interval": "5m", "within": "3m"}, "'interval' must not be longer"),
    ({"query": "up", "below": 1, "onNotRecovered": "page"}, "escalate"),
    ({"query": "up", "below": float("nan")}, "finite"),
    ({"query": "up", "below": 1, "holdFor": "1m"}, "Extra inputs"),
    ({"query": "", "below": 1}, "at least 1 character"),
])
def test_verify_block_is_strict(bad: dict[str, Any], message: str):
    """Exactly one side, a hold inside the window, known follow-ups, no unknown keys."""
    with pytest.raises(ValidationError, match=message):
        VerifySpec.model_validate(bad)


def test_verify_block_in_the_json_schema():
    """The export names `for` and `onNotRecovered` and asks for exactly one of below/above."""
    schema = policy_json_schema(action_registry(), detector_registry())
    verify = schema["$defs"]["VerifySpec"]
    assert {"query", "below", "above", "for", "within", "interval", "onNotRecovered"} <= set(verify["properties"])
    assert verify["oneOf"] == [{"required": ["below"]}, {"required": ["above"]}]
    assert verify["properties"]["onNotRecovered"]["enum"] == ["escalate", "revert", "none"]
    assert "verify" in schema["properties"]


def test_verify_query_with_an_unknown_placeholder_is_a_load_error():
    """`$modle` is refused when the policy loads, naming the field."""
    with pytest.raises(PolicyLoadError, match=r"verify\.query: query placeholder \$modle"):
        _policy(verify="{query: 'up{model=\"$modle\"}', below: 1}")


# ---- the check a decision gets -------------------------------------------------------------------

def test_verify_block_renders_the_model_escaped():
    """`$model` in the verify query is replaced with the escaped label value, as in detector queries."""
    policy = _policy(model='ran"ker', verify="{query: 'max(x{model=\"$model\"})', below: 0.5, for: 2s, within: 8s, "
                                            "interval: 1s, onNotRecovered: none}")
    check = recovery_check(policy, _alert_signal())
    assert check is not None
    assert check.query == 'max(x{model="ran\\"ker"})'
    assert check.condition == RecoveryCondition(below=0.5, hold_seconds=2, within_seconds=8, max_gap_seconds=2.5)
    assert (check.interval, check.on_not_recovered, check.source) == (1, "none", "verify")


def test_detector_default_holds_below_the_threshold_drawn_at_the_episode_start():
    """No verify block: a detector signal is checked on the detector's query, below its threshold."""
    line = RecoveryLine(108_500.0, Side.BELOW, "threshold")
    check = recovery_check(_policy(detector=True), _detector_signal({}, line=line))
    assert check is not None
    assert check.query == P999.replace("$model", "ranker")
    assert (check.condition.below, check.condition.above) == (108_500.0, None)
    assert (check.condition.hold_seconds, check.condition.within_seconds) == (60, 180)
    assert check.interval == 5 and check.on_not_recovered == "escalate"
    assert check.source == "detector tail_anomaly threshold at episode start"
    assert check.model_label == "model"


def test_detector_default_falls_back_to_the_baseline_and_follows_the_direction():
    """A line drawn from the baseline is named so; a line whose good side is above is held above."""
    check = recovery_check(_policy(detector=True), _detector_signal({}, line=RecoveryLine(8_523.0, Side.BELOW,
                                                                                          "baseline")))
    assert check is not None and check.condition.below == 8_523.0
    assert "baseline" in check.source
    policy = _policy(detector=True, detector_type="threshold", params="{threshold: 10, direction: below}")
    check = recovery_check(policy, _detector_signal({}, name="threshold", line=RecoveryLine(10.0, Side.ABOVE,
                                                                                             "threshold")))
    assert check is not None and (check.condition.below, check.condition.above) == (None, 10.0)


def test_no_check_without_a_line_or_a_verify_block():
    """An alert on an alert-only policy (one that loads without verify: dry run), or a detector signal
    that drew no line (whatever its details hold): no check."""
    assert recovery_check(_policy(dry_run=True), _alert_signal()) is None
    assert recovery_check(_policy(detector=True), _alert_signal()) is None
    assert recovery_check(_policy(detector=True), _detector_signal({"threshold": 108_500.0})) is None


def test_the_line_is_journaled_with_the_signal_and_read_back_typed():
    """A detector signal's summary carries its line (null when it drew none), and the signal read
    back from the journal gets the same check; alert summaries have no such key."""
    policy = _policy(detector=True)
    signal = _detector_signal({"threshold": 108_500.0}, line=RecoveryLine(108_500.0, Side.BELOW, "threshold"))
    summary = json.loads(signal.summary_json())
    assert summary["recovery_line"] == {"level": 108_500.0, "good": "below", "drawn_from": "threshold"}
    back = Signal.from_summary(summary)
    assert back.recovery_line == signal.recovery_line
    assert recovery_check(policy, back) == recovery_check(policy, signal)
    none = Signal.from_summary(json.loads(_detector_signal({"threshold": 108_500.0}).summary_json()))
    assert none.recovery_line is None and recovery_check(policy, none) is None
    assert "recovery_line" not in _alert_signal().summary()


@pytest.mark.parametrize("details, detector_type, params, want", [
    ({"threshold": 108_500.0, "baseline": 8_523.0}, "tail_anomaly", "{min_absolute_increase: 100000}",
     (108_500.0, None, "detector tail_anomaly threshold at episode start")),
    ({"threshold": None, "baseline": 8_523.0}, "tail_anomaly", "{min_absolute_increase: 100000}",
     (8_523.0, None, "detector tail_anomaly baseline at episode start")),
    ({"threshold": 10.0}, "threshold", "{threshold: 10, direction: below}",
     (None, 10.0, "detector threshold threshold at episode start")),
    ({"threshold": 500.0, "baseline": 480.0}, "forecast_breach", "{threshold: 500}",
     (500.0, None, "detector forecast_breach threshold at episode start")),
    ({"threshold": float("nan"), "baseline": None}, "tail_anomaly", "{min_absolute_increase: 100000}", None),
    ({"threshold": True}, "tail_anomaly", "{min_absolute_increase: 100000}", None),
    ({"input": "counters", "threshold": 13.0, "baseline": 4000.0}, "tail_excess", "{line: 500000}", None),
])
def test_a_signal_journaled_before_lines_were_typed_gets_the_check_it_got_then(
        details: dict[str, Any], detector_type: str, params: str, want: tuple[Any, ...] | None):
    """A signal still pending across the upgrade (its summary without `recovery_line`): the line comes
    from its `threshold`, else `baseline` detail, none for counters, on the side its detector's params
    say, as the check read them before; written back, it stays as it was journaled."""
    policy = _policy(detector=True, detector_type=detector_type, params=params)
    summary = _summary_of_the_previous_version(details, name=detector_type)
    signal = Signal.from_summary(summary)
    check = recovery_check(policy, signal)
    if want is None:
        assert check is None
        return
    assert check is not None and isinstance(signal.recovery_line, UnsidedLine)
    assert (check.condition.below, check.condition.above, check.source) == want
    assert check.query == P999.replace("$model", "ranker") and check.model_label == "model"
    assert (check.condition.hold_seconds, check.condition.within_seconds, check.interval) == (60, 180, 5)
    again = json.loads(signal.summary_json())
    assert "recovery_line" not in again and recovery_check(policy, Signal.from_summary(again)) == check


def test_validate_warns_about_policies_whose_alerts_get_no_recovery_check():
    """Alert-only without verify (loads only when it never acts: dry run, all shadow): warned that it
    will be refused once it may act; alert + detector: alert signals warned; with verify: nothing."""
    for exempt in (_policy(dry_run=True), _policy(shadow=True)):
        assert "loaded only because it never acts" in (recovery_warning(exempt) or "")
    with_schedule = load_policies_text(
        "name: p\ntarget: {model: ranker}\ntriggers:\n  - alert: {name: A}\n  - schedule: {every: 1m}\n"
        "actions:\n  - {type: notify, url: 'http://127.0.0.1:1/h'}\n", "p.yaml", action_registry(),
        detector_registry()).policies[0]  # not alert-only: loads, and its alert signals act unchecked
    assert recovery_warning(with_schedule) == "alert signals get no recovery check after acting (no verify block)"
    assert "alert signals get no recovery check" in (recovery_warning(_policy(detector=True)) or "")
    assert recovery_warning(_policy(detector=True, alert=False)) is None
    assert recovery_warning(_policy(verify="{query: up, below: 1}")) is None


def test_check_value_is_the_worst_series_of_the_model_and_round_trips():
    """Several series: the worst counts (all must recover); a detector default ignores other models."""
    check = recovery_check(_policy(detector=True), _detector_signal({}, line=RecoveryLine(100.0, Side.BELOW,
                                                                                          "threshold")))
    assert check is not None
    samples = [Sample({"model": "ranker", "version": "1"}, 50.0), Sample({"model": "ranker", "version": "2"}, 70.0),
               Sample({"model": "other"}, 900.0)]
    assert check.value(samples) == 70.0
    assert check.value([Sample({"model": "other"}, 1.0)]) is None
    assert RecoveryCheck.from_dict(check.as_dict()) == check
    above = RecoveryCheck("q", RecoveryCondition(above=1.0), 1.0, "none", "verify")
    assert above.value([Sample({}, 3.0), Sample({"model": "x"}, 2.0)]) == 2.0


# ---- the watch -----------------------------------------------------------------------------------

class FakeTime:
    """A clock that moves only when the watch sleeps."""

    def __init__(self, start: float = 1_000.0) -> None:
        self.now = start
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, delay: float) -> None:
        self.sleeps.append(delay)
        self.now += delay


CHECK = RecoveryCheck("p999", RecoveryCondition(below=500.0, hold_seconds=2, within_seconds=8, max_gap_seconds=2.5),
                      1.0, "escalate", "verify")


def _query(fake: FakeTime, value_at: Any) -> Any:
    async def query(promql: str) -> QueryResult:
        value = value_at(fake.now - 1_000.0)
        if isinstance(value, str):
            return QueryResult(promql, error=value)
        return QueryResult(promql, () if value is None else (Sample({}, float(value)),))
    return query


async def test_watch_recovers_once_good_for_the_hold():
    """900 for 3 s, then 100: recovered after 2 s of good samples, polled every interval."""
    fake = FakeTime()
    watched = await watch_recovery(CHECK, 1_000.0, _query(fake, lambda t: 900 if t < 3 else 100), fake.clock,
                                   fake.sleep)
    assert watched.verdict.state is Recovery.RECOVERED
    assert watched.verdict.held_from == 1_003.0 and fake.now == 1_005.0
    assert set(fake.sleeps) == {1.0}


async def test_watch_not_recovered_when_the_window_closes_bad():
    """Bad to the end: not recovered at the deadline, the last wait cut to it."""
    fake = FakeTime()
    watched = await watch_recovery(CHECK, 1_000.0, _query(fake, lambda t: 900), fake.clock, fake.sleep)
    assert watched.verdict.state is Recovery.NOT_RECOVERED
    assert fake.now == 1_008.0 and len(watched.samples) == 9


async def test_watch_without_data_or_with_failing_queries_is_unknown():
    """No series, or every query failing: unknown (never success), the errors counted."""
    fake = FakeTime()
    watched = await watch_recovery(CHECK, 1_000.0, _query(fake, lambda t: None), fake.clock, fake.sleep)
    assert watched.verdict.state is Recovery.UNKNOWN and watched.query_errors == 0
    fake = FakeTime()
    watched = await watch_recovery(CHECK, 1_000.0, _query(fake, lambda t: "HTTPError: 503"), fake.clock, fake.sleep)
    assert watched.verdict.state is Recovery.UNKNOWN
    assert watched.query_errors == 9 and watched.last_error == "HTTPError: 503"


async def test_watch_survives_a_query_that_raises_and_without_prometheus_is_unknown():
    """A raising client is one failed sample; no query function at all settles unknown at once."""
    fake = FakeTime()

    async def boom(promql: str) -> QueryResult:
        raise RuntimeError("client bug")

    watched = await watch_recovery(CHECK, 1_000.0, boom, fake.clock, fake.sleep)
    assert watched.verdict.state is Recovery.UNKNOWN and "client bug" in (watched.last_error or "")
    watched = await watch_recovery(CHECK, 1_000.0, None, fake.clock, fake.sleep)
    assert watched.verdict.state is Recovery.UNKNOWN and "no Prometheus" in watched.verdict.reason


async def test_resumed_watch_reads_back_what_it_missed():
    """After a restart the range query restores the samples: a recovery already held is not lost
    (worst series per timestamp, NaN skipped); the window past, the verdict is immediate."""
    async def query_range(promql: str, start: float, end: float, step: float) -> RangeResult:
        assert (start, end, step) == (1_000.0, 1_008.0, 1.0)
        ts = tuple(1_000.0 + i for i in range(9))
        return RangeResult(promql, [Series({"v": "1"}, ts, (900, 900, 100, 100, 100, 100, 100, 100, 100)),
                                    Series({"v": "2"}, ts, (float("nan"), 900, 200, 300, 100, 100, 100, 100, 100))])

    missed = await missed_samples(CHECK, 1_000.0, 1_020.0, query_range)
    assert missed[:4] == [(1_000.0, 900.0), (1_001.0, 900.0), (1_002.0, 200.0), (1_003.0, 300.0)]
    fake = FakeTime(1_020.0)
    watched = await watch_recovery(CHECK, 1_000.0, _query(fake, lambda t: 900), fake.clock, fake.sleep, missed)
    assert watched.verdict.state is Recovery.RECOVERED and fake.sleeps == []
    assert await missed_samples(CHECK, 1_000.0, 1_020.0, None) == []


# ---- the command line ----------------------------------------------------------------------------

ONLY_ALERTS = ("name: only-alerts\ntarget: {model: ranker}\ntriggers:\n  - alert: {name: A}\n"
               "actions:\n  - {type: notify, url: 'http://127.0.0.1:1/h'}\n")


def test_validate_refuses_an_alert_only_policy_without_verify_in_one_line(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]):
    """`tailguard validate` prints the refusal as one `error:` line naming the file, the policy, the
    field `verify` and the fix, then the count; exit 1, nothing reported ok."""
    (tmp_path / "p.yaml").write_text(ONLY_ALERTS)
    assert main(["validate", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    error, count = captured.err.splitlines()
    assert error.startswith(f"error: {tmp_path / 'p.yaml'}: policy 'only-alerts': verify: required: ")
    assert "add a verify block, e.g. verify: {query: " in error and "below: " in error and "within: " in error
    assert count == "1 error(s)"


def test_validate_warns_about_an_alert_only_policy_that_never_acts(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]):
    """Dry run: the alert-only policy without verify loads (exit 0), warned that it is refused once it may act."""
    (tmp_path / "p.yaml").write_text(ONLY_ALERTS + "guards: {dryRun: true}\n")
    assert main(["validate", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("ok: only-alerts") and out[0].endswith("(dry run)")
    assert out[1].startswith("warning: only-alerts: alert-only policy without a verify block: loaded only because "
                             "it never acts")


def test_unfreeze_lifts_the_freeze_and_journals_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """`tailguard unfreeze ranker --config` lifts the freeze in force (journaled with its reason);
    asking again finds nothing to lift (exit 1)."""
    config = tmp_path / "config.yaml"
    config.write_text("journal: {path: j.db}\n")
    journal = Journal(tmp_path / "j.db")
    journal.freezes.record("default/ranker", "did not recover", time.time() + 3600, decision_id=7)
    journal.freezes.record("default/other", "did not recover", time.time() + 3600)
    journal.close()

    assert main(["unfreeze", "ranker", "--config", str(config), "--reason", "fixed by hand"]) == 0
    assert "unfrozen: default/ranker (freeze 1 of decision 7: did not recover)" in capsys.readouterr().out
    assert main(["unfreeze", "default/ranker", "--config", str(config)]) == 1
    assert "no freeze in force on default/ranker (frozen now: default/other)" in capsys.readouterr().err

    journal = Journal(tmp_path / "j.db")
    try:
        assert journal.freezes.active_on("default/ranker") is None
        assert journal.freezes.active_on("default/other") is not None
        (lifted,) = journal.freezes.all("default/ranker")
        assert lifted.lifted_at is not None and lifted.lifted_reason == "fixed by hand"
    finally:
        journal.close()
