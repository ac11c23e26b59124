"""The chart's journal backends (SQLite on a PVC or in an emptyDir, PostgreSQL shared by replicas),
Alertmanager silences and outcome notifications: what each mode renders, what the schema refuses,
what NOTES.txt says, and that the daemon reads the config and the mounted Secrets as rendered."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

from daemon.common.config import Settings, journal_store, load_settings
from daemon.common.metrics import Metrics
from daemon.workers.notifier import Notifier, read_url_file
from tests.support import helm_render as hr

SA = f"{hr.RELEASE}-tailguard"
DSN = "postgresql://tailguard:s3cret@tailguard-pg-rw.db:5432/app?sslmode=verify-full"
POSTGRES: dict[str, Any] = {"replicas": 3,
                            "journal": {"backend": "postgres", "postgres": {"existingSecret": "tailguard-pg-app"}}}
NOTIFICATIONS: list[dict[str, Any]] = [
    {"existingSecret": "tailguard-slack", "format": "slack", "events": ["escalated", "failed"]},
    {"existingSecret": "tailguard-pager", "secretKey": "webhook", "timeoutSeconds": 2.5, "maxAttempts": 6},
]
# What the Secrets named above hold, by (Secret, key).
SECRET_DATA = {("tailguard-pg-app", "uri"): DSN,
               ("tailguard-slack", "url"): "https://hooks.slack.example/services/T0/B0/XYZ\n",
               ("tailguard-pager", "webhook"): "https://pager.example/hook/abc"}


def _deployment(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return hr.one(objects, "Deployment")


def _pod(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return dict(_deployment(objects)["spec"]["template"]["spec"])


def _mounts(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    (container,) = _pod(objects)["containers"]
    return {m["name"]: m for m in container["volumeMounts"]}


def _volumes(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in _pod(objects)["volumes"]}


def _config(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return dict(yaml.safe_load(hr.one(objects, "ConfigMap", f"{SA}-config")["data"]["config.yaml"]))


def _notes(values: dict[str, Any]) -> str:
    return hr.render_files(values)["tailguard/templates/NOTES.txt"]


def daemon_settings(objects: list[dict[str, Any]], root: Path) -> Settings:
    """config.yaml as the pod sees it, read by the daemon's own loader: the Secret volumes the
    Deployment mounts are written under `root` (from SECRET_DATA, key -> path as projected) and the
    config's paths are moved there with them.

    Raises:
        KeyError: a mounted Secret key that SECRET_DATA does not know.
    """
    volumes, mounts = _volumes(objects), _mounts(objects)
    text = hr.one(objects, "ConfigMap", f"{SA}-config")["data"]["config.yaml"]
    for name, mount in mounts.items():
        volume = volumes[name]
        sources = ([{"secret": {"name": volume["secret"]["secretName"], "items": volume["secret"]["items"]}}]
                   if "secret" in volume else volume.get("projected", {}).get("sources", []))
        for source in sources:
            for item in source["secret"]["items"]:
                path = root / mount["mountPath"].lstrip("/") / item["path"]
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(SECRET_DATA.get((source["secret"]["name"], item["key"]), "x"))
        if sources:
            assert mount.get("readOnly") is True, f"Secret volume {name} is mounted writable"
            text = text.replace(mount["mountPath"] + "/", f"{root}{mount['mountPath']}/")
    config = root / "etc" / "tailguard" / "config.yaml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(text)
    return load_settings(config)


# ---- journal: SQLite on a PVC (default), SQLite in an emptyDir, PostgreSQL -------------------------


def test_default_is_one_replica_with_sqlite_on_a_pvc_and_recreate(tmp_path: Path) -> None:
    """Defaults: 1 replica, the SQLite file on a kept RWO PVC mounted at the journal path, strategy
    Recreate (two pods cannot mount the file), leader election still on, a PDB that never blocks a drain."""
    objects = hr.render()
    deployment = _deployment(objects)
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    pvc = hr.one(objects, "PersistentVolumeClaim", f"{SA}-journal")
    assert pvc["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert _volumes(objects)["journal"]["persistentVolumeClaim"] == {"claimName": f"{SA}-journal"}
    config = _config(objects)
    assert config["journal"] == {"backend": "sqlite", "path": "/var/lib/tailguard/journal.db", "maxPending": 100000,
                                 "maxHistoryRows": 100000}
    assert str(Path(config["journal"]["path"]).parent) == _mounts(objects)["journal"]["mountPath"]
    assert config["leaderElection"]["enabled"] is True
    assert hr.one(objects, "PodDisruptionBudget")["spec"]["maxUnavailable"] >= deployment["spec"]["replicas"]
    settings = daemon_settings(objects, tmp_path)
    assert journal_store(settings.journal) == Path("/var/lib/tailguard/journal.db")


def test_sqlite_without_persistence_uses_an_emptydir_and_rolls() -> None:
    """persistence off: no PVC, the journal in an emptyDir, and a surge-first RollingUpdate (each pod has its own file)."""
    objects = hr.render({"journal": {"persistence": {"enabled": False}}})
    assert hr.find(objects, "PersistentVolumeClaim") == []
    assert "emptyDir" in _volumes(objects)["journal"]
    assert _deployment(objects)["spec"]["strategy"] == {
        "type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    assert _config(objects)["journal"]["backend"] == "sqlite"


@pytest.mark.parametrize("values", [
    {"replicas": 2},
    {"replicas": 2, "journal": {"persistence": {"enabled": False}}},
    {"replicas": 5, "journal": {"backend": "sqlite", "persistence": {"enabled": True}}},
], ids=["pvc", "emptydir", "explicit-sqlite"])
def test_schema_refuses_several_replicas_on_sqlite(values: dict[str, Any]) -> None:
    """replicas > 1 with sqlite is refused by values.schema.json, naming both ways out: replicas 1 or postgres."""
    with pytest.raises(helm.HelmValuesError) as excinfo:
        hr.render(values)
    message = str(excinfo.value)
    assert f"at '/replicas': maximum: got {values['replicas']}, want 1" in message
    assert "at '/journal/backend': value must be 'postgres'" in message


@pytest.mark.parametrize(("values", "message"), [
    ({"journal": {"backend": "postgres"}}, "at '/journal/postgres/existingSecret': minLength"),
    ({"journal": {"backend": "mysql"}}, "at '/journal/backend'"),
    ({"journal": {"postgres": {"secretKey": "a b"}}}, "at '/journal/postgres/secretKey'"),
    ({**POSTGRES, "leaderElection": {"enabled": False}}, "at '/leaderElection/enabled': value must be true"),
], ids=["postgres-without-secret", "unknown-backend", "bad-key", "replicas-without-leader-election"])
def test_schema_refuses_bad_journal_values(values: dict[str, Any], message: str) -> None:
    """postgres needs journal.postgres.existingSecret; several replicas keep leader election on."""
    with pytest.raises(helm.HelmValuesError) as excinfo:
        hr.render(values)
    assert message in str(excinfo.value)


def test_postgres_with_three_replicas(tmp_path: Path) -> None:
    """postgres, 3 replicas: the Secret's `uri` key mounted read-only as the config's dsnFile, no PVC
    (even with persistence left on), a surge-first RollingUpdate, leader election with its Lease
    Role; the daemon reads the DSN from the mounted file."""
    objects = hr.render(POSTGRES)
    deployment = _deployment(objects)
    assert deployment["spec"]["replicas"] == 3
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    assert hr.find(objects, "PersistentVolumeClaim") == []
    assert "emptyDir" in _volumes(objects)["journal"]  # the working directory only
    assert _volumes(objects)["journal-dsn"]["secret"] == {
        "secretName": "tailguard-pg-app", "items": [{"key": "uri", "path": "dsn"}]}
    mount = _mounts(objects)["journal-dsn"]
    assert mount["readOnly"] is True
    config = _config(objects)
    assert config["journal"] == {"backend": "postgres", "dsnFile": f"{mount['mountPath']}/dsn", "sharedPollSeconds": 1,
                                 "maxPending": 100000, "maxHistoryRows": 100000}
    assert config["leaderElection"]["enabled"] is True
    assert hr.one(objects, "Role", f"{SA}-leader-election")
    settings = daemon_settings(objects, tmp_path)
    assert settings.journal.backend == "postgres" and settings.leader_election.enabled
    assert journal_store(settings.journal) == DSN


def test_postgres_secret_key_is_configurable() -> None:
    """journal.postgres.secretKey picks another key of the Secret; it is still projected to `dsn`."""
    objects = hr.render({**POSTGRES, "journal": {**POSTGRES["journal"],
                                                 "postgres": {"existingSecret": "db", "secretKey": "dsn.txt"}}})
    assert _volumes(objects)["journal-dsn"]["secret"]["items"] == [{"key": "dsn.txt", "path": "dsn"}]


def test_postgres_poll_interval_reaches_the_daemon(tmp_path: Path) -> None:
    """journal.postgres.pollIntervalSeconds becomes the daemon's journal.sharedPollSeconds; 0 is refused."""
    values = {**POSTGRES, "journal": {**POSTGRES["journal"],
                                      "postgres": {"existingSecret": "tailguard-pg-app", "pollIntervalSeconds": 0.5}}}
    assert daemon_settings(hr.render(values), tmp_path).journal.shared_poll_seconds == 0.5
    values["journal"]["postgres"]["pollIntervalSeconds"] = 0
    with pytest.raises(helm.HelmValuesError, match="at '/journal/postgres/pollIntervalSeconds'"):
        hr.render(values)


