"""The Helm chart, rendered by the real Helm engine and checked against Kubernetes and CRD schemas.

RBAC is compared exactly with a rule set computed here from the values, so a template change that
grants one verb too many fails. Rules, dashboard queries and the Alertmanager snippet in NOTES.txt
go through promtool and amtool where those are installed.
"""

from __future__ import annotations

import base64
import copy
import json
import re
import shutil
import subprocess
import textwrap
import tomllib
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

from tests.support import helm_render as hr

REPO = hr.REPO
SA = f"{hr.RELEASE}-tailguard"

EXAMPLE_POLICY = {
    "name": "ranker-tail",
    "target": {
        "model": "ranker",
        "namespace": "serving",
        "triton": {"service": {"namespace": "serving", "name": "triton", "port": 8000}},
    },
    "triggers": [{"alert": {"name": "TritonTailLatencyHigh", "matchers": {"severity": "page"}}}],
    "actions": [
        {"type": "triton.rollback", "to": "previous"},
        {"type": "istio.shift_weights", "virtualService": {"namespace": "serving", "name": "ranker"},
         "set": {"v1": 100, "v2": 0}},
        {"type": "gateway.retune_timeout",
         "sink": {"kind": "istio", "virtualService": {"namespace": "serving", "name": "ranker"}}},
    ],
    "guards": {"cooldown": "10m", "dryRun": False},
    # alert-only: the daemon's loader requires a verify block
    "verify": {"query": 'max(nv_inference_request_summary_us{model="$model", quantile="0.999"})', "below": 500000},
}

# Values sets that together switch every template and branch on at least once.
CASES: dict[str, dict[str, Any]] = {
    "defaults": {},
    "everything-on": {
        "policies": [EXAMPLE_POLICY],
        "rbac": {"namespaces": ["serving", "models"]},
        "actions": {"istio": {"enabled": True}, "httproute": {"enabled": True},
                    "configmap": {"enabled": True, "names": ["ranker-limits"]},
                    "tritonDiscovery": {"enabled": True}, "scale": {"enabled": True}},
        "networkPolicy": {"enabled": True, "egress": {"enabled": True, "apiServer": {"cidrs": ["10.0.0.1/32"]}}},
        "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
        "prometheusRule": {"enabled": True},
        "dashboard": {"enabled": True},
        "image": {"digest": "sha256:" + "a" * 64},
    },
    "cluster-wide": {"rbac": {"clusterWide": True}, "actions": {"httproute": {"enabled": True}}},
    "existing-secret-and-policies": {
        "webhook": {"existingSecret": "am-token", "existingSecretKey": "bearer"},
        "api": {"existingSecret": "operator-tokens", "existingSecretKey": "tokens"},
        "existingPoliciesConfigMap": "gitops-policies",
    },
    "single-replica-persistent": {
        "replicas": 1, "leaderElection": {"enabled": False},
        "journal": {"persistence": {"enabled": True, "storageClassName": "fast"}},
        "actions": {"istio": {"enabled": False}},
        "podDisruptionBudget": {"enabled": False},
    },
    "sqlite-emptydir": {"journal": {"persistence": {"enabled": False}}},
    # Several replicas on one PostgreSQL journal, with every optional dependency the daemon can reach.
    "postgres-ha": {
        "replicas": 3,
        "journal": {"backend": "postgres", "postgres": {"existingSecret": "tailguard-pg-app"}},
        "alertmanager": {"url": "http://alertmanager-operated.monitoring:9093", "timeoutSeconds": 1.5},
        "notifications": [
            {"existingSecret": "tailguard-slack", "format": "slack", "events": ["escalated", "failed"]},
            {"existingSecret": "tailguard-pager", "secretKey": "webhook", "timeoutSeconds": 2, "maxAttempts": 6},
        ],
        "networkPolicy": {"enabled": True, "egress": {"enabled": True}},
    },
}


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    """Every case rendered once for the module (a render takes milliseconds, but there are many asserts)."""
    return {case: hr.render(values) for case, values in CASES.items()}


