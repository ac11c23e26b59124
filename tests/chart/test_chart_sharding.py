"""The chart's sharding values: off by default (the rendered config has no sharding block and the
Lease Role names the one Lease), more than one shard renders the setting and lets the replicas list
and write the shard Leases, and the schema refuses shards > 1 without PostgreSQL or leader election."""
from __future__ import annotations

from typing import Any

import pytest
import yaml
from helm_python.errors import HelmValuesError

from daemon.common.config import Settings
from tests.support import helm_render as hr

POSTGRES: dict[str, Any] = {"journal": {"backend": "postgres", "postgres": {"existingSecret": "tailguard-pg-app"}}}


def _config(objects: list[dict[str, Any]]) -> dict[str, Any]:
    cm = next(o for o in objects if o["kind"] == "ConfigMap" and "config.yaml" in o.get("data", {}))
    return yaml.safe_load(cm["data"]["config.yaml"])  # type: ignore[no-any-return]


def _lease_rules(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    role = next(o for o in objects if o["kind"] == "Role" and o["metadata"]["name"].endswith("-leader-election"))
    return [r for r in role["rules"] if r["resources"] == ["leases"]]


def test_one_shard_by_default_renders_todays_config_and_role() -> None:
    objects = hr.render()
    assert "sharding" not in _config(objects)
    assert all("list" not in r["verbs"] for r in _lease_rules(objects))


def test_shards_render_the_setting_and_the_shard_lease_rules() -> None:
    objects = hr.render({"replicas": 3, **POSTGRES, "sharding": {"shards": 16}})
    config = _config(objects)
    assert config["sharding"] == {"shards": 16}
    settings = Settings.model_validate(config)  # what `tailguard run` reads: it fits together
    assert settings.sharding.shards == 16
    assert {"verbs": ["get", "list", "update"], "apiGroups": ["coordination.k8s.io"], "resources": ["leases"]} in \
        _lease_rules(objects)


@pytest.mark.parametrize("values", [
    {"sharding": {"shards": 4}},  # the default journal: SQLite
    {**POSTGRES, "leaderElection": {"enabled": False}, "sharding": {"shards": 4}},
    {**POSTGRES, "sharding": {"shards": 0}},
], ids=["sqlite", "no-election", "zero"])
def test_the_schema_refuses_shards_that_cannot_run(values: dict[str, Any]) -> None:
    with pytest.raises(HelmValuesError) as excinfo:
        hr.render(values)
    assert any(where in str(excinfo.value) for where in ("/journal/backend", "/leaderElection/enabled",
                                                        "/sharding/shards"))
