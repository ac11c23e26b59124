"""Pin life cycle and known-bad versions against a real Triton: a roll-forward by the operator ends
the pin and is left alone; `to: previous` skips versions rolled back from; disabling the policy and
`tailguard unpin` end the pin. Plus the pure planning with known-bad versions."""
from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from actions.triton import choose_version
from daemon.wiring.cli import main as cli_main
from daemon.wiring.registries import action_registry, detector_registry
from daemon.wiring.service import Service
from lab.triton import TritonServer, write_model_repository
from tests.support.helpers import TOKEN, local_settings, payload_with, sample_payload

POLICY = """
name: ranker-tail
target:
  model: ranker
  triton: {{endpoints: ["{url}"]}}
triggers:
  - alert: {{name: TritonTailLatencyHigh, matchers: {{severity: page}}}}
actions:
  - type: triton.rollback
    to: previous
guards: {{cooldown: 0s}}
enabled: {enabled}
# alert-only: a verify block is required; its outcome is irrelevant here (onNotRecovered: none)
verify: {{query: 'vector(0)', below: 1, onNotRecovered: none}}
"""
KEY = "default/ranker"


def _served(server: TritonServer) -> list[str]:
    req = urllib.request.Request(f"{server.base_url}/v2/repository/index", data=b"{}", method="POST")
    with urllib.request.urlopen(req, timeout=10) as resp:
        return sorted(e["version"] for e in json.load(resp) if e.get("state") == "READY")


def _roll_forward(server: TritonServer, version: int) -> None:
    """What an operator does: add `version` to the repository and load the model serving the newest."""
    write_model_repository(server.model_repository, slow_fraction_by_version={version: 0.0})
    with urllib.request.urlopen(f"{server.base_url}/v2/models/ranker/config", timeout=10) as resp:
        config = json.load(resp)
    config["version_policy"] = {"latest": {"num_versions": 1}}
    body = json.dumps({"parameters": {"config": json.dumps(config)}}).encode()
    req = urllib.request.Request(f"{server.base_url}/v2/repository/models/ranker/load", data=body, method="POST")
    with urllib.request.urlopen(req, timeout=120) as resp:
        assert resp.status == 200


def _write_policy(tmp_path: Path, url: str, enabled: bool = True) -> Path:
    pol = tmp_path / "policies"
    pol.mkdir(exist_ok=True)
    (pol / "ranker.yaml").write_text(POLICY.format(url=url, enabled=str(enabled).lower()))
    return pol


async def _post(svc: Service, body: dict[str, Any]) -> int:
    async with aiohttp.ClientSession() as http:
        async with http.post(f"http://127.0.0.1:{svc.port}/api/v1/alerts", json=body,
                             headers={"Authorization": f"Bearer {TOKEN}"}) as resp:
            return resp.status


def test_previous_skips_known_bad_versions() -> None:
    """Pure: `to: previous` is the newest good version below the served one."""
    assert choose_version("previous", [3], [1, 2, 3], None, frozenset({2}))[0] == 1
    assert choose_version("previous", [3], [1, 2, 3], None)[0] == 2
    assert choose_version("previous", [3], [3], None, frozenset({2}))[0] == 1  # unlisted: assumed
    assert choose_version("previous", [3], [1, 2, 3], None, frozenset({1, 2}))[0] is None
    # pinned to a version since marked bad: not "already rolled back"
    assert choose_version("previous", [2], [1, 2], [2], frozenset({2}))[0] == 1
    assert choose_version("previous", [1], [1, 2], [1], frozenset({2}))[0] == 1