def _deployment(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return hr.one(objects, "Deployment")


def _container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (container,) = _deployment(objects)["spec"]["template"]["spec"]["containers"]
    return container


def _merged(values: dict[str, Any]) -> dict[str, Any]:
    return hr.chart().merge_values(values)


# ---- engine-level checks -------------------------------------------------------------


@pytest.mark.parametrize("kube_version", hr.KUBE_VERSIONS)
@pytest.mark.parametrize("case", ["defaults", "everything-on", "postgres-ha"])
def test_chart_lints_without_warnings(case: str, kube_version: str) -> None:
    """`helm lint --strict` finds nothing at warning level or above, on the oldest and newest Kubernetes."""
    report = hr.lint(CASES[case], kube_version=kube_version)
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert problems == [] and report["errors"] == []


@pytest.mark.slow
@pytest.mark.parametrize("kube_version", hr.KUBE_VERSIONS)
@pytest.mark.parametrize("case", list(CASES))
def test_builtin_objects_match_kubernetes_schema(rendered, case: str, kube_version: str) -> None:
    """Every built-in object validates strictly (no unknown fields) against the Kubernetes OpenAPI schema."""
    builtin = [o for o in rendered[case] if (o["apiVersion"], o["kind"]) not in hr.crd_validators()]
    assert builtin, "nothing rendered"
    errors = {f"{o['kind']}/{o['metadata']['name']}": hr.kubernetes_errors(o, kube_version) for o in builtin}
    assert {k: v for k, v in errors.items() if v} == {}


def test_custom_resources_match_crd_schemas(rendered) -> None:
    """ServiceMonitor and PrometheusRule validate strictly against the prometheus-operator CRDs."""
    custom = [o for o in rendered["everything-on"] if (o["apiVersion"], o["kind"]) in hr.crd_validators()]
    assert sorted(o["kind"] for o in custom) == ["PrometheusRule", "ServiceMonitor"]
    for obj in custom:
        assert hr.validation_errors(hr.crd_validators(), obj) == [], obj["kind"]


def test_optional_objects_are_off_by_default(rendered) -> None:
    """The default install renders no monitoring CRs, dashboard or ClusterRole; the journal's PVC
    (SQLite, one replica) and the NetworkPolicy are on by default."""
    kinds = {o["kind"] for o in rendered["defaults"]}
    assert kinds == {"ConfigMap", "Deployment", "NetworkPolicy", "PersistentVolumeClaim", "PodDisruptionBudget",
                     "Role", "RoleBinding", "Secret", "Service", "ServiceAccount"}


# ---- pod security and wiring ---------------------------------------------------------------


@pytest.mark.parametrize("case", list(CASES))
def test_pod_runs_as_restricted_non_root(rendered, case: str) -> None:
    """Pod and container security contexts meet the `restricted` Pod Security Standard and pin uid 10001."""
    pod = _deployment(rendered[case])["spec"]["template"]["spec"]
    container = _container(rendered[case])
    for ctx in (pod["securityContext"], container["securityContext"]):
        assert ctx["runAsNonRoot"] is True and ctx["runAsUser"] == 10001
        assert ctx["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert "hostNetwork" not in pod and "hostPID" not in pod


def test_only_tmp_and_journal_are_writable(rendered) -> None:
    """With a read-only root, the writable mounts are exactly /tmp and the journal directory."""
    container = _container(rendered["defaults"])
    writable = {m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")}
    assert writable == {"/tmp", "/var/lib/tailguard"}


def test_policies_are_mounted_as_a_directory(rendered) -> None:
    """The policies ConfigMap is a directory mount; a subPath would stop kubelet updates and hot reload."""
    mounts = {m["mountPath"]: m for m in _container(rendered["defaults"])["volumeMounts"]}
    assert "subPath" not in mounts["/etc/tailguard/policies"]


def test_probes_use_health_endpoints(rendered) -> None:
    """Liveness checks /healthz and readiness /readyz on the named http port 8080."""
    container = _container(rendered["defaults"])
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]


def test_pod_identity_comes_from_downward_api(rendered) -> None:
    """POD_NAME and POD_NAMESPACE (leader election identity) come from the downward API."""
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in _container(rendered["defaults"])["env"]}
    assert env == {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}


def test_command_matches_daemon_contract(rendered) -> None:
    """The container runs `tailguard run --config /etc/tailguard/config.yaml` via the image's entrypoint."""
    container = _container(rendered["defaults"])
    assert "command" not in container
    assert container["args"] == ["run", "--config", "/etc/tailguard/config.yaml"]
    assert container["image"] == f"ghcr.io/tailguard/tailguard:{hr.chart().metadata['appVersion']}"


def test_image_digest_wins_over_tag(rendered) -> None:
    """A digest pins the image immutably and replaces the tag."""
    assert _container(rendered["everything-on"])["image"] == "ghcr.io/tailguard/tailguard@sha256:" + "a" * 64


def _config(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return yaml.safe_load(hr.one(objects, "ConfigMap", f"{SA}-config")["data"]["config.yaml"])


@pytest.mark.parametrize("case", list(CASES))
def test_rendered_config_is_accepted_by_daemon(rendered, case: str, tmp_path: Path) -> None:
    """The daemon's own strict settings loader accepts config.yaml exactly as the chart renders it."""
    from daemon.common.config import load_settings

    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(_config(rendered[case])))
    settings = load_settings(path)
    assert settings.kubernetes.mode == "in-cluster"
    assert settings.leader_election.enabled is _merged(CASES[case])["leaderElection"]["enabled"]


def test_config_paths_point_at_mounts(rendered) -> None:
    """Every path in config.yaml lies under a volume mount that provides it."""
    config = _config(rendered["defaults"])
    mounts = {m["mountPath"] for m in _container(rendered["defaults"])["volumeMounts"]}
    assert str(Path(config["webhook"]["tokenFile"]).parent) in mounts
    assert config["policies"]["path"] in mounts
    assert str(Path(config["journal"]["path"]).parent) in mounts
    assert config["listen"] == {"host": "0.0.0.0", "port": 8080, "shutdownTimeoutSeconds": 10}
    assert config["leaderElection"]["leaseNamespace"] == hr.NAMESPACE


def test_webhook_bounds_and_shutdown_timeout_reach_the_daemon(tmp_path: Path) -> None:
    """The webhook bounds and the shutdown timeout are rendered into config.yaml, defaults and
    overrides alike, and the daemon's settings read them."""
    from daemon.common.config import load_settings

    for values, expected in (({}, (10.0, 10.0, 64)),
                             ({"shutdownTimeoutSeconds": 2.5, "terminationGracePeriodSeconds": 10,
                               "webhook": {"bodyReadTimeoutSeconds": 0.5, "maxConcurrentRequests": 1000000}},
                              (2.5, 0.5, 1000000))):
        path = tmp_path / "config.yaml"
        path.write_text(yaml.safe_dump(_config(hr.render(values))))
        settings = load_settings(path)
        assert (settings.listen.shutdown_timeout_seconds, settings.webhook.body_read_timeout_seconds,
                settings.webhook.max_concurrent_requests) == expected


@pytest.mark.parametrize(("values", "expected"), [
    ({}, {"max_signal_age_seconds": 600.0, "escalation_freeze_seconds": 3600.0, "queue_size": 10_000,
          "notification_queue_size": 1000, "max_pending": 100_000, "max_targets_per_window": 5,
          "window_seconds": 3600.0, "common_cause_targets": 3, "common_cause_share": None,
          "common_cause_span_seconds": 60.0, "quiet_hold_seconds": 15.0, "max_history_rows": 100_000,
          "max_crashes": 5,
          "crash_window_seconds": 300.0, "repin_escalate_after": 3, "repin_window_seconds": 3600.0}),
    ({"executor": {"maxSignalAgeSeconds": 2.5, "escalationFreezeSeconds": 86400, "queueSize": 1_000_000,
                   "notificationQueueSize": 1, "repinEscalateAfter": 5, "repinWindowSeconds": 7200.5},
      "journal": {"maxPending": 5_000_000},
      "blastRadius": {"maxTargetsPerWindow": 3, "windowSeconds": 1800, "commonCauseTargets": 5,
                      "commonCauseShare": 0.25, "commonCauseSpanSeconds": 30.5}},
     {"max_signal_age_seconds": 2.5, "escalation_freeze_seconds": 86400.0, "queue_size": 1_000_000,
      "notification_queue_size": 1, "max_pending": 5_000_000, "max_targets_per_window": 3,
      "window_seconds": 1800.0, "common_cause_targets": 5, "common_cause_share": 0.25,
      "common_cause_span_seconds": 30.5, "repin_escalate_after": 5, "repin_window_seconds": 7200.5}),
    # an explicit null (off) passes the schema; Helm drops the key and the template renders null
    ({"blastRadius": {"maxTargetsPerWindow": None, "commonCauseShare": None}},
     {"max_targets_per_window": None, "common_cause_share": None}),
], ids=["defaults", "overrides", "null-is-off"])
def test_executor_journal_and_blast_radius_settings_reach_the_daemon(
        values: dict[str, Any], expected: dict[str, Any], tmp_path: Path) -> None:
    """executor.*, journal.maxPending and blastRadius.* are rendered into config.yaml (large numbers as
    plain decimals, not 1e+06), and the daemon's strict settings read them with the chart's defaults."""
    from daemon.common.config import Settings, load_settings

    path = tmp_path / "config.yaml"
    path.write_text(hr.one(hr.render(values), "ConfigMap", f"{SA}-config")["data"]["config.yaml"])
    settings = load_settings(path)
    assert isinstance(settings, Settings)
    ex, br = settings.executor, settings.blast_radius
    got = {"max_signal_age_seconds": ex.max_signal_age_seconds,
           "escalation_freeze_seconds": ex.escalation_freeze_seconds, "queue_size": ex.queue_size,
           "notification_queue_size": ex.notification_queue_size, "max_pending": settings.journal.max_pending,
           "max_targets_per_window": br.max_targets_per_window, "window_seconds": br.window_seconds,
           "common_cause_targets": br.common_cause_targets, "common_cause_share": br.common_cause_share,
           "common_cause_span_seconds": br.common_cause_span_seconds, "quiet_hold_seconds": br.quiet_hold_seconds,
           "max_history_rows": settings.journal.max_history_rows, "max_crashes": settings.loops.max_crashes,
           "crash_window_seconds": settings.loops.crash_window_seconds,
           "repin_escalate_after": ex.repin_escalate_after, "repin_window_seconds": ex.repin_window_seconds}
    assert {k: got[k] for k in expected} == expected
    assert all(type(got[k]) is type(v) for k, v in expected.items())


def test_chart_defaults_are_the_daemon_defaults() -> None:
    """The chart's executor (repinEscalateAfter and repinWindowSeconds among them), journal.maxPending,
    blastRadius and loops defaults are the daemon's own."""
    from daemon.common.config import BlastRadiusSettings, ExecutorSettings, JournalSettings, LoopSettings

    values = hr.chart().values
    for section, model in ((values["executor"], ExecutorSettings()), (values["blastRadius"], BlastRadiusSettings()),
                           (values["loops"], LoopSettings())):
        defaults = model.model_dump(by_alias=True)
        assert {k: defaults[k] for k in section} == section
    # The tug of war's escalation is tunable from the chart (#42), not left to the daemon's defaults.
    assert {"repinEscalateAfter", "repinWindowSeconds"} <= set(values["executor"])
    assert values["journal"]["maxPending"] == JournalSettings().max_pending
    assert values["journal"]["maxHistoryRows"] == JournalSettings().max_history_rows


def test_shutdown_fits_in_the_grace_period() -> None:
    """The defaults leave room; the hand-back of the Lease counts only with leader election."""
    assert _deployment(hr.render({}))["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 30
    hr.render({"shutdownTimeoutSeconds": 24})  # 24 + 2 x 2 + 1 = 29 < 30
    hr.render({"replicas": 1, "leaderElection": {"enabled": False}, "shutdownTimeoutSeconds": 29})


def test_state_configmap_in_config_is_the_one_rbac_grants() -> None:
    """The daemon writes the ConfigMap the config names, and the leader-election Role names the same one."""
    for values, expected in (({}, "tailguard-state"), ({"leaderElection": {"stateConfigMap": "tg-x"}}, "tg-x")):
        objects = hr.render(values)
        name = _config(objects)["leaderElection"]["stateConfigMap"]
        assert name == expected
        grants = rendered_rbac(objects)
        assert (hr.NAMESPACE, "", "configmaps", ("get", "update"), (name,)) in grants


def _checksum(values: dict[str, Any]) -> str:
    return _deployment(hr.render(values))["spec"]["template"]["metadata"]["annotations"]["checksum/config"]


def test_config_change_rolls_pods_but_policy_change_does_not() -> None:
    """The checksum annotation follows config.yaml only: policies are hot-reloaded without restarts."""
    base = _checksum({})
    assert _checksum({"log": {"level": "debug"}}) != base
    assert _checksum({"policies": [EXAMPLE_POLICY]}) == base


def test_policies_render_one_file_each_and_parse() -> None:
    """Each policy in values becomes <name>.yaml, and the daemon's strict policy model accepts it."""
    from policies.schema import Policy

    second = copy.deepcopy(EXAMPLE_POLICY) | {"name": "scorer-tail"}
    objects = hr.render({"policies": [EXAMPLE_POLICY, second]})
    data = hr.one(objects, "ConfigMap", f"{SA}-policies")["data"]
    assert sorted(data) == ["ranker-tail.yaml", "scorer-tail.yaml"]
    assert yaml.safe_load(data["ranker-tail.yaml"]) == EXAMPLE_POLICY
    for text in data.values():
        Policy.model_validate(yaml.safe_load(text))


def test_policy_verify_and_approval_pass_the_schema() -> None:
    """Every top-level field of the daemon's Policy (verify, approval, approvalTimeoutSeconds too) is
    accepted by values.schema.json and rendered as given."""
    from policies.schema import Policy

    policy = EXAMPLE_POLICY | {"verify": {"query": 'max(nv_inference_request_summary_us{model="$model"})',
                                          "below": 500000, "for": "60s", "within": "3m"},
                               "approval": "required", "approvalTimeoutSeconds": "1h"}
    data = hr.one(hr.render({"policies": [policy]}), "ConfigMap", f"{SA}-policies")["data"]
    assert yaml.safe_load(data["ranker-tail.yaml"]) == policy
    Policy.model_validate(policy)
    schema_fields = set(hr.chart().schema["properties"]["policies"]["items"]["properties"])
    assert schema_fields == {f.alias or n for n, f in Policy.model_fields.items()}


def test_existing_secret_and_policies_are_used(rendered) -> None:
    """With existing Secret and ConfigMap the chart renders neither and mounts the given ones."""
    objects = rendered["existing-secret-and-policies"]
    assert hr.find(objects, "Secret") == []
    assert hr.find(objects, "ConfigMap", f"{SA}-policies") == []
    volumes = {v["name"]: v for v in _deployment(objects)["spec"]["template"]["spec"]["volumes"]}
    assert volumes["policies"]["configMap"]["name"] == "gitops-policies"
    assert volumes["webhook-token"]["secret"] == {
        "secretName": "am-token", "items": [{"key": "bearer", "path": "token"}]}
    assert volumes["api-tokens"]["secret"] == {
        "secretName": "operator-tokens", "items": [{"key": "tokens", "path": "tokens.yaml"}]}


def test_generated_token_is_random_and_strong() -> None:
    """Without an existing Secret the chart generates a 48-character alphanumeric token, different per install."""
    tokens = [base64.b64decode(hr.one(hr.render(), "Secret", f"{SA}-webhook")["data"]["token"]).decode() for _ in range(2)]
    assert all(re.fullmatch(r"[A-Za-z0-9]{48}", t) for t in tokens)
    assert tokens[0] != tokens[1]


def test_upgrade_keeps_the_token_already_in_the_cluster() -> None:
    """`lookup` finds the generated Secret on upgrade and keeps its token, so Alertmanager's copy stays valid."""
    kept = base64.b64encode(b"token-from-first-install").decode()
    secret = {"apiVersion": "v1", "kind": "Secret", "data": {"token": kept},
              "metadata": {"name": f"{SA}-webhook", "namespace": hr.NAMESPACE}}
    with hr.apiserver_with([secret]) as cluster:
        assert hr.one(hr.render_against(cluster), "Secret", f"{SA}-webhook")["data"]["token"] == kept


def test_upgrade_generates_a_token_when_the_cluster_has_none() -> None:
    """When the Secret is not in the cluster (first install, or it was deleted) a fresh token is generated."""
    with hr.apiserver_with([]) as cluster:
        token = base64.b64decode(hr.one(hr.render_against(cluster), "Secret", f"{SA}-webhook")["data"]["token"]).decode()
    assert re.fullmatch(r"[A-Za-z0-9]{48}", token)


def test_persistent_journal_uses_a_kept_pvc(rendered) -> None:
    """journal.persistence renders a PVC that survives uninstall and mounts it at the journal path."""
    objects = rendered["single-replica-persistent"]
    pvc = hr.one(objects, "PersistentVolumeClaim")
    assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert pvc["spec"]["storageClassName"] == "fast"
    volumes = {v["name"]: v for v in _deployment(objects)["spec"]["template"]["spec"]["volumes"]}
    assert volumes["journal"] == {"name": "journal", "persistentVolumeClaim": {"claimName": pvc["metadata"]["name"]}}


# ---- RBAC: exactly what the enabled actions need ------------------------------------------------


def expected_rbac(values: dict[str, Any]) -> set[tuple]:
    """The least-privilege grant, computed independently of the templates.

    Returns:
        {(scope, apiGroup, resource, verbs, resourceNames)}, scope being a namespace or "cluster".
    """
    v = _merged(values)
    if not v["rbac"]["create"]:
        return set()
    actions = v["actions"]
    rules = {("", "events", ("create", "patch"), ())}
    if actions["istio"]["enabled"]:
        rules.add(("networking.istio.io", "virtualservices", ("get", "patch", "update"), ()))
    if actions["httproute"]["enabled"]:
        rules.add(("gateway.networking.k8s.io", "httproutes", ("get", "patch"), ()))
    if actions["configmap"]["enabled"]:
        rules.add(("", "configmaps", ("get", "patch"), tuple(sorted(actions["configmap"]["names"]))))
    if actions["tritonDiscovery"]["enabled"]:
        rules.add(("discovery.k8s.io", "endpointslices", ("list", "watch"), ()))
    if actions["scale"]["enabled"]:
        rules.add(("apps", "deployments", ("get", "patch"), ()))
        rules.add(("autoscaling", "horizontalpodautoscalers", ("get", "list", "patch"), ()))
    scopes = ["cluster"] if v["rbac"]["clusterWide"] else (v["rbac"]["namespaces"] or [hr.NAMESPACE])
    grant = {(scope, *rule) for scope in scopes for rule in rules}
    le = v["leaderElection"]
    if le["enabled"]:
        lease_ns = le["leaseNamespace"] or hr.NAMESPACE
        grant.add((lease_ns, "coordination.k8s.io", "leases", ("create",), ()))
        grant.add((lease_ns, "coordination.k8s.io", "leases", ("get", "update"), (le["leaseName"],)))
        state = le["stateConfigMap"] or f"{le['leaseName']}-state"
        grant.add((lease_ns, "", "configmaps", ("create",), ()))
        grant.add((lease_ns, "", "configmaps", ("get", "update"), (state,)))
    if v["control"]["enabled"]:  # the operators' freeze switch: read only
        grant.add((hr.NAMESPACE, "", "configmaps", ("get",), (f"{SA}-control",)))
    return grant


def rendered_rbac(objects: list[dict[str, Any]]) -> set[tuple]:
    """What the rendered (Cluster)Roles grant to the release's ServiceAccount, one tuple per group/resource."""
    roles = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o
             for o in objects if o["kind"] in ("Role", "ClusterRole")}
    grant = set()
    for binding in (o for o in objects if o["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": SA, "namespace": hr.NAMESPACE}]
        ref = binding["roleRef"]
        ns = binding["metadata"].get("namespace") if ref["kind"] == "Role" else None
        role = roles.pop((ref["kind"], ns, ref["name"]))  # KeyError: binding to a role not rendered
        for rule in role["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    grant.add((ns or "cluster", group, resource, tuple(sorted(rule["verbs"])),
                               tuple(sorted(rule.get("resourceNames", [])))))
    assert roles == {}, "roles without a binding"
    return grant


