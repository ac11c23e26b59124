"""The one compare-and-swap loop (actions/_compare_and_swap.py): its pure decisions, the retry rule
with a fake value, and the writes every Kubernetes writer sends the emulator under persistent
conflict (exactly maxConflictRetries + 1 PATCHes, even when applied as the executor applies)."""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import pytest
from aiohttp import web
from kubernetes_asyncio.client import ApiClient

from actions._compare_and_swap import Conflict, Decision, backoff_seconds, compare_and_swap, decide
from actions.base import Action, ActionDeps
from actions.gateway import RetuneTimeout, RetuneTimeoutParams
from actions.istio import ShiftWeights, ShiftWeightsParams
from core.outcome import Outcome, OutcomeStatus, PermanentError, TemporaryError
from core.query import QueryResult, Sample
from core.target import Target
from daemon.workers.progress import MAX_APPLY_ATTEMPTS
from lab.kube.emulator import KubeEmulator
from tests.support.kube_helpers import http_route, virtual_service

NS = "serving"
TARGET = Target("ranker", NS)
SIGNAL: Any = None  # plan does not read the signal


# ---- pure decisions ---------------------------------------------------------------------------


@pytest.mark.parametrize("found,expected,wanted,decision", [
    ("2s", "2s", "6s", Decision.WRITE),
    ("6s", "2s", "6s", Decision.NOOP),
    ("9s", "2s", "6s", Decision.REFUSE),
    (None, None, "6s", Decision.WRITE),
    ("6s", "6s", "6s", Decision.NOOP),
])
def test_decide_writes_only_over_the_expected_value(found: Any, expected: Any, wanted: Any,
                                                    decision: Decision) -> None:
    """Wanted already: noop; expected: write; anything else is someone else's: refuse."""
    assert decide(found, expected, wanted) is decision


def test_backoff_doubles_from_50ms_and_is_capped_at_one_second() -> None:
    """One backoff policy for every writer: 0.05 s, 0.1 s, 0.2 s ... at most 1 s."""
    assert [backoff_seconds(n) for n in (1, 2, 3, 4, 5, 6, 10)] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0]


# ---- the loop, with a value in memory ----------------------------------------------------------


@dataclass
class Box:
    """A Swap of a value in memory with a version: counts reads and writes; `fail` answers the next writes."""

    stored: str
    version: int = 1
    reads: int = 0
    writes: int = 0
    fail: list[Exception] = field(default_factory=list)

    what = "timeout"

    async def read(self) -> tuple[str, int]:
        self.reads += 1
        return self.stored, self.version

    def value(self, reading: tuple[str, int]) -> str:
        return reading[0]

    def where(self, reading: tuple[str, int]) -> str:
        return "box"

    def show(self, value: str) -> str:
        return value

    def ours(self, reading: tuple[str, int]) -> bool:
        return False

    def refusal(self, reading: tuple[str, int]) -> str | None:
        return None

    async def write(self, reading: tuple[str, int], wanted: str) -> Mapping[str, Any]:
        self.writes += 1
        if self.fail:
            raise self.fail.pop(0)
        if reading[1] != self.version:
            raise Conflict(f"version {reading[1]} is stale")
        self.stored, self.version = wanted, self.version + 1
        return {"version": self.version}


async def swap(box: Box, max_retries: int = 3, seen: tuple[str, int] | None = None) -> Outcome:
    return await compare_and_swap(box, expected="2s", wanted="6s", purpose="apply",
                                  max_retries=max_retries, seen=seen)


async def test_swap_writes_and_reports_attempts_and_write_data() -> None:
    """A free value is written once; data has the value, attempts and what the write returned."""
    box = Box("2s")
    outcome = await swap(box)
    assert outcome.status is OutcomeStatus.OK and box.stored == "6s"
    assert outcome.message == "apply: box timeout 2s -> 6s"
    assert dict(outcome.data) == {"timeout": "6s", "attempts": 1, "version": 2}


async def test_seen_reading_is_trusted_for_the_first_try_only() -> None:
    """With the plan's reading there is no first read; a stale one conflicts and is re-read."""
    box = Box("2s", version=5)
    outcome = await swap(box, seen=("2s", 4))
    assert outcome.ok and outcome.data["attempts"] == 2 and (box.reads, box.writes) == (1, 2)


