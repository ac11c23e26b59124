"""istio.shift_weights: pure weight planning, and optimistic writes through the real client against the emulator."""
from __future__ import annotations

import datetime
import itertools
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient
from pydantic import ValidationError

from actions.base import ActionDeps, Step
from actions.istio import (Destination, ShiftWeights, ShiftWeightsParams, effective_weights, largest_remainder,
                           plan_shift, plan_weights, weights_patch)
from core.outcome import OutcomeStatus, PermanentError
from core.signal import Signal, SignalSource
from core.target import Target
from lab.kube.emulator import KubeEmulator
from lab.kube.schemas import object_errors

NS, NAME = "serving", "reviews"
TARGET = Target(model="reviews", namespace=NS)
SIGNAL = Signal(SignalSource.ALERT, "TritonTailLatency", {}, datetime.datetime.now(datetime.timezone.utc), "k")


def dests(*weights: int | None, subsets: str = "v1 v2 v3") -> list[Destination]:
    return [Destination("reviews", s, w) for s, w in zip(subsets.split(), weights)]


def params(**kwargs: Any) -> ShiftWeightsParams:
    return ShiftWeightsParams.model_validate({"virtualService": {"namespace": NS, "name": NAME}, **kwargs})


def virtual_service(*weights: int | None, api_version: str = "networking.istio.io/v1") -> dict[str, Any]:
    route = []
    for subset, weight in zip(("v1", "v2", "v3"), weights):
        entry: dict[str, Any] = {"destination": {"host": NAME, "subset": subset}}
        if weight is not None:
            entry["weight"] = weight
        route.append(entry)
    return {
        "apiVersion": api_version, "kind": "VirtualService",
        "metadata": {"name": NAME, "namespace": NS},
        "spec": {"hosts": [NAME], "http": [
            {"name": "mirror", "match": [{"headers": {"x-mirror": {"exact": "1"}}}],
             "route": [{"destination": {"host": NAME, "subset": "v1"}}]},
            {"name": "primary", "route": route},
        ]},
    }


def weights_in(emulator: KubeEmulator, route: int = 1) -> list[int | None]:
    vs = emulator.get("virtualservices", NS, NAME)
    assert vs is not None
    return [d.get("weight") for d in vs["spec"]["http"][route]["route"]]


async def observe_and_plan(action: ShiftWeights, p: ShiftWeightsParams) -> Step:
    return action.plan(TARGET, p, await action.observe(TARGET, p), SIGNAL)


@pytest.fixture
def action(kube_api: ApiClient) -> ShiftWeights:
    return ShiftWeights(ActionDeps(kube=kube_api))


# ---- pure: remainder split and weight planning -------------------------------------------------


def test_largest_remainder_is_proportional_and_exact() -> None:
    """The split sums to the total and follows the shares."""
    assert largest_remainder(90, [50, 30]) == [56, 34]


def test_largest_remainder_ties_go_to_the_earlier_destination() -> None:
    """Equal fractional parts round up in route order, so the result is deterministic."""
    assert largest_remainder(100, [50, 30]) == [63, 37]
    assert largest_remainder(5, [1, 1]) == [3, 2]


def test_largest_remainder_splits_evenly_when_all_shares_are_zero() -> None:
    """Destinations that all had 0 share the remainder evenly."""
    assert largest_remainder(100, [0, 0, 0]) == [34, 33, 33]


def test_set_abort_sends_everything_to_the_rest() -> None:
    """set {v2: 0} on 90/10 gives 100/0: the unnamed v1 takes the remainder."""
    assert plan_weights(dests(90, 10), set_weights={"v2": 0}) == [100, 0]


def test_set_remainder_is_proportional_to_current_weights() -> None:
    """Unnamed destinations share the remainder in proportion to what they had."""
    assert plan_weights(dests(50, 30, 20), set_weights={"v3": 0}) == [63, 37, 0]


def test_set_every_destination_must_sum_to_100() -> None:
    """Naming every destination with a total other than 100 is an error."""
    with pytest.raises(PermanentError, match="sum to 100"):
        plan_weights(dests(90, 10), set_weights={"v1": 50, "v2": 10})


def test_step_moves_weight_to_the_unnamed_destination() -> None:
    """step {v2: +10} on 90/10 gives 80/20."""
    assert plan_weights(dests(90, 10), step_weights={"v2": 10}) == [80, 20]


def test_step_is_floored_at_zero() -> None:
    """A step below 0 stops at 0 and the remainder goes to the others."""
    assert plan_weights(dests(90, 10), step_weights={"v2": -50}) == [100, 0]