RBAC_CASES = {
    **{name: values for name, values in CASES.items()},
    "no-actions": {"actions": {"istio": {"enabled": False}}},
    "lease-elsewhere": {"leaderElection": {"leaseNamespace": "tailguard-system", "leaseName": "tg-leader"}},
    "state-configmap-named": {"leaderElection": {"stateConfigMap": "tg-shared-state"}},
    "rbac-off": {"rbac": {"create": False}},
    "cluster-wide-all": {"rbac": {"clusterWide": True, "namespaces": ["ignored"]},
                         "actions": {"configmap": {"enabled": True, "names": ["b", "a"]},
                                     "tritonDiscovery": {"enabled": True}, "scale": {"enabled": True}}},
    "scale-only": {"actions": {"istio": {"enabled": False}, "scale": {"enabled": True}}},
}


@pytest.mark.parametrize("case", list(RBAC_CASES))
def test_rbac_grants_exactly_what_enabled_actions_need(case: str) -> None:
    """The rendered RBAC equals the least-privilege set computed from the values: nothing more, nothing less."""
    values = RBAC_CASES[case]
    assert rendered_rbac(hr.render(values)) == expected_rbac(values)


def test_rbac_never_uses_wildcards() -> None:
    """No rule anywhere uses '*' for groups, resources or verbs."""
    objects = hr.render(RBAC_CASES["cluster-wide-all"]) + hr.render(CASES["everything-on"])
    rules = [r for o in objects if o["kind"] in ("Role", "ClusterRole") for r in o["rules"]]
    assert rules and not any("*" in r[k] for r in rules for k in ("apiGroups", "resources", "verbs"))