async def test_persistent_conflict_is_bounded_and_not_retryable(monkeypatch: pytest.MonkeyPatch) -> None:
    """Conflicts on every write: maxConflictRetries + 1 writes, backing off, then a failure the
    executor must not retry."""
    pauses: list[float] = []

    async def sleep(seconds: float) -> None:
        pauses.append(seconds)

    monkeypatch.setattr("actions._compare_and_swap.asyncio.sleep", sleep)
    box = Box("2s", fail=[Conflict("409") for _ in range(10)])
    outcome = await swap(box, max_retries=3)
    assert outcome.status is OutcomeStatus.FAILED and not outcome.retryable
    assert "still conflicting after 4 attempt(s)" in outcome.message and outcome.data["attempts"] == 4
    assert box.writes == 4 and box.reads == 4 and box.stored == "2s"
    assert pauses == [0.05, 0.1, 0.2]


async def test_transient_failure_is_retryable_and_not_retried_inside() -> None:
    """A 5xx-like TemporaryError ends the loop at once as a retryable failure (the executor's job)."""
    box = Box("2s", fail=[TemporaryError("server error 500")])
    outcome = await swap(box)
    assert outcome.status is OutcomeStatus.FAILED and outcome.retryable and box.writes == 1
    assert outcome.message == "server error 500"


async def test_permanent_failure_is_not_retryable() -> None:
    box = Box("2s", fail=[PermanentError("forbidden: cannot patch")])
    outcome = await swap(box)
    assert outcome.status is OutcomeStatus.FAILED and not outcome.retryable and box.writes == 1


async def test_after_a_conflict_the_fresh_value_decides_again() -> None:
    """A conflict re-reads: someone else's value is refused (data: expected/found), ours is a noop."""
    box = Box("9s", version=2)  # changed by someone else since the reading we planned from
    refused = await swap(box, seen=("2s", 1))
    assert refused.status is OutcomeStatus.FAILED and not refused.retryable
    assert "changed by someone else (expected 2s, found 9s); not overwriting" in refused.message
    assert dict(refused.data) == {"expected": "2s", "found": "9s"} and box.stored == "9s"

    box = Box("6s", version=2)
    noop = await swap(box, seen=("2s", 1))
    assert noop.status is OutcomeStatus.NOOP and box.writes == 1


# ---- every Kubernetes writer against the emulator ----------------------------------------------


def answer(value: float) -> Callable[[str], Any]:
    async def query(q: str) -> QueryResult:
        return QueryResult(q, (Sample({}, value),))
    return query


def configmap() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "gw", "namespace": NS},
            "data": {"t": "2000"}}


def weighted_virtual_service() -> dict[str, Any]:
    vs = virtual_service()
    vs["spec"]["http"][0]["route"] = [{"destination": {"host": "ranker", "subset": s}, "weight": w}
                                      for s, w in (("v1", 90), ("v2", 10))]
    return vs


# writer -> (what the emulator holds, the resource PATCHed, the action's params)
WRITERS: dict[str, tuple[Callable[[], dict[str, Any]], str, dict[str, Any]]] = {
    "istio.shift_weights": (weighted_virtual_service, "virtualservices",
                            {"virtualService": {"namespace": NS, "name": "ranker"}, "set": {"v2": 0}}),
    "retune istio sink": (lambda: virtual_service(timeout="2s"), "virtualservices",
                          {"sink": {"kind": "istio", "namespace": NS, "name": "ranker"}}),
    "retune httproute sink": (lambda: http_route(timeouts={"request": "2s"}), "httproutes",
                              {"sink": {"kind": "httproute", "namespace": NS, "name": "ranker"}}),
    "retune configmap sink": (configmap, "configmaps",
                              {"sink": {"kind": "configmap", "namespace": NS, "name": "gw", "key": "t"}}),
}


async def apply_as_the_executor(action: Action, p: Any) -> list[Outcome]:
    """observe, plan, then apply as daemon/workers/steps.py does: again while retryable."""
    step = action.plan(TARGET, p, await action.observe(TARGET, p), SIGNAL)
    assert not step.noop, step.summary
    outcomes: list[Outcome] = []
    for _ in range(MAX_APPLY_ATTEMPTS):
        outcomes.append(await action.apply(step, TARGET, p))
        if outcomes[-1].ok or not outcomes[-1].retryable:
            break
    return outcomes