@pytest.mark.parametrize(("values", "says", "not_says"), [
    ({}, ["Journal: SQLite on a PVC, tg-tailguard-journal (kept on uninstall), one replica.", "Recreate"],
     ["emptyDir", "PostgreSQL"]),
    ({"journal": {"persistence": {"existingClaim": "my-claim"}}}, ["Journal: SQLite on a PVC, my-claim"], []),
    ({"journal": {"persistence": {"enabled": False}}},
     ["Journal: SQLite in an emptyDir: history lost with the pod."], ["PVC", "PostgreSQL"]),
    (POSTGRES, ["Journal: PostgreSQL shared by 3 replicas", f"Secret {hr.NAMESPACE}/tailguard-pg-app, key uri"],
     ["SQLite"]),
    ({"replicas": 1, "journal": POSTGRES["journal"]}, ["Journal: PostgreSQL shared by 1 replica "], []),
], ids=["sqlite-pvc", "existing-claim", "sqlite-emptydir", "postgres", "postgres-one"])
def test_notes_say_which_journal_mode_runs(values: dict[str, Any], says: list[str], not_says: list[str]) -> None:
    """NOTES.txt names the journal mode: SQLite on a PVC, SQLite in an emptyDir (history lost with
    the pod), or PostgreSQL shared by N replicas."""
    notes = " ".join(_notes(values).split())  # lines are wrapped
    assert all(s in notes for s in says), notes
    assert not any(s in notes for s in not_says), notes


