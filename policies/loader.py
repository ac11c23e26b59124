"""Load policies from YAML files or a directory: parse strictly, bind plugin params, cross-check.

Everything is validated at load time; a reload builds a new `PolicySet` and the caller swaps
it in only when it is valid. Whatever a file holds (bytes that are not UTF-8, a file that vanishes
while read, YAML nested too deep or aliases that expand without end, documents that are not
mappings), loading ends in a PolicySet or a PolicyLoadError, each error one line naming the file.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import yaml
from pydantic import BaseModel, ValidationError

from actions.base import Action
from core.promql import render_query
from core.target import ServiceRef, Target
from detectors.base import Detector, DetectorParams
from policies.schema import DetectorTrigger, Policy

YAML_SUFFIXES = (".yaml", ".yml")
MAX_FILE_BYTES = 1_048_576
"""A policy file larger than this is refused (a ConfigMap holds at most 1 MiB)."""
MAX_YAML_DEPTH = 64
"""Nesting of YAML collections; PyYAML's composer recurses once per level."""
MAX_YAML_VALUES = 100_000
"""Values in one document once aliases are expanded (a 'billion laughs' document expands without end)."""


def _printable(text: str) -> str:
    """`text` on one line: newlines, other control characters and undecodable bytes escaped."""
    return text if text.isprintable() else "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


@dataclass(frozen=True)
class PolicyError:
    file: str
    policy: str | None
    field: str
    message: str

    def __str__(self) -> str:
        where = _printable(self.file)
        if self.policy:
            where += f": policy {self.policy!r}"
        if self.field:
            where += f": {_printable(self.field)}"
        return f"{where}: {_printable(self.message)}"


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
    params: DetectorParams


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

    def gate_for(self, alert_index: int) -> BoundDetector | None:
        """The detector trigger whose evidence gates the alert trigger at `alert_index` (None: the
        alert is not gated, or, on a policy that did not load, nothing could gate it)."""
        trigger = self.spec.triggers[alert_index]
        gate = trigger.alert.gate if trigger.alert is not None else None
        if gate is None:
            return None
        if gate.detector is not None:
            return next((d for d in self.detectors if d.index == gate.detector), None)
        able = [d for d in self.detectors if d.params.gives_budget_evidence]
        return able[0] if len(able) == 1 else None


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
    try:
        if path.is_file():
            return [path]
        if not path.is_dir():
            raise PolicyLoadError([PolicyError(str(path), None, "", "no such file or directory")])
        return sorted(
            p for p in path.iterdir() if p.suffix in YAML_SUFFIXES and not p.name.startswith(".") and p.is_file()
        )
    except (OSError, ValueError) as exc:  # unreadable, or gone while listed
        raise PolicyLoadError([PolicyError(str(path), None, "", f"cannot list: {_os_reason(exc)}")]) from None


def _os_reason(exc: OSError | ValueError) -> str:
    return (exc.strerror if isinstance(exc, OSError) else None) or str(exc)


