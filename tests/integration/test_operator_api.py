"""The operator API on a real daemon on loopback: token scopes, runtime freeze and unfreeze through
the API and the CLI (each stops an action a signal would otherwise run, the lift lets the next one
through, all journaled with who and why, visible in /readyz, /metrics and status), status against a
daemon mid-incident, the OpenAPI document, and hostile input (a 4xx with a one-line reason, never 500).
The ConfigMap way to freeze is in tests/emulator/test_freeze_configmap.py."""
from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any, AsyncIterator, Iterator

import aiohttp
import pytest
from hypothesis import given
from hypothesis import strategies as st

from daemon.http.openapi import openapi_document
from daemon.wiring.cli import main
from daemon.wiring.registries import action_registry, detector_registry
from daemon.wiring.service import Service
from tests.integration.test_webhook_hardening import FAST, ThreadedService, json_logs  # noqa: F401 (fixture)
from tests.support.helpers import TOKEN, NotifySink, local_settings, notify_policy, payload_with

REPO = Path(__file__).resolve().parents[2]
READER, OPERATOR = "reader-token-5a1e9c0b", "operator-token-77d2f1aa"
TOKENS = f"""
- {{name: dashboards, token: {READER}, scopes: [read]}}
- {{name: alice, token: {OPERATOR}, scopes: [read, write]}}
"""


@pytest.fixture(autouse=True)
def api_tokens_env() -> Iterator[None]:
    os.environ["TAILGUARD_API_TOKENS"] = TOKENS
    yield
    os.environ.pop("TAILGUARD_API_TOKENS", None)


def _settings(tmp_path: Path, sink_url: str = "http://127.0.0.1:9/hook", cooldown: str = "0s") -> Any:
    pol = tmp_path / "policies"
    pol.mkdir(exist_ok=True)
    (pol / "p.yaml").write_text(notify_policy(sink_url, f"cooldown: {cooldown}, maxActions: 10, maxActionsWindow: 1h"))
    return local_settings(tmp_path, pol)


@pytest.fixture
async def svc(tmp_path: Path, sink: NotifySink) -> AsyncIterator[Service]:
    async with Service(_settings(tmp_path, sink.url), action_registry(), detector_registry()) as s:
        yield s


async def call(svc: Service, method: str, path: str, token: str | None = OPERATOR,
               body: Any = None) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    async with aiohttp.ClientSession() as http:
        async with http.request(method, f"http://127.0.0.1:{svc.port}{path}", json=body, headers=headers) as resp:
            text = await resp.text()
            return resp.status, (json.loads(text) if resp.content_type == "application/json" else text)


async def alert(svc: Service, minute: int) -> None:
    """One new alert (a distinct startsAt), processed before this returns."""
    status, _ = await call(svc, "POST", "/api/v1/alerts", TOKEN, payload_with(starts_at=f"2026-11-29T17:{minute:02d}:00Z"))
    assert status == 200
    await svc.drain()


async def last_decision(svc: Service) -> tuple[str, str]:
    d = (await svc.journal.decisions.all.in_thread())[-1]
    return d.state.value, d.reason


# ---- access -------------------------------------------------------------------------------------


async def test_token_scopes(svc: Service) -> None:
    """No token 401; the webhook token is no API token (401 on status); a read token reads but cannot
    freeze (403); an API token cannot post alerts (401)."""
    assert (await call(svc, "GET", "/api/v1/status", None))[0] == 401
    status, body = await call(svc, "GET", "/api/v1/status", TOKEN)
    assert status == 401 and body == {"error": "missing or invalid bearer token"}
    assert (await call(svc, "GET", "/api/v1/status", READER))[0] == 200
    status, body = await call(svc, "POST", "/api/v1/freeze", READER, {"reason": "x"})
    assert status == 403 and body["error"] == "token 'dashboards' lacks the 'write' scope"
    assert (await call(svc, "POST", "/api/v1/alerts", OPERATOR, payload_with()))[0] == 401
    assert await svc.journal.freezes.all.in_thread() == []


async def test_openapi_is_served_and_committed(svc: Service) -> None:
    """The document is served without a token and equals docs/openapi.json (regenerate it when this fails:
    python -c 'import json; from daemon.http.openapi import openapi_document as d; print(json.dumps(d(), indent=2))')."""
    status, served = await call(svc, "GET", "/api/v1/openapi.json", None)
    assert status == 200 and served == openapi_document()
    assert json.loads((REPO / "docs" / "openapi.json").read_text()) == served
    assert {"/api/v1/status", "/api/v1/freeze", "/api/v1/unfreeze", "/api/v1/approvals/{approval}/approve"} <= set(served["paths"])


