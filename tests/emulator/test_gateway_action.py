"""gateway.retune_timeout: pure decisions, each sink against the emulator or a real HTTP endpoint,
optimistic writes (409 / someone else's edit / 403), and exact revert."""
from __future__ import annotations

from typing import Any

import pytest
from aiohttp import web
from kubernetes_asyncio.client import ApiClient
from pydantic import ValidationError

from actions.base import ActionDeps
from actions.gateway import (RetuneTimeout, RetuneTimeoutParams, compute_timeout_ms, plan_retune,
                             should_write)
from actions.registry import ACTIONS
from actions.timeout_sinks.base import duration_text
from actions.timeout_sinks.registry import SINKS, sink_class
from core.outcome import OutcomeStatus, PermanentError, TemporaryError
from core.query import QueryResult, Sample
from core.target import Target
from tests.support.kube.conftest_plugin import kube_api, kube_emulator  # noqa: F401  (fixtures)
from lab.kube.emulator import KubeEmulator
from tests.support.kube_helpers import http_route, virtual_service

NS = "serving"
TARGET = Target("ranker", NS)
SIGNAL: Any = None  # plan does not read the signal


def params(sink: dict[str, Any], **kw: Any) -> RetuneTimeoutParams:
    raw = {"query": 'p999_seconds{model="$model"}', "maxMs": 60000, "sink": sink, **kw}
    return RetuneTimeoutParams.model_validate(raw)


def istio_sink(**kw: Any) -> dict[str, Any]:
    return {"kind": "istio", "namespace": NS, "name": "ranker", **kw}


def answer(*values: float, error: str | None = None):
    async def query(q: str) -> QueryResult:
        answer.seen.append(q)
        if error:
            return QueryResult(q, error=error)
        return QueryResult(q, tuple(Sample({"i": str(i)}, v) for i, v in enumerate(values)))
    answer.seen = []
    return query


async def run_steps(action: RetuneTimeout, p: RetuneTimeoutParams):
    observed = await action.observe(TARGET, p)
    step = action.plan(TARGET, p, observed, SIGNAL)
    return step, (await action.apply(step, TARGET, p)) if not step.noop else None


# ---- pure -----------------------------------------------------------------------------------


@pytest.mark.parametrize("p999,expected", [(0.5, 2000), (2000.0, 3000), (1999.4, 3000), (50000.0, 60000)])
def test_compute_timeout_is_clamped_max_of_floor_and_scaled_p999(p999: float, expected: int) -> None:
    """clamp(max(floor, p999 x factor), min, max), rounded up to whole ms."""
    assert compute_timeout_ms(p999, 2000, 1.5, 1, 60000) == expected
    assert compute_timeout_ms(10, 0, 1.5, 100, 60000) == 100


def test_should_write_respects_hysteresis() -> None:
    """Below 10% relative change nothing is written; unset or disabled timeouts always are."""
    assert not should_write(3000, 3200, 0.10)
    assert should_write(3000, 3300, 0.10)
    assert should_write(3000, 2600, 0.10)
    assert not should_write(3000, 3000, 0.0)
    assert should_write(None, 3000, 0.10) and should_write(0, 3000, 0.10)


def test_duration_text_fits_gateway_api_five_digits() -> None:
    """Short Istio form when it fits GEP-2257, else h/m/s/ms parts."""
    assert duration_text(2500) == "2500ms" and duration_text(3000) == "3s"
    assert duration_text(123456) == "2m3s456ms"


def test_params_are_strict_and_sink_kinds_explicit() -> None:
    """Unknown sink kinds and unknown keys are load errors; maxMs is required; registry is explicit."""
    with pytest.raises(ValidationError, match="kind"):
        params({"kind": "nginx", "name": "x"})
    with pytest.raises(ValidationError):
        params(istio_sink(extra=1))
    with pytest.raises(ValidationError, match="maxMs"):
        RetuneTimeoutParams.model_validate({"query": "x", "sink": istio_sink()})
    with pytest.raises(KeyError, match="unknown timeout sink kind"):
        sink_class("nginx")
    assert set(SINKS) == {"istio", "httproute", "configmap", "http"}
    assert ACTIONS["gateway.retune_timeout"] is RetuneTimeout


