"""`triton.rollback`: pin a Triton model to a known-good version through explicit model control.

Rollback that works (docs/stack-facts.md): read the model config, set
`version_policy: {specific: {versions: [N]}}` and `load_model(name, config=...)`; Triton loads N
and unloads the bad version in one step (~1.5 s), faster than load-beside-then-unload.

Delivery: exactly-once by re-observation. Triton's model control holds no mark of who loaded a
version, but the effect is a state that `verify` reads (every replica serves only the target
version): a decision resumed after a crash between the load and its journal record verifies
first, and records the step as applied (recovered) instead of loading again when the state holds.
"""
from __future__ import annotations

import asyncio
import copy
import json
from typing import Any, ClassVar, Literal, Mapping
from urllib.parse import urlsplit

from pydantic import Field
from tritonclient.http.aio import InferenceServerClient
from tritonclient.utils import InferenceServerException

from actions.base import ActionDeps, ActionParams, Step
from core.outcome import ActionError, Outcome, PermanentError
from core.signal import Signal, SignalSource
from core.target import Target

KIND = "triton.rollback"


class TritonRollbackParams(ActionParams):
    # "previous": the highest version below the one being served; or an explicit version.
    to: Literal["previous"] | int = "previous"
    load_timeout_seconds: float = Field(120.0, gt=0, alias="loadTimeoutSeconds")
    # Act on a detector signal only when it names the version carrying the anomaly (a `version`
    # label, as tail_excess gives per-version counters) and that version is the newest served: an
    # anomaly on the old version, or one without attribution, is not a reason to roll back.
    # Alert signals are the operator's own rule and are not held to this.
    require_attribution: bool = Field(False, alias="requireAttribution")


# ---- pure decisions -------------------------------------------------------------------------


def ready_versions(index: list[Mapping[str, Any]], model: str) -> list[int]:
    """Versions of `model` that the repository index reports READY, ascending."""
    return sorted(
        int(e["version"]) for e in index
        if e.get("name") == model and e.get("state") == "READY" and str(e.get("version", "")).isdigit()
    )


def listed_versions(index: list[Mapping[str, Any]], model: str) -> list[int]:
    """Every version of `model` the index knows about (loaded or unloaded), ascending."""
    return sorted({
        int(e["version"]) for e in index
        if e.get("name") == model and str(e.get("version", "")).isdigit()
    })


def pinned_versions(config: Mapping[str, Any]) -> list[int] | None:
    """The versions a `specific` version policy pins, or None for latest/all policies."""
    specific = (config.get("version_policy") or {}).get("specific")
    if specific is None:
        return None
    return sorted(int(v) for v in specific.get("versions", []))


def choose_version(
    to: Literal["previous"] | int, served: list[int], listed: list[int], pinned: list[int] | None,
    known_bad: frozenset[int] = frozenset(),
) -> tuple[int | None, str]:
    """The version to serve, or None with the reason when there is nothing to roll back to.

    With "previous", a model already pinned to one version it serves counts as rolled back:
    rolling back twice must not walk further into the past. Versions in `known_bad` (rolled back
    from before) are skipped: "previous" is the newest good version below the served one.
    """
    if isinstance(to, int):
        return to, f"version {to} requested by the policy"
    if not served:
        return None, "no READY version is served: nothing to roll back from"
    if pinned is not None and len(pinned) == 1 and served == pinned and pinned[0] not in known_bad:
        return pinned[0], f"already pinned to version {pinned[0]}"
    bad = max(served)
    skipped = sorted(v for v in known_bad if v < bad)
    skipping = f"; skipped known-bad {skipped}" if skipped else ""
    older = [v for v in listed if v < bad and v not in known_bad]
    if older:
        return max(older), f"previous of served version {bad} (known versions {listed}{skipping})"
    # The index lists only loaded versions; Triton's numeric versions are assumed consecutive.
    guess = next((v for v in range(bad - 1, 0, -1) if v not in known_bad and v not in listed), None)
    if guess is not None:
        return guess, f"version {guess} assumed to precede served version {bad}{skipping}"
    return None, f"served version {bad} has no earlier good version{skipping}"


