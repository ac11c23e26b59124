"""`tailguard simulate`: what the daemon would do with an Alertmanager payload right now.

Policies are matched, guards read from the journal (if one exists), targets observed read-only and
plans computed; nothing is journaled and nothing is applied."""
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
from detectors.base import Detector
from policies.loader import load_policies


async def simulate(settings: Settings, payload_path: Path, actions: Mapping[str, type[Action]],
                   detectors: Mapping[str, type[Detector]]) -> list[dict[str, Any]]:
    """Plans per alert in the payload, as JSON-able dicts.

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
            plans = await parts.executor.preview(signal)
            out.append({"signal": signal.summary(), "plans": [p.as_dict() for p in plans]})
        return out
    finally:
        await parts.close()
