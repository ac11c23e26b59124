"""Whose forecast rise it is: the served version's, or the load's (pure; no I/O).

A forecast breach has two remedies that help in opposite cases. A rise the request rate explains (a
capacity knee: Holt used the knee, detectors/forecast/load_knee.py) is load: rolling the version
back does not help, scaling out does. A rise the rate does not explain is the version's only when
it is attributed to it, read on per-version series (`max by (model, version)`):

- it is seen on the version's own series, so it began after that version started serving;
- the previous version (the highest version label below it in the same answer) does not show it:
  it neither fires nor stands beyond the threshold. A previous version no longer serving (no
  series in the answer) shows nothing.

`cause` (ForecastBreachParams) keeps the firings of one kind: "version" fires only for attributed
rises (a rollback policy, with `requireAttribution` on the rollback), "load" only for the knee's
(a scale-out policy), "any" for both, unattributed (as before causes existed). With a cause, every
firing detection's details carry `attribution` (cause, version, previous, and why), kept or not.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Literal, Mapping, Sequence

from core.detection import Detection

Cause = Literal["any", "version", "load"]


def knee_used(d: Detection) -> bool:
    """Whether the forecast went through the capacity knee (the rate explains the latency)."""
    knee = d.details.get("knee")
    return isinstance(knee, Mapping) and bool(knee.get("used"))


def _version_key(version: str) -> tuple[int, int | str]:
    return (0, int(version)) if version.isdigit() else (1, version)


def previous_row(labels: Sequence[Mapping[str, str]], row: int, version_label: str) -> int | None:
    """The row of the highest version below row `row`'s in the same answer, or None."""
    mine = labels[row].get(version_label)
    if mine is None:
        return None
    lower = [(i, lab[version_label]) for i, lab in enumerate(labels)
             if lab.get(version_label) is not None and _version_key(lab[version_label]) < _version_key(mine)]
    return max(lower, key=lambda pair: _version_key(pair[1]))[0] if lower else None


def shows_rise(d: Detection, direction: str = "above") -> bool:
    """Whether a version's detection shows the rise: it fires, or its value is beyond the threshold."""
    if d.fired:
        return True
    if d.value is None or d.threshold is None:
        return False
    return d.value >= d.threshold if direction == "above" else d.value <= d.threshold


def attribution(detections: Sequence[Detection], labels: Sequence[Mapping[str, str]], row: int,
                version_label: str, direction: str = "above") -> dict[str, Any]:
    """Why row `row`'s firing is the load's or the version's (`cause`), and whether a version's is
    attributed to it (`attributed`)."""
    version = labels[row].get(version_label)
    if knee_used(detections[row]):
        return {"cause": "load", "version": version, "attributed": False,
                "why": "the request rate explains the rise (a capacity knee): load, not the version"}
    if version is None:
        return {"cause": "version", "version": None, "attributed": False,
                "why": f"the series has no {version_label!r} label: the rise cannot be attributed to a version"}
    prev = previous_row(labels, row, version_label)
    previous = labels[prev][version_label] if prev is not None else None
    if prev is not None and shows_rise(detections[prev], direction):
        return {"cause": "version", "version": version, "previous": previous, "attributed": False,
                "why": f"the previous version {previous} shows it too: not version {version}'s"}
    return {"cause": "version", "version": version, "previous": previous, "attributed": True,
            "why": f"on version {version}'s own series" + (f"; version {previous} does not show it"
                                                          if previous is not None else "")}


def attribute(detections: Sequence[Detection], labels: Sequence[Mapping[str, str]], cause: Cause,
              version_label: str = "version", direction: str = "above") -> list[Detection]:
    """The detections with every firing one's `attribution` in its details; with `cause` "version"
    or "load", a firing of the other kind (or a version's rise not attributed) no longer fires."""
    out = list(detections)
    if cause == "any":
        return out  # unattributed, as before causes existed
    for row, d in enumerate(detections):
        if not d.fired:
            continue
        found = attribution(detections, labels, row, version_label, direction)
        details = {**d.details, "attribution": found}
        keep = found["cause"] == "load" if cause == "load" else bool(found["attributed"])
        if keep:
            out[row] = replace(d, details=details)
        else:
            why = (found["why"] if cause == "version" or found["cause"] == "load"
                   else "the request rate does not explain the rise (no capacity knee)")
            out[row] = replace(d, fired=False, details=details, episode_start=None, recovery_line=None,
                               reason=f"not acted on (cause: {cause}): {why}; {d.reason}")
    return out