def test_step_is_capped_at_100() -> None:
    """A step above 100 stops at 100, leaving 0 for the others."""
    assert plan_weights(dests(90, 10), step_weights={"v2": 100}) == [0, 100]


def test_unknown_subset_is_a_permanent_error() -> None:
    """A subset the route does not have is refused before anything is written."""
    with pytest.raises(PermanentError, match="no destination"):
        plan_weights(dests(90, 10), set_weights={"canary": 0})


def test_ambiguous_subset_is_a_permanent_error() -> None:
    """A subset name shared by two hosts cannot say which destination is meant."""
    two_hosts = [Destination("a", "v1", 50), Destination("b", "v1", 50)]
    with pytest.raises(PermanentError, match="more than one"):
        plan_weights(two_hosts, set_weights={"v1": 0})


def test_lone_destination_without_weight_counts_as_100() -> None:
    """Istio gives a lone unweighted destination all traffic; among several, a missing weight is 0."""
    assert effective_weights(dests(None, subsets="v1")) == [100]
    assert effective_weights(dests(None, 100)) == [0, 100]


def test_planned_weights_always_sum_to_100() -> None:
    """Over many starting splits and steps, every plan sums to 100 and stays in 0..100."""
    for start, delta in itertools.product([(100, 0, 0), (50, 30, 20), (0, 0, 100), (1, 1, 98)],
                                          [-100, -37, -1, 0, 1, 33, 100]):
        weights = plan_weights(dests(*start), step_weights={"v2": delta})
        assert sum(weights) == 100 and all(0 <= w <= 100 for w in weights), (start, delta, weights)


# ---- pure: params, step, patch ---------------------------------------------------------------


def test_params_reject_unknown_keys() -> None:
    """A typo in a policy is a load error (extra=forbid)."""
    with pytest.raises(ValidationError):
        params(set={"v2": 0}, wieght=1)


@pytest.mark.parametrize("bad", [
    {"set": {"v2": 0}, "step": {"v2": -10}},
    {},
    {"set": {"v1": 80, "v2": 30}},
    {"set": {"v2": 0}, "route": "primary", "match": 1},
    {"set": {"v2": 0}, "apiVersion": "v1alpha3"},
    {"step": {"v2": 101}},
])
def test_params_reject_contradictions(bad: dict[str, Any]) -> None:
    """Exactly one of set/step; set sums to at most 100; route or match; v1/v1beta1 only."""
    with pytest.raises(ValidationError):
        params(**bad)


def test_params_accept_full_api_version() -> None:
    """apiVersion may be written as in a manifest: networking.istio.io/v1beta1."""
    assert params(set={"v2": 0}, apiVersion="networking.istio.io/v1beta1").api_version == "v1beta1"


def test_plan_records_exact_before_and_after() -> None:
    """before holds the route's weights as stored (absent stays None) and the resourceVersion read."""
    vs = virtual_service(90, None)
    vs["metadata"]["resourceVersion"] = "42"
    step = plan_shift(vs, params(route="primary", set={"v2": 0}))
    assert step.before["resourceVersion"] == "42"
    assert [d["weight"] for d in step.before["destinations"]] == [90, None]
    assert [d["weight"] for d in step.after["destinations"]] == [100, 0]
    assert step.before["route"] == {"index": 1, "name": "primary"} and not step.noop


def test_plan_is_noop_when_weights_already_match() -> None:
    """Asking for the weights the route already has plans a noop step."""
    step = plan_shift(virtual_service(100, 0), params(route="primary", set={"v2": 0}))
    assert step.noop and "already" in step.summary


def test_plan_selects_the_first_route_by_default() -> None:
    """Without route/match the first http route is changed."""
    step = plan_shift(virtual_service(90, 10), params(set={"v1": 100}))
    assert step.before["route"]["index"] == 0 and step.noop  # the mirror route has v1 alone


def test_plan_unknown_route_name_is_permanent() -> None:
    """A route name the VirtualService does not have is refused."""
    with pytest.raises(PermanentError, match="no http route named"):
        plan_shift(virtual_service(90, 10), params(route="canary", set={"v2": 0}))


def test_patch_tests_resource_version_and_changed_weights_first() -> None:
    """The JSON patch starts with `test` ops (resourceVersion, then each old weight) before writes."""
    ops = weights_patch("7", 1, dests(90, 10), [100, 0])
    assert ops == [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "7"},
        {"op": "test", "path": "/spec/http/1/route/0/weight", "value": 90},
        {"op": "test", "path": "/spec/http/1/route/1/weight", "value": 10},
        {"op": "add", "path": "/spec/http/1/route/0/weight", "value": 100},
        {"op": "add", "path": "/spec/http/1/route/1/weight", "value": 0},
    ]