def test_cluster_wide_role_is_named_per_namespace(rendered) -> None:
    """The ClusterRole carries the release namespace so two releases named alike do not collide."""
    role = hr.one(rendered["cluster-wide"], "ClusterRole")
    assert role["metadata"]["name"] == f"{hr.NAMESPACE}-{SA}"
    assert hr.find(rendered["cluster-wide"], "Role", SA) == []


# ---- network and monitoring ----------------------------------------------------------------------


def _release_namespace_peer() -> dict[str, Any]:
    return {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": hr.NAMESPACE}}}


def test_network_policy_admits_only_configured_peers(rendered) -> None:
    """Ingress reaches only port http from the Alertmanager and Prometheus peers given in values and
    the operators' namespace (by default the release's)."""
    policy = hr.one(rendered["everything-on"], "NetworkPolicy")
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    (ingress,) = policy["spec"]["ingress"]
    peers = _merged({})["networkPolicy"]["ingress"]
    assert ingress["from"] == peers["alertmanager"] + peers["prometheus"] + [_release_namespace_peer()]
    assert ingress["ports"] == [{"port": "http", "protocol": "TCP"}]


def test_default_install_admits_alertmanager_prometheus_and_the_operators_only(rendered) -> None:
    """On by default: Ingress only (egress is opt-in), from Alertmanager's and Prometheus's pods in
    `monitoring` and from the release's namespace, to port http; nothing else reaches the daemon."""
    policy = hr.one(rendered["defaults"], "NetworkPolicy")
    assert policy["spec"]["policyTypes"] == ["Ingress"] and "egress" not in policy["spec"]
    assert policy["spec"]["podSelector"]["matchLabels"] == _deployment(rendered["defaults"])["spec"]["selector"][
        "matchLabels"]
    (ingress,) = policy["spec"]["ingress"]
    names = [(p.get("namespaceSelector", {}).get("matchLabels", {}).get("kubernetes.io/metadata.name"),
              p.get("podSelector", {}).get("matchLabels", {}).get("app.kubernetes.io/name")) for p in ingress["from"]]
    assert names == [("monitoring", "alertmanager"), ("monitoring", "prometheus"), (hr.NAMESPACE, None)]
    assert ingress["ports"] == [{"port": "http", "protocol": "TCP"}]


def test_network_policy_selectors_are_configurable() -> None:
    """Each group of peers is its own value: Alertmanager elsewhere, operators in two namespaces, one
    more peer; and with every group emptied no rule is rendered (an empty `from` would admit anyone)."""
    elsewhere = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "observability"}},
                  "podSelector": {"matchLabels": {"app": "am"}}}]
    ops = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": n}}} for n in ("sre", "oncall")]
    extra = [{"ipBlock": {"cidr": "10.1.0.0/16"}}]
    policy = hr.one(hr.render({"networkPolicy": {"ingress": {"alertmanager": elsewhere, "operators": ops,
                                                             "from": extra}}}), "NetworkPolicy")
    (ingress,) = policy["spec"]["ingress"]
    assert ingress["from"] == elsewhere + _merged({})["networkPolicy"]["ingress"]["prometheus"] + ops + extra
    none = hr.one(hr.render({"networkPolicy": {"ingress": {"alertmanager": [], "prometheus": [], "operators": []}}}),
                  "NetworkPolicy")
    assert none["spec"]["ingress"] == []  # deny all ingress, never a rule without `from`
    assert hr.find(hr.render({"networkPolicy": {"enabled": False}}), "NetworkPolicy") == []


