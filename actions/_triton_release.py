"""What the Triton release in use promises when a loaded model is loaded again, read from its server
metadata (`GET /v2`: name, version, extensions), and the switch sequence of the rollback that follows. Pure.

Up to 2.65.0 (NGC 26.01) Triton's model-management page promised under EXPLICIT model control that a
reload "will replace the already loaded model without any loss in availability" and that a failed one
leaves the loaded model unchanged. From 2.66.0 (26.02; triton-inference-server/server PR #8562) it says
instead that "the existing model should be explicitly unloaded prior to the updated version being
loaded", and keeps both promises for POLL mode only (docs/stack-facts.md, "Which releases promise it").

- `IN_PLACE` (a release that promises it): today's path. The rollback is one load with a `specific`
  version-policy override; where the target version is already loaded beside the bad one (keepWarm)
  that load is a config update of the loaded version, the warm switch.
- `LOAD` (a release that does not, or one the metadata does not name): no warm switch and no version
  kept warm (loading one beside the served version is itself a reload of a loaded model), and still
  never `unload_model` on a serving model (it takes every version down: the outage the advice means).
  The rollback sends the same single load with the override, the one request that keeps the old
  version serving while the new one loads in the code of every release read (docs/stack-facts.md);
  apply re-reads every replica after it and puts back what moved if one is refused.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

IN_PLACE = "in_place"
LOAD = "load"
LAST_PROMISING = (2, 65)
"""The last Triton release (major, minor) whose docs promise a reload without loss of availability."""

_VERSION = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?")


@dataclass(frozen=True)
class SwitchSequence:
    """How a rollback switches one replica's version, and why (said in the step and the docs)."""

    sequence: str  # IN_PLACE or LOAD
    release: str  # "triton 2.51.0", or what is known of the server
    why: str

    @property
    def warm(self) -> bool:
        """Whether a version may be kept warm beside the served one and switched to in place."""
        return self.sequence == IN_PLACE


def release_version(metadata: Mapping[str, Any] | None) -> tuple[int, int, int] | None:
    """The (major, minor, patch) a server's metadata names, or None when it names none."""
    if not isinstance(metadata, Mapping):
        return None
    found = _VERSION.match(str(metadata.get("version", "")).strip())
    if found is None:
        return None
    return int(found[1]), int(found[2]), int(found[3] or 0)


def switch_sequence(metadata: Mapping[str, Any] | None) -> SwitchSequence:
    """The switch sequence the release behind `metadata` (`GET /v2`; None when unreadable) allows."""
    if not isinstance(metadata, Mapping):
        return SwitchSequence(LOAD, "unknown", "the server metadata (GET /v2) could not be read: no promise "
                                               "of a reload without loss of availability is assumed")
    name = str(metadata.get("name", ""))
    version = release_version(metadata)
    release = f"{name or 'unnamed server'} {metadata.get('version', '?')}"
    if name != "triton" or version is None:
        return SwitchSequence(LOAD, release, "not a Triton release the metadata names: no promise of a reload "
                                             "without loss of availability is assumed")
    if "model_repository" not in (metadata.get("extensions") or ()):
        return SwitchSequence(LOAD, release, "the server reports no model_repository extension")
    if version[:2] <= LAST_PROMISING:
        return SwitchSequence(IN_PLACE, release, "its docs promise a reload without loss of availability "
                                                 "(explicit model control)")
    return SwitchSequence(LOAD, release, "its docs ask for an unload before a reload and no longer promise one "
                                         "without loss of availability (since 2.66.0); tailguard never unloads "
                                         "a serving model")