# ---- Alertmanager silences -------------------------------------------------------------------------


def test_alertmanager_url_reaches_the_daemon(tmp_path: Path) -> None:
    """alertmanager.url and timeoutSeconds are rendered when the url is set (and only then), and the
    daemon's settings read them; the chart's default timeout is the daemon's."""
    assert "alertmanager" not in _config(hr.render())
    assert hr.chart().values["alertmanager"]["timeoutSeconds"] == Settings().alertmanager.timeout_seconds
    objects = hr.render({"alertmanager": {"url": "http://alertmanager-operated.monitoring:9093", "timeoutSeconds": 1.5}})
    assert _config(objects)["alertmanager"] == {"url": "http://alertmanager-operated.monitoring:9093",
                                                "timeoutSeconds": 1.5}
    settings = daemon_settings(objects, tmp_path)
    assert (settings.alertmanager.url, settings.alertmanager.timeout_seconds) == (
        "http://alertmanager-operated.monitoring:9093", 1.5)


@pytest.mark.parametrize(("values", "message"), [
    ({"alertmanager": {"url": "alertmanager:9093"}}, "at '/alertmanager/url'"),
    ({"alertmanager": {"timeoutSeconds": 31}}, "at '/alertmanager/timeoutSeconds': maximum"),
    ({"alertmanager": {"timeoutSeconds": 0}}, "at '/alertmanager/timeoutSeconds': exclusiveMinimum"),
])
def test_schema_refuses_bad_alertmanager_values(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmValuesError) as excinfo:
        hr.render(values)
    assert message in str(excinfo.value)