def observed(status: str, value: float | None = None, raw: Any = "3s", ms: float | None = 3000) -> dict:
    p999 = {"status": status, "value": value, "detail": "why"}
    return {"query": "q", "p999": p999,
            "current": {"raw": raw, "ms": ms, "version": "1", "where": "VS", "extra": {}}}


def test_plan_no_data_is_noop_error_and_multiple_are_distinct() -> None:
    """No data: noop step naming the reason; error: TemporaryError; several series: PermanentError."""
    p = params(istio_sink())
    step = plan_retune(TARGET, p, observed("no_data"), duration_text)
    assert step.noop and "no P99.9 data" in step.summary
    with pytest.raises(TemporaryError, match="query failed"):
        plan_retune(TARGET, p, observed("error"), duration_text)
    with pytest.raises(PermanentError, match="one series"):
        plan_retune(TARGET, p, observed("multiple"), duration_text)
    assert plan_retune(TARGET, p, observed("value", 2.1), duration_text).noop  # 3150 vs 3000: < 10%
    step = plan_retune(TARGET, p, observed("value", 4.0), duration_text)
    assert not step.noop and step.after["raw"] == "6s" and step.before["timeout"]["raw"] == "3s"
    assert plan_retune(TARGET, params(istio_sink(), unit="us"), observed("value", 4e6),
                       duration_text).after["ms"] == 6000


# ---- sinks against the emulator -------------------------------------------------------------


