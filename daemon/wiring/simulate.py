"""`tailguard simulate`: what the daemon would do with an Alertmanager payload right now.

Policies are matched, guards read from the journal (if one exists), targets observed read-only and
plans computed; nothing is journaled and nothing is applied."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from actions.base import ActionDeps
from daemon.common.config import Settings
from daemon.workers.executor import Executor, ExecutorState
from daemon.http.intake import alert_signals, parse_payload
from daemon.storage.journal import AsyncJournal, Journal
from daemon.cluster.kube import create_api_client, endpoints_resolver
from daemon.common.metrics import Metrics
from daemon.sources.prometheus import PrometheusClient
from policies.loader import load_policies


async def simulate(settings: Settings, payload_path: Path, actions: Mapping[str, type],
                   detectors: Mapping[str, type]) -> list[dict[str, Any]]:
    """Plans per alert in the payload, as JSON-able dicts.

    Raises:
        PolicyLoadError, PayloadError, ValueError: bad policies or payload (nothing is touched).
    """
    policies = load_policies(settings.policies.path, actions, detectors)
    signals = alert_signals(parse_payload(json.loads(payload_path.read_text(encoding="utf-8"))))
    journal_path = settings.journal.path
    # An existing journal gives real cooldown history; none means a first action would be allowed.
    journal = Journal(journal_path if journal_path.exists() else ":memory:")
    prometheus = PrometheusClient(settings.prometheus.url) if settings.prometheus.url else None
    kube = await create_api_client(settings.kubernetes)
    deps = ActionDeps(kube=kube, query=prometheus.query if prometheus else None,
                      endpoints=endpoints_resolver(kube),
                      triton_timeout_seconds=settings.executor.triton_timeout_seconds)
    executor = Executor(AsyncJournal(journal), ExecutorState(policies, frozen=settings.freeze), actions, deps,
                        Metrics())
    try:
        out = []
        for signal in signals:
            plans = await executor.preview(signal)
            out.append({"signal": signal.summary(), "plans": [p.as_dict() for p in plans]})
        return out
    finally:
        journal.close()
        if prometheus is not None:
            prometheus.close()
        if kube is not None:
            await kube.close()