# ---- freeze and unfreeze ---------------------------------------------------------------------------


async def test_freeze_via_api_stops_the_action_and_unfreeze_lets_the_next_through(
        svc: Service, sink: NotifySink) -> None:
    """A daemon freeze through the API blocks the plan (nothing sent), shows in /readyz, /metrics and
    status, is journaled with the token's name and reason; the unfreeze lets the next signal act."""
    status, body = await call(svc, "POST", "/api/v1/freeze", body={"reason": "maintenance window"})
    assert status == 201 and body["frozen"]["scope"] == "*" and body["frozen"]["by"] == "alice"
    await alert(svc, 0)
    state, reason = await last_decision(svc)
    assert state == "blocked" and reason.startswith("daemon frozen: maintenance window (by alice via api)")
    assert sink.received == []
    ready = (await call(svc, "GET", "/readyz", None))[1]
    assert ready["frozen"] is True and ready["freeze"]["daemon"]["reason"] == "maintenance window (by alice via api)"
    metrics = (await call(svc, "GET", "/metrics", None))[1]
    assert "tailguard_frozen 1.0" in metrics and "tailguard_frozen_daemon 1.0" in metrics
    doc = (await call(svc, "GET", "/api/v1/status", READER))[1]
    assert doc["freeze"]["daemon"]["by"] == "alice"

    status, body = await call(svc, "POST", "/api/v1/unfreeze", body={"reason": "window over"})
    assert status == 200 and [f["scope"] for f in body["lifted"]] == ["*"]
    await alert(svc, 1)
    assert (await last_decision(svc))[0] == "succeeded" and len(sink.received) == 1
    (freeze,) = await svc.journal.freezes.all.in_thread("*")
    assert (freeze.by, freeze.source, freeze.lifted_by) == ("alice", "api", "alice")
    assert freeze.lifted_reason == "window over (by alice via api)"
    assert "tailguard_frozen 0.0" in (await call(svc, "GET", "/metrics", None))[1]
    assert (await call(svc, "POST", "/api/v1/unfreeze", body={}))[0] == 409  # nothing frozen any more


async def test_target_freeze_via_api_for_a_while(svc: Service, sink: NotifySink) -> None:
    """A target freeze with a duration: blocked with the reason and the lift hint; a target no policy
    names is refused (422) rather than silently doing nothing."""
    status, body = await call(svc, "POST", "/api/v1/freeze",
                              body={"target": "ranker", "reason": "canary by hand", "durationSeconds": 600})
    assert status == 201 and body["frozen"]["scope"] == "default/ranker" and body["frozen"]["until"]
    await alert(svc, 0)
    state, reason = await last_decision(svc)
    assert state == "blocked" and "target frozen: canary by hand" in reason and "tailguard unfreeze default/ranker" in reason
    assert (await call(svc, "GET", "/readyz", None))[1]["frozen_targets"] == ["default/ranker"]
    assert "tailguard_frozen_targets 1.0" in (await call(svc, "GET", "/metrics", None))[1]
    status, body = await call(svc, "POST", "/api/v1/freeze", body={"target": "ranker-typo", "reason": "x"})
    assert status == 422 and "no policy names default/ranker-typo" in body["error"]
    for scope in ("bad//y", "a b", "Serving/ranker", "x" * 300):  # not namespace/model: a clear 422, not a 500
        status, body = await call(svc, "POST", "/api/v1/freeze", body={"target": scope, "reason": "x"})
        assert status == 422 and body["error"].startswith("target: ") and "not namespace/model" in body["error"], body
    assert [f.target for f in svc.journal.freezes.all()] == ["default/ranker"]  # nothing else stored
    assert (await call(svc, "POST", "/api/v1/unfreeze", body={"target": "default/ranker"}))[0] == 200
    await alert(svc, 1)
    assert (await last_decision(svc))[0] == "succeeded" and len(sink.received) == 1