@pytest.mark.parametrize("api_version", ["v1", "v1beta1"])
async def test_istio_route_timeout_retuned_verified_and_reverted(
        kube_api: ApiClient, kube_emulator: KubeEmulator, api_version: str) -> None:  # noqa: F811
    """P99.9 2.4 s x 1.5 -> 3600ms on the route (schema-valid); revert restores 2s exactly."""
    kube_emulator.seed(virtual_service(timeout="2s"))
    action = RetuneTimeout(ActionDeps(kube=kube_api, query=answer(2.4)))
    p = params(istio_sink(apiVersion=api_version, route="primary"))
    step, outcome = await run_steps(action, p)
    assert answer.seen == ['p999_seconds{model="ranker"}']
    assert outcome.status is OutcomeStatus.OK, outcome.message
    assert kube_emulator.get("virtualservices", NS, "ranker")["spec"]["http"][0]["timeout"] == "3600ms"
    assert (await action.verify(step, TARGET, p)).ok
    assert (await action.revert(step, TARGET, p)).ok
    assert kube_emulator.get("virtualservices", NS, "ranker")["spec"]["http"][0]["timeout"] == "2s"
    (patch,) = [r for r in kube_emulator.requests_for("patch") if r.status == 200][:1]
    assert patch.body[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": step.before["timeout"]["version"]}


async def test_absent_istio_timeout_is_added_then_removed_on_revert(
        kube_api: ApiClient, kube_emulator: KubeEmulator) -> None:  # noqa: F811
    """A route without timeout gets one; revert removes the field again."""
    kube_emulator.seed(virtual_service())
    action = RetuneTimeout(ActionDeps(kube=kube_api, query=answer(1.0)))
    p = params(istio_sink())
    step, outcome = await run_steps(action, p)
    assert outcome.ok and kube_emulator.get("virtualservices", NS, "ranker")["spec"]["http"][0]["timeout"] == "2s"
    assert (await action.revert(step, TARGET, p)).ok
    assert "timeout" not in kube_emulator.get("virtualservices", NS, "ranker")["spec"]["http"][0]


async def test_httproute_request_timeout_retuned_and_reverted(
        kube_api: ApiClient, kube_emulator: KubeEmulator) -> None:  # noqa: F811
    """rules[0].timeouts.request is written as a Gateway API duration; revert drops `timeouts`."""
    kube_emulator.seed(http_route())
    action = RetuneTimeout(ActionDeps(kube=kube_api, query=answer(82304.0)))
    p = params({"kind": "httproute", "namespace": NS, "name": "ranker"}, maxMs=200000, unit="ms")
    step, outcome = await run_steps(action, p)
    assert outcome.ok, outcome.message
    rule = kube_emulator.get("httproutes", NS, "ranker")["spec"]["rules"][0]
    assert rule["timeouts"] == {"request": "2m3s456ms"}  # 123456ms: too many digits for GEP-2257
    assert (await action.verify(step, TARGET, p)).ok
    assert (await action.revert(step, TARGET, p)).ok
    assert "timeouts" not in kube_emulator.get("httproutes", NS, "ranker")["spec"]["rules"][0]


async def test_httproute_backend_request_above_new_timeout_is_refused(
        kube_api: ApiClient, kube_emulator: KubeEmulator) -> None:  # noqa: F811
    """backendRequest must not exceed request: the write is refused, nothing changes."""
    kube_emulator.seed(http_route(timeouts={"request": "10s", "backendRequest": "8s"}))
    action = RetuneTimeout(ActionDeps(kube=kube_api, query=answer(1.0)))
    _, outcome = await run_steps(action, params({"kind": "httproute", "namespace": NS, "name": "ranker"}))
    assert outcome.status is OutcomeStatus.FAILED and "backendRequest" in outcome.message
    assert kube_emulator.get("httproutes", NS, "ranker")["spec"]["rules"][0]["timeouts"]["request"] == "10s"


async def test_configmap_key_retuned_and_reverted(kube_api: ApiClient, kube_emulator: KubeEmulator) -> None:  # noqa: F811
    """A ConfigMap key in milliseconds; other keys untouched; revert restores the text exactly."""
    kube_emulator.seed({"apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": "gw", "namespace": NS},
                        "data": {"timeout_ms": "1500", "other": "x"}})
    action = RetuneTimeout(ActionDeps(kube=kube_api, query=answer(3000.0)))
    p = params({"kind": "configmap", "namespace": NS, "name": "gw", "key": "timeout_ms"}, unit="ms")
    step, outcome = await run_steps(action, p)
    assert outcome.ok, outcome.message
    assert kube_emulator.get("configmaps", NS, "gw")["data"] == {"timeout_ms": "4500", "other": "x"}
    assert (await action.revert(step, TARGET, p)).ok
    assert kube_emulator.get("configmaps", NS, "gw")["data"]["timeout_ms"] == "1500"


# ---- optimistic writes ------------------------------------------------------------------------


async def test_unrelated_concurrent_edit_conflicts_then_retries_on_fresh_read(
        kube_api: ApiClient, kube_emulator: KubeEmulator) -> None:  # noqa: F811
    """Someone edits labels between our read and write: the guarded patch fails, we re-read, retry."""
    kube_emulator.seed(virtual_service(timeout="2s"))
    action = RetuneTimeout(ActionDeps(kube=kube_api, query=answer(4.0)))
    p = params(istio_sink())
    observed_ = await action.observe(TARGET, p)
    step = action.plan(TARGET, p, observed_, SIGNAL)
    kube_emulator.modify("virtualservices", NS, "ranker",
                         lambda o: o["metadata"].setdefault("labels", {}).update(team="search"))
    outcome = await action.apply(step, TARGET, p)
    assert outcome.ok and outcome.data["attempts"] == 2
    stored = kube_emulator.get("virtualservices", NS, "ranker")
    assert stored["spec"]["http"][0]["timeout"] == "6s" and stored["metadata"]["labels"] == {"team": "search"}


