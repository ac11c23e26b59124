"""Bytes per journal row at realistic sizes, for journal.maxHistoryRows (docs/operations.md): 2,000
alert signals from the sample webhook, each with a decision whose plan is a rollback's and six step
rows (intent, apply, verify twice); the SQLite file's size per decision.

    .venv/bin/python bench/bench_journal_rows.py
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: the project's packages first

from daemon.http.intake import alert_signals, parse_payload  # noqa: E402
from daemon.storage.journal import Journal  # noqa: E402
from daemon.storage.records import StepRecord  # noqa: E402
from daemon.storage.step_kinds import StepPhase, StepStatus  # noqa: E402

N = 2000
print("command: .venv/bin/python bench/bench_journal_rows.py")
tmp = Path(tempfile.mkdtemp())
j = Journal(tmp / "j.db")
payload = json.loads((ROOT / "fixtures" / "samples" / "alertmanager_webhook_v4.json").read_text())
plan = {"policy": "ranker-tail", "target": "serving/ranker", "signal_key": "x" * 40, "dry_run": False, "blocked": None,
        "steps": [{"action": "triton.rollback", "kind": "triton.rollback", "description": "load ranker v1, unload v2",
                   "before": {"versions": [2]}, "after": {"versions": [1]}, "noop": False, "effect_key": "1:0"}] * 2}
for i in range(N):
    p = json.loads(json.dumps(payload))
    for a in p["alerts"]:
        a["startsAt"] = f"2026-11-29T{i // 3600 % 24:02d}:{i // 60 % 60:02d}:{i % 60:02d}Z"
        a["fingerprint"] = f"{i:016x}"
    sigs = alert_signals(parse_payload(p))
    ((sid, _), *_), _ = j.signals.record(sigs[:1])
    d = j.decisions.record(sid, "ranker-tail", "serving/ranker", "succeeded", "2 step(s) applied and verified", plan, executed=True)
    for k, phase in enumerate((StepPhase.INTENT, StepPhase.APPLY, StepPhase.VERIFY) * 2):
        j.decisions.record_step(StepRecord(d, k // 3, "triton.rollback", phase, StepStatus.OK,
                                           "loaded v1; v2 unloaded", {"pin": True, "versions": [1]}, 0.2))
j.close()
size = (tmp / "j.db").stat().st_size
print(f"{N} signals + {N} decisions + {6*N} steps: {size/1e6:.1f} MB, {size/N:.0f} bytes per decision with its signal and steps")