def test_patch_removes_a_weight_that_was_absent() -> None:
    """Reverting to an absent weight removes the field instead of writing a number."""
    ops = weights_patch("7", 0, dests(100, 0), [None, 0])
    assert ops[-1] == {"op": "remove", "path": "/spec/http/0/route/0/weight"}


# ---- against the emulator with the real client ------------------------------------------------


async def test_abort_sends_all_traffic_to_stable(action: ShiftWeights, kube_emulator: KubeEmulator) -> None:
    """set {v2: 0}: apply writes 100/0 with one GET and one PATCH, and verify confirms it."""
    kube_emulator.seed(virtual_service(90, 10))
    p = params(route="primary", set={"v2": 0})
    step = await observe_and_plan(action, p)
    outcome = await action.apply(step, TARGET, p)
    assert outcome.status == OutcomeStatus.OK, outcome.message
    assert weights_in(kube_emulator) == [100, 0]
    assert [(r.verb, r.status) for r in kube_emulator.requests] == [("get", 200), ("patch", 200)]
    assert (await action.verify(step, TARGET, p)).ok


async def test_step_shifts_ten_percent(action: ShiftWeights, kube_emulator: KubeEmulator) -> None:
    """step {v2: +10} on 90/10 writes 80/20."""
    kube_emulator.seed(virtual_service(90, 10))
    p = params(route="primary", step={"v2": 10})
    assert (await action.apply(await observe_and_plan(action, p), TARGET, p)).ok
    assert weights_in(kube_emulator) == [80, 20]


async def test_v1beta1_api_version_is_used_for_requests(action: ShiftWeights,
                                                        kube_emulator: KubeEmulator) -> None:
    """apiVersion v1beta1 reads and writes through the v1beta1 endpoint."""
    kube_emulator.seed(virtual_service(90, 10))
    p = params(route="primary", set={"v2": 0}, apiVersion="v1beta1")
    assert (await action.apply(await observe_and_plan(action, p), TARGET, p)).ok
    assert {r.version for r in kube_emulator.requests} == {"v1beta1"}


async def test_concurrent_unrelated_edit_is_retried_on_fresh_state(
        action: ShiftWeights, kube_emulator: KubeEmulator) -> None:
    """An edit between our GET and PATCH fails the `test` op (422); we re-read, re-plan and win,
    keeping the other actor's change."""
    kube_emulator.seed(virtual_service(90, 10))
    kube_emulator.after("get", "virtualservices", lambda emu, rec: emu.modify(
        "virtualservices", NS, NAME, lambda o: o["metadata"].setdefault("labels", {}).update(owner="argo")))
    p = params(route="primary", set={"v2": 0})
    outcome = await action.apply(await observe_and_plan(action, p), TARGET, p)
    assert outcome.ok and outcome.data["attempts"] == 2
    assert [r.status for r in kube_emulator.requests_for("patch")] == [422, 200]
    stored = kube_emulator.get("virtualservices", NS, NAME)
    assert weights_in(kube_emulator) == [100, 0] and stored["metadata"]["labels"] == {"owner": "argo"}


async def test_concurrent_route_insert_is_followed_by_name(action: ShiftWeights,
                                                           kube_emulator: KubeEmulator) -> None:
    """If someone inserts a route before ours, the retry finds our route again by name."""
    kube_emulator.seed(virtual_service(90, 10))
    new_route = {"name": "debug", "route": [{"destination": {"host": NAME, "subset": "v1"}}]}
    kube_emulator.after("get", "virtualservices", lambda emu, rec: emu.modify(
        "virtualservices", NS, NAME, lambda o: o["spec"]["http"].insert(0, new_route)))
    p = params(route="primary", set={"v2": 0})
    assert (await action.apply(await observe_and_plan(action, p), TARGET, p)).ok
    assert weights_in(kube_emulator, route=2) == [100, 0]
    assert kube_emulator.get("virtualservices", NS, NAME)["spec"]["http"][0]["name"] == "debug"


