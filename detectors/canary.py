"""TailCanaryDetector (`tail_canary`): judge each canary against the stable serving beside it.

Roles come from the VirtualService (core/canary.py): the destination with the most weight is the
stable, every other one with weight a canary, each mapped to the version label its series carry.
The evidence is tail_excess's (requests above the line per step, from a histogram or counters;
detectors/tail_excess_batch.front_end), summed over each version's series.

The judge is the single-version bank with the canary's null raised to what the stable shows: the
stable's share above the line over the steps the canary served in (so a slowdown both share, begun
with the canary, is not diluted by the stable's healthy history before it), its point estimate
(`stable_reference`), floored at half budget. A canary that fires must fire again against the
stable's share over its own episode (`episode_fired`): a slowdown both share that began after the
canary did is measured over the same recent steps, not the canary's whole time.
The canary fires when its own share exceeds that by the margins the bank's members are made for
(the same sizes: 2x the budget and up, minus the null). A canary whose whole life is in the
lookback is also judged on its life by the start test (detectors/canary_start.py), which spends
`start_false_verdicts` per canary start; the running bank spends what is left of the rate per
version-day. When both are at half budget the test is the single-version one, so its stated
false-alarm rate is the single-version promise; when both slow down together (a shared cause) the
canary is measured against a stable that is just as slow, and does not fire: the detection says
"shared slowdown" instead.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Callable, ClassVar, Mapping, Sequence

import numpy as np
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict, Field

from core.canary import CanaryRoles, canary_roles
from core.detection import Detection, DetectorStatus
from core.query import Series
from detectors.base import ClusterReader, DetectorParams
from detectors.canary_start import (START_ALPHA, bank_days, life_start, live_start_thresholds, start_alpha,
                                    start_statistic)
from detectors.grid_detector import paired_grid
from detectors.sequential.acceptance import shown_above
from detectors.sequential.bank import BankRun, run_bank
from detectors.sequential.design import BankDesign
from detectors.sequential.thresholds import STORE, Promise
from detectors.tail_excess import TailExcessDetector, TailExcessParams, lookback_at
from detectors.tail_excess_batch import OK, SLOWEST_COUNTED, Front, front_end

ISTIO = ("networking.istio.io", "v1")
REFERENCE_GRID = 1.1
"""The canary's null is rounded up to a 10% grid (a higher null only makes the judge more
patient), so canaries of similar references share one threshold computation."""


class ObjectRef(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    namespace: str = Field(min_length=1)
    name: str = Field(min_length=1)


class TailCanaryParams(TailExcessParams):
    """tail_excess's parameters, and where the roles are read."""

    virtual_service: ObjectRef = Field(alias="virtualService")
    """The VirtualService whose route splits the traffic (its destinations by subset)."""
    route: str | None = None
    """The http route's name; omitted: the first route."""
    destination_rule: str | None = Field(None, alias="destinationRule")
    """The DestinationRule that maps subsets to pod labels (same namespace); omitted: the
    VirtualService's name."""
    versions: dict[str, str] | None = None
    """subset -> the version label value of its series (e.g. {v1: "1", v2: "2"} for one Triton
    serving both versions); wins over the DestinationRule."""
    pod_label: str = "version"
    """The DestinationRule subset label that names the version."""
    start_false_verdicts: float = Field(START_ALPHA, ge=0.0, le=0.05)
    """The start test's false verdicts per canary start (detectors/canary_start.py): higher judges a
    young canary sooner and rolls back more good ones; 0 turns the start test off."""


