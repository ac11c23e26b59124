"""Token files re-read on change, through a Kubernetes Secret volume's atomic symlink swap: the
new tokens are applied, a set that does not check out is refused (the old ones stay, a fault is
counted), and nothing changes while nothing changed."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from daemon.common.config import ApiTokenEntry, Settings
from daemon.common.metrics import Metrics
from daemon.http.secret_reload import SecretReloader
from tests.support.secret_volume import SecretVolume

API_A = "- {name: ops, token: aaaaaaaaaaaaaaaaaaaa, scopes: [read, write]}\n"
API_B = "- {name: ops, token: bbbbbbbbbbbbbbbbbbbb, scopes: [read]}\n"


def _settings(volume: Path) -> Settings:
    return Settings.model_validate({"webhook": {"tokenFile": str(volume / "webhook-token")},
                                    "api": {"tokensFile": str(volume / "api-tokens")}})


@pytest.fixture(autouse=True)
def no_env_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TAILGUARD_WEBHOOK_TOKEN", raising=False)
    monkeypatch.delenv("TAILGUARD_API_TOKENS", raising=False)


def test_a_rotated_secret_is_applied_and_a_bad_one_refused(tmp_path: Path) -> None:
    volume = SecretVolume(tmp_path / "secret", {"webhook-token": "token-one\n", "api-tokens": API_A})
    applied: list[tuple[Any, list[ApiTokenEntry]]] = []
    metrics = Metrics()
    reloader = SecretReloader(_settings(volume.root), lambda t, a: applied.append((t, a)), metrics)
    assert reloader.check() is False and applied == []  # nothing changed

    volume.update({"webhook-token": "token-two\n", "api-tokens": API_B})
    assert reloader.check() is True
    (token, tokens), = applied
    assert token == "token-two" and [(t.token, t.scopes) for t in tokens] == [("b" * 20, frozenset({"read"}))]
    assert reloader.check() is False  # seen once

    volume.update({"webhook-token": "\n", "api-tokens": API_B})  # an empty token: refused
    assert reloader.check() is False and len(applied) == 1 and reloader.refused == 1
    assert metrics.registry.get_sample_value("tailguard_faults_total", {"component": "secrets"}) == 1
    assert reloader.check() is False and reloader.refused == 1  # not refused again until the next change

    volume.update({"webhook-token": "token-three\n", "api-tokens": API_A})
    assert reloader.check() is True and applied[-1][0] == "token-three"