async def test_timeout_changed_by_someone_else_is_not_overwritten(
        kube_api: ApiClient, kube_emulator: KubeEmulator) -> None:  # noqa: F811
    """Another actor changed the timeout itself after our read: failure, their value stays."""
    kube_emulator.seed(virtual_service(timeout="2s"))
    action = RetuneTimeout(ActionDeps(kube=kube_api, query=answer(4.0)))
    p = params(istio_sink())
    step = action.plan(TARGET, p, await action.observe(TARGET, p), SIGNAL)
    kube_emulator.modify("virtualservices", NS, "ranker",
                         lambda o: o["spec"]["http"][0].update(timeout="9s"))
    outcome = await action.apply(step, TARGET, p)
    assert outcome.status is OutcomeStatus.FAILED and "someone else" in outcome.message
    assert kube_emulator.get("virtualservices", NS, "ranker")["spec"]["http"][0]["timeout"] == "9s"


async def test_forbidden_patch_is_one_request_and_a_permanent_failure(
        kube_api: ApiClient, kube_emulator: KubeEmulator) -> None:  # noqa: F811
    """RBAC 403 on patch: a clear, non-retryable failure after exactly one PATCH."""
    kube_emulator.seed(virtual_service(timeout="2s"))
    kube_emulator.forbid("patch", "virtualservices")
    action = RetuneTimeout(ActionDeps(kube=kube_api, query=answer(4.0)))
    _, outcome = await run_steps(action, params(istio_sink()))
    assert outcome.status is OutcomeStatus.FAILED and not outcome.retryable
    assert outcome.message.startswith("forbidden: cannot patch virtualservices")
    assert len(kube_emulator.requests_for("patch")) == 1


# ---- custom HTTP endpoint -------------------------------------------------------------------


class GatewayAdmin:
    """A custom gateway admin API with ETags: GET/PUT {"timeoutMs": N}, 412 on a stale If-Match."""

    def __init__(self, timeout_ms: int) -> None:
        self.timeout_ms, self.generation, self.puts = timeout_ms, 1, []

    async def get(self, request: web.Request) -> web.Response:
        return web.json_response({"timeoutMs": self.timeout_ms}, headers={"ETag": f'"{self.generation}"'})

    async def put(self, request: web.Request) -> web.Response:
        self.puts.append(dict(request.headers))
        if request.headers.get("If-Match") not in (None, f'"{self.generation}"'):
            return web.Response(status=412)
        self.timeout_ms = (await request.json())["timeoutMs"]
        self.generation += 1
        return web.json_response({"timeoutMs": self.timeout_ms}, headers={"ETag": f'"{self.generation}"'})


@pytest.fixture
async def gateway_admin():
    admin = GatewayAdmin(2000)
    app = web.Application()
    app.router.add_get("/admin/timeout", admin.get)
    app.router.add_put("/admin/timeout", admin.put)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    admin.url = f"http://127.0.0.1:{runner.addresses[0][1]}/admin/timeout"
    try:
        yield admin
    finally:
        await runner.cleanup()


async def test_http_sink_puts_json_with_if_match_and_reverts(gateway_admin: GatewayAdmin) -> None:
    """PUT {"timeoutMs": N} with the ETag from the GET; a 412 re-reads; revert restores 2000."""
    action = RetuneTimeout(ActionDeps(query=answer(3.0)))
    p = params({"kind": "http", "url": gateway_admin.url})
    step = action.plan(TARGET, p, await action.observe(TARGET, p), SIGNAL)
    gateway_admin.generation += 1  # someone touched it (same value): our ETag is stale
    outcome = await action.apply(step, TARGET, p)
    assert outcome.ok and outcome.data["attempts"] == 2 and gateway_admin.timeout_ms == 4500
    assert [h["If-Match"] for h in gateway_admin.puts] == ['"1"', '"2"']
    assert (await action.verify(step, TARGET, p)).ok
    assert (await action.revert(step, TARGET, p)).ok and gateway_admin.timeout_ms == 2000


async def test_no_prometheus_is_a_clear_error() -> None:
    """Without deps.query the action refuses at observe."""
    with pytest.raises(PermanentError, match="needs Prometheus"):
        await RetuneTimeout(ActionDeps()).observe(TARGET, params(istio_sink()))