def _read(file: Path) -> bytes | str:
    """The file's bytes, or a one-line reason why they cannot be had."""
    try:
        with file.open("rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except (OSError, ValueError) as exc:
        return f"cannot read: {_os_reason(exc)}"
    if len(data) > MAX_FILE_BYTES:
        return f"larger than {MAX_FILE_BYTES} bytes"
    return data


def _decode(data: bytes) -> str:
    """UTF-8 text. Raises ValueError with a one-line reason."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})") from None


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
        data = _read(file)
        if isinstance(data, str):
            errors.append(PolicyError(str(file), None, "", data))
            continue
        hasher.update(os.fsencode(file.name) + b"\0" + data)
        try:
            text = _decode(data)
        except ValueError as exc:
            errors.append(PolicyError(str(file), None, "", str(exc)))
            continue
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
    return PolicySet(tuple(loaded), hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16])


def policy_document(policy: LoadedPolicy) -> dict[str, Any]:
    """The policy as a JSON document (field aliases as written in YAML) that `restore_policy` reads back:
    what a decision journals of the policy it started with."""
    return policy.spec.model_dump(mode="json", by_alias=True)


def restore_policy(document: Mapping[str, Any], source: str, actions: Mapping[str, type[Action]]) -> LoadedPolicy:
    """The policy a `policy_document` describes, its actions bound with this registry (its detector
    triggers are not bound: a restored policy runs steps and reverts, it does not detect).

    Raises:
        PolicyLoadError: the document no longer validates (an action kind or a parameter this
            version does not know).
    """
    errors: list[PolicyError] = []
    try:
        spec = Policy.model_validate(dict(document))
    except ValidationError as exc:
        raise PolicyLoadError(_pydantic_errors(exc, source, str(document.get("name")), prefix="")) from None
    bound = []
    for i, action in enumerate(spec.actions):
        cls = actions.get(action.type)
        if cls is None:
            errors.append(PolicyError(source, spec.name, f"actions[{i}].type", f"unknown action type {action.type!r}"))
            continue
        try:
            bound.append(BoundAction(action.type, cls.Params.model_validate(action.params())))
        except ValidationError as exc:
            errors.extend(_pydantic_errors(exc, source, spec.name, prefix=f"actions[{i}]"))
    if errors:
        raise PolicyLoadError(errors)
    return LoadedPolicy(spec, source, _target(spec), tuple(bound))


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that refuses nesting deeper than MAX_YAML_DEPTH as it composes, before Python's
    recursion limit turns it into a RecursionError."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise yaml.composer.ComposerError(None, None, f"nested deeper than {MAX_YAML_DEPTH} levels",
                                                  parent.start_mark if parent is not None else None)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _expands_too_far(document: Any) -> bool:
    """Whether `document` holds more than MAX_YAML_VALUES values with aliases expanded (what
    pydantic would walk). Iterative, and stops at the bound: an alias cycle ends too."""
    stack = [document]
    for _ in range(MAX_YAML_VALUES):
        if not stack:
            return False
        value = stack.pop()
        if isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, (list, tuple, set)):
            stack.extend(value)
    return bool(stack)


def _yaml_reason(exc: Exception) -> str:
    """One line: where (for syntax errors) and what."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        what = "; ".join(p for p in (exc.context, exc.problem) if p)
        return f"invalid YAML at line {mark.line + 1}, column {mark.column + 1}: {' '.join(what.split())}"
    if isinstance(exc, RecursionError):
        return "invalid YAML: nested too deep"
    return f"invalid YAML: {' '.join(str(exc).split())}"


def _load_text(
    text: str,
    source: str,
    actions: Mapping[str, type[Action]],
    detectors: Mapping[str, type[Detector]],
    errors: list[PolicyError],
) -> list[LoadedPolicy]:
    try:
        # ValueError: timestamps like 2024-02-30 and integers over Python's digit limit
        documents = [d for d in yaml.load_all(text, Loader=_BoundedLoader) if d is not None]
    except (yaml.YAMLError, ValueError, TypeError, OverflowError, RecursionError) as exc:
        errors.append(PolicyError(source, None, "", _yaml_reason(exc)))
        return []
    out = []
    for number, doc in enumerate(documents, start=1):
        name = doc.get("name") if isinstance(doc, dict) else None
        label = name if isinstance(name, str) else None
        where = f"{source} (document {number})" if len(documents) > 1 else source
        if not isinstance(doc, dict):
            errors.append(PolicyError(where, None, "", "a policy must be a mapping"))
            continue
        if _expands_too_far(doc):
            errors.append(PolicyError(where, label, "", f"expands to more than {MAX_YAML_VALUES} values "
                                                        "(YAML aliases repeating each other?)"))
            continue
        try:
            policy = _parse_one(doc, where, label, actions, detectors, errors)
        except (ValueError, TypeError, ArithmeticError, RecursionError) as exc:
            # a validator that raised something pydantic does not wrap (float() of a 400-digit int)
            errors.append(PolicyError(where, label, "", f"invalid value: {exc}"))
            continue
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
            problem = params.query_problem(trig.detector.query, trig.detector.companion_query)
            if problem is not None:
                errors.append(PolicyError(where, spec.name, f"triggers[{i}].detector.query", problem))
            bound_detectors.append(BoundDetector(i, trig.detector, params))
        except ValidationError as exc:
            errors.extend(_pydantic_errors(exc, where, spec.name, prefix=f"triggers[{i}].detector.params"))
    loaded = LoadedPolicy(spec, where, _target(spec), tuple(bound_actions), tuple(bound_detectors))
    for i, trig in enumerate(spec.triggers):
        named = trig.alert.governed_by if trig.alert is not None else None
        if named is not None and not any(d.index == named for d in bound_detectors):
            errors.append(PolicyError(where, spec.name, f"triggers[{i}].alert.governedBy",
                                      f"trigger {named} is not a detector trigger of this policy"))
        if trig.alert is None or trig.alert.gate is None or len(errors) != before:
            continue
        bound = loaded.gate_for(i)
        if bound is None or not bound.params.gives_budget_evidence:
            errors.append(PolicyError(where, spec.name, f"triggers[{i}].alert.gate", GATE_NEEDS))
    if spec.verify is not None:
        try:  # an unknown placeholder is a load error, not a verification that fails at run time
            render_query(spec.verify.query, {"model": spec.target.model, "namespace": spec.target.namespace})
        except KeyError as exc:
            errors.append(PolicyError(where, spec.name, "verify.query", str(exc.args[0])))
    elif needs_verify(spec):
        errors.append(PolicyError(where, spec.name, "verify", VERIFY_REQUIRED))
    if len(errors) != before:
        return None
    return loaded


GATE_NEEDS = ("a gate needs one detector trigger of this policy that counts requests above a line (tail_excess); "
              "with several, name it with `detector: <its trigger index>`")
"""The error of a gate that nothing in the policy could feed (one line)."""

VERIFY_REQUIRED = (
    "required: this policy acts on alerts only, and an alert carries no line to check recovery against; "
    "add a verify block, e.g. verify: {query: 'max(nv_inference_request_summary_us{model=\"$model\", "
    "quantile=\"0.999\"})', below: 500000, for: 60s, within: 3m} (README.md, Policies: Recovery)")
"""The error of an alert-only policy without a verify block (one line)."""


def acts_on_alerts_only(spec: Policy) -> bool:
    """Whether every trigger that can act (not `shadow`) is an alert trigger, and there is one: its
    signals carry no detector line, so without a verify block nothing checks that acting helped."""
    live = [t for t in spec.triggers if not t.shadow]
    return bool(live) and all(t.alert is not None for t in live)


def needs_verify(spec: Policy) -> bool:
    """Whether `spec` must have a verify block and has none: it acts on alerts only. Exempt: a
    policy that never applies anything, i.e. `guards.dryRun` (plans are journaled, never applied)
    or every trigger `shadow` (decided and journaled, never applied): neither reaches a recovery check."""
    return spec.verify is None and not spec.guards.dry_run and acts_on_alerts_only(spec)


def _target(spec: Policy) -> Target:
    triton = spec.target.triton
    service = None
    endpoints: tuple[str, ...] = ()
    metrics: tuple[str, ...] = ()
    if triton is not None:
        endpoints = tuple(u.rstrip("/") for u in triton.endpoints)
        metrics = tuple(triton.metrics_endpoints)
        if triton.service is not None:
            s = triton.service
            service = ServiceRef(s.namespace, s.name, s.port, s.scheme)
    return Target(spec.target.model, spec.target.namespace, endpoints, service, metrics)


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