def test_notes_state_the_network_policy_and_an_upgrade_note() -> None:
    """NOTES.txt names who may reach the daemon; on an upgrade it says the policy is now on by default
    and how to admit peers elsewhere; nothing about it when it is off."""
    def notes(values: dict[str, Any], **how: bool) -> str:
        files = hr.chart().render(values, name=hr.RELEASE, namespace=hr.NAMESPACE, **how)
        return next(text for path, text in files.items() if path.endswith("NOTES.txt"))

    installed = notes({}, is_install=True)
    assert "only these reach port http" in installed and "every pod of namespace tailguard" in installed
    assert '"app.kubernetes.io/name":"alertmanager"' in installed
    assert "UPGRADE NOTE" not in installed
    upgraded = notes({}, is_upgrade=True)
    assert "UPGRADE NOTE: the NetworkPolicy is on by default" in upgraded
    assert "networkPolicy.ingress.alertmanager / .prometheus / .operators" in upgraded
    assert "NetworkPolicy" not in notes({"networkPolicy": {"enabled": False}}, is_upgrade=True)


def test_network_policy_egress_covers_every_dependency(rendered) -> None:
    """Egress allows the API server, Prometheus, Triton and DNS, and nothing else."""
    egress = hr.one(rendered["everything-on"], "NetworkPolicy")["spec"]["egress"]
    ports = [sorted(p["port"] for p in rule["ports"]) for rule in egress]
    assert ports == [[443, 6443], [9090], [8000, 8002], [53, 53]]
    assert egress[0]["to"] == [{"ipBlock": {"cidr": "10.0.0.1/32"}}]
    assert all(rule.get("to") for rule in egress)