class TailCanaryDetector(TailExcessDetector):
    """The canary judge. Stateless in its decisions (recomputed from the queried range); what it
    keeps is the roles read at the last cycle."""

    kind: ClassVar[str] = "tail_canary"
    Params: ClassVar[type[DetectorParams]] = TailCanaryParams

    def __init__(self, params: TailCanaryParams | Mapping[str, Any]) -> None:
        canary = params if isinstance(params, TailCanaryParams) else TailCanaryParams.model_validate(params)
        super().__init__(canary)
        self.canary = canary
        self.roles: CanaryRoles | str = "the VirtualService has not been read yet"

    async def observe_cluster(self, reader: ClusterReader) -> None:
        p = self.canary
        vs_ref = p.virtual_service
        source = f"{vs_ref.namespace}/{vs_ref.name}" + (f" route {p.route}" if p.route else "")
        try:
            vs = await reader.get(*ISTIO, "virtualservices", vs_ref.namespace, vs_ref.name)
            dr = None
            if p.versions is None or vs is None:
                dr = await reader.get(*ISTIO, "destinationrules", vs_ref.namespace, p.destination_rule or vs_ref.name)
        except Exception as exc:  # the cluster did not answer: no roles, no verdict (never a shift)
            self.roles = f"could not read VirtualService {source}: {type(exc).__name__}: {exc}"
            return
        self.roles = canary_roles(vs, p.route, dr, p.versions, p.pod_label, source)

    def detect_many(self, series: Sequence[Series], now: float,
                    companions: Sequence[Series | None] | None = None) -> list[Detection]:
        head = paired_grid(self.detect, series, now, companions)
        if isinstance(head, list):
            return head
        grid, counters, n = head.grid, head.counters, head.n
        # The window is the lookback the poller was asked for (the last cycle's `judged_lookback`);
        # the start test's horizon is the lookback this cycle implies, or the window if longer.
        front = front_end(replace(self._test, lookback_seconds=self._lookback), grid, counters[:n], counters[n:], now)
        labels = [s.labels for s in series]
        by_version = _versions(self.canary, front, labels)
        self._lookback = judged_lookback(self.canary, front, by_version, self.roles)
        horizon = max(int(front.grid.size), int(round(self._lookback / front.step_seconds)))
        return judge(self.canary, front, labels, self.roles, self.kind, horizon, by_version)


def canary_lookback(p: TailExcessParams, requests_per_step: float, step_seconds: float, threshold: float) -> float:
    """The lookback a canary at `requests_per_step` (per scored step) implies: tail_excess's rule
    (`lookback_at`: LOOKBACK_DELAYS x the smallest member's expected delay, in doublings of
    `lookback_seconds`, capped at `max_lookback_seconds`) for the canary's running bank at its floor
    (the null at half budget), `threshold` that bank's smallest member's at this traffic. A canary
    below SLOWEST_COUNTED requests per second (per scored step, as tail_excess counts) gives the least.

    At the floor and not at the canary's raised null: the lookback follows the canary's traffic,
    not the stable's share. A reference raised by a slowdown both versions share would otherwise
    grow the window into the stable's healthy past before the slowdown, and the stable over the
    canary's steps would read healthier than it is now."""
    if not requests_per_step / step_seconds >= SLOWEST_COUNTED:
        return p.lookback_seconds_
    return lookback_at(p.lookback_seconds_, p.max_lookback_seconds, p.test().design, requests_per_step, threshold,
                       step_seconds)


def _versions(p: TailCanaryParams, f: Front, labels: Sequence[Mapping[str, str]]) -> dict[str, list[int]]:
    """The rows of each version that can be judged (OK, with the version label)."""
    by_version: dict[str, list[int]] = {}
    for row, lab in enumerate(labels):
        if f.status[row] == OK and p.version_label in lab:
            by_version.setdefault(lab[p.version_label], []).append(row)
    return by_version


def _traffic(f: Front, rows: list[int]) -> float:
    """A version's requests per scored step over the window (its rows summed)."""
    units, requests = _sum_rows(f.units, rows), _sum_rows(f.requests, rows)
    scored = np.isfinite(units)
    return float(requests[scored].mean()) if scored.any() else 0.0


def bank_promise(p: TailCanaryParams, step_seconds: float) -> Promise:
    """The running bank's promise: what the start test (`start_false_verdicts` per start) leaves of
    the stated rate."""
    days = p.test().promise_days
    return Promise(bank_days(days, start_alpha(days, p.start_false_verdicts)), step_seconds)


def judged_lookback(p: TailCanaryParams, f: Front, by_version: Mapping[str, list[int]],
                    roles: CanaryRoles | str) -> float:
    """The detector's lookback: the longest `canary_lookback` of the canaries judged this cycle (the
    slowest canary's), at the running bank's thresholds as this cycle reads them (the Wald bound
    until derived, as tail_excess's); the least when none is judged."""
    if isinstance(roles, str):
        return p.lookback_seconds_
    design, promise = p.test().design, bank_promise(p, f.step_seconds)
    out = p.lookback_seconds_
    for canary in roles.canaries:
        rows = by_version.get(canary.version)
        if rows and roles.stable.version in by_version:
            traffic = _traffic(f, rows)
            if traffic > 0:
                h = STORE.get(design, promise, traffic)[0][0]
                out = max(out, canary_lookback(p, traffic, f.step_seconds, h))
    return out


