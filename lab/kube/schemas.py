"""Real schemas for objects written to the emulator: Istio/Gateway CRDs (strict) and Kubernetes core types.

CRD checks use the helper copied verbatim from fixtures/schemas/README.md; core types use
`kubernetes_validate`'s strict schemas. Both are built once per process: they are immutable.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

import jsonschema
import referencing
from kubernetes_validate import utils as kv_utils

# Which Kubernetes release the core schemas come from; 1.33 is a current, widely-run minor.
KUBERNETES_VERSION = "1.33"

from lab.kube.crd_helper import load_crd_validators  # the README's helper, one copy

# The CRD schemas copied into the repository (fixtures/schemas: provenance and NOTICE there).
SCHEMAS = Path(__file__).resolve().parents[2] / "fixtures" / "schemas"


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


class SchemaRegistry:
    """Validates any object the emulator stores: CRD kinds by their CRD, the rest by core schemas."""

    def __init__(self, crd_dir: Path, kubernetes_version: str = KUBERNETES_VERSION) -> None:
        self._crd = crd_validators(crd_dir)
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


@functools.lru_cache(maxsize=4)
def crd_validators(crd_dir: Path = SCHEMAS) -> Mapping[tuple[str, str], Any]:
    """(apiVersion, kind) -> strict validator for every served version of every CRD in `crd_dir`;
    built once per directory and process (parsing the CRDs takes seconds), shared by every user."""
    validators: dict[tuple[str, str], Any] = {}
    for path in sorted(crd_dir.glob("*.yaml")):
        validators.update(load_crd_validators(path, strict=True))
    return validators


@functools.lru_cache(maxsize=1)
def default_registry() -> SchemaRegistry:
    """The process-wide registry (building it reads every CRD once, about a second)."""
    return SchemaRegistry(SCHEMAS)


def object_errors(obj: Mapping[str, Any]) -> list[str]:
    """Convenience for assertions: ["field: message", ...] for one object, [] when valid."""
    return [str(e) for e in default_registry().errors(obj)]
