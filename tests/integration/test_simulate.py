"""`tailguard simulate`: the plan for a payload, from live targets, with nothing applied or journaled."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from daemon.wiring.cli import main
from daemon.storage.journal import Journal
from lab.policies import ALERT_TRIGGER, rollback_policy
from lab.triton import TritonServer, served_versions
from tests.support.helpers import SAMPLES


def _config(tmp_path: Path, url: str) -> Path:
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "p.yaml").write_text(rollback_policy(
        url, triggers=ALERT_TRIGGER, to=None,
        verify="verify: {query: 'max(p999_us{model=\"$model\"})', below: 500000, for: 60s, within: 3m}\n"))
    cfg = tmp_path / "config.yaml"
    cfg.write_text("policies: {path: policies}\njournal: {path: journal.db}\n")
    return cfg


@pytest.mark.integration
def test_simulate_prints_the_rollback_plan_and_changes_nothing(
        tmp_path: Path, triton_server: TritonServer, capsys: pytest.CaptureFixture[str]):
    """The plan names v1 from the live Triton; Triton still serves v2 and no journal appears."""
    cfg = _config(tmp_path, triton_server.base_url)
    assert main(["simulate", str(SAMPLES / "alertmanager_webhook_v4.json"), "--config", str(cfg)]) == 0
    (result,) = json.loads(capsys.readouterr().out)
    (plan,) = result["plans"]
    assert plan["policy"] == "ranker-tail" and plan["blocked"] is None
    assert plan["steps"][0]["after"]["version"] == 1
    assert served_versions(triton_server) == ["2"]
    assert not (tmp_path / "journal.db").exists()


@pytest.mark.integration
def test_simulate_reads_cooldowns_from_an_existing_journal(
        tmp_path: Path, triton_server: TritonServer, capsys: pytest.CaptureFixture[str]):
    """With a recent executed plan in the journal, the simulated plan is blocked by the cooldown."""
    from datetime import datetime, timezone

    from core.signal import Signal, SignalSource

    cfg = _config(tmp_path, triton_server.base_url)
    journal = Journal(tmp_path / "journal.db")
    ((sid, _),), _ = journal.signals.record(
        [Signal(SignalSource.ALERT, "TritonTailLatencyHigh", {}, datetime.now(timezone.utc), "k")])
    journal.decisions.record(sid, "ranker-tail", "default/ranker", "succeeded", "", {}, executed=True)
    journal.close()
    assert main(["simulate", str(SAMPLES / "alertmanager_webhook_v4.json"), "--config", str(cfg)]) == 0
    (result,) = json.loads(capsys.readouterr().out)
    assert "cooldown" in result["plans"][0]["blocked"]


def test_simulate_rejects_a_bad_payload(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """A payload that is not an Alertmanager v4 webhook is a clear error, exit 1."""
    cfg = _config(tmp_path, "http://127.0.0.1:9")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"version": "3", "alerts": []}))
    assert main(["simulate", str(bad), "--config", str(cfg)]) == 1
    assert "unsupported webhook version" in capsys.readouterr().err


SHADOW_POLICIES = """
name: ranker-watch
target: {{model: ranker}}
triggers:
  - alert: {{name: TritonTailLatencyHigh}}
    shadow: true
actions:
  - type: notify
    url: {url}
guards: {{cooldown: 10m}}
---
name: ranker-live
target: {{model: ranker}}
triggers:
  - alert: {{name: TritonTailLatencyHigh}}
actions:
  - type: notify
    url: {url}
guards: {{cooldown: 10m}}
verify: {{query: 'max(p999_us{{model="$model"}})', below: 500000, for: 60s, within: 3m}}
"""


def test_simulate_shows_a_shadow_trigger_as_would_act_shadow_never_executed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """A policy whose only matching trigger is `shadow: true` is shown as `would act (shadow)`, not
    executed, with the shadow trigger named (as the live daemon journals it: would "act"); the live
    policy beside it is the only one counted as acting, in the JSON and the summary line."""
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "p.yaml").write_text(SHADOW_POLICIES.format(url="http://127.0.0.1:9/hook"))
    cfg = tmp_path / "config.yaml"
    cfg.write_text("policies: {path: policies}\njournal: {path: journal.db}\n")
    assert main(["simulate", str(SAMPLES / "alertmanager_webhook_v4.json"), "--config", str(cfg)]) == 0
    out, err = capsys.readouterr()
    (result,) = json.loads(out)
    plans = {p["policy"]: p for p in result["plans"]}
    watch, live = plans["ranker-watch"], plans["ranker-live"]
    assert watch["outcome"] == "would act (shadow)" and watch["executed"] is False
    assert watch["shadow"] == {"trigger": 0, "kind": "alert TritonTailLatencyHigh", "would": "act"}
    assert watch["blocked"] is None and watch["steps"]  # the plan is still shown, for what it would do
    assert live["outcome"] == "would act" and live["executed"] is True and live["shadow"] is None
    assert "2 plan(s): 1 would act, 1 shadow (never applied), 0 would not act" in err
    assert not (tmp_path / "journal.db").exists()


def test_simulate_shows_a_blocked_shadow_trigger_as_blocked_shadow(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """Inside the cooldown a live executed decision left, the shadow policy reads `would be blocked
    (shadow)` (its would: "blocked") and nothing is counted as acting."""
    from datetime import datetime, timezone

    from core.signal import Signal, SignalSource

    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "p.yaml").write_text(SHADOW_POLICIES.format(url="http://127.0.0.1:9/hook"))
    cfg = tmp_path / "config.yaml"
    cfg.write_text("policies: {path: policies}\njournal: {path: journal.db}\n")
    journal = Journal(tmp_path / "journal.db")
    ((sid, _),), _ = journal.signals.record(
        [Signal(SignalSource.ALERT, "TritonTailLatencyHigh", {}, datetime.now(timezone.utc), "k")])
    for policy in ("ranker-watch", "ranker-live"):
        journal.decisions.record(sid, policy, "default/ranker", "succeeded", "", {}, executed=True)
    journal.close()
    assert main(["simulate", str(SAMPLES / "alertmanager_webhook_v4.json"), "--config", str(cfg)]) == 0
    out, err = capsys.readouterr()
    plans = {p["policy"]: p for p in json.loads(out)[0]["plans"]}
    assert plans["ranker-watch"]["outcome"] == "would be blocked (shadow)"
    assert plans["ranker-watch"]["shadow"]["would"] == "blocked" and not plans["ranker-watch"]["executed"]
    assert plans["ranker-live"]["outcome"] == "would be blocked" and not plans["ranker-live"]["executed"]
    assert "0 would act, 1 shadow (never applied), 1 would not act" in err