def test_service_monitor_scrapes_the_service(rendered) -> None:
    """The ServiceMonitor selects the chart's Service and scrapes /metrics on its named port."""
    objects = rendered["everything-on"]
    monitor, service = hr.one(objects, "ServiceMonitor"), hr.one(objects, "Service")
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def _promtool_check(groups: list[dict[str, Any]], tmp_path: Path) -> None:
    if not shutil.which("promtool"):
        pytest.skip("promtool not installed (Debian package prometheus)")
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": groups}))
    result = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.integration
def test_prometheus_rules_pass_promtool(rendered, tmp_path: Path) -> None:
    """Every alert expression and template in the PrometheusRule is accepted by promtool."""
    rule = hr.one(rendered["everything-on"], "PrometheusRule")
    alerts = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]}
    assert alerts == {"TailguardActionFailed", "TailguardPrometheusDown", "TailguardQueryFailing",
                      "TailguardTargetUnwatched", "TailguardDown", "TailguardNoLeader", "TailguardSplitBrain"}
    _promtool_check(rule["spec"]["groups"], tmp_path)


def test_leader_alerts_need_leader_election() -> None:
    """Without leader election there is no lease, so no leader alerts are rendered."""
    rule = hr.one(hr.render({"prometheusRule": {"enabled": True}, "replicas": 1,
                             "leaderElection": {"enabled": False}}), "PrometheusRule")
    alerts = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]}
    assert "TailguardNoLeader" not in alerts and "TailguardActionFailed" in alerts