def stable_reference(units: Any, requests: Any, null: float) -> Any:
    """The canary's null: the stable's share above the line over the lookback, floored at `null`
    (elementwise on arrays; a stable without requests gives the floor).

    Why the point estimate and not an upper bound: each member's alternative is the reference plus
    (size x budget - null), at least 0.15 points above it for P99.9, and a member's drift turns
    positive only when the canary exceeds the reference by about half that. The stable's estimate
    errs by share / sqrt(units above the line), below 0.05 points wherever the stable carries 9x the
    canary's traffic over 900 s at 36 req/s and up; an upper bound instead raised the null by
    ~60% at 36 req/s with both healthy, and cost the judge that much delay against the test on the
    canary alone. The floor keeps the stated rate: a higher null only makes the bank more patient."""
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(np.asarray(requests) > 0, np.asarray(units) / np.asarray(requests), 0.0)
    out = np.maximum(null, share)
    return float(out) if out.ndim == 0 else out


def reference_step(reference: float, null: float) -> int:
    """How many steps of REFERENCE_GRID above `null` the canary's null sits: the least that reaches
    `reference` (0 when the reference is the null itself)."""
    return math.ceil(math.log(reference / null) / math.log(REFERENCE_GRID) - 1e-9)


def canary_design(design: BankDesign, step: int) -> BankDesign:
    """The bank a canary is judged by when its null is `step` grid steps above `design`'s: the
    null raised, each member still made for the same excess over it (size x budget - null), so
    every drain (what a request removes) is the single-version one and every jump smaller."""
    null = design.null
    cell = null * REFERENCE_GRID ** step
    return BankDesign(cell, tuple(1.0 + null * (r - 1.0) / cell for r in design.ratios), design.lump)


def episode_fired(base: BankDesign, step: int, run: BankRun, row: int, units: NDArray[np.float64],
                  requests: NDArray[np.float64], s_units: NDArray[np.float64], s_requests: NDArray[np.float64],
                  thresholds: Callable[[BankDesign], Sequence[float]], rounds: int = 3) -> bool:
    """Whether a canary whose bank fired at `step` is still worse than the stable over its own
    episode: the stable's share over the columns since the firing run began (its point estimate,
    floored at the null) becomes the canary's null, and the bank must fire again there.

    Why: the window's reference averages the whole lookback, while the canary's bank reacts to the
    recent run; when both versions slow down together, the stable's average lags the onset and a
    canary as slow as its stable would read as worse. Over the same episode it does not. A higher
    null only lowers the statistic, so this never adds a verdict (the stated rate still holds)."""
    null = base.null
    for _ in range(rounds):
        if not run.fired[row]:
            return False
        members = run.state.statistic[:, row] >= np.asarray(thresholds(canary_design(base, step)))
        begun = run.state.run_start[members, row]
        start = int(begun.min()) - (run.state.column - units.shape[-1]) if begun.size else 0
        su, sn = s_units[max(start, 0):], s_requests[max(start, 0):]
        ok = np.isfinite(su) & np.isfinite(sn)
        seen = float(sn[ok].sum())
        share = float(su[ok].sum()) / seen if seen > 0 else 0.0
        raised = reference_step(max(null, share), null)
        if raised <= step:
            return True
        step = raised
        design = canary_design(base, step)
        run = run_bank(design, units[None, :], requests[None, :], np.array(thresholds(design)))
        row = 0
    return bool(run.fired[row])


def _sum_rows(x: NDArray[np.float64], rows: list[int]) -> NDArray[np.float64]:
    """Per step, the sum over `rows` (NaN where none of them was scored)."""
    block = x[rows]
    return np.where(np.isfinite(block).any(axis=0), np.nansum(block, axis=0), np.nan)


