"""The chart's operator pieces: the API tokens Secret (generated, stable, readable by the daemon),
HTTPS from a TLS Secret, and the control ConfigMap the daemon reads freezes from."""
from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest
import yaml

from daemon.common.config import ApiSettings, api_tokens, load_settings
from tests.support import helm_render as hr

SA = f"{hr.RELEASE}-tailguard"


def _config(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return dict(yaml.safe_load(hr.one(objects, "ConfigMap", f"{SA}-config")["data"]["config.yaml"]))


def _container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return dict(hr.one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0])


def test_generated_api_tokens_are_read_by_the_daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One `admin` token with read and write, a different secret per install, mounted where config points."""
    monkeypatch.delenv("TAILGUARD_API_TOKENS", raising=False)
    objects = hr.render()
    secret = hr.one(objects, "Secret", f"{SA}-api")
    path = tmp_path / "tokens.yaml"
    path.write_bytes(base64.b64decode(secret["data"]["tokens.yaml"]))
    (entry,) = api_tokens(ApiSettings(tokensFile=path))
    assert entry.name == "admin" and entry.scopes == {"read", "write"} and len(entry.token) == 48
    other = hr.one(hr.render(), "Secret", f"{SA}-api")["data"]["tokens.yaml"]
    assert other != secret["data"]["tokens.yaml"]
    config = _config(objects)
    mounts = {m["mountPath"] for m in _container(objects)["volumeMounts"]}
    assert str(Path(config["api"]["tokensFile"]).parent) in mounts
    assert config["api"]["externalUrl"] == f"http://{SA}.{hr.NAMESPACE}.svc:8080"


def test_tls_from_a_secret(tmp_path: Path) -> None:
    """tls.enabled mounts the Secret, points listen.tls at it and probes over HTTPS; without a Secret it fails."""
    objects = hr.render({"tls": {"enabled": True, "existingSecret": "tailguard-cert"}})
    config = _config(objects)
    assert config["listen"]["tls"] == {"certFile": "/var/run/secrets/tailguard-tls/tls.crt",
                                       "keyFile": "/var/run/secrets/tailguard-tls/tls.key"}
    assert config["api"]["externalUrl"].startswith("https://")
    container = _container(objects)
    assert {m["mountPath"] for m in container["volumeMounts"]} >= {"/var/run/secrets/tailguard-tls"}
    volumes = {v["name"]: v for v in hr.one(objects, "Deployment")["spec"]["template"]["spec"]["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == "tailguard-cert"
    assert all(container[p]["httpGet"]["scheme"] == "HTTPS" for p in ("startupProbe", "livenessProbe", "readinessProbe"))
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    assert load_settings(tmp_path / "config.yaml").listen.tls is not None
    with pytest.raises(Exception, match="tls.enabled needs tls.existingSecret"):
        hr.render({"tls": {"enabled": True}})


def test_control_configmap_is_rendered_named_in_config_and_readable() -> None:
    objects = hr.render()
    control = hr.one(objects, "ConfigMap", f"{SA}-control")
    assert control["data"] == {"freeze": "false", "freezeTargets": "", "freezeReason": ""}
    assert _config(objects)["control"] == {"configMap": f"{SA}-control", "namespace": hr.NAMESPACE,
                                           "pollIntervalSeconds": 5}
    off = hr.render({"control": {"enabled": False}})
    assert hr.find(off, "ConfigMap", f"{SA}-control") == [] and "control" not in _config(off)