def _dashboard(objects: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    cm = hr.one(objects, "ConfigMap", f"{SA}-dashboard")
    (text,) = cm["data"].values()
    return cm, json.loads(text)


def test_dashboard_shows_tail_quantiles_and_actions(rendered) -> None:
    """The Grafana dashboard plots P90/P95/P99/P99.9 per model and marks tailguard actions."""
    cm, dash = _dashboard(rendered["everything-on"])
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    quantiles = {m for e in exprs if "nv_inference_request_summary_us" in e
                 for m in re.findall(r'quantile="([0-9.]+)"', e)}
    assert quantiles == {"0.9", "0.95", "0.99", "0.999", "0.9999"}
    (radar,) = [p for p in dash["panels"] if p["title"].startswith("Tail radar")]
    assert radar["type"] == "bargauge" and all("by (model, version)" in t["expr"] for t in radar["targets"])
    assert "0.9999" in radar["description"]
    annotations = [a["expr"] for a in dash["annotations"]["list"]]
    assert any("tailguard_actions_total" in e for e in annotations)
    assert any("tailguard_decisions_total" in e for e in annotations)
    assert any("tailguard_detector_threshold" in t["expr"] for p in dash["panels"] for t in p.get("targets", []))


@pytest.mark.integration
def test_dashboard_queries_pass_promtool(rendered, tmp_path: Path) -> None:
    """Each dashboard query, with Grafana variables filled in, is valid PromQL."""
    _, dash = _dashboard(rendered["everything-on"])
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    exprs += [a["expr"] for a in dash["annotations"]["list"]]
    filled = [e.replace("$__rate_interval", "5m").replace("$model", "ranker") for e in exprs]
    assert not any("$" in e for e in filled)
    _promtool_check([{"name": "dashboard", "rules": [
        {"record": f"dashboard:query{i}", "expr": e} for i, e in enumerate(filled)]}], tmp_path)


# ---- NOTES.txt: the Alertmanager receiver snippet ---------------------------------------------------


@pytest.mark.integration
def test_notes_receiver_snippet_is_valid_alertmanager_config(tmp_path: Path) -> None:
    """The receiver pasted from NOTES.txt passes `amtool check-config` and points at the Service."""
    notes = hr.render_files({})["tailguard/templates/NOTES.txt"]
    block = re.search(r"^( +)receivers:\n(?:\1 .*\n|\n)+", notes, re.M)
    assert block, notes
    config = yaml.safe_load(textwrap.dedent(block.group(0)))
    webhook = config["receivers"][0]["webhook_configs"][0]
    assert webhook["url"] == f"http://{SA}.{hr.NAMESPACE}.svc:8080/api/v1/alerts"
    if not shutil.which("amtool"):
        pytest.skip("amtool not installed (Debian package prometheus-alertmanager)")
    token = tmp_path / "token"
    token.write_text("x")
    webhook["http_config"]["authorization"]["credentials_file"] = str(token)
    config["route"] = {"receiver": "tailguard"}
    path = tmp_path / "alertmanager.yml"
    path.write_text(yaml.safe_dump(config))
    result = subprocess.run(["amtool", "check-config", str(path)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stdout + result.stderr


# ---- values.schema.json and template checks reject bad values readably --------------------------------


@pytest.mark.parametrize(("values", "message"), [
    ({"replicas": "two"}, "at '/replicas': got string, want integer"),
    ({"replicas": 0}, "at '/replicas': minimum"),
    ({"actions": {"kafka": {"enabled": True}}}, "at '/actions': additional properties 'kafka' not allowed"),
    ({"leaderElection": {"leaseDurationSeconds": -15}}, "at '/leaderElection/leaseDurationSeconds': minimum"),
    ({"replicaCount": 3}, "additional properties 'replicaCount' not allowed"),
    ({"log": {"level": "verbose"}}, "at '/log/level'"),
    ({"prometheus": {"url": "prometheus:9090"}}, "at '/prometheus/url'"),
    ({"rbac": {"namespaces": ["Serving"]}}, "at '/rbac/namespaces/0'"),
    ({"policies": [{"name": "p", "target": {}, "triggers": [{}]}]}, "missing property 'actions'"),
    ({"replicas": 2, "leaderElection": {"enabled": False}}, "at '/leaderElection/enabled'"),
    ({"webhook": {"maxConcurrentRequests": 0}}, "at '/webhook/maxConcurrentRequests': minimum"),
    ({"webhook": {"bodyReadTimeoutSeconds": 0}}, "at '/webhook/bodyReadTimeoutSeconds': exclusiveMinimum"),
    ({"shutdownTimeoutSeconds": "10s"}, "at '/shutdownTimeoutSeconds': got string, want number"),
    ({"executor": {"queueSize": 0}}, "at '/executor/queueSize': minimum"),
    ({"executor": {"maxSignalAgeSeconds": 0}}, "at '/executor/maxSignalAgeSeconds': exclusiveMinimum"),
    ({"executor": {"workerz": 4}}, "at '/executor': additional properties 'workerz' not allowed"),
    ({"executor": {"repinEscalateAfter": 0}}, "at '/executor/repinEscalateAfter': minimum"),
    ({"executor": {"repinWindowSeconds": 0}}, "at '/executor/repinWindowSeconds': exclusiveMinimum"),
    ({"journal": {"maxPending": 1.5}}, "at '/journal/maxPending'"),
    ({"blastRadius": {"maxTargetsPerWindow": 0}}, "at '/blastRadius/maxTargetsPerWindow': minimum"),
    ({"blastRadius": {"commonCauseShare": 1}}, "at '/blastRadius/commonCauseShare': exclusiveMaximum"),
    ({"blastRadius": {"commonCauseTargets": "5"}}, "at '/blastRadius/commonCauseTargets'"),
    ({"blastRadius": {"commonCauseSpanSeconds": 0}}, "at '/blastRadius/commonCauseSpanSeconds': exclusiveMinimum"),
])
def test_schema_rejects_bad_values_with_the_field_path(values: dict[str, Any], message: str) -> None:
    """values.schema.json refuses the values at render time and the error names the offending field."""
    with pytest.raises(helm.HelmValuesError) as excinfo:
        hr.render(values)
    assert message in str(excinfo.value)


@pytest.mark.parametrize(("values", "message"), [
    ({"policies": [EXAMPLE_POLICY], "existingPoliciesConfigMap": "x"}, "not both"),
    ({"policies": [EXAMPLE_POLICY, EXAMPLE_POLICY]}, 'name "ranker-tail" is used twice'),
    ({"actions": {"configmap": {"enabled": True}}}, "needs actions.configmap.names"),
    ({"leaderElection": {"renewDeadlineSeconds": 20}}, "leaseDurationSeconds > renewDeadlineSeconds"),
    ({"shutdownTimeoutSeconds": 25}, "shutdownTimeoutSeconds (25) plus the leader's Lease hand-back (5 s"),
    ({"terminationGracePeriodSeconds": 15}, "must stay below terminationGracePeriodSeconds (15)"),
    ({"replicas": 1, "leaderElection": {"enabled": False}, "shutdownTimeoutSeconds": 30},
     "hand-back (0 s"),
])
def test_templates_reject_inconsistent_values(values: dict[str, Any], message: str) -> None:
    """Cross-field mistakes that JSON Schema cannot word well fail the render with a sentence."""
    with pytest.raises(helm.HelmRenderError) as excinfo:
        hr.render(values)
    assert message in str(excinfo.value)


def test_every_default_value_is_described_by_the_schema() -> None:
    """values.yaml and values.schema.json agree: each default key is a schema property (no silent keys)."""
    def walk(values: dict[str, Any], schema: dict[str, Any], path: str) -> list[str]:
        missing = []
        for key, value in values.items():
            sub = schema.get("properties", {}).get(key)
            if sub is None:
                missing.append(f"{path}.{key}")
            elif isinstance(value, dict) and "properties" in sub:
                missing += walk(value, sub, f"{path}.{key}")
        return missing
    assert walk(hr.chart().values, hr.chart().schema, "") == []


# ---- Image (the Dockerfile's own checks are in tests/image/test_dockerfile.py) ---------------------


def test_chart_app_version_matches_package_version() -> None:
    """The chart's default image tag (appVersion) is the version pyproject builds."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert hr.chart().metadata["appVersion"] == pyproject["project"]["version"]


@pytest.mark.slow
def test_docs_example_values_render_and_validate() -> None:
    """The values file shown in docs/helm.md renders, and its objects pass the Kubernetes schema."""
    text = (REPO / "docs" / "helm.md").read_text()
    values = yaml.safe_load(re.search(r"## A typical values file\n\n```yaml\n(.*?)```", text, re.S).group(1))
    objects = hr.render(values)
    builtin = [o for o in objects if (o["apiVersion"], o["kind"]) not in hr.crd_validators()]
    assert [e for o in builtin for e in hr.kubernetes_errors(o, hr.KUBE_VERSIONS[-1])] == []
    assert hr.find(objects, "Role", SA)[0]["metadata"]["namespace"] == "serving"