async def test_freeze_via_cli_stops_the_action_and_unfreeze_lets_the_next_through(
        tmp_path: Path, svc: Service, sink: NotifySink, capsys: pytest.CaptureFixture[str]) -> None:
    """`tailguard freeze ranker --url` and `tailguard unfreeze ranker --url` with a token file."""
    token_file = tmp_path / "token"
    token_file.write_text(OPERATOR + "\n")
    url = ["--url", f"http://127.0.0.1:{svc.port}", "--token-file", str(token_file)]
    assert await asyncio.to_thread(main, ["freeze", "ranker", "--reason", "bad deploy", *url]) == 0
    assert "frozen: default/ranker: bad deploy (by alice via api)" in capsys.readouterr().out
    await alert(svc, 0)
    assert (await last_decision(svc))[0] == "blocked" and sink.received == []
    assert await asyncio.to_thread(main, ["unfreeze", "ranker", "--reason", "fixed", *url]) == 0
    assert "unfrozen: default/ranker" in capsys.readouterr().out
    await alert(svc, 1)
    assert (await last_decision(svc))[0] == "succeeded" and len(sink.received) == 1
    (freeze,) = await svc.journal.freezes.all.in_thread("default/ranker")
    assert freeze.by == "alice" and freeze.lifted_reason == "fixed (by alice via api)"
    # A read token is refused by the CLI too, with the reason on stderr and exit 1.
    token_file.write_text(READER)
    assert await asyncio.to_thread(main, ["freeze", "--reason", "x", *url]) == 1
    assert "403: token 'dashboards' lacks the 'write' scope" in capsys.readouterr().err