def _egress_ports(objects: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    rules = hr.one(objects, "NetworkPolicy")["spec"]["egress"]
    return {p["port"]: rule for rule in rules for p in rule["ports"]}


def test_network_policy_lets_the_daemon_reach_optional_dependencies() -> None:
    """With the NetworkPolicy on, egress is opened to Alertmanager (9093, its pods in monitoring) when
    alertmanager.url is set, to PostgreSQL (5432) with the postgres backend and to receivers (443) with
    notifications; none of these is opened when unused."""
    off = _egress_ports(hr.render({"networkPolicy": {"enabled": True, "egress": {"enabled": True}}}))
    assert 9093 not in off and 5432 not in off
    objects = hr.render({**POSTGRES, "networkPolicy": {"enabled": True, "egress": {"enabled": True}},
                         "notifications": NOTIFICATIONS,
                         "alertmanager": {"url": "http://alertmanager-operated.monitoring:9093"}})
    egress = _egress_ports(objects)
    assert egress[9093]["to"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
                                   "podSelector": {"matchLabels": {"app.kubernetes.io/name": "alertmanager"}}}]
    assert egress[5432] == {"ports": [{"port": 5432, "protocol": "TCP"}]}  # any address: the database's is not known
    assert {"ports": [{"port": 443, "protocol": "TCP"}]} in hr.one(objects, "NetworkPolicy")["spec"]["egress"]
    narrowed = _egress_ports(hr.render({**POSTGRES, "networkPolicy": {"enabled": True, "egress": {"enabled": True,
        "postgres": {"to": [{"ipBlock": {"cidr": "10.8.0.0/16"}}]}}}}))
    assert narrowed[5432]["to"] == [{"ipBlock": {"cidr": "10.8.0.0/16"}}]


# ---- outcome notifications -----------------------------------------------------------------------------


def test_notifications_mount_each_secret_key_as_url_file(tmp_path: Path) -> None:
    """Each receiver's Secret key is projected read-only and named as its urlFile (default key `url`),
    with format, events, timeout and attempts passed through; the daemon's notifier reads the URLs
    from the mounted files."""
    objects = hr.render({"notifications": NOTIFICATIONS})
    sources = _volumes(objects)["notifications"]["projected"]["sources"]
    assert sources == [{"secret": {"name": "tailguard-slack", "items": [{"key": "url", "path": "receiver-0"}]}},
                       {"secret": {"name": "tailguard-pager", "items": [{"key": "webhook", "path": "receiver-1"}]}}]
    mount = _mounts(objects)["notifications"]
    assert mount["readOnly"] is True
    assert _config(objects)["notifications"] == [
        {"urlFile": f"{mount['mountPath']}/receiver-0", "format": "slack", "events": ["escalated", "failed"]},
        {"urlFile": f"{mount['mountPath']}/receiver-1", "timeoutSeconds": 2.5, "maxAttempts": 6}]
    settings = daemon_settings(objects, tmp_path)
    slack, pager = settings.notifications
    assert (slack.format, slack.events, slack.url) == ("slack", ["escalated", "failed"], None)
    assert (pager.timeout_seconds, pager.max_attempts) == (2.5, 6)
    Notifier(settings.notifications, Metrics())  # reads every urlFile, or raises ConfigError
    assert [read_url_file(s.url_file) for s in settings.notifications if s.url_file] == [
        "https://hooks.slack.example/services/T0/B0/XYZ", "https://pager.example/hook/abc"]


def test_no_notifications_no_volume() -> None:
    objects = hr.render()
    assert "notifications" not in _volumes(objects) and "notifications" not in _config(objects)


@pytest.mark.parametrize(("receiver", "message"), [
    ({"format": "slack"}, "missing property 'existingSecret'"),
    ({"existingSecret": "s", "url": "https://hooks.example/x"}, "additional properties 'url' not allowed"),
    ({"existingSecret": "s", "events": ["paged"]}, "at '/notifications/0/events/0'"),
    ({"existingSecret": "s", "format": "teams"}, "at '/notifications/0/format'"),
    ({"existingSecret": "s", "maxAttempts": 21}, "at '/notifications/0/maxAttempts': maximum"),
    ({"existingSecret": "s", "timeoutSeconds": 0}, "at '/notifications/0/timeoutSeconds': exclusiveMinimum"),
], ids=["no-secret", "plain-url", "unknown-event", "unknown-format", "attempts", "timeout"])
def test_schema_refuses_bad_receivers(receiver: dict[str, Any], message: str) -> None:
    """A receiver names an existing Secret (a URL in values would be a secret in plain sight) and the
    daemon's own formats, events and bounds."""
    with pytest.raises(helm.HelmValuesError) as excinfo:
        hr.render({"notifications": [receiver]})
    assert message in str(excinfo.value)