def pinned_config(config: Mapping[str, Any], version: int) -> dict[str, Any]:
    """A copy of `config` with its version policy pinned to `version`."""
    out = copy.deepcopy(dict(config))
    out["version_policy"] = {"specific": {"versions": [version]}}
    return out


def attribution_refusal(params: TritonRollbackParams, served: list[int],
                        labels: Mapping[str, str] | None) -> str | None:
    """Why a rollback that requires attribution must not run for a detector signal with these
    labels (None: not a detector signal), or None."""
    if not params.require_attribution or labels is None:
        return None
    version = labels.get("version", "")
    if not version.isdigit():
        return "requireAttribution: the signal names no model version (no `version` label)"
    if not served or int(version) != max(served):
        return (f"requireAttribution: the anomaly is on version {version}, not on the newest served "
                f"version {max(served) if served else 'none'}")
    return None


def plan_rollback(
    target: Target, params: TritonRollbackParams, observed: Mapping[str, Any],
    known_bad: frozenset[int] = frozenset(), signal_labels: Mapping[str, str] | None = None,
) -> Step:
    """Decide the rollback across every observed replica, skipping `known_bad` versions. Pure."""
    replicas: Mapping[str, Mapping[str, Any]] = observed["replicas"]
    unreachable: Mapping[str, str] = observed.get("unreachable", {})
    if not replicas:
        raise PermanentError(
            f"no reachable Triton replica for model {target.model!r}"
            + (f" (unreachable: {dict(unreachable)})" if unreachable else "")
        )
    served = sorted({v for r in replicas.values() for v in ready_versions(r["index"], target.model)})
    listed = sorted({v for r in replicas.values() for v in listed_versions(r["index"], target.model)})
    pins = {tuple(pinned_versions(r["config"]) or ()) for r in replicas.values()}
    pinned = list(next(iter(pins))) if len(pins) == 1 and next(iter(pins)) else None
    refusal = attribution_refusal(params, served, signal_labels)
    if refusal is not None:
        raise PermanentError(f"{target.model}: {refusal}")
    version, why = choose_version(params.to, served, listed, pinned, known_bad)
    if version is None:
        raise PermanentError(f"{target.model}: {why}")
    todo = {}
    before = {}
    for url, rep in replicas.items():
        rep_served = ready_versions(rep["index"], target.model)
        before[url] = {"served": rep_served, "config": rep["config"]}
        if rep_served == [version] and pinned_versions(rep["config"]) == [version]:
            continue
        todo[url] = {"version": version, "from": rep_served}
    summary = (
        f"pin {target.model} to version {version} on {len(todo)} of {len(replicas)} replica(s): {why}"
        if todo else f"{target.model} already serves only version {version} on every replica"
    )
    return Step(
        action=KIND,
        target=target.key,
        summary=summary,
        before={"replicas": before, "unreachable": dict(unreachable)},
        after={"version": version, "replicas": todo},
        noop=not todo,
    )


# ---- I/O ------------------------------------------------------------------------------------


def _client_url(base_url: str) -> tuple[str, bool]:
    parts = urlsplit(base_url if "://" in base_url else f"http://{base_url}")
    return parts.netloc, parts.scheme == "https"