async def test_cli_freeze_on_the_journal_file_and_daemon_scope(tmp_path: Path, svc: Service, sink: NotifySink,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """Without --url, freeze and unfreeze write the journal the settings name (on the pod itself); the
    running daemon reads it at its next decision. No target: the whole daemon."""
    config = tmp_path / "config.yaml"
    config.write_text(f"journal: {{path: {tmp_path / 'journal.db'}}}\n")
    assert await asyncio.to_thread(main, ["freeze", "--reason", "incident review", "--config", str(config)]) == 0
    await alert(svc, 0)
    assert (await last_decision(svc))[1].startswith("daemon frozen: incident review")
    assert await asyncio.to_thread(main, ["unfreeze", "--config", str(config), "--reason", "done"]) == 0
    await alert(svc, 1)
    assert (await last_decision(svc))[0] == "succeeded" and len(sink.received) == 1


async def test_freezes_survive_a_restart(tmp_path: Path, sink: NotifySink) -> None:
    """A freeze journaled before a restart still blocks after it."""
    settings = _settings(tmp_path, sink.url)
    async with Service(settings, action_registry(), detector_registry()) as svc:
        assert (await call(svc, "POST", "/api/v1/freeze", body={"reason": "hold"}))[0] == 201
    async with Service(settings, action_registry(), detector_registry()) as svc:
        assert (await call(svc, "GET", "/readyz", None))[1]["frozen"] is True
        await alert(svc, 0)
        assert (await last_decision(svc))[0] == "blocked" and sink.received == []


# ---- status ---------------------------------------------------------------------------------------


async def test_status_mid_incident_lists_pin_cooldown_and_last_decision(
        tmp_path: Path, sink: NotifySink, capsys: pytest.CaptureFixture[str]) -> None:
    """After an action (1h cooldown) and a rollback's pin, status (JSON and the CLI table) shows the
    last decision, the cooldown left, the actions in the window, the pin and the last signal."""
    async with Service(_settings(tmp_path, sink.url, cooldown="1h"), action_registry(), detector_registry()) as svc:
        await alert(svc, 0)
        await alert(svc, 1)  # inside the cooldown: blocked
        # As triton.rollback's verify records it (real Triton rollbacks: tests/integration/test_e2e_rollback.py).
        await svc.journal.pins.record.in_thread("default/ranker", "ranker", 1, from_version=2, decision_id=1,
                                                reason="P99.9 above 500 ms", policy="ranker-notify")
        status, doc = await call(svc, "GET", "/api/v1/status", READER)
        assert status == 200 and doc["role"] == "leader" and doc["acting"] is True
        assert doc["policies"]["count"] == 1 and doc["policies"]["errors"] is None and doc["policies"]["lastReloadAt"]
        (target,) = doc["targets"]
        assert target["target"] == "default/ranker"
        assert target["pin"]["version"] == 1 and target["pin"]["fromVersion"] == 2
        assert target["lastSignal"]["name"] == "TritonTailLatencyHigh"
        assert target["lastDecision"]["state"] == "blocked" and "cooldown" in target["lastDecision"]["reason"]
        (row,) = target["policies"]
        assert 3000 < row["cooldownLeftSeconds"] <= 3600 and row["actionsInWindow"] == 1 and row["maxActions"] == 10
        assert doc["staleQueries"] == []

        token_file = tmp_path / "token"
        token_file.write_text(READER)
        assert await asyncio.to_thread(main, ["status", "--url", f"http://127.0.0.1:{svc.port}",
                                              "--token-file", str(token_file)]) == 0
        table = capsys.readouterr().out
        assert "leader (acting)" in table and "default/ranker" in table and "ranker-notify" in table
        assert "v1 (from v2)" in table and "#2 blocked: cooldown" in table
        assert "1/10 per 1h" in table and ("59m" in table or "1h" in table)
        assert await asyncio.to_thread(main, ["status", "--json", "--url", f"http://127.0.0.1:{svc.port}",
                                              "--token-file", str(token_file)]) == 0
        assert json.loads(capsys.readouterr().out)["targets"][0]["pin"]["version"] == 1


async def test_unpin_via_api(svc: Service) -> None:
    await svc.journal.pins.record.in_thread("default/ranker", "ranker", 1, from_version=2)
    status, body = await call(svc, "POST", "/api/v1/unpin", body={"target": "ranker", "reason": "v3 is fixed"})
    assert status == 200 and body["unpinned"]["version"] == 1
    assert await svc.journal.pins.live.in_thread() == []
    assert (await call(svc, "POST", "/api/v1/unpin", body={"target": "ranker"}))[0] == 409
    assert (await call(svc, "POST", "/api/v1/unpin", READER, {"target": "ranker"}))[0] == 403


async def test_unpin_via_cli_calls_the_api(tmp_path: Path, svc: Service, capsys: pytest.CaptureFixture[str]) -> None:
    """`tailguard unpin ranker --url` ends the running daemon's pin through the API (journaled with the
    token's name), not a local journal file: no --config is given and none exists. A second unpin finds
    no pin (exit 1, one line); a read token is refused (403, exit 1); TAILGUARD_API_TOKEN works too."""
    token_file = tmp_path / "token"
    token_file.write_text(OPERATOR + "\n")
    url = ["--url", f"http://127.0.0.1:{svc.port}"]
    await svc.journal.pins.record.in_thread("default/ranker", "ranker", 1, from_version=2, decision_id=None)
    capsys.readouterr()
    assert await asyncio.to_thread(main, ["unpin", "ranker", "--reason", "v3 is fixed", *url,
                                          "--token-file", str(token_file)]) == 0
    assert "unpinned: default/ranker (was pinned to version 1 from 2)" in capsys.readouterr().out.splitlines()
    assert await svc.journal.pins.live.in_thread() == []
    (ended,) = svc.journal.pins.ended("default/ranker")
    assert ended.ended_reason == "v3 is fixed (by alice via api)"
    assert await asyncio.to_thread(main, ["unpin", "default/ranker", *url, "--token-file", str(token_file)]) == 1
    # The daemon runs in this process: its own log lines may share stderr with the CLI's.
    assert "error: 409: no pin on default/ranker" in capsys.readouterr().err.splitlines()

    await svc.journal.pins.record.in_thread("default/ranker", "ranker", 1, from_version=2)
    token_file.write_text(READER)
    assert await asyncio.to_thread(main, ["unpin", "ranker", *url, "--token-file", str(token_file)]) == 1
    assert "403: token 'dashboards' lacks the 'write' scope" in capsys.readouterr().err
    assert len(await svc.journal.pins.live.in_thread()) == 1
    os.environ["TAILGUARD_API_TOKEN"] = OPERATOR
    try:
        assert await asyncio.to_thread(main, ["unpin", "ranker", *url]) == 0
    finally:
        os.environ.pop("TAILGUARD_API_TOKEN")
    assert await svc.journal.pins.live.in_thread() == []
    # A daemon that cannot be reached: one line, exit 1 (the daemon in this process logs to stderr too).
    capsys.readouterr()
    assert await asyncio.to_thread(main, ["unpin", "ranker", "--url", "http://127.0.0.1:9"]) == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("20")]
    assert len(errors) == 1 and errors[0].startswith("error: cannot reach http://127.0.0.1:9"), errors


