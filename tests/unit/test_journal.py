"""The journal: dedup, decisions, and retention that keeps it bounded without losing what matters."""
from __future__ import annotations

import time
from datetime import datetime, timezone
from pathlib import Path

from core.signal import Signal, SignalSource
from daemon.storage.journal import Journal


def _signal(key: str) -> Signal:
    return Signal(SignalSource.ALERT, "A", {"model": "m"}, datetime.now(timezone.utc), key)


def test_prune_drops_old_processed_history_and_keeps_pending_recent_and_pins(tmp_path: Path):
    """Old processed signals with their decisions and steps go; pending signals, recent rows and
    pins stay, and dedup still holds for what stays."""
    j = Journal(tmp_path / "j.db")
    (old_id, _), (recent_id, _), (pending_id, _) = j.record_signals(
        [_signal("old"), _signal("recent"), _signal("pending")])[0]
    for sid in (old_id, recent_id):
        d = j.record_decision(sid, "p", "ns/m", "succeeded", "", {}, executed=True)
        j.record_step(d, 0, "notify", "apply", "ok", "", {}, 0.1)
        j.mark_processed(sid)
    j.record_pin("ns/m", "m", 1)
    j.record_evaluation("p", 0, "series", False, "ok")
    long_ago = time.time() - 40 * 86400
    j._db.execute("UPDATE signals SET received_at=? WHERE id IN (?, ?)", (long_ago, old_id, pending_id))
    j._db.execute("UPDATE decisions SET at=? WHERE signal_id=?", (long_ago, old_id))
    j._db.execute("UPDATE evaluations SET at=?", (long_ago,))

    pruned = j.prune(time.time() - 30 * 86400)

    assert pruned == {"signals": 1, "decisions": 1, "steps": 1, "evaluations": 1}
    assert sorted(s["dedup_key"] for s in j.signals()) == ["pending", "recent"]
    assert [d.signal_id for d in j.decisions()] == [recent_id]
    assert j.pins()[0]["version"] == 1
    assert j.record_signals([_signal("recent")])[1] == 1  # still a duplicate
    j.close()