async def run_writer(kube: ApiClient, emulator: KubeEmulator, writer: str, retries: int, status: int,
                     times: int | None = None) -> list[Outcome]:
    """Seed the writer's object, answer its PATCHes with `status` (`times`; None: always), apply."""
    seed, resource, raw = WRITERS[writer]
    emulator.seed(seed())
    emulator.inject("patch", resource, status=status, times=times)
    action: Action
    if writer == "istio.shift_weights":
        action, p = ShiftWeights(ActionDeps(kube=kube)), ShiftWeightsParams.model_validate(
            {**raw, "maxConflictRetries": retries})
    else:
        action, p = RetuneTimeout(ActionDeps(kube=kube, query=answer(4.0))), RetuneTimeoutParams.model_validate(
            {"query": "p999", "maxMs": 60000, **raw, "maxConflictRetries": retries})
    return await apply_as_the_executor(action, p)


@pytest.mark.parametrize("writer", list(WRITERS))
@pytest.mark.parametrize("retries", [0, 2])
async def test_persistent_conflict_sends_exactly_retries_plus_one_patches(
        kube_api: ApiClient, kube_emulator: KubeEmulator, writer: str, retries: int) -> None:
    """Every PATCH answered 409: maxConflictRetries + 1 PATCHes in all, one failed, not retryable
    apply, nothing changed; the executor does not multiply them."""
    seed, resource, _ = WRITERS[writer]
    outcomes = await run_writer(kube_api, kube_emulator, writer, retries, status=409)
    assert len(outcomes) == 1 and outcomes[0].status is OutcomeStatus.FAILED and not outcomes[0].retryable
    assert "still conflicting" in outcomes[0].message
    assert [r.status for r in kube_emulator.requests_for("patch")] == [409] * (retries + 1)
    (stored,) = kube_emulator.objects(resource, NS)
    assert {k: stored[k] for k in ("spec", "data") if k in stored} == {
        k: v for k, v in seed().items() if k in ("spec", "data")}


@pytest.mark.parametrize("writer", list(WRITERS))
async def test_server_errors_are_retried_by_the_executor_only(
        kube_api: ApiClient, kube_emulator: KubeEmulator, writer: str) -> None:
    """Every PATCH answered 500: one PATCH per executor attempt, each apply retryable."""
    outcomes = await run_writer(kube_api, kube_emulator, writer, 3, status=500)
    assert len(outcomes) == MAX_APPLY_ATTEMPTS and all(o.retryable for o in outcomes)
    assert len(kube_emulator.requests_for("patch")) == MAX_APPLY_ATTEMPTS


@pytest.mark.parametrize("writer", list(WRITERS))
async def test_a_passing_conflict_is_won_on_a_fresh_read(
        kube_api: ApiClient, kube_emulator: KubeEmulator, writer: str) -> None:
    """One 409, then the write lands: two PATCHes, attempts 2, one re-read."""
    (outcome,) = await run_writer(kube_api, kube_emulator, writer, 3, status=409, times=1)
    assert outcome.status is OutcomeStatus.OK and outcome.data["attempts"] == 2, outcome.message
    assert [r.status for r in kube_emulator.requests_for("patch")] == [409, 200]
    assert len(kube_emulator.requests_for("get")) == 2  # observe, then the re-read after the 409


async def test_http_sink_persistent_412_sends_retries_plus_one_puts() -> None:
    """The HTTP endpoint sink goes through the same loop: If-Match answered 412 every time."""
    puts: list[str | None] = []
    versions = itertools.count(1)

    async def get(request: web.Request) -> web.Response:
        return web.json_response({"timeoutMs": 2000}, headers={"ETag": f'"{next(versions)}"'})

    async def put(request: web.Request) -> web.Response:
        puts.append(request.headers.get("If-Match"))
        return web.Response(status=412)

    app = web.Application()
    app.router.add_get("/t", get)
    app.router.add_put("/t", put)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        url = f"http://127.0.0.1:{runner.addresses[0][1]}/t"
        p = RetuneTimeoutParams.model_validate({"query": "p999", "maxMs": 60000, "maxConflictRetries": 2,
                                                "sink": {"kind": "http", "url": url}})
        outcomes = await apply_as_the_executor(RetuneTimeout(ActionDeps(query=answer(4.0))), p)
    finally:
        await runner.cleanup()
    assert len(outcomes) == 1 and not outcomes[0].retryable and "still conflicting" in outcomes[0].message
    assert puts == ['"1"', '"2"', '"3"']
