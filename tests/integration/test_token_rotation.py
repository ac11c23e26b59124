"""A rotated webhook token is in force without a restart: the Secret volume's atomic symlink swap
puts a new token in place, the old one is then refused (401) and the new one accepted, through
the daemon's real webhook."""
from __future__ import annotations

from pathlib import Path

import pytest

from daemon.wiring.registries import action_registry, detector_registry
from daemon.wiring.service import Service
from tests.support.helpers import local_settings, notify_policy, payload_with, post_alerts
from tests.support.secret_volume import SecretVolume

pytestmark = pytest.mark.integration

OLD, NEW = "old-webhook-token-0123456789", "new-webhook-token-9876543210"


async def test_a_rotated_webhook_token_is_in_force_without_a_restart(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    volume = SecretVolume(tmp_path / "secret", {"token": OLD + "\n"})
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "p.yaml").write_text(notify_policy("http://127.0.0.1:9/hook"))
    settings = local_settings(tmp_path, policies, webhook={"tokenFile": str(volume.root / "token")})
    monkeypatch.delenv("TAILGUARD_WEBHOOK_TOKEN")  # local_settings sets it; the file is the source here
    svc = Service(settings, action_registry(), detector_registry())
    svc.secret_reload_seconds = 0.1
    async with svc:
        await post_alerts(svc, payload_with(fingerprint="f1"), token=OLD, expect=200)
        volume.update({"token": NEW + "\n"})
        answers: list[int] = []

        async def old_refused() -> bool:
            answers.append((await post_alerts(svc, payload_with(fingerprint="f2"), token=OLD)).status)
            return answers[-1] == 401

        for _ in range(300):  # bounded: a look every 0.1 s
            if await old_refused():
                break
        assert answers[-1] == 401, answers
        await post_alerts(svc, payload_with(fingerprint="f3"), token=NEW, expect=200)
