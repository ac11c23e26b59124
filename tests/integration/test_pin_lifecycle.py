"""Pin life cycle and known-bad versions against a real Triton: a roll-forward by the operator ends
the pin and is left alone; `to: previous` skips versions rolled back from; disabling the policy and
`tailguard unpin` end the pin. Plus the pure planning with known-bad versions."""
from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from actions.triton import TritonRollbackParams, choose_version, plan_rollback
from core.outcome import PermanentError
from core.target import Target
from daemon.wiring.cli import main as cli_main
from daemon.wiring.registries import action_registry, detector_registry
from daemon.wiring.service import Service
from lab.policies import rollback_policy
from lab.triton import TritonServer, served_versions, write_model_repository
from tests.support.helpers import local_settings, payload_with, post_alerts, sample_payload

KEY = "default/ranker"


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
    (pol / "ranker.yaml").write_text(rollback_policy(url, guards="cooldown: 0s", extra=f"enabled: {str(enabled).lower()}\n"))
    return pol


def test_an_explicit_version_marked_bad_is_refused() -> None:
    """Pure: `to: N` never loads a version known bad; planning fails with why (and how to clear it)."""
    version, why = choose_version(1, [2], [1, 2], None, frozenset({1}))
    assert version is None and why.startswith("version 1 requested by the policy is marked bad")
    assert "--clear 1" in why
    assert choose_version(1, [2], [1, 2], None, frozenset({2})) == (1, "version 1 requested by the policy")
    target = Target("ranker", "default", ("http://127.0.0.1:9",))
    observed = {"replicas": {"http://127.0.0.1:9": {"index": [{"name": "ranker", "version": "2", "state": "READY"}],
                                                    "config": {}}}, "known_bad": [1]}
    with pytest.raises(PermanentError, match="version 1 requested by the policy is marked bad"):
        plan_rollback(target, TritonRollbackParams(to=1), observed, frozenset({1}))


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
async def test_to_n_refuses_a_version_an_operator_marked_bad(tmp_path: Path, triton_server: TritonServer) -> None:
    """`to: 1` with version 1 marked bad (`tailguard bad-versions mark`): the decision fails at planning
    with why, and nothing is loaded: the bad version 2 stays served rather than a known-bad 1."""
    pol = tmp_path / "policies"
    pol.mkdir()
    (pol / "ranker.yaml").write_text(rollback_policy(triton_server.base_url, to="1", guards="cooldown: 0s"))
    settings = local_settings(tmp_path, pol)
    config = tmp_path / "tailguard.yaml"
    config.write_text(json.dumps({"journal": {"path": str(settings.journal.path)}, "policies": {"path": str(pol)}}))
    async with Service(settings, action_registry(), detector_registry()) as svc:
        assert await asyncio.to_thread(cli_main, ["bad-versions", "mark", "ranker", "1", "--config", str(config),
                                                  "--reason", "v1 leaks memory"]) == 0
        assert (await post_alerts(svc, sample_payload())).status == 200
        await svc.drain()
        (decision,) = await svc.journal.decisions.all.in_thread()
        assert decision.state == "failed" and not decision.executed
        assert decision.reason.startswith("planning failed: ranker: version 1 requested by the policy is marked bad")
        assert served_versions(triton_server, "ranker") == ["2"]
        assert await svc.journal.pins.live.in_thread() == []


@pytest.mark.integration
async def test_roll_forward_ends_the_pin_and_previous_skips_the_bad_version(
        tmp_path: Path, triton_factory: Any) -> None:
    """Rolled back v2 -> v1 (v2 marked bad, pin from 2); the operator loads v3: the reconciler ends
    the pin and leaves v3; a later rollback `to: previous` goes to v1, not the bad v2."""
    triton = await triton_factory(name="ranker")
    pol = _write_policy(tmp_path, triton.base_url)
    async with Service(local_settings(tmp_path, pol), action_registry(), detector_registry()) as svc:
        assert (await post_alerts(svc, sample_payload())).status == 200
        await svc.drain()
        assert served_versions(triton) == ["1"]
        (pin,) = await svc.journal.pins.live.in_thread()
        (decision,) = await svc.journal.decisions.all.in_thread()
        assert (pin.version, pin.from_version, pin.decision_id, pin.policy) == (
            1, 2, decision.id, "ranker-tail")
        assert pin.signal and pin.reason
        assert await svc.journal.bad_versions.known.in_thread(KEY) == frozenset({2})

        _roll_forward(triton, 3)
        assert served_versions(triton) == ["3"]
        results = await svc.pins.reconcile_once()
        assert results[KEY].status.value == "noop" and "rolled forward" in results[KEY].data["ended"]
        assert served_versions(triton) == ["3"]  # not fought
        assert await svc.journal.pins.live.in_thread() == []
        (ended,) = await svc.journal.pins.ended.in_thread(KEY)
        assert "version 3" in ended.ended_reason and ended.from_version == 2
        assert await svc.pins.reconcile_once() == {}

        assert (await post_alerts(svc, payload_with(starts_at="2026-11-29T17:40:00Z"))).status == 200
        await svc.drain()
        second = (await svc.journal.decisions.all.in_thread())[-1]
        assert second.state == "succeeded", second.reason
        assert second.plan["steps"][0]["after"]["version"] == 1
        assert served_versions(triton) == ["1"]
        (pin,) = await svc.journal.pins.live.in_thread()
        assert (pin.version, pin.from_version) == (1, 3)
        assert await svc.journal.bad_versions.known.in_thread(KEY) == frozenset({2, 3})


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
        assert (await post_alerts(svc, sample_payload())).status == 200
        await svc.drain()
        assert served_versions(triton) == ["1"] and len(await svc.journal.pins.live.in_thread()) == 1

        _write_policy(tmp_path, triton.base_url, enabled=False)
        for _ in range(100):
            if not svc.state.policies.policies[0].spec.enabled:
                break
            await asyncio.sleep(0.1)
        assert not svc.state.policies.policies[0].spec.enabled
        assert await svc.pins.reconcile_once() == {}
        assert await svc.journal.pins.live.in_thread() == []
        (ended,) = await svc.journal.pins.ended.in_thread(KEY)
        assert ended.ended_reason == "policy ranker-tail disabled"
        assert [e["reason"] for e in events if e["reason"] == "PinEnded"] == ["PinEnded"]

        _write_policy(tmp_path, triton.base_url, enabled=True)
        for _ in range(100):
            if svc.state.policies.policies[0].spec.enabled:
                break
            await asyncio.sleep(0.1)
        await svc.journal.pins.record.in_thread(KEY, "ranker", 1, from_version=2, policy="ranker-tail")
        assert (await svc.pins.reconcile_once())[KEY].status.value == "noop"  # live again, in sync

        assert await asyncio.to_thread(cli_main, ["unpin", "ranker", "--config", str(config),
                                                  "--reason", "operator"]) == 0
        assert await svc.journal.pins.live.in_thread() == []
        assert (await svc.journal.pins.ended.in_thread(KEY))[-1].ended_reason == "operator"
        assert await svc.pins.reconcile_once() == {}
        assert await asyncio.to_thread(cli_main, ["unpin", "ranker", "--config", str(config)]) == 1

        assert await asyncio.to_thread(cli_main, ["bad-versions", "ranker", "--config", str(config)]) == 0
        assert await asyncio.to_thread(cli_main, ["bad-versions", "ranker", "--config", str(config),
                                                  "--clear", "2"]) == 0
        assert await svc.journal.bad_versions.known.in_thread(KEY) == frozenset()
        assert served_versions(triton) == ["1"]
