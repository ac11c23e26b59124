"""`triton.rollback`: pin a Triton model to a known-good version through explicit model control.

Rollback that works (docs/stack-facts.md): read the model config, set
`version_policy: {specific: {versions: [N]}}` and `load_model(name, config=...)`; Triton loads N
and unloads the bad version in one step (~1.5 s), faster than load-beside-then-unload.

All or nothing per target (`TritonRollback`): every replica counts, down ones included; each apply
ends with every replica that answers on the target version (the down ones pinned when they return)
or every replica back on what it served; a restarting replica's errors are retryable.

Delivery: exactly-once by re-observation. Triton's model control holds no mark of who loaded a
version, but the effect is a state that `verify` reads (every replica that answers serves only the
target version): a decision resumed after a crash between the load and its journal record verifies
first, and records the step as applied (recovered) instead of loading again when the state holds;
apply re-reads each replica before it loads, so one already on the version is not loaded again.
"""
from __future__ import annotations

import asyncio
import json
from typing import Any, ClassVar, Literal, Mapping
from urllib.parse import urlsplit

import aiohttp
from pydantic import Field
from tritonclient.http.aio import InferenceServerClient
from tritonclient.utils import InferenceServerException

from actions._triton_release import switch_sequence
from actions._triton_versions import (in_place, is_warm_set, listed_versions, pin_in_force, pinned_config,
                                      pinned_versions, ready_versions)
from actions.base import ActionDeps, ActionParams, Effect, PinCheck, Refused, Replicas, Step
from core.outcome import ActionError, Declined, Outcome, PermanentError
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
    # "previous": keep the newest good version below the served one loaded beside it (`specific
    # [N-1, N]`: unversioned requests still go to N), so the rollback is a config update of a version
    # already loaded, not a load (actions/triton_warm.py; docs/stack-facts.md "The switch").
    keep_warm: Literal["none", "previous"] = Field("none", alias="keepWarm")


# ---- pure decisions -------------------------------------------------------------------------


def choose_version(
    to: Literal["previous"] | int, served: list[int], listed: list[int], pinned: list[int] | None,
    known_bad: frozenset[int] = frozenset(),
) -> tuple[int | None, str]:
    """The version to serve, or None with the reason when there is nothing to roll back to.

    With "previous", a model already pinned to one version it serves counts as rolled back:
    rolling back twice must not walk further into the past. Versions in `known_bad` (rolled back
    from before, or marked by an operator) are skipped: "previous" is the newest good version below
    the served one; an explicit version that is known bad is refused, never loaded.
    """
    if isinstance(to, int):
        if to in known_bad:
            return None, (f"version {to} requested by the policy is marked bad for this target; not rolled "
                          f"back to it (`tailguard bad-versions <target> --clear {to}` once it is good)")
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
    warm_ok: bool = False,
) -> Step:
    """Decide the rollback across every observed replica, skipping `known_bad` versions. Pure.

    A replica that already has the version loaded (kept warm beside the bad one) is switched by the
    same load, which Triton makes a config update of the loaded version (no load: `switch` "warm" in
    the step); one without it loads it (`switch` "load", today's path). Where the replica's read
    carries its server metadata (`server`, as `observe` reads it) the switch follows what that
    release promises (actions/_triton_release.py): no warm switch on one that does not promise a
    reload without loss of availability (`release` in the step names it). `warm_ok` (the pin
    reconciler's check): a replica serving the version with a warm one beside it is in place."""
    replicas: Mapping[str, Mapping[str, Any]] = observed["replicas"]
    unreachable: Mapping[str, str] = observed.get("unreachable", {})
    if not replicas:
        raise PermanentError(
            f"no reachable Triton replica for model {target.model!r}"
            + (f" (unreachable: {dict(unreachable)})" if unreachable else "")
        )
    served = sorted({v for r in replicas.values() for v in ready_versions(r["index"], target.model)})
    listed = sorted({v for r in replicas.values() for v in listed_versions(r["index"], target.model)})
    pins = {tuple(pin_in_force(r, target.model) or ()) for r in replicas.values()}  # the switch's report lags
    pinned = list(next(iter(pins))) if len(pins) == 1 and next(iter(pins)) else None
    refusal = attribution_refusal(params, served, signal_labels)
    if refusal is not None:
        raise Declined(f"{target.model}: {refusal}")
    version, why = choose_version(params.to, served, listed, pinned, known_bad)
    if version is None:
        raise PermanentError(f"{target.model}: {why}")
    todo: dict[str, dict[str, Any]] = {}
    before = {}
    cold: dict[str, str] = {}  # replicas whose release allows no warm switch, with why
    for url, rep in replicas.items():
        rep_served = ready_versions(rep["index"], target.model)
        before[url] = {"served": rep_served, "config": rep["config"]}
        if in_place(rep, target.model, version, warm_ok, known_bad):
            continue
        seq = switch_sequence(rep["server"]) if "server" in rep else None  # None: not read, today's path
        todo[url] = {"version": version, "from": rep_served,
                     "switch": "warm" if version in rep_served and (seq is None or seq.warm) else "load",
                     **({"release": seq.release} if seq is not None else {})}
        if seq is not None and not seq.warm:
            cold[url] = f"{seq.release}: {seq.why}"
    down = f"; {len(unreachable)} down: the pin brings them over when they return" if unreachable else ""
    every = len(replicas) + len(unreachable)
    warm = sum(1 for t in todo.values() if t["switch"] == "warm")
    how = f" (warm switch on {warm}: version {version} already loaded)" if warm else ""
    how += f" (no warm switch on {len(cold)}: {sorted(set(cold.values()))[0]})" if cold else ""
    summary = (
        f"pin {target.model} to version {version} on {len(todo)} of {every} replica(s){how}: {why}{down}"
        if todo else f"{target.model} already serves only version {version} on every replica that answers{down}"
    )
    return Step(
        action=KIND,
        target=target.key,
        summary=summary,
        before={"replicas": before, "unreachable": dict(unreachable)},
        after={"version": version, "replicas": todo, **({"warm_ok": True} if warm_ok else {})},
        noop=not todo,
    )