class TritonRollback:
    kind: ClassVar[str] = KIND
    Params: ClassVar[type[ActionParams]] = TritonRollbackParams

    def __init__(self, deps: ActionDeps) -> None:
        self._deps = deps

    def _client(self, base_url: str, timeout: float) -> InferenceServerClient:
        netloc, tls = _client_url(base_url)
        return InferenceServerClient(netloc, conn_timeout=timeout, ssl=tls)

    async def _read_replica(self, url: str, model: str, timeout: float) -> dict[str, Any]:
        client = self._client(url, timeout)
        try:
            index = await client.get_model_repository_index()
            config = await client.get_model_config(model)
            return {"index": index, "config": config}
        finally:
            await client.close()

    async def observe(self, target: Target, params: TritonRollbackParams) -> Mapping[str, Any]:
        urls = await self._deps.endpoints(target)
        if not urls:
            raise PermanentError(f"no Triton endpoints known for {target.key}")
        timeout = self._deps.triton_timeout_seconds
        results = await asyncio.gather(
            *(self._read_replica(u, target.model, timeout) for u in urls), return_exceptions=True
        )
        replicas, unreachable = {}, {}
        for url, res in zip(urls, results):
            if isinstance(res, BaseException):
                # One replica down must not stop the rollback of the others; it is recorded.
                unreachable[url] = _describe(res)
            else:
                replicas[url] = res
        known_bad = sorted(await self._deps.known_bad(target.key)) if params.to == "previous" else []
        return {"replicas": replicas, "unreachable": unreachable, "known_bad": known_bad}

    def plan(self, target: Target, params: TritonRollbackParams, observed: Mapping[str, Any],
             signal: Signal) -> Step:
        detector_labels = signal.labels if signal.source == SignalSource.DETECTOR else None
        return plan_rollback(target, params, observed, frozenset(observed.get("known_bad", ())),
                             detector_labels)

    async def _load(self, url: str, model: str, config: Mapping[str, Any], timeout: float) -> str | None:
        client = self._client(url, timeout)
        try:
            await client.load_model(model, config=json.dumps(config))
            return None
        except (InferenceServerException, OSError, asyncio.TimeoutError) as exc:
            return _describe(exc)
        finally:
            await client.close()

    async def apply(self, step: Step, target: Target, params: TritonRollbackParams) -> Outcome:
        version = int(step.after["version"])
        configs = {u: step.before["replicas"][u]["config"] for u in step.after["replicas"]}
        errors = await self._load_all(
            {u: pinned_config(c, version) for u, c in configs.items()}, target.model,
            params.load_timeout_seconds,
        )
        if errors:
            return Outcome.failure(f"load of version {version} failed on {len(errors)} replica(s)",
                                   retryable=True, errors=errors)
        return Outcome.success(f"loaded {target.model} version {version} pinned on {len(configs)} replica(s)")

    async def _load_all(self, configs: Mapping[str, Mapping[str, Any]], model: str,
                        timeout: float) -> dict[str, str]:
        results = await asyncio.gather(*(self._load(u, model, c, timeout) for u, c in configs.items()))
        return {u: err for u, err in zip(configs, results) if err is not None}

    async def verify(self, step: Step, target: Target, params: TritonRollbackParams) -> Outcome:
        version = int(step.after["version"])
        problems = {}
        for url in step.after["replicas"]:
            try:
                rep = await self._read_replica(url, target.model, self._deps.triton_timeout_seconds)
            except (InferenceServerException, OSError, asyncio.TimeoutError) as exc:
                problems[url] = _describe(exc)
                continue
            served = ready_versions(rep["index"], target.model)
            if served != [version]:
                problems[url] = f"serves versions {served}, expected only {version}"
        if problems:
            return Outcome.failure(f"version {version} not confirmed on {len(problems)} replica(s)",
                                   retryable=True, problems=problems)
        # `pin` tells the daemon to remember this version, so replicas that appear later get it too;
        # `from_version` (the newest version served before) is marked bad for the target.
        before = [v for r in step.before.get("replicas", {}).values() for v in r.get("served", [])]
        newest = max(before, default=None)
        pin: dict[str, Any] = {"model": target.model, "version": version, "reason": step.summary}
        if newest is not None and newest > version:
            pin["from_version"] = newest
        return Outcome.success(f"{target.model} serves only version {version} on every replica", pin=pin)

    async def revert(self, step: Step, target: Target, params: TritonRollbackParams) -> Outcome:
        configs = {u: step.before["replicas"][u]["config"] for u in step.after["replicas"]}
        errors = await self._load_all(configs, target.model, params.load_timeout_seconds)
        if errors:
            return Outcome.failure("revert failed", retryable=True, errors=errors)
        return Outcome.success(f"restored the previous version policy of {target.model}")


def _describe(exc: BaseException) -> str:
    if isinstance(exc, InferenceServerException):
        return f"Triton: {exc.message()}"
    if isinstance(exc, ActionError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"
