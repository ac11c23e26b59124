"""Render and check the tailguard Helm chart with the real Helm engine (helm-python-sdk).

The SDK binds Helm's Go library in-process (ctypes), so a render takes milliseconds and
needs no `helm` binary and no cluster. The CRD helper below is copied from
shared/schemas/README.md (keep it in sync with that file).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
from collections.abc import Iterator
from functools import cache
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import yaml

REPO = Path(__file__).resolve().parents[1]
CHART_DIR = REPO / "helm" / "tailguard"
RELEASE = "tg"
NAMESPACE = "tailguard"
# Oldest supported (Chart.yaml kubeVersion) and newest that kubernetes-validate ships.
KUBE_VERSIONS = ("1.25.0", kubernetes_validate.latest_version())


def shared_dir() -> Path:
    """shared/ beside the clone (CI layout), or TAILGUARD_SHARED_DIR."""
    override = os.environ.get("TAILGUARD_SHARED_DIR")
    return Path(override) if override else Path(__file__).resolve().parents[2] / "shared"


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


@cache
def crd_validators() -> dict[tuple[str, str], Any]:
    """Validators for every CRD in shared/schemas, built once (about a second)."""
    validators: dict[tuple[str, str], Any] = {}
    for path in sorted((shared_dir() / "schemas").glob("*.yaml")):
        validators.update(load_crd_validators(path, strict=True))
    return validators


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


# ---- copied from shared/schemas/README.md (BEGIN helper ... END helper) -------------

_SCHEMA_MAP_KEYS = ("properties", "patternProperties")  # name -> schema
_SCHEMA_KEYS = ("additionalProperties", "items", "not")   # schema (or bool)
_SCHEMA_LIST_KEYS = ("allOf", "anyOf", "oneOf")           # [schema]
_INT_OR_STRING = [{"type": "integer"}, {"type": "string"}]
_DNS1123_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
METADATA_SCHEMA = {
    "type": "object",
    "anyOf": [{"required": ["name"]}, {"required": ["generateName"]}],
    "properties": {
        "name": {"type": "string", "maxLength": 253, "pattern": _DNS1123_SUBDOMAIN},
        "generateName": {"type": "string"},
        "namespace": {"type": "string", "maxLength": 63},
        "labels": _STRING_MAP,
        "annotations": _STRING_MAP,
    },
}


def k8s_schema_to_jsonschema(node, strict=False):
    """Return a JSON Schema (draft 4) copy of one CRD openAPIV3Schema node.

    Args:
        node: a schema node from spec.versions[].schema.openAPIV3Schema.
        strict: reject unknown fields (like kubectl --validate=strict).
    Returns:
        a new dict; `node` is not modified.
    """
    if not isinstance(node, dict):
        return node
    out = {}
    for key, val in node.items():
        if key in _SCHEMA_MAP_KEYS:
            out[key] = {n: k8s_schema_to_jsonschema(s, strict) for n, s in val.items()}
        elif key in _SCHEMA_KEYS:
            if isinstance(val, list):  # tuple form of items
                out[key] = [k8s_schema_to_jsonschema(s, strict) for s in val]
            else:
                out[key] = k8s_schema_to_jsonschema(val, strict)
        elif key in _SCHEMA_LIST_KEYS:
            out[key] = [k8s_schema_to_jsonschema(s, strict) for s in val]
        elif key == "x-kubernetes-validations":  # CEL: cannot be evaluated here
            continue
        elif key == "pattern" and val.startswith("^(?"):  # RE2 allows ^(?i)...
            out[key] = re.sub(r"^\^(\(\?[a-zA-Z]+\))", r"\1^", val)
        else:  # type, required, enum, default, minimum, ... copied as they are
            out[key] = val
    if out.get("x-kubernetes-int-or-string") and out.get("anyOf") != _INT_OR_STRING:
        out.setdefault("allOf", []).append({"anyOf": _INT_OR_STRING})
    if (strict and out.get("type") == "object" and "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    if out.pop("nullable", False):
        return {"anyOf": [{"type": "null"}, out]}
    return out


def _list_type(validator, list_type, instance, schema):
    """x-kubernetes-list-type: 'set' items are unique, 'map' items have unique keys."""
    if not validator.is_type(instance, "array"):
        return
    keys = schema.get("x-kubernetes-list-map-keys", [])
    seen = set()
    for item in instance:
        if list_type == "set":
            ident = json.dumps(item, sort_keys=True)
        elif list_type == "map" and isinstance(item, dict):
            ident = json.dumps([item.get(k) for k in keys])
        else:  # 'atomic' or a non-object item in a map list
            continue
        if ident in seen:
            yield jsonschema.ValidationError(
                f"duplicate {'item' if list_type == 'set' else 'key ' + str(keys)}: {ident}"
                f" (x-kubernetes-list-type={list_type})")
        seen.add(ident)


K8sValidator = jsonschema.validators.extend(
    jsonschema.Draft4Validator, {"x-kubernetes-list-type": _list_type})


def load_crd_validators(path, strict=False):
    """Build a validator for every served version of every CRD in a YAML file.

    Returns:
        {(apiVersion, kind): K8sValidator}, e.g. ("networking.istio.io/v1", "VirtualService").
    """
    validators = {}
    with open(path, encoding="utf-8") as fh:
        for crd in yaml.safe_load_all(fh):
            if not crd or crd.get("kind") != "CustomResourceDefinition":
                continue
            group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
            for version in crd["spec"]["versions"]:
                if not version.get("served"):
                    continue
                api_version = f"{group}/{version['name']}"
                schema = k8s_schema_to_jsonschema(
                    version["schema"]["openAPIV3Schema"], strict)
                schema.setdefault("properties", {}).update(
                    apiVersion={"enum": [api_version]},
                    kind={"enum": [kind]},
                    metadata=METADATA_SCHEMA)
                schema["required"] = sorted(
                    set(schema.get("required", [])) | {"apiVersion", "kind", "metadata"})
                K8sValidator.check_schema(schema)
                validators[(api_version, kind)] = K8sValidator(schema)
    return validators


def validation_errors(validators, obj):
    """Return ["path: message", ...] for one object; an empty list means valid."""
    key = (obj.get("apiVersion"), obj.get("kind"))
    if key not in validators:
        return [f"<root>: no served CRD version for apiVersion={key[0]!r} kind={key[1]!r}"]
    errors = sorted(validators[key].iter_errors(obj), key=lambda e: list(map(str, e.absolute_path)))
    return [f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in errors]

# ---- end of copied helper ---------------------------------------------------------------
