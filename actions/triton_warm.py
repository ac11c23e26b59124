"""Keep the known-good version warm: `triton.rollback` with `keepWarm: previous`.

On Triton 2.51 a load whose `specific` version policy names a version that is already loaded, from
a folder unchanged since, is a config update of that version: no new backend instances, done in
milliseconds; versions the policy leaves out are released after it, their requests in flight
finishing (bench/bench_switch.py; docs/stack-facts.md "The switch"). So with the previous good
version loaded beside the served one (`specific [P, N]`: unversioned requests go to the highest,
N), the rollback's own load (`specific [P]`) is a switch, not a load; without it the same load is
today's full load of P, the fallback.

This module plans and makes that warm load, one replica at a time, through the door
(`ActionDeps.actuator`): an Effect whose `loads` is the warm version, so a freeze, a lost Lease or a
bad mark on it refuses it. It never unloads a version (`unload_model` takes every version of a
model down): the load names every version the replica serves now plus the warm one.

Only on a replica whose Triton release promises a reload without loss of availability (its server
metadata, actions/_triton_release.py): loading a version beside the served one is a reload of the
loaded model, which releases from 2.66.0 say should follow an unload. There no version is kept warm
and the rollback makes today's load.
"""
from __future__ import annotations

from typing import Any, Mapping

from actions.base import Refused
from actions._triton_release import switch_sequence
from actions._triton_versions import listed_versions, pinned_config, ready_versions
from actions.triton import LOAD_ERRORS, TritonRollback, TritonRollbackParams, _describe, choose_version
from core.outcome import Outcome
from core.target import Target


NOT_PROMISED = "no version kept warm on"  # plan_warm's reason where the release does not promise a reload


def warm_version(served: list[int], listed: list[int], known_bad: frozenset[int]) -> tuple[int | None, str]:
    """The version to keep warm beside the newest served one (the newest good version below it),
    or None with why there is none (nothing served, a model with a single version). Pure."""
    if not served:
        return None, "serves no READY version"
    version, why = choose_version("previous", [max(served)], listed, None, known_bad)
    return version, why


def plan_warm(model: str, observed: Mapping[str, Any], failed: Mapping[str, int] | None = None
              ) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Per replica, the warm load to make ({url: {"warm", "serving", "versions", "from", "config"}})
    and why each other replica needs none ({url: why}). Pure.

    `failed`: replica -> a warm version whose load failed there before (missing from the repository,
    refused by Triton): not tried again there while it is the version to warm (a deploy moves it on;
    the warm keeper reads them back from the journal, for an hour: daemon/workers/warm_failures.py).

    A replica whose read carries server metadata (`server`) of a release that does not promise a
    reload without loss of availability gets none (see the module doc)."""
    known_bad = frozenset(int(v) for v in observed.get("known_bad", ()))
    todo: dict[str, dict[str, Any]] = {}
    skipped: dict[str, str] = {}
    for url, rep in observed["replicas"].items():
        seq = switch_sequence(rep["server"]) if "server" in rep else None  # None: not read (today's path)
        if seq is not None and not seq.warm:
            skipped[url] = f"{NOT_PROMISED} {seq.release}: {seq.why}"
            continue
        served = ready_versions(rep["index"], model)
        warm, why = warm_version(served, listed_versions(rep["index"], model), known_bad)
        if warm is None:
            skipped[url] = why
        elif warm in served:
            skipped[url] = f"version {warm} is warm beside {max(served)}"
        elif failed is not None and failed.get(url) == warm:
            skipped[url] = f"loading version {warm} failed before; not tried again while it is the one to warm"
        else:
            versions = sorted({*served, warm})
            todo[url] = {"warm": warm, "serving": max(served), "versions": versions, "from": served,
                         "config": pinned_config(rep["config"], versions), "why": why}
    return todo, skipped


async def keep_warm(rollback: TritonRollback, target: Target, params: TritonRollbackParams,
                    failed: dict[str, int] | None = None) -> Outcome:
    """Load the previous good version beside the served one on every replica that lacks it.

    OK when a load was made (`warmed`), NOOP when every replica read has it (or can have none),
    FAILED (retryable) when a load failed (`failed` is updated: that version is not tried again on
    that replica until it serves something else), SKIPPED when the door refused (`refused`)."""
    observed = await rollback.observe(target, params)
    todo, skipped = plan_warm(target.model, observed, failed)
    unreachable = dict(observed.get("unreachable", {}))
    if not todo:
        return Outcome.noop(f"{target.model}: nothing to warm", skipped=skipped, unreachable=unreachable)
    warmed: dict[str, int] = {}
    errors: dict[str, str] = {}
    for url, load in todo.items():
        summary = (f"load {target.model} version {load['warm']} warm beside version {load['serving']} on {url} "
                   f"(keepWarm: {load['why']})")
        try:
            await rollback.load_versions(target, url, load["config"], load["warm"], summary,
                                         params.load_timeout_seconds)
        except Refused as exc:
            return Outcome.skipped(f"not warmed: {exc}", refused=exc.check, warmed=warmed)
        except LOAD_ERRORS as exc:
            # Triton keeps serving what it served when a load fails: nothing is left unloaded.
            errors[url] = _describe(exc)
            if failed is not None:
                failed[url] = load["warm"]
            continue
        warmed[url] = load["warm"]
    data = {"warmed": warmed, "skipped": skipped, "unreachable": unreachable}
    if errors:
        return Outcome.failure(f"{target.model}: keeping the previous version warm failed on {len(errors)} "
                               f"replica(s); they serve what they served", retryable=True, errors=errors, **data)
    return Outcome.success(f"{target.model}: version(s) {sorted(set(warmed.values()))} kept warm on "
                           f"{len(warmed)} replica(s)", **data)


def warm_params(params: Any) -> TritonRollbackParams | None:
    """A policy action's params when they ask for a warm version (`keepWarm: previous`), else None."""
    if isinstance(params, TritonRollbackParams) and params.keep_warm == "previous":
        return params
    return None
