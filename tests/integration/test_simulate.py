"""`tailguard simulate`: the plan for a payload, from live targets, with nothing applied or journaled."""
from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from daemon.wiring.cli import main
from daemon.storage.journal import Journal
from lab.triton import TritonServer
from tests.support.helpers import SAMPLES

POLICY = """
name: ranker-tail
target:
  model: ranker
  triton: {{endpoints: ["{url}"]}}
triggers:
  - alert: {{name: TritonTailLatencyHigh}}
actions:
  - type: triton.rollback
guards: {{cooldown: 10m}}
"""


def _served(server: TritonServer) -> list[str]:
    req = urllib.request.Request(f"{server.base_url}/v2/repository/index", data=b"{}", method="POST")
    with urllib.request.urlopen(req, timeout=10) as resp:
        return sorted(e["version"] for e in json.load(resp) if e.get("state") == "READY")


def _config(tmp_path: Path, url: str) -> Path:
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "p.yaml").write_text(POLICY.format(url=url))
    cfg = tmp_path / "config.yaml"
    cfg.write_text("policies: {path: policies}\njournal: {path: journal.db}\n")
    return cfg


def test_simulate_prints_the_rollback_plan_and_changes_nothing(
        tmp_path: Path, triton_server: TritonServer, capsys: pytest.CaptureFixture[str]):
    """The plan names v1 from the live Triton; Triton still serves v2 and no journal appears."""
    cfg = _config(tmp_path, triton_server.base_url)
    assert main(["simulate", str(SAMPLES / "alertmanager_webhook_v4.json"), "--config", str(cfg)]) == 0
    (result,) = json.loads(capsys.readouterr().out)
    (plan,) = result["plans"]
    assert plan["policy"] == "ranker-tail" and plan["blocked"] is None
    assert plan["steps"][0]["after"]["version"] == 1
    assert _served(triton_server) == ["2"]
    assert not (tmp_path / "journal.db").exists()


def test_simulate_reads_cooldowns_from_an_existing_journal(
        tmp_path: Path, triton_server: TritonServer, capsys: pytest.CaptureFixture[str]):
    """With a recent executed plan in the journal, the simulated plan is blocked by the cooldown."""
    from datetime import datetime, timezone

    from core.signal import Signal, SignalSource

    cfg = _config(tmp_path, triton_server.base_url)
    journal = Journal(tmp_path / "journal.db")
    ((sid, _),), _ = journal.record_signals(
        [Signal(SignalSource.ALERT, "TritonTailLatencyHigh", {}, datetime.now(timezone.utc), "k")])
    journal.record_decision(sid, "ranker-tail", "default/ranker", "succeeded", "", {}, executed=True)
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