async def test_concurrent_weight_edit_is_not_overwritten(action: ShiftWeights,
                                                         kube_emulator: KubeEmulator) -> None:
    """If someone else changed this route's weights, apply fails and leaves their weights."""
    kube_emulator.seed(virtual_service(90, 10))

    def human_shift(o: dict[str, Any]) -> None:
        o["spec"]["http"][1]["route"][0]["weight"], o["spec"]["http"][1]["route"][1]["weight"] = 50, 50

    kube_emulator.after("get", "virtualservices", lambda emu, rec: emu.modify("virtualservices", NS, NAME, human_shift))
    p = params(route="primary", set={"v2": 0})
    outcome = await action.apply(await observe_and_plan(action, p), TARGET, p)
    assert outcome.status == OutcomeStatus.FAILED and not outcome.retryable
    assert "changed by someone else" in outcome.message
    assert weights_in(kube_emulator) == [50, 50]
    assert len(kube_emulator.requests_for("patch")) == 1


async def test_concurrent_edit_to_the_wanted_weights_is_a_noop(action: ShiftWeights,
                                                               kube_emulator: KubeEmulator) -> None:
    """If someone else already set the weights we wanted, apply reports noop after the re-read."""
    kube_emulator.seed(virtual_service(90, 10))

    def same_abort(o: dict[str, Any]) -> None:
        o["spec"]["http"][1]["route"][0]["weight"], o["spec"]["http"][1]["route"][1]["weight"] = 100, 0

    kube_emulator.after("get", "virtualservices", lambda emu, rec: emu.modify("virtualservices", NS, NAME, same_abort))
    p = params(route="primary", set={"v2": 0})
    outcome = await action.apply(await observe_and_plan(action, p), TARGET, p)
    assert outcome.status == OutcomeStatus.NOOP


async def test_endless_conflicts_are_bounded(action: ShiftWeights, kube_emulator: KubeEmulator) -> None:
    """An object edited after every read gives up after 1 + maxConflictRetries patches, not retryable:
    conflicts are retried only inside the compare-and-swap, never again by the executor."""
    kube_emulator.seed(virtual_service(90, 10))
    counter = itertools.count()
    kube_emulator.after("get", "virtualservices", lambda emu, rec: emu.modify(
        "virtualservices", NS, NAME, lambda o: o["metadata"].update(labels={"n": str(next(counter))})),
        times=None)
    p = params(route="primary", set={"v2": 0}, maxConflictRetries=2)
    outcome = await action.apply(await observe_and_plan(action, p), TARGET, p)
    assert outcome.status == OutcomeStatus.FAILED and not outcome.retryable
    assert len(kube_emulator.requests_for("patch")) == 3
    assert weights_in(kube_emulator) == [90, 10]


async def test_forbidden_patch_fails_once_without_retry(action: ShiftWeights,
                                                        kube_emulator: KubeEmulator) -> None:
    """403 on PATCH: a non-retryable failure naming verb and resource, after exactly one PATCH."""
    kube_emulator.seed(virtual_service(90, 10))
    kube_emulator.forbid("patch", "virtualservices")
    p = params(route="primary", set={"v2": 0})
    outcome = await action.apply(await observe_and_plan(action, p), TARGET, p)
    assert outcome.status == OutcomeStatus.FAILED and not outcome.retryable
    assert "forbidden: cannot patch virtualservices.networking.istio.io serving/reviews" in outcome.message
    assert [r.status for r in kube_emulator.requests_for("patch")] == [403]
    assert weights_in(kube_emulator) == [90, 10]


async def test_forbidden_get_fails_observe(action: ShiftWeights, kube_emulator: KubeEmulator) -> None:
    """403 on GET: observe raises a PermanentError naming the get, after one request."""
    kube_emulator.seed(virtual_service(90, 10))
    kube_emulator.forbid("get", "virtualservices")
    with pytest.raises(PermanentError, match="cannot get virtualservices"):
        await action.observe(TARGET, params(set={"v2": 0}))
    assert len(kube_emulator.requests) == 1


async def test_server_error_is_retryable_and_not_retried_inside(action: ShiftWeights,
                                                                kube_emulator: KubeEmulator) -> None:
    """500 on PATCH: a retryable failure (the executor retries), one PATCH from the action."""
    kube_emulator.seed(virtual_service(90, 10))
    kube_emulator.inject("patch", "virtualservices", status=500, times=1)
    p = params(route="primary", set={"v2": 0})
    step = await observe_and_plan(action, p)
    outcome = await action.apply(step, TARGET, p)
    assert outcome.status == OutcomeStatus.FAILED and outcome.retryable
    assert len(kube_emulator.requests_for("patch")) == 1
    assert (await action.apply(step, TARGET, p)).ok  # the executor's retry succeeds


async def test_unknown_subset_writes_nothing(action: ShiftWeights, kube_emulator: KubeEmulator) -> None:
    """A subset the route lacks fails planning; no write request is made."""
    kube_emulator.seed(virtual_service(90, 10))
    with pytest.raises(PermanentError):
        await observe_and_plan(action, params(route="primary", set={"canary": 0}))
    assert [r.verb for r in kube_emulator.requests] == ["get"]


