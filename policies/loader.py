"""Load policies from YAML files or a directory: parse strictly, bind plugin params, cross-check.

Everything is validated at load time; a reload builds a new `PolicySet` and the caller swaps
it in only when it is valid.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import yaml
from pydantic import BaseModel, ValidationError

from actions.base import Action
from core.target import ServiceRef, Target
from detectors.base import Detector
from policies.schema import DetectorTrigger, Policy

YAML_SUFFIXES = (".yaml", ".yml")


@dataclass(frozen=True)
class PolicyError:
    file: str
    policy: str | None
    field: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file}"
        if self.policy:
            where += f": policy {self.policy!r}"
        if self.field:
            where += f": {self.field}"
        return f"{where}: {self.message}"


class PolicyLoadError(Exception):
    def __init__(self, errors: list[PolicyError]) -> None:
        self.errors = errors
        super().__init__("\n".join(str(e) for e in errors))


@dataclass(frozen=True)
class BoundAction:
    """An action step of a policy: the registry kind and its validated parameters."""

    kind: str
    params: BaseModel


@dataclass(frozen=True)
class BoundDetector:
    index: int  # position in the policy's triggers list
    trigger: DetectorTrigger
    params: BaseModel


@dataclass(frozen=True)
class LoadedPolicy:
    spec: Policy
    source: str
    target: Target
    actions: tuple[BoundAction, ...]
    detectors: tuple[BoundDetector, ...] = ()

    @property
    def name(self) -> str:
        return self.spec.name


@dataclass(frozen=True)
class PolicySet:
    policies: tuple[LoadedPolicy, ...] = ()
    digest: str = ""

    @property
    def enabled(self) -> tuple[LoadedPolicy, ...]:
        return tuple(p for p in self.policies if p.spec.enabled)


def policy_files(path: Path) -> list[Path]:
    """The YAML files under `path` (a file or a directory, not recursive, hidden files skipped).

    Kubernetes mounts ConfigMaps through `..data` symlinks; hidden entries are skipped so each
    file is read once.
    """
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise PolicyLoadError([PolicyError(str(path), None, "", "no such file or directory")])
    return sorted(
        p for p in path.iterdir() if p.suffix in YAML_SUFFIXES and not p.name.startswith(".") and p.is_file()
    )


def load_policies(
    path: Path | str,
    actions: Mapping[str, type[Action]],
    detectors: Mapping[str, type[Detector]],
) -> PolicySet:
    """Load and validate every policy under `path`.

    Args:
        path: a YAML file or a directory of them; each YAML document is one policy.
        actions: the action registry, kind -> class with a `Params` model.
        detectors: the detector registry, kind -> class with a `Params` model.
    Returns:
        a valid PolicySet.
    Raises:
        PolicyLoadError: with every error found, each naming the file, policy and field.
    """
    files = policy_files(Path(path))
    errors: list[PolicyError] = []
    loaded: list[LoadedPolicy] = []
    hasher = hashlib.sha256()
    for file in files:
        text = file.read_text(encoding="utf-8")
        hasher.update(file.name.encode() + b"\0" + text.encode())
        loaded.extend(_load_text(text, str(file), actions, detectors, errors))
    _cross_check(loaded, errors)
    if errors:
        raise PolicyLoadError(errors)
    return PolicySet(tuple(loaded), hasher.hexdigest()[:16])


def load_policies_text(
    text: str, source: str, actions: Mapping[str, type[Action]], detectors: Mapping[str, type[Detector]]
) -> PolicySet:
    """Like `load_policies` for YAML text already in memory (tests, simulate)."""
    errors: list[PolicyError] = []
    loaded = _load_text(text, source, actions, detectors, errors)
    _cross_check(loaded, errors)
    if errors:
        raise PolicyLoadError(errors)
    return PolicySet(tuple(loaded), hashlib.sha256(text.encode()).hexdigest()[:16])


def _load_text(
    text: str,
    source: str,
    actions: Mapping[str, type[Action]],
    detectors: Mapping[str, type[Detector]],
    errors: list[PolicyError],
) -> list[LoadedPolicy]:
    try:
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        errors.append(PolicyError(source, None, "", f"invalid YAML: {exc}"))
        return []
    out = []
    for number, doc in enumerate(documents, start=1):
        label = doc.get("name") if isinstance(doc, dict) else None
        where = f"{source} (document {number})" if len(documents) > 1 else source
        if not isinstance(doc, dict):
            errors.append(PolicyError(where, None, "", "a policy must be a mapping"))
            continue
        policy = _parse_one(doc, where, label, actions, detectors, errors)
        if policy is not None:
            out.append(policy)
    return out


def _parse_one(
    doc: dict[str, Any],
    where: str,
    label: str | None,
    actions: Mapping[str, type[Action]],
    detectors: Mapping[str, type[Detector]],
    errors: list[PolicyError],
) -> LoadedPolicy | None:
    try:
        spec = Policy.model_validate(doc)
    except ValidationError as exc:
        errors.extend(_pydantic_errors(exc, where, label, prefix=""))
        return None
    before = len(errors)
    bound_actions = []
    for i, action in enumerate(spec.actions):
        cls = actions.get(action.type)
        if cls is None:
            errors.append(
                PolicyError(where, spec.name, f"actions[{i}].type",
                            f"unknown action type {action.type!r} (known: {', '.join(sorted(actions))})")
            )
            continue
        try:
            bound_actions.append(BoundAction(action.type, cls.Params.model_validate(action.params())))
        except ValidationError as exc:
            errors.extend(_pydantic_errors(exc, where, spec.name, prefix=f"actions[{i}]"))
    bound_detectors = []
    for i, trig in enumerate(spec.triggers):
        if trig.detector is None:
            continue
        detector_cls = detectors.get(trig.detector.type)
        if detector_cls is None:
            errors.append(
                PolicyError(where, spec.name, f"triggers[{i}].detector.type",
                            f"unknown detector type {trig.detector.type!r} (known: {', '.join(sorted(detectors))})")
            )
            continue
        try:
            params = detector_cls.Params.model_validate(trig.detector.params)
            bound_detectors.append(BoundDetector(i, trig.detector, params))
        except ValidationError as exc:
            errors.extend(_pydantic_errors(exc, where, spec.name, prefix=f"triggers[{i}].detector.params"))
    if len(errors) != before:
        return None
    return LoadedPolicy(spec, where, _target(spec), tuple(bound_actions), tuple(bound_detectors))


def _target(spec: Policy) -> Target:
    triton = spec.target.triton
    service = None
    endpoints: tuple[str, ...] = ()
    if triton is not None:
        endpoints = tuple(u.rstrip("/") for u in triton.endpoints)
        if triton.service is not None:
            s = triton.service
            service = ServiceRef(s.namespace, s.name, s.port, s.scheme)
    return Target(spec.target.model, spec.target.namespace, endpoints, service)


def _pydantic_errors(exc: ValidationError, where: str, policy: str | None, prefix: str) -> list[PolicyError]:
    out = []
    for err in exc.errors():
        loc = ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in err["loc"]).replace(".[", "[")
        field_path = f"{prefix}.{loc}" if prefix and loc else (prefix or loc)
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown field (check spelling)"
        out.append(PolicyError(where, policy, field_path, msg))
    return out


def _cross_check(loaded: list[LoadedPolicy], errors: list[PolicyError]) -> None:
    """Checks across policies: names are unique; a target needs Triton endpoints for Triton actions."""
    seen: dict[str, str] = {}
    for p in loaded:
        if p.name in seen:
            errors.append(PolicyError(p.source, p.name, "name", f"duplicate policy name (also in {seen[p.name]})"))
        seen.setdefault(p.name, p.source)
        for i, a in enumerate(p.actions):
            if a.kind.startswith("triton.") and p.spec.target.triton is None:
                errors.append(PolicyError(p.source, p.name, f"actions[{i}]",
                                          f"{a.kind} needs target.triton (endpoints or service)"))
        if not any(t.alert or t.detector or t.schedule for t in p.spec.triggers):
            errors.append(PolicyError(p.source, p.name, "triggers", "no trigger"))