def judge(p: TailCanaryParams, f: Front, labels: Sequence[Mapping[str, str]], roles: CanaryRoles | str,
          kind: str, horizon: int | None = None, by_version: Mapping[str, list[int]] | None = None
          ) -> list[Detection]:
    """One Detection per row: the first series of each canary version carries its verdict.
    `horizon`: the steps the start test's bound holds over (the lookback in use; None: the window's);
    `by_version`: `_versions` of these rows when the caller has it."""
    test = p.test()
    if isinstance(roles, str):
        return [Detection(kind, False, f"no canary verdict: {roles}") for _ in labels]
    horizon = int(f.grid.size) if horizon is None else horizon
    by_version = _versions(p, f, labels) if by_version is None else by_version
    stable = roles.stable.version
    out: list[Detection | None] = [None] * len(labels)
    for row, lab in enumerate(labels):
        if p.version_label not in lab:
            out[row] = Detection(kind, False, f"no {p.version_label!r} label on the series: it cannot be told "
                                              "stable or canary")
        elif f.status[row] != OK:
            out[row] = Detection(kind, False, f"not decided: status {int(f.status[row])} (no data, stale or too little "
                                              "history)", status=DetectorStatus(int(f.status[row])))
    stable_rows = by_version.get(stable, [])
    if not stable_rows:
        return [d or Detection(kind, False, f"no series of the stable {roles.stable.subset} (version {stable}) to "
                                            "compare against; no verdict") for d in out]
    # Per step, the stable's requests above the line and its requests (NaN: not scored).
    st_units, st_requests = _sum_rows(f.units, stable_rows), _sum_rows(f.requests, stable_rows)
    st_scored = np.isfinite(st_units)
    s_units = float(st_units[st_scored].sum())
    s_requests = float(st_requests[st_scored].sum())
    stable_share = s_units / s_requests if s_requests > 0 else 0.0
    null = test.design.null
    allowed = test.budget * test.design.lump
    alpha = start_alpha(test.promise_days, p.start_false_verdicts)
    promise = bank_promise(p, f.step_seconds)
    # A canary the route sends traffic to but whose series are missing (no traffic reached it, or
    # its series lack the version label) has no row of its own: the stable's reason names it.
    unseen = [c for c in roles.canaries if c.version not in by_version]
    unjudged = "".join(f"; canary {c.subset} (version {c.version}, {c.weight}%) not judged: no series of it with "
                       f"data and a {p.version_label!r} label (no traffic reached it?)" for c in unseen)
    for row in stable_rows:
        out[row] = Detection(kind, False, f"stable {roles.stable.subset} (version {stable}): {stable_share:.3%} above the "
                                          f"line over the lookback{unjudged}",
                             details={"version": stable, "role": "stable", "roles": roles.describe(),
                                      "stable_share": stable_share, "unjudged": [c.version for c in unseen]})
    for canary in roles.canaries:
        rows = by_version.get(canary.version, [])
        if not rows:
            continue
        units, requests = _sum_rows(f.units, rows), _sum_rows(f.requests, rows)
        scored = np.isfinite(units)
        c_units, c_requests = float(np.nansum(units)), float(np.where(scored, requests, 0.0).sum())
        # The stable over the same steps as the canary: a slowdown both share, begun when the canary
        # began (or later), is measured against the stable's share while the canary served, never
        # diluted by the stable's healthy history before it.
        beside = scored & st_scored
        b_units, b_requests = float(st_units[beside].sum()), float(st_requests[beside].sum())
        silent = ("canary" if c_requests <= 0 else "stable") if c_requests <= 0 or b_requests <= 0 else None
        if silent is not None:
            who = (f"canary {canary.subset} (version {canary.version}, {canary.weight}%) got no requests in the lookback"
                   if silent == "canary" else f"the stable {roles.stable.subset} (version {stable}) got no requests "
                                              f"while canary {canary.subset} (version {canary.version}) served")
            out[rows[0]] = Detection(kind, False, f"{who}: nothing to compare; no verdict",
                                     details={"version": canary.version, "role": "canary", "no_traffic": silent})
            for row in rows[1:]:
                out[row] = Detection(kind, False, f"judged with the first series of canary version {canary.version}",
                                     details={"version": canary.version, "role": "canary"})
            continue
        beside_share = b_units / b_requests
        reference = float(stable_reference(b_units, b_requests, null))
        step = reference_step(reference, null)
        design = canary_design(test.design, step)
        cell = design.null
        shared = shown_above(b_units, b_requests, allowed)
        traffic = float(requests[scored].mean()) if scored.any() else 0.0
        h, derived = STORE.get(design, promise, traffic)
        run = run_bank(design, units[None, :], requests[None, :], np.array(h))
        c_share = c_units / c_requests if c_requests > 0 else 0.0
        leader = int(run.leader[0])
        what = (f"canary {canary.subset} (version {canary.version}, {canary.weight}%): {c_share:.3%} above the line "
                f"vs the stable's {beside_share:.3%} over the same steps (reference {reference:.3%}); the "
                f"{test.sizes[leader]:g}x member at {run.state.statistic[leader, 0]:.2f} of {h[leader]:.2f} "
                f"(one false alarm per {test.promise_days:g} days with both at {null:.3%}, "
                f"{traffic / f.step_seconds:.3g} req/s" + ("" if derived else "; Wald bound until derived") + ")")
        fired = bool(run.fired[0]) and episode_fired(
            test.design, step, run, 0, units, requests, np.where(beside, st_units, np.nan),
            np.where(beside, st_requests, np.nan), lambda d: STORE.get(d, promise, traffic)[0])
        began = life_start(requests, np.where(st_scored, st_requests, np.nan),
                           canary.weight / max(canary.weight + roles.stable.weight, 1))
        start_test: dict[str, Any] | None = None
        if began is not None and alpha > 0:
            life = start_statistic(design, c_units, c_requests)  # its whole life is in the lookback
            # Derived by the threshold store's worker, never here (on the poller's event loop); Ville's meanwhile.
            bound, bound_derived = live_start_thresholds(design, alpha, traffic, horizon)
            started = bool((life >= np.asarray(bound)).any())
            start_test = {"began": float(f.grid[began]), "alpha": alpha, "fired": started, "horizon_steps": horizon,
                          "derived": bound_derived,
                          "statistic": {f"{s:g}x": float(v) for s, v in zip(test.sizes, life)},
                          "thresholds": {f"{s:g}x": v for s, v in zip(test.sizes, bound)}}
            if not bound_derived:
                what = f"{what}; start bound being derived (Ville's {bound[0]:.2f} meanwhile)"
            if started and not fired:
                fired = True
                what = (f"{what}; since its first request ({c_requests:.0f} requests, its whole life in the "
                        f"lookback) beyond the start bound (one false verdict in {1 / alpha:.0f} canary starts)")
        details: dict[str, Any] = {
            "version": canary.version, "role": "canary", "stable": stable, "roles": roles.describe(),
            "canary_share": c_share, "stable_share": beside_share, "reference": reference,
            "canary_above_line": c_units, "canary_requests": c_requests, "evidence": test.evidence,
            "stable_above_line": b_units, "stable_requests": b_requests,
            "assumed": {"false_alarm_days": test.promise_days, "null": null, "reference_cell": cell,
                        "requests_per_second": traffic / f.step_seconds, "derived": derived,
                        "thresholds": {f"{s:g}x": v for s, v in zip(test.sizes, h)}},
        }
        if start_test is not None:
            details["start_test"] = start_test
        if fired and shared and not shown_above(c_units, c_requests, reference):
            # The stable is above budget too and the canary's share over the lookback is not shown
            # above the stable's: a burst both shared (a stall, a noisy node) set off a large
            # member. Not the canary's fault (seen on a CPU-starved lab run: 0.387% vs 0.340%).
            fired = False
        if not fired and shared:
            what = f"shared slowdown: the stable is above its budget too, so the canary is not at fault; {what}"
            details["shared_slowdown"] = [stable, canary.version]
        episode = None
        if fired and start_test is not None and start_test["fired"]:
            episode = start_test["began"]  # the canary's life is the episode
        elif fired and run.episode_start[0] >= 0:
            start = int(run.episode_start[0] - (run.state.column - f.grid.size))
            episode = float(f.grid[max(start, 0)])
        out[rows[0]] = Detection(kind, fired, ("canary worse than the stable: " if fired else "") + what,
                                 value=float(run.state.statistic[leader, 0]), threshold=float(h[leader]),
                                 score=float(run.score[0]), episode_start=episode, details=details)
        for row in rows[1:]:
            out[row] = Detection(kind, False, f"judged with the first series of canary version {canary.version}",
                                 details={"version": canary.version, "role": "canary"})
    return [d or Detection(kind, False, "a version the VirtualService does not route to: not judged")
            for d in out]