async def test_noop_step_makes_no_write(action: ShiftWeights, kube_emulator: KubeEmulator) -> None:
    """Weights already as wanted: apply is a noop without a PATCH."""
    kube_emulator.seed(virtual_service(100, 0))
    p = params(route="primary", set={"v2": 0})
    step = await observe_and_plan(action, p)
    assert (await action.apply(step, TARGET, p)).status == OutcomeStatus.NOOP
    assert kube_emulator.requests_for("patch") == []


async def test_revert_restores_the_exact_previous_object(action: ShiftWeights,
                                                         kube_emulator: KubeEmulator) -> None:
    """Revert brings back the previous weights exactly, including a weight field that was absent."""
    original = kube_emulator.seed(virtual_service(None, 0, 100))
    p = params(route="primary", set={"v3": 0})
    step = await observe_and_plan(action, p)
    assert (await action.apply(step, TARGET, p)).ok
    assert weights_in(kube_emulator) == [50, 50, 0]
    outcome = await action.revert(step, TARGET, p)
    assert outcome.ok, outcome.message
    assert kube_emulator.get("virtualservices", NS, NAME)["spec"] == original["spec"]


async def test_revert_after_an_unrelated_edit_still_restores(action: ShiftWeights,
                                                             kube_emulator: KubeEmulator) -> None:
    """Revert re-reads first, so a label edit since apply does not block it and is kept."""
    kube_emulator.seed(virtual_service(90, 10))
    p = params(route="primary", set={"v2": 0})
    step = await observe_and_plan(action, p)
    assert (await action.apply(step, TARGET, p)).ok
    kube_emulator.modify("virtualservices", NS, NAME, lambda o: o["metadata"].update(labels={"a": "b"}))
    assert (await action.revert(step, TARGET, p)).ok
    assert weights_in(kube_emulator) == [90, 10]


async def test_revert_does_not_overwrite_a_later_weight_change(action: ShiftWeights,
                                                               kube_emulator: KubeEmulator) -> None:
    """If someone moved the weights after our apply, revert refuses rather than undoing them."""
    kube_emulator.seed(virtual_service(90, 10))
    p = params(route="primary", set={"v2": 0})
    step = await observe_and_plan(action, p)
    assert (await action.apply(step, TARGET, p)).ok
    kube_emulator.modify("virtualservices", NS, NAME,
                         lambda o: o["spec"]["http"][1]["route"][1].update(weight=5)
                         or o["spec"]["http"][1]["route"][0].update(weight=95))
    outcome = await action.revert(step, TARGET, p)
    assert outcome.status == OutcomeStatus.FAILED and "someone else" in outcome.message
    assert weights_in(kube_emulator) == [95, 5]


async def test_verify_fails_when_weights_differ(action: ShiftWeights, kube_emulator: KubeEmulator) -> None:
    """verify re-reads and reports weights that are not the planned ones."""
    kube_emulator.seed(virtual_service(90, 10))
    p = params(route="primary", set={"v2": 0})
    step = await observe_and_plan(action, p)
    outcome = await action.verify(step, TARGET, p)
    assert outcome.status == OutcomeStatus.FAILED and "expected" in outcome.message


async def test_every_written_object_matches_the_istio_crd(action: ShiftWeights,
                                                          kube_emulator: KubeEmulator) -> None:
    """Everything the action wrote (apply, then revert) validates against the real Istio CRD."""
    kube_emulator.seed(virtual_service(None, 0, 100))
    p = params(route="primary", step={"v3": -30})
    step = await observe_and_plan(action, p)
    assert (await action.apply(step, TARGET, p)).ok
    assert (await action.revert(step, TARGET, p)).ok
    written = [w.object for w in kube_emulator.writes if w.verb == "patch"]
    assert len(written) == 2 and all(object_errors(o) == [] for o in written)


async def test_reapplying_a_landed_step_is_a_noop(action: ShiftWeights, kube_emulator: KubeEmulator) -> None:
    """The executor's retry after a lost response finds its own write: noop, no second write."""
    kube_emulator.seed(virtual_service(90, 10))
    p = params(route="primary", set={"v2": 0})
    step = await observe_and_plan(action, p)
    assert (await action.apply(step, TARGET, p)).ok
    assert (await action.apply(step, TARGET, p)).status == OutcomeStatus.NOOP
    assert [w.verb for w in kube_emulator.writes] == ["patch"]