# ---- I/O ------------------------------------------------------------------------------------

# What a replica that is down or restarting answers (connection refused or reset, the server gone
# mid-request, a timeout): retryable, and the replica is counted down, not as refusing.
UNREACHABLE = (OSError, asyncio.TimeoutError, aiohttp.ClientError)
# What a load that did not land raises: Triton's refusal, or the replica unreachable.
LOAD_ERRORS = (InferenceServerException, *UNREACHABLE)


def _client_url(base_url: str) -> tuple[str, bool]:
    parts = urlsplit(base_url if "://" in base_url else f"http://{base_url}")
    return parts.netloc, parts.scheme == "https"


def every_replica(step: Step) -> list[str]:
    """Every replica the step's plan counted: those it read and those it found down."""
    return sorted({*step.before.get("replicas", {}), *step.before.get("unreachable", {})})


class TritonRollback:
    """`triton.rollback`, all or nothing per target.

    Every replica the target has counts: a Service's EndpointSlices, ready or not (never the Service's
    own load-balanced name: load and verify would reach different pods), or the static list. A
    replica that does not answer (refused, reset, gone mid-request, timed out: it is down or
    restarting) is *down*; one that answers is *up*, whatever its readiness (a pod listed not ready
    is not read to plan, but apply and verify try it like the rest). The rule that keeps a target
    consistent:

    - apply loads the version on every up replica not on it yet (re-read first: a replica already on
      it is not loaded again), and succeeds when every up replica serves only that version; down
      replicas are named and the pin the verified step records brings them over when they return
      (finish when the rest return);
    - when an up replica refuses the load (Triton answers an error, or it drops the request and still
      serves the old version), the replicas this apply moved are put back to what they served before
      (revert those that moved) and the step fails, retryable: each attempt ends with every replica on
      the target version or on its `before`, never half. A revert that fails too is said loudly;
    - verify reads every replica: OK (with the pin) when every up replica serves only the version and
      one does at least; a replica up on another version asks the executor to apply again (`reapply`).

    Every Triton write passes the door (`ActionDeps.actuator`, daemon/workers/door.py): leadership,
    every freeze on the target, known-bad versions, and right before the request the write fence (a
    new leader waits out the old one's in-flight writes and this replica must still hold the Lease).
    A refused write is a replica "fenced": nothing is sent to it.
    """

    kind: ClassVar[str] = KIND
    Params: ClassVar[type[ActionParams]] = TritonRollbackParams
    advisory: ClassVar[bool] = False

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

    async def _replicas(self, target: Target) -> Replicas:
        if self._deps.replicas is not None:
            return await self._deps.replicas(target)
        return Replicas(tuple(await self._deps.endpoints(target)))

    async def _read_server(self, url: str, timeout: float) -> Mapping[str, Any] | None:
        """The replica's server metadata (`GET /v2`: name, version, extensions), None when unreadable
        (then no release promise is assumed: actions/_triton_release.py)."""
        client = self._client(url, timeout)
        try:
            metadata = await client.get_server_metadata()
            return metadata if isinstance(metadata, dict) else None
        except Exception:  # any failure is "unknown": the safe path, never a crash of the plan
            return None
        finally:
            await client.close()

    async def observe(self, target: Target, params: TritonRollbackParams) -> Mapping[str, Any]:
        found = await self._replicas(target)
        if not found.ready and not found.not_ready:
            raise PermanentError(f"no Triton endpoints known for {target.key}")
        timeout = self._deps.triton_timeout_seconds
        reads = asyncio.gather(*(self._read_replica(u, target.model, timeout) for u in found.ready),
                               return_exceptions=True)
        # What each replica's release promises about a reload decides its switch (plan_rollback).
        results, servers = await asyncio.gather(reads, asyncio.gather(*(self._read_server(u, timeout)
                                                                         for u in found.ready)))
        replicas: dict[str, Any] = {}
        unreachable = {url: "not ready (EndpointSlice)" for url in found.not_ready}
        for url, res, server in zip(found.ready, results, servers):
            if isinstance(res, BaseException):
                if not isinstance(res, Exception):
                    raise res
                # A replica down is counted (the rollback reaches it through the pin), never dropped.
                unreachable[url] = _describe(res)
            else:
                replicas[url] = {**res, "server": server}
        known_bad = sorted(await self._deps.known_bad(target.key))
        return {"replicas": replicas, "unreachable": unreachable, "known_bad": known_bad}

    def plan(self, target: Target, params: TritonRollbackParams, observed: Mapping[str, Any],
             signal: Signal) -> Step:
        detector_labels = signal.labels if signal.source == SignalSource.DETECTOR else None
        return plan_rollback(target, params, observed, frozenset(observed.get("known_bad", ())),
                             detector_labels)

    # ---- Pinning: the pin reconciler keeps the version a verified rollback pinned (`pin` in its data)

    def pin_params(self, version: int) -> TritonRollbackParams:
        return TritonRollbackParams(to=version)

    def plan_pin(self, target: Target, params: TritonRollbackParams, observed: Mapping[str, Any]) -> PinCheck:
        # A warm version kept beside the pinned one (keepWarm) is no drift: the pinned one serves.
        step = plan_rollback(target, params, observed, frozenset(observed.get("known_bad", ())), warm_ok=True)
        replicas: Mapping[str, Mapping[str, Any]] = observed["replicas"]
        ready = sorted({v for r in replicas.values() for v in ready_versions(r["index"], target.model)})
        return PinCheck(step, tuple(ready), {u: r["from"] for u, r in step.after["replicas"].items()},
                        len(replicas), dict(observed.get("unreachable", {})))

    # ---- writes ------------------------------------------------------------------------------

    async def _load(self, target: Target, url: str, config: Mapping[str, Any], timeout: float) -> None:
        """One load, through the door (`ActionDeps.actuator`: it may refuse, raising `Refused`);
        raises what the client raises (UNREACHABLE, InferenceServerException)."""
        versions = pinned_versions(config)
        loads = versions[0] if versions is not None and len(versions) == 1 else None
        await self.load_versions(target, url, config, loads, f"load {target.model} "
                                 + (f"version {loads}" if loads is not None else "with its previous version policy")
                                 + f" on {url}", timeout)

    async def load_versions(self, target: Target, url: str, config: Mapping[str, Any], loads: int | None,
                            summary: str, timeout: float) -> None:
        """Load `config` on one replica through the door, announcing `loads` (the version the load
        makes served, checked against bad marks). Raises `Refused` and what the client raises."""
        effect = Effect("triton.load", summary, target=target.key, loads=loads, timeout_seconds=timeout,
                        data={"replica": url, "model": target.model})
        await self._deps.actuator.write(effect, lambda: self._send_load(url, target.model, config, timeout))

    async def _send_load(self, url: str, model: str, config: Mapping[str, Any], timeout: float) -> None:
        """The load request itself: only ever the `send` of a door's write."""
        client = self._client(url, timeout)
        try:
            await client.load_model(model, config=json.dumps(config))
        finally:
            await client.close()

    async def _move(self, target: Target, url: str, version: int, before: Mapping[str, Any] | None,
                    timeout: float, warm_ok: bool = False) -> tuple[str, str, Mapping[str, Any] | None]:
        """Bring one replica onto `version`: (state, why, the config it served before the load). The
        state: "on" already there, "moved" loaded now, "down" unreachable, "refused" up and not on
        it, "emptied" refused and left serving nothing, "fenced" the door refused the write (not the
        leader, frozen, a bad version...)."""
        model = target.model
        read_timeout = self._deps.triton_timeout_seconds
        if self._deps.write_fence is not None:
            # A new leader waits out the old one's in-flight writes before it reads what to write.
            fenced = await self._deps.write_fence(timeout)
            if fenced is not None:
                return "fenced", fenced, None
        try:
            rep = await self._read_replica(url, model, read_timeout)
        except UNREACHABLE as exc:
            return "down", _describe(exc), None
        except InferenceServerException as exc:
            return "refused", _describe(exc), None
        if in_place(rep, model, version, warm_ok):
            return "on", "already serves it pinned", None
        config = before["config"] if before is not None else rep["config"]
        try:
            # The door asks leadership, freezes and bad marks, and waits out a takeover's fence.
            await self._load(target, url, pinned_config(config, version), timeout)
            return "moved", "loaded", config
        except Refused as exc:
            return "fenced", exc.reason, None
        except InferenceServerException as exc:
            failed = _describe(exc)
        except UNREACHABLE as exc:
            failed = _describe(exc)
        # The answer was lost or refused: what does the replica serve now?
        try:
            rep = await self._read_replica(url, model, read_timeout)
        except UNREACHABLE as exc:
            return "down", f"{failed}; then {_describe(exc)}", config
        except InferenceServerException as exc:
            return "refused", f"{failed}; then {_describe(exc)}", config
        now = ready_versions(rep["index"], model)
        if now == [version]:
            return "moved", f"loaded ({failed}, yet it serves version {version})", config
        if not now:
            # From 2.66 Triton no longer promises a failed reload leaves the model as it was: one left
            # serving nothing is put back with those that moved (apply).
            return "emptied", f"{failed}; serves nothing", config
        return "refused", f"{failed}; serves {now}", None

    async def apply(self, step: Step, target: Target, params: TritonRollbackParams) -> Outcome:
        version = int(step.after["version"])
        urls = every_replica(step)
        befores: Mapping[str, Mapping[str, Any]] = step.before.get("replicas", {})
        # A warm set is in place only where the plan found it so (a replica it planned to move moves).
        warm_ok = bool(step.after.get("warm_ok"))
        planned = step.after.get("replicas", {})
        results = await asyncio.gather(*(self._move(target, u, version, befores.get(u), params.load_timeout_seconds,
                                                    warm_ok and u not in planned) for u in urls))
        by: dict[str, dict[str, str]] = {}
        prior: dict[str, Mapping[str, Any]] = {}  # what each replica moved now served before
        for url, (state, why, config) in zip(urls, results):
            by.setdefault(state, {})[url] = why
            if state in ("moved", "emptied") and config is not None:
                prior[url] = config
        moved, on, down = by.get("moved", {}), by.get("on", {}), by.get("down", {})
        emptied, fenced = by.get("emptied", {}), by.get("fenced", {})
        blocked = {**by.get("refused", {}), **emptied}
        data: dict[str, Any] = {"moved": sorted(moved), "already": sorted(on), "down": down}
        if fenced:
            # The door refused (not the leader, frozen, a bad version): nothing more is written; a new
            # leader resumes this decision and re-observes.
            return Outcome.failure(f"stopped: {next(iter(fenced.values()))}; {len(moved)} replica(s) moved so far are "
                                   "left as they are (a leader that takes over resumes this decision)",
                                   retryable=False, fenced=fenced, **data)
        if blocked:
            # All or nothing: what this apply moved goes back to what it served before.
            back = {u: prior[u] for u in (*moved, *emptied) if u in prior}
            not_back = await self._load_each(back, target, params.load_timeout_seconds)
            data |= {"refused": blocked, "put_back": sorted(set(back) - set(not_back)),
                     "not_put_back": not_back}
            head = f"version {version} refused on {len(blocked)} of {len(urls)} replica(s)"
            if not_back:
                return Outcome.failure(f"{head}; putting back the {len(back)} that moved FAILED on "
                                       f"{sorted(not_back)}: the target is mixed", retryable=False, **data)
            which = "that moved or were left serving nothing" if emptied else "that moved"
            return Outcome.failure(f"{head}; the {len(back)} {which} were put back: every replica serves what "
                                   "it did before", retryable=True, **data)
        if not moved and not on:
            return Outcome.failure(f"no replica of {target.model} answered: {down}", retryable=True, **data)
        waiting = f"; {len(down)} down: the pin brings them over when they return" if down else ""
        return Outcome.success(f"{target.model} version {version}: loaded on {len(moved)}, already on {len(on)} "
                               f"of {len(urls)} replica(s){waiting}", **data)

    async def _load_each(self, configs: Mapping[str, Mapping[str, Any]], target: Target,
                         timeout: float) -> dict[str, str]:
        """Load each replica's config (a revert, putting back); the replicas where it failed, with why
        (a write the door refused among them)."""
        async def one(url: str, config: Mapping[str, Any]) -> str | None:
            try:
                await self._load(target, url, config, timeout)
                return None
            except (InferenceServerException, Refused, *UNREACHABLE) as exc:
                return _describe(exc)

        results = await asyncio.gather(*(one(u, c) for u, c in configs.items()))
        return {u: err for u, err in zip(configs, results) if err is not None}

    async def verify(self, step: Step, target: Target, params: TritonRollbackParams) -> Outcome:
        version = int(step.after["version"])
        problems, down, on = {}, {}, []
        for url in every_replica(step):
            try:
                rep = await self._read_replica(url, target.model, self._deps.triton_timeout_seconds)
            except UNREACHABLE as exc:
                down[url] = _describe(exc)
                continue
            except InferenceServerException as exc:
                problems[url] = _describe(exc)
                continue
            served = ready_versions(rep["index"], target.model)
            if served != [version] and not (step.after.get("warm_ok") and is_warm_set(served, version)):
                problems[url] = f"serves versions {served}, expected only {version}"
            else:
                on.append(url)
        if problems:
            return Outcome.failure(f"version {version} not confirmed on {len(problems)} replica(s) that answer",
                                   retryable=True, problems=problems, down=down, reapply=True)
        if not on:
            return Outcome.failure(f"no replica of {target.model} answered: {down}", retryable=True, down=down)
        # `pin` tells the daemon to remember this version, so replicas that return or appear later get it
        # too; `from_version` (the newest version served before) is marked bad for the target.
        before = [v for r in step.before.get("replicas", {}).values() for v in r.get("served", [])]
        newest = max(before, default=None)
        pin: dict[str, Any] = {"model": target.model, "version": version, "reason": step.summary}
        if newest is not None and newest > version:
            pin["from_version"] = newest
        if down:
            return Outcome.success(f"{target.model} serves only version {version} on the {len(on)} replica(s) that "
                                   f"answer; {len(down)} down: pinned when they return", pin=pin, down=down)
        return Outcome.success(f"{target.model} serves only version {version} on every replica", pin=pin)

    async def preconditions(self, step: Step, target: Target, params: TritonRollbackParams) -> Outcome:
        """Every replica the plan found still serves what it served then, or already only the target
        version; a replica serving anything else (someone deployed or rolled back meanwhile) fails it."""
        version = int(step.after["version"])
        changed = {}
        for url, before in step.before.get("replicas", {}).items():
            try:
                rep = await self._read_replica(url, target.model, self._deps.triton_timeout_seconds)
            except (InferenceServerException, *UNREACHABLE):
                continue  # down is no change: the apply finds it down too
            served = ready_versions(rep["index"], target.model)
            if served != list(before.get("served", [])) and served != [version]:
                changed[url] = f"serves {served}, planned when it served {before.get('served')}"
        if changed:
            return Outcome.failure(f"{target.model} changed since the plan on {len(changed)} replica(s)",
                                   changed=changed)
        return Outcome.success(f"{target.model} is as planned on every replica that answers")

    async def revert(self, step: Step, target: Target, params: TritonRollbackParams) -> Outcome:
        """Put every replica the plan read back on its `before` config (a replica down is named: it
        comes back on what its repository says, which the plan found it serving)."""
        configs = {u: r["config"] for u, r in step.before.get("replicas", {}).items()}
        errors = await self._load_each(configs, target, params.load_timeout_seconds)
        if errors:
            return Outcome.failure(f"revert failed on {len(errors)} of {len(configs)} replica(s)", retryable=True,
                                   errors=errors)
        return Outcome.success(f"restored the previous version policy of {target.model} on {len(configs)} replica(s)")


def _describe(exc: BaseException) -> str:
    if isinstance(exc, InferenceServerException):
        return f"Triton: {exc.message()}"
    if isinstance(exc, ActionError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
