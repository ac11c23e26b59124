"""What a Triton replica serves and pins, read from its repository index and model config. Pure.

Shared by `triton.rollback` (actions/triton.py) and its warm version (actions/triton_warm.py).
"""
from __future__ import annotations

import copy
from typing import Any, Mapping


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


def pinned_config(config: Mapping[str, Any], version: int | list[int]) -> dict[str, Any]:
    """A copy of `config` with its version policy pinned to `version` (or to several versions)."""
    out = copy.deepcopy(dict(config))
    out["version_policy"] = {"specific": {"versions": sorted(version) if isinstance(version, list) else [version]}}
    return out


def is_warm_set(served: list[int], version: int, known_bad: frozenset[int] = frozenset()) -> bool:
    """Whether `served` is `version` with one older good version kept warm beside it (`[W, version]`):
    unversioned requests go to the highest, `version`, so a pin to it holds (keepWarm)."""
    return len(served) == 2 and served[1] == version and served[0] < version and served[0] not in known_bad


def pin_in_force(rep: Mapping[str, Any], model: str) -> list[int] | None:
    """The versions a replica read shows pinned: its config's `specific` policy, except that a
    replica serving one version that policy names is pinned to that version alone.

    Triton reports the config a version was loaded with; a later load that keeps the version loaded
    (the warm switch `[P, N]` -> `[P]`, a re-pin) updates it in place without rewriting that report:
    after the switch P reports `[P, N]` while the override in force is `[P]` (a plain reload keeps P
    alone: tests/integration/test_warm_switch.py). No load changes the report, so read literally the
    pin would look drifted for ever (a load every pass) and a second rollback would not see it."""
    served, pinned = ready_versions(rep["index"], model), pinned_versions(rep["config"])
    if pinned is not None and len(served) == 1 and served[0] in pinned:
        return served
    return pinned


def in_place(rep: Mapping[str, Any], model: str, version: int, warm_ok: bool,
             known_bad: frozenset[int] = frozenset()) -> bool:
    """Whether a replica read (index and config) serves `version` pinned: alone (its report pinned to
    it, `pin_in_force`, or a `latest`/`all` policy), or (`warm_ok`) with a warm version beside it and
    its config pinned to exactly those two.

    Alone under `latest`/`all` (a pod that started while the repository's newest was `version`): the
    `specific [version]` load is a config update of the loaded version that leaves the report as it
    is (measured on 2.51), so read literally the pin reconciler loaded it every pass. Only here,
    where `version` is the pin asked for: without one (`pin_in_force`, the rollback's "already
    pinned") such a replica is a deploy, not a rollback made."""
    served, pinned = ready_versions(rep["index"], model), pin_in_force(rep, model)
    if served == [version] and pinned in ([version], None):
        return True
    return warm_ok and is_warm_set(served, version, known_bad) and pinned == served