async def test_bad_versions_via_cli_list_and_clear_through_the_api(
        tmp_path: Path, svc: Service, capsys: pytest.CaptureFixture[str]) -> None:
    """`tailguard bad-versions --url` lists the running daemon's marks and clears one through the API
    (journaled with the token's name); clearing a version not marked is exit 1 with one line, a read
    token cannot clear, and bad input to the endpoints is a 4xx, never a 500."""
    token_file = tmp_path / "token"
    token_file.write_text(OPERATOR)
    api = ["--url", f"http://127.0.0.1:{svc.port}", "--token-file", str(token_file)]
    await svc.journal.bad_versions.mark.in_thread("default/ranker", 2, "rolled back by decision 7", decision_id=7)
    capsys.readouterr()
    assert await asyncio.to_thread(main, ["bad-versions", "ranker", *api]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    listed = json.loads(line)
    assert (listed["target"], listed["version"], listed["decision"]) == ("default/ranker", 2, 7)

    token_file.write_text(READER)
    assert await asyncio.to_thread(main, ["bad-versions", "ranker", "--clear", "2", *api]) == 1
    assert "403: token 'dashboards' lacks the 'write' scope" in capsys.readouterr().err
    token_file.write_text(OPERATOR)
    assert await asyncio.to_thread(main, ["bad-versions", "ranker", "--clear", "2", "--reason", "v2 was fine",
                                          *api]) == 0
    assert "cleared: version 2 of default/ranker" in capsys.readouterr().out.splitlines()
    assert await svc.journal.bad_versions.known.in_thread("default/ranker") == frozenset()
    (mark,) = await svc.journal.bad_versions.of.in_thread("default/ranker", include_cleared=True)
    assert mark.cleared_reason == "v2 was fine (by alice via api)"
    assert await asyncio.to_thread(main, ["bad-versions", "ranker", "--clear", "2", *api]) == 1
    assert "error: 409: version 2 of default/ranker is not marked bad" in capsys.readouterr().err.splitlines()

    for path in ["/api/v1/bad-versions", "/api/v1/bad-versions?target=a%20b", "/api/v1/bad-versions?target=a/b/c"]:
        status, body = await call(svc, "GET", path, READER)
        assert status == 422 and "\n" not in body["error"], (path, body)
    # Undecodable bytes in the query arrive as U+FFFD: a target no policy names, with no marks.
    assert await call(svc, "GET", "/api/v1/bad-versions?target=%ff", READER) == (
        200, {"target": "default/\ufffd", "badVersions": []})
    for bad in [{"target": "ranker"}, {"target": "ranker", "version": -1}, {"target": "ranker", "version": "x"},
                {"target": "ranker", "version": 10**30}, {"version": 2}]:
        status, body = await call(svc, "POST", "/api/v1/bad-versions/clear", OPERATOR, bad)
        assert status == 422, (bad, body)


async def test_bad_versions_mark_through_the_cli_and_the_api_is_journaled_and_scoped(
        tmp_path: Path, svc: Service, capsys: pytest.CaptureFixture[str]) -> None:
    """`tailguard bad-versions mark TARGET VERSION --reason` marks through the API, journaled with the
    token's name; marking it again is a 409; a read token cannot mark, a target no policy names and a
    missing reason or version are 422, never a 500."""
    token_file = tmp_path / "token"
    token_file.write_text(OPERATOR)
    api = ["--url", f"http://127.0.0.1:{svc.port}", "--token-file", str(token_file)]
    capsys.readouterr()
    assert await asyncio.to_thread(main, ["bad-versions", "mark", "ranker", "3", "--reason", "slow path", *api]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == \
        "marked bad: version 3 of default/ranker: slow path (by alice via api)"
    (mark,) = await svc.journal.bad_versions.of.in_thread("default/ranker")
    assert (mark.version, mark.reason, mark.decision_id) == (3, "slow path (by alice via api)", None)
    assert await asyncio.to_thread(main, ["bad-versions", "mark", "ranker", "3", "--reason", "again", *api]) == 1
    assert "error: 409: version 3 of default/ranker is already marked bad" in capsys.readouterr().err.splitlines()

    assert await call(svc, "POST", "/api/v1/bad-versions/mark", READER,
                      {"target": "ranker", "version": 4, "reason": "x"}) == (
        403, {"error": "token 'dashboards' lacks the 'write' scope"})
    status, body = await call(svc, "POST", "/api/v1/bad-versions/mark", OPERATOR,
                              {"target": "serving/other", "version": 4, "reason": "x"})
    assert status == 422 and body["error"].startswith("target: no policy names serving/other"), body
    for bad in [{"target": "ranker", "version": 4}, {"target": "ranker", "reason": "x"},
                {"target": "ranker", "version": 0, "reason": "x"}, {"version": 4, "reason": "x"},
                {"target": "ranker", "version": "x", "reason": "x"}, {"target": "ranker", "version": 4, "reason": ""}]:
        status, body = await call(svc, "POST", "/api/v1/bad-versions/mark", OPERATOR, bad)
        assert status == 422, (bad, body)
    assert await svc.journal.bad_versions.known.in_thread("default/ranker") == frozenset({3})


# ---- hostile input --------------------------------------------------------------------------------

BAD_BODIES = [
    (b"{", 400), (b"[]", 422), (b'"x"', 422), (b'{"reason": ""}', 422), (b'{"reason": 5}', 422),
    (b'{"reason": "x", "extra": 1}', 422), (b'{"reason": "x", "durationSeconds": -1}', 422),
    (b'{"reason": "x", "durationSeconds": 1e400}', 400), (b'{"reason": "x", "target": "a b"}', 422),
    (b'{"reason": "x", "target": "NS/m"}', 422), (b'{"reason": "\\ud800"}', 422), (b"\xff\xfe", 400),
    (b'{"reason": "x", "target": "' + b"a" * 400 + b'"}', 422), (b"[" * 100 + b"]" * 100, 400),
]


@pytest.mark.parametrize("body,code", BAD_BODIES)
async def test_bad_freeze_bodies_get_a_4xx_with_one_line(svc: Service, body: bytes, code: int) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.post(f"http://127.0.0.1:{svc.port}/api/v1/freeze", data=body,
                             headers={"Authorization": f"Bearer {OPERATOR}"}) as resp:
            assert resp.status == code, await resp.text()
            error = (await resp.json())["error"]
            assert error and "\n" not in error
    assert await svc.journal.freezes.all.in_thread() == []


@pytest.mark.parametrize("path", ["/api/v1/approvals/x/approve", "/api/v1/approvals/-1/approve",
                                  "/api/v1/approvals/99999999999999999999/approve", "/api/v1/approvals/7/approve"])
async def test_unknown_approvals_are_404(svc: Service, path: str) -> None:
    status, body = await call(svc, "POST", path, body={})
    assert status == 404 and body["error"].startswith("no approval")


@pytest.fixture
def threaded(tmp_path: Path, json_logs: Any) -> Iterator[ThreadedService]:  # noqa: F811
    with ThreadedService(_settings(tmp_path)) as ts:
        yield ts


_paths = st.sampled_from(["/api/v1/status", "/api/v1/freeze", "/api/v1/unfreeze", "/api/v1/unpin",
                          "/api/v1/approvals", "/api/v1/approvals/1/approve", "/api/v1/approvals/%ff/approve"])
_auth = st.sampled_from([f"Bearer {OPERATOR}", f"Bearer {READER}", f"Bearer {TOKEN}", "Bearer", "", "Basic x",
                         f"bearer  {OPERATOR} ", "Bearer \udcff"])
_json_values = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20)),
                            lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                    st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                            max_leaves=8)
