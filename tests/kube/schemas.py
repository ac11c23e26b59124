"""Real schemas for objects written to the emulator: Istio/Gateway CRDs (strict) and Kubernetes core types.

CRD checks use the helper copied verbatim from /work/shared/schemas/README.md; core types use
`kubernetes_validate`'s strict schemas. Both are built once per process: they are immutable.
"""
from __future__ import annotations

import functools
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

import jsonschema
import referencing
import yaml
from kubernetes_validate import utils as kv_utils

# Which Kubernetes release the core schemas come from; 1.33 is a current, widely-run minor.
KUBERNETES_VERSION = "1.33"

# ---- helper copied verbatim from /work/shared/schemas/README.md (BEGIN helper .. END helper) ----
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
# ---- end of the copied helper ----


@dataclass(frozen=True)
class FieldError:
    """One schema violation; `field` is written the way the API server writes it: spec.http[0].route."""

    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


def _field_path(parts: Iterable[Any]) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<root>"


def schemas_dir() -> Path:
    """Where the CRD files are: $TAILGUARD_SCHEMAS_DIR, else shared/schemas in or beside the repo."""
    env = os.environ.get("TAILGUARD_SCHEMAS_DIR")
    if env:
        return Path(env)
    repo = Path(__file__).resolve().parents[2]
    for candidate in (repo / "shared" / "schemas", repo.parent / "shared" / "schemas"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError("CRD schemas not found; set TAILGUARD_SCHEMAS_DIR")


class SchemaRegistry:
    """Validates any object the emulator stores: CRD kinds by their CRD, the rest by core schemas."""

    def __init__(self, crd_dir: Path, kubernetes_version: str = KUBERNETES_VERSION) -> None:
        self._crd: dict[tuple[str, str], Any] = {}
        for path in sorted(crd_dir.glob("*.yaml")):
            self._crd.update(load_crd_validators(path, strict=True))
        self._version = kubernetes_version
        self._core: dict[tuple[str, str], Any] = {}

    def errors(self, obj: Mapping[str, Any]) -> list[FieldError]:
        """Every violation in `obj`, sorted by field; an empty list means valid.

        Args:
            obj: a whole object with apiVersion and kind.
        Returns:
            FieldErrors; an unknown apiVersion/kind is itself an error (never silently valid).
        """
        key = (str(obj.get("apiVersion")), str(obj.get("kind")))
        validator = self._crd.get(key) or self._core_validator(key)
        if validator is None:
            return [FieldError("<root>", f"no schema for apiVersion={key[0]!r} kind={key[1]!r}")]
        found = sorted(validator.iter_errors(obj), key=lambda e: [str(p) for p in e.absolute_path])
        return [FieldError(_field_path(e.absolute_path), e.message) for e in found]

    def _core_validator(self, key: tuple[str, str]) -> Any | None:
        if key not in self._core:
            self._core[key] = self._load_core(*key)
        return self._core[key]

    def _load_core(self, api_version: str, kind: str) -> Any | None:
        # Mirrors kubernetes_validate.validate(), which re-reads 1.8 MB of definitions per call.
        version = [v for v in kv_utils.all_versions()
                   if kv_utils.major_minor(v) <= self._version][-1]
        schema_dir = f"kubernetes-json-schema/v{version}-local-strict"
        # The same file naming as kubernetes_validate: coordination.k8s.io/v1 -> coordination-v1.
        short = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
        try:
            schema = kv_utils.schema_contents(f"{schema_dir}/{kind.lower()}-{short}.json", version)
        except FileNotFoundError:
            return None
        definitions = _core_definitions(schema_dir, version)
        registry = referencing.Registry().with_resources([
            (schema["$id"], referencing.Resource.from_contents(schema)),
            (definitions["$id"], referencing.Resource.from_contents(definitions)),
        ])
        return jsonschema.Draft202012Validator(schema, registry=registry)


@functools.lru_cache(maxsize=4)
def _core_definitions(schema_dir: str, version: str) -> Any:
    return kv_utils.schema_contents(f"{schema_dir}/_definitions.json", version)


@functools.lru_cache(maxsize=1)
def default_registry() -> SchemaRegistry:
    """The process-wide registry (building it reads every CRD once, about a second)."""
    return SchemaRegistry(schemas_dir())


def object_errors(obj: Mapping[str, Any]) -> list[str]:
    """Convenience for assertions: ["field: message", ...] for one object, [] when valid."""
    return [str(e) for e in default_registry().errors(obj)]
