"""Render and check the tailguard Helm chart with the real Helm engine (helm-python-sdk).

The SDK binds Helm's Go library in-process (ctypes), so a render takes milliseconds and
needs no `helm` binary and no cluster. The CRD helper is
lab/kube/crd_helper.py, the one in fixtures/schemas/README.md.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator, Mapping
from functools import cache
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import helm_python as helm
import kubernetes_validate
import yaml

from tests.support.paths import CHART_DIR, REPO, SCHEMAS  # noqa: F401  (REPO re-exported)
from lab.kube.crd_helper import load_crd_validators, validation_errors  # noqa: F401  (re-exported)
from lab.kube.schemas import crd_validators as lab_crd_validators

RELEASE = "tg"
NAMESPACE = "tailguard"
# Oldest supported (Chart.yaml kubeVersion) and newest that kubernetes-validate ships.
KUBE_VERSIONS = ("1.25.0", kubernetes_validate.latest_version())


@cache
def chart() -> helm.Chart:
    """The chart, loaded once: charts are immutable and safe to share."""
    return helm.Chart.load(CHART_DIR)


def render_files(values: dict[str, Any] | None = None, *, namespace: str = NAMESPACE) -> dict[str, str]:
    """Render as `helm template` does: template path -> text, NOTES.txt included.

    Raises:
        helm_python.HelmValuesError: values rejected by values.schema.json.
        helm_python.HelmRenderError: a template failed (e.g. a `fail` check).
    """
    return chart().render(values or {}, name=RELEASE, namespace=namespace, is_install=True)


def render(values: dict[str, Any] | None = None, *, namespace: str = NAMESPACE) -> list[dict[str, Any]]:
    """Render and parse: every Kubernetes object the chart would apply, in template order."""
    objects: list[dict[str, Any]] = []
    for path, text in sorted(render_files(values, namespace=namespace).items()):
        if path.endswith("NOTES.txt"):
            continue
        objects.extend(obj for obj in yaml.safe_load_all(text) if obj)
    return objects


def find(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    """Objects of `kind` (and `name`, when given)."""
    return [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


def one(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    """The single object of `kind`; fails loudly when there are none or several."""
    found = find(objects, kind, name)
    assert len(found) == 1, f"expected one {kind} {name or ''}, got {len(found)}"
    return found[0]


def lint(values: dict[str, Any] | None = None, *, kube_version: str = KUBE_VERSIONS[0]) -> dict[str, Any]:
    """`helm lint --strict` report: {"messages": [...], "errors": [...]}."""
    return helm.lint(CHART_DIR, values or {}, strict=True, namespace=NAMESPACE, kube_version=f"v{kube_version}")


def kubernetes_errors(obj: dict[str, Any], version: str) -> list[str]:
    """Errors of one built-in object against the Kubernetes OpenAPI schema (strict: no unknown fields)."""
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [f"{'.'.join(map(str, exc.path)) or '<root>'}: {exc.message}"]
    return []


def crd_validators() -> Mapping[tuple[str, str], Any]:
    """Validators for every CRD in fixtures/schemas: the Kubernetes emulator's, built once per run."""
    return lab_crd_validators(SCHEMAS)


def iter_objects(values_sets: dict[str, dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(case id, object) for every object rendered from each named values set."""
    for case, values in values_sets.items():
        for obj in render(values):
            yield case, obj


@contextlib.contextmanager
def apiserver_with(objects: list[dict[str, Any]]) -> Iterator[helm.Config]:
    """A Helm Config whose `lookup` reads `objects` from a loopback stub of the core/v1 API.

    Only what Helm's lookup asks for is served: /api/v1 discovery and GET of one namespaced
    object; everything else is 404. The engine runs in-process, so the stub runs in a thread.
    """
    plurals = {"Secret": "secrets", "ConfigMap": "configmaps"}
    by_path = {f"/api/v1/namespaces/{o['metadata']['namespace']}/{plurals[o['kind']]}/{o['metadata']['name']}": o
               for o in objects}
    discovery = {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "v1", "resources": [
        {"name": plural, "singularName": kind.lower(), "namespaced": True, "kind": kind, "verbs": ["get", "list"]}
        for kind, plural in plurals.items()]}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            path = self.path.split("?")[0]
            body = discovery if path == "/api/v1" else by_path.get(path)
            code = 200 if body else 404
            data = json.dumps(body or {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                       "reason": "NotFound", "code": 404}).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:  # keep pytest output clean
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    config = helm.Config(kube_apiserver=f"http://127.0.0.1:{server.server_port}", kube_token="test",
                         namespace=NAMESPACE)
    try:
        yield config
    finally:
        config.close()
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def render_against(config: helm.Config, values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Render as `helm upgrade` does against a cluster: `lookup` sees the cluster's objects."""
    files = config.render(chart(), values or {}, name=RELEASE, namespace=NAMESPACE, is_upgrade=True)
    return [obj for path, text in sorted(files.items()) if not path.endswith("NOTES.txt")
            for obj in yaml.safe_load_all(text) if obj]