_bodies = st.one_of(
    st.binary(max_size=200),
    st.fixed_dictionaries({}, optional={"target": st.one_of(st.text(max_size=30), st.integers(), st.none()),
                                        "reason": st.one_of(st.text(max_size=30), st.integers()),
                                        "durationSeconds": st.one_of(st.floats(), st.integers(), st.text(max_size=5))})
    .map(lambda d: json.dumps(d).encode()),
    _json_values.map(lambda v: json.dumps(v).encode()),
)


@pytest.mark.slow
def test_random_operator_requests_never_get_a_500(threaded: ThreadedService) -> None:
    """Any method, path, token and body: a 2xx or a 4xx/503 with a one-line JSON reason, never a 500."""

    @given(st.sampled_from(["GET", "POST"]), _paths, _auth, _bodies)
    @FAST
    def check(method: str, path: str, auth: str, body: bytes) -> None:
        head = (f"{method} {path} HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}\r\n"
                f"Authorization: {auth}\r\nConnection: close\r\n\r\n").encode("utf-8", "surrogateescape")
        status, raw = threaded.send(head + body)
        assert status < 500 or status == 503, (status, raw[:300])
        if status >= 400 and status != 405:
            error = json.loads(raw)["error"]
            assert error and "\n" not in error

    check()