@pytest.mark.integration
async def test_roll_forward_ends_the_pin_and_previous_skips_the_bad_version(
        tmp_path: Path, triton_factory: Any) -> None:
    """Rolled back v2 -> v1 (v2 marked bad, pin from 2); the operator loads v3: the reconciler ends
    the pin and leaves v3; a later rollback `to: previous` goes to v1, not the bad v2."""
    triton = await triton_factory(name="ranker")
    pol = _write_policy(tmp_path, triton.base_url)
    async with Service(local_settings(tmp_path, pol), action_registry(), detector_registry()) as svc:
        assert await _post(svc, sample_payload()) == 200
        await svc.drain()
        assert _served(triton) == ["1"]
        (pin,) = await svc.journal.pins()
        (decision,) = await svc.journal.decisions()
        assert (pin["version"], pin["from_version"], pin["decision_id"], pin["policy"]) == (
            1, 2, decision.id, "ranker-tail")
        assert pin["signal"] and pin["reason"]
        assert await svc.journal.known_bad(KEY) == frozenset({2})

        _roll_forward(triton, 3)
        assert _served(triton) == ["3"]
        results = await svc.pins.reconcile_once()
        assert results[KEY].status.value == "noop" and "rolled forward" in results[KEY].data["ended"]
        assert _served(triton) == ["3"]  # not fought
        assert await svc.journal.pins() == []
        (ended,) = await svc.journal.ended_pins(KEY)
        assert "version 3" in ended["ended_reason"] and ended["from_version"] == 2
        assert await svc.pins.reconcile_once() == {}

        assert await _post(svc, payload_with(starts_at="2026-11-29T17:40:00Z")) == 200
        await svc.drain()
        second = (await svc.journal.decisions())[-1]
        assert second.state == "succeeded", second.reason
        assert second.plan["steps"][0]["after"]["version"] == 1
        assert _served(triton) == ["1"]
        (pin,) = await svc.journal.pins()
        assert (pin["version"], pin["from_version"]) == (1, 3)
        assert await svc.journal.known_bad(KEY) == frozenset({2, 3})


@pytest.mark.integration
async def test_disabling_the_policy_and_unpin_end_the_pin(tmp_path: Path, triton_factory: Any) -> None:
    """A disabled policy's pin ends (with an Event when a recorder is lent); `tailguard unpin` ends a
    pin; `tailguard bad-versions` lists and clears marks."""
    triton = await triton_factory(name="ranker")
    pol = _write_policy(tmp_path, triton.base_url)
    settings = local_settings(tmp_path, pol)
    config = tmp_path / "tailguard.yaml"
    config.write_text(json.dumps({"journal": {"path": str(settings.journal.path)},
                                  "policies": {"path": str(pol)}}))
    events: list[dict[str, Any]] = []

    async def record_event(**kwargs: Any) -> None:
        events.append(kwargs)

    async with Service(settings, action_registry(), detector_registry()) as svc:
        svc.deps.record_event = record_event
        assert await _post(svc, sample_payload()) == 200
        await svc.drain()
        assert _served(triton) == ["1"] and len(await svc.journal.pins()) == 1

        _write_policy(tmp_path, triton.base_url, enabled=False)
        for _ in range(100):
            if not svc.state.policies.policies[0].spec.enabled:
                break
            await asyncio.sleep(0.1)
        assert not svc.state.policies.policies[0].spec.enabled
        assert await svc.pins.reconcile_once() == {}
        assert await svc.journal.pins() == []
        (ended,) = await svc.journal.ended_pins(KEY)
        assert ended["ended_reason"] == "policy ranker-tail disabled"
        assert [e["reason"] for e in events if e["reason"] == "PinEnded"] == ["PinEnded"]

        _write_policy(tmp_path, triton.base_url, enabled=True)
        for _ in range(100):
            if svc.state.policies.policies[0].spec.enabled:
                break
            await asyncio.sleep(0.1)
        await svc.journal.record_pin(KEY, "ranker", 1, from_version=2, policy="ranker-tail")
        assert (await svc.pins.reconcile_once())[KEY].status.value == "noop"  # live again, in sync

        assert await asyncio.to_thread(cli_main, ["unpin", "ranker", "--config", str(config),
                                                  "--reason", "operator"]) == 0
        assert await svc.journal.pins() == []
        assert (await svc.journal.ended_pins(KEY))[-1]["ended_reason"] == "operator"
        assert await svc.pins.reconcile_once() == {}
        assert await asyncio.to_thread(cli_main, ["unpin", "ranker", "--config", str(config)]) == 1

        assert await asyncio.to_thread(cli_main, ["bad-versions", "ranker", "--config", str(config)]) == 0
        assert await asyncio.to_thread(cli_main, ["bad-versions", "ranker", "--config", str(config),
                                                  "--clear", "2"]) == 0
        assert await svc.journal.known_bad(KEY) == frozenset()
        assert _served(triton) == ["1"]
