"""Settings that cannot run fail before anything starts, in one line naming the field: checks across
sections at load (daemon/common/config.py validators), checks of secret files where the settings
are resolved (resolve_secrets)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from daemon.common.config import ConfigError, Settings, load_settings, resolve_secrets

KUBE = {"kubernetes": {"mode": "in-cluster"}}
TOKEN = "webhook-token-0123456789"


def _load(tmp_path: Path, raw: dict[str, Any]) -> Settings:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return load_settings(path)


@pytest.mark.parametrize(("raw", "message"), [
    ({"leaderElection": {"enabled": True}},
     "leaderElection.enabled needs kubernetes.mode in-cluster or kubeconfig"),
    ({"control": {"configMap": "tailguard-control"}},
     "control.configMap needs kubernetes.mode in-cluster or kubeconfig"),
    ({**KUBE, "leaderElection": {"enabled": True, "leaseDurationSeconds": 10, "renewDeadlineSeconds": 10}},
     "leaderElection.renewDeadlineSeconds (10) must be below leaseDurationSeconds (10): a leader must stop "
     "acting before its Lease can be taken"),
    ({**KUBE, "leaderElection": {"enabled": True, "renewDeadlineSeconds": 2}},
     "leaderElection.retryPeriodSeconds (2) must be below renewDeadlineSeconds (2)"),
    ({**KUBE, "sharding": {"shards": 4}},
     "sharding.shards (4) above 1 needs leaderElection.enabled (the shard Leases use its namespace and durations)"),
    ({**KUBE, "leaderElection": {"enabled": True}, "sharding": {"shards": 4}},
     "sharding.shards (4) above 1 needs the PostgreSQL journal (journal.backend: postgres): every replica reads "
     "the signals the others journaled"),
], ids=["election-without-kubernetes", "control-configmap-without-kubernetes", "renew-deadline", "retry-period",
        "shards-without-election", "shards-on-sqlite"])
def test_settings_that_do_not_fit_together_fail_at_load_in_one_line(tmp_path: Path, raw: dict[str, Any],
                                                                   message: str) -> None:
    """Each cross-section mistake fails load_settings (what `tailguard run` and the chart's rendered
    config go through) with exactly one line: the file, then the sentence naming the field."""
    with pytest.raises(ConfigError) as excinfo:
        _load(tmp_path, raw)
    assert str(excinfo.value) == f"{tmp_path / 'config.yaml'}: {message}"


def test_the_same_checks_hold_for_settings_built_in_code() -> None:
    """Settings built without a file (the lab, tests) are checked the same way."""
    with pytest.raises(ValueError, match="leaderElection.enabled needs kubernetes.mode"):
        Settings.model_validate({"leaderElection": {"enabled": True}})


@pytest.mark.parametrize("raw", [
    {**KUBE, "leaderElection": {"enabled": True}, "control": {"configMap": "c"}},
    {"kubernetes": {"mode": "kubeconfig"}, "leaderElection": {"enabled": True}},
    {"leaderElection": {"renewDeadlineSeconds": 20}},  # election off: its durations are not used
    {},
], ids=["in-cluster", "kubeconfig", "election-off", "defaults"])
def test_settings_that_fit_load(tmp_path: Path, raw: dict[str, Any]) -> None:
    assert isinstance(_load(tmp_path, raw), Settings)


def test_no_webhook_token_fails_where_secrets_are_resolved(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a token (file or env) the daemon refuses to start, unless unauthenticated webhooks are asked for."""
    monkeypatch.delenv("TAILGUARD_WEBHOOK_TOKEN", raising=False)
    monkeypatch.delenv("TAILGUARD_API_TOKENS", raising=False)
    with pytest.raises(ConfigError, match="^no webhook token: set webhook.tokenFile or TAILGUARD_WEBHOOK_TOKEN"):
        resolve_secrets(Settings())
    secrets = resolve_secrets(Settings.model_validate({"webhook": {"allowUnauthenticated": True}}))
    assert (secrets.webhook_token, secrets.api_tokens, secrets.tls) == (None, [], None)


def test_webhook_token_file_is_read_and_an_unreadable_one_names_the_file(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TAILGUARD_WEBHOOK_TOKEN", raising=False)
    monkeypatch.delenv("TAILGUARD_API_TOKENS", raising=False)
    (tmp_path / "token").write_text(TOKEN + "\n")
    assert resolve_secrets(_load(tmp_path, {"webhook": {"tokenFile": "token"}})).webhook_token == TOKEN
    with pytest.raises(ConfigError, match=f"^cannot read webhook token file {tmp_path / 'missing'}: "):
        resolve_secrets(_load(tmp_path, {"webhook": {"tokenFile": "missing"}}))


def test_an_api_token_equal_to_the_webhook_token_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TAILGUARD_WEBHOOK_TOKEN", TOKEN)
    monkeypatch.setenv("TAILGUARD_API_TOKENS", yaml.safe_dump([{"name": "ops", "token": TOKEN, "scopes": ["read"]}]))
    with pytest.raises(ConfigError, match="^an API token equals the webhook token: give Alertmanager and operators "
                                          "different secrets$"):
        resolve_secrets(Settings())
    monkeypatch.setenv("TAILGUARD_API_TOKENS", yaml.safe_dump(
        [{"name": "ops", "token": "another-secret-0123456789", "scopes": ["read"]}]))
    assert [t.name for t in resolve_secrets(Settings()).api_tokens] == ["ops"]


def test_a_tls_certificate_that_cannot_be_loaded_fails_before_the_daemon_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TAILGUARD_WEBHOOK_TOKEN", TOKEN)
    monkeypatch.delenv("TAILGUARD_API_TOKENS", raising=False)
    (tmp_path / "tls.crt").write_text("not a certificate")
    settings = _load(tmp_path, {"listen": {"tls": {"certFile": "tls.crt", "keyFile": "tls.key"}}})
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    with pytest.raises(ConfigError, match=f"^listen.tls: cannot load {cert} / {key}: "):
        resolve_secrets(settings)


def test_sharding_is_off_by_default_and_one_shard_is_todays_single_leader(tmp_path: Path) -> None:
    settings = _load(tmp_path, {})
    assert settings.sharding.shards == 1 and not settings.sharding.enabled
    on = _load(tmp_path, {**KUBE, "leaderElection": {"enabled": True},
                          "journal": {"backend": "postgres", "dsn": "postgresql://u@h/db"}, "sharding": {"shards": 8}})
    assert on.sharding.enabled and on.sharding.lease_prefix is None
