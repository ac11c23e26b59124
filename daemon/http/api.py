"""The operator API: status, runtime freeze and unfreeze, approvals, unpin, bad versions (list, mark,
clear); and its OpenAPI document.

Every call but the OpenAPI document needs a named token (`api.tokensFile`): `read` for status and
approvals, `write` for freeze, unfreeze, approve and unpin. Only the leader acts. On a journal the
replicas share (PostgreSQL) any replica answers status, approvals, freeze, unfreeze and unpin from
and into that journal, where the leader reads them; approve runs the plan, so only the leader takes
it. With a journal per replica (SQLite) a follower's view is its own and stale: it answers 503
(Retry-After) with the leader's name (the Lease holder, the leader pod's name).
Bad input gets a 4xx with a one-line reason, never a 500.
"""
from __future__ import annotations

import asyncio
import functools
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Protocol, Sequence

import aiohttp
import structlog
from aiohttp import hdrs, web
from pydantic import ValidationError

from daemon.http.auth import TOKEN_NAME, Caller, Credentials
from daemon.http.bodies import (ApproveRequest, Body, ClearBadVersionRequest, FreezeRequest, MarkBadVersionRequest,
                                UnfreezeRequest, UnpinRequest)
from daemon.http.intake import BodyError, decode_body, field_path
from daemon.http.openapi import openapi_document
from daemon.http.responses import answer_and_close, error
from daemon.http.setup import SETUP
from daemon.http.status import StatusInputs, build_status
from daemon.storage.errors import JournalError, JournalValueError
from daemon.storage.records import DAEMON_SCOPE, BadVersionMark, EndedPin, Freeze
from daemon.workers.approvals import ApprovalOutcome, ApprovalResult, approval_view
from daemon.workers.freezes import FreezeError, freeze_as_dict, target_key

log = structlog.get_logger("tailguard.api")

READ, WRITE = "read", "write"
CONTENT_CODINGS = frozenset({"identity", "gzip", "deflate"})  # what aiohttp decodes; others are refused


@dataclass(frozen=True)
class Leadership:
    """Who answers for the leader: this replica's name and the Lease holder's (None when unknown)."""

    replica: str
    leader: str | None


class Operator(Protocol):
    """What the operator API asks of the running daemon: named operations only; the journal, its
    repositories and the settings stay behind them (daemon/wiring/operations.py implements it).
    Operations that write raise FreezeError (its status answers) or JournalError."""

    def credentials(self) -> Credentials:
        """The tokens in force now."""

    def may_answer(self, leader_only: bool) -> bool:
        """Whether this replica answers a call now: it acts (the leader, with the shared state
        imported), or the call only reads or writes a journal the replicas share and is not `leader_only`."""

    async def leadership(self) -> Leadership:
        """This replica's name and the Lease holder's, for a replica that may not answer."""

    async def status(self) -> StatusInputs:
        """What the status document shows, read now."""

    async def freeze(self, scope: str, reason: str, by: str, duration_seconds: float | None) -> Freeze:
        """Freeze the daemon (DAEMON_SCOPE) or a target a policy names (else FreezeError 422) for
        `duration_seconds` (None: until lifted)."""

    async def unfreeze(self, scope: str, reason: str, by: str) -> list[Freeze]:
        """Lift the freezes of `scope` in force: the ones lifted."""

    async def approve(self, approval_id: int, by: str, reason: str) -> ApprovalResult:
        """Approve a pending plan: what came of it (`approval_status` gives its HTTP status)."""

    async def bad_versions(self, target: str, include_cleared: bool) -> Sequence[BadVersionMark]:
        """The versions of `target` marked bad (and those cleared, with `include_cleared`)."""

    async def mark_bad_version(self, target: str, version: int, reason: str) -> bool:
        """Mark a version of a target a policy names (else FreezeError 422) bad; False: it already is."""

    async def clear_bad_version(self, target: str, version: int, reason: str) -> bool:
        """Clear a version's bad mark; False: it was not marked."""

    async def unpin(self, target: str, reason: str) -> EndedPin | None:
        """End the pin on `target`: the pin ended, None when there was none."""


OPERATOR: web.AppKey[Operator] = web.AppKey("operator")


# ---- gates ---------------------------------------------------------------------------------------


async def _admit(request: web.Request, scope: str, *, leader_only: bool = False) -> Caller | web.Response:
    """The caller when its token has `scope` and this replica answers for the leader (it is the
    leader, or the call only reads or writes a journal the leader shares and is not `leader_only`);
    else the answer."""
    svc = request.app[OPERATOR]
    tokens = svc.credentials().api_tokens
    caller = tokens.authenticate(request.headers.get("Authorization"))
    if caller is None:
        why = ("no API tokens are configured (api.tokensFile)" if not len(tokens)
               else "missing or invalid bearer token")
        return await answer_and_close(request, error(401, why, **{"WWW-Authenticate": "Bearer"}))
    request[TOKEN_NAME] = caller.name
    if scope not in caller.scopes:
        return await answer_and_close(request, error(403, f"token {caller.name!r} lacks the {scope!r} scope"))
    if not svc.may_answer(leader_only):
        who = await svc.leadership()
        leader, here = who.leader, who.replica
        if leader == here:
            why = f"{here} leads but has not imported the shared state yet; retry"
        else:
            why = (f"{here} is a follower; the leader is {leader or 'unknown (no Lease holder)'}: call it "
                   f"(kubectl port-forward pod/{leader or '<leader>'})")
        return await answer_and_close(request, error(503, why, {"leader": leader, "replica": here},
                                                     **{"Retry-After": "2"}))
    return caller


async def _json_body(request: web.Request, model: type[Body]) -> Any:
    """The body as `model` (an empty body is `{}`), or the 4xx answer."""
    limits = request.app[SETUP].api
    codings = [c.strip().lower() for value in request.headers.getall(hdrs.CONTENT_ENCODING, [])
               for c in value.split(",") if c.strip()]
    if len(codings) > 1 or not set(codings) <= CONTENT_CODINGS:
        return await answer_and_close(request, error(
            400, f"unsupported Content-Encoding {', '.join(codings)!r}; send one of {', '.join(sorted(CONTENT_CODINGS))}"))
    if request.content_length is not None and request.content_length > limits.max_bytes:
        return await answer_and_close(request, error(413, f"body larger than {limits.max_bytes} bytes"))
    try:
        async with asyncio.timeout(limits.read_timeout_seconds):
            raw = await request.read()
    except TimeoutError:
        return await answer_and_close(request, error(408, f"body not received within "
                                                          f"{limits.read_timeout_seconds:g} s"))
    except web.HTTPRequestEntityTooLarge:
        return await answer_and_close(request, error(413, f"body larger than {limits.max_bytes} bytes"))
    except (web.RequestPayloadError, aiohttp.ClientError, ConnectionError) as exc:
        cause = exc.__cause__ or exc
        return await answer_and_close(request, error(400, f"unreadable body: {getattr(cause, 'message', None) or cause}"))
    if len(raw) > limits.max_bytes:
        return error(413, f"body larger than {limits.max_bytes} bytes")
    try:
        body = decode_body(raw) if raw.strip() else {}
    except BodyError as exc:
        return error(400, str(exc))
    if not isinstance(body, dict):
        return error(422, "the body must be a JSON object")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        return error(422, f"{field_path(first['loc'])}: {first['msg']}")


def _scope(text: str | None) -> str:
    """DAEMON_SCOPE for None, else the target key. Raises FreezeError (422) for one that is not
    namespace/model (whether a policy names it is the operation's to check)."""
    if text is None:
        return DAEMON_SCOPE
    try:
        return target_key(text)
    except ValueError as exc:
        raise FreezeError(422, f"target: {exc}") from None


def _journal_failed(exc: JournalError) -> web.Response:
    if isinstance(exc, JournalValueError):
        return error(422, str(exc))
    log.error("journal failed in an operator call", error=str(exc))
    return error(503, "journal unavailable; retry", **{"Retry-After": "5"})


# ---- handlers ------------------------------------------------------------------------------------

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Call = Callable[[web.Request, Operator, Caller, Any], Awaitable[web.StreamResponse]]


def operator_call(scope: str, body: type[Body] | None = None, *, leader_only: bool = False) -> Callable[[Call], Handler]:
    """A handler from a call's own work: the token, its scope and whether this replica may answer
    checked first (`_admit`), the JSON body parsed as `body` (None: the call reads it itself), and a
    FreezeError or JournalError the call raises answered as such. The call gets (request, service,
    caller, body)."""
    def wrap(call: Call) -> Handler:
        @functools.wraps(call)
        async def handler(request: web.Request) -> web.StreamResponse:
            caller = await _admit(request, scope, leader_only=leader_only)
            if isinstance(caller, web.Response):
                return caller
            parsed = None
            if body is not None:
                parsed = await _json_body(request, body)
                if isinstance(parsed, web.Response):
                    return parsed
            try:
                return await call(request, request.app[OPERATOR], caller, parsed)
            except FreezeError as exc:
                return error(exc.status, str(exc))
            except JournalError as exc:
                return _journal_failed(exc)
        return handler
    return wrap


@operator_call(READ)
async def get_status(request: web.Request, svc: Operator, caller: Caller, _: None) -> web.StreamResponse:
    return web.json_response(build_status(await svc.status()))


@operator_call(READ)
async def get_approvals(request: web.Request, svc: Operator, caller: Caller, _: None) -> web.StreamResponse:
    inputs = await svc.status()
    return web.json_response({"approvals": [approval_view(a, inputs.now) for a in inputs.approvals]})


@operator_call(WRITE, FreezeRequest)
async def post_freeze(request: web.Request, svc: Operator, caller: Caller, body: FreezeRequest) -> web.StreamResponse:
    freeze = await svc.freeze(_scope(body.target), body.reason, caller.name, body.duration_seconds)
    return web.json_response({"frozen": freeze_as_dict(freeze, request.app[SETUP].clock())}, status=201)


@operator_call(WRITE, UnfreezeRequest)
async def post_unfreeze(request: web.Request, svc: Operator, caller: Caller,
                        body: UnfreezeRequest) -> web.StreamResponse:
    lifted = await svc.unfreeze(_scope(body.target), body.reason, caller.name)
    now = request.app[SETUP].clock()
    return web.json_response({"lifted": [freeze_as_dict(f, now) for f in lifted]})


@operator_call(WRITE, leader_only=True)  # applying the plan is acting
async def post_approve(request: web.Request, svc: Operator, caller: Caller, _: None) -> web.StreamResponse:
    text = request.match_info["approval"]
    if not text.isascii() or not text.isdigit() or len(text) > 18:
        return await answer_and_close(request, error(404, f"no approval {text[:40]!r}"))
    body = await _json_body(request, ApproveRequest)
    if isinstance(body, web.Response):
        return body
    result = await svc.approve(int(text), caller.name, body.reason)
    status = approval_status(result.outcome)
    if result.outcome is not ApprovalOutcome.STARTED:
        return error(status, result.message)
    assert result.approval is not None
    return web.json_response({"message": result.message,
                              "approval": approval_view(result.approval, request.app[SETUP].clock())}, status=status)


def approval_status(outcome: ApprovalOutcome) -> int:
    """The HTTP status of an approve call: 202 started; 404 no such approval; 409 not pending, past its
    deadline, its policy gone or changed, or a freeze in force (it stays pending: lift, then approve).
    Every outcome is named: a new one fails mypy here until it has its status."""
    match outcome:
        case ApprovalOutcome.STARTED:
            return 202
        case ApprovalOutcome.NOT_FOUND:
            return 404
        case (ApprovalOutcome.NOT_PENDING | ApprovalOutcome.EXPIRED | ApprovalOutcome.POLICY_CHANGED
              | ApprovalOutcome.FROZEN):
            return 409


def _bad_version_view(mark: BadVersionMark) -> dict[str, Any]:
    return {"version": mark.version, "reason": mark.reason, "decision": mark.decision_id, "at": mark.at,
            "clearedAt": mark.cleared_at, "clearedReason": mark.cleared_reason}


@operator_call(READ)
async def get_bad_versions(request: web.Request, svc: Operator, caller: Caller, _: None) -> web.StreamResponse:
    """The versions of `?target=` marked bad (rolled back from), which `to: previous` skips."""
    key = _scope(request.query.get("target") or "")
    marks = await svc.bad_versions(key, include_cleared="all" in request.query)
    return web.json_response({"target": key, "badVersions": [_bad_version_view(m) for m in marks]})


@operator_call(WRITE, ClearBadVersionRequest)
async def post_clear_bad_version(request: web.Request, svc: Operator, caller: Caller,
                                 body: ClearBadVersionRequest) -> web.StreamResponse:
    key = _scope(body.target)
    if not await svc.clear_bad_version(key, body.version, f"{body.reason} (by {caller.name} via api)"):
        return error(409, f"version {body.version} of {key} is not marked bad")
    log.warning("bad-version mark cleared", target=key, version=body.version, by=caller.name, reason=body.reason)
    return web.json_response({"cleared": {"target": key, "version": body.version}})


@operator_call(WRITE, MarkBadVersionRequest)
async def post_mark_bad_version(request: web.Request, svc: Operator, caller: Caller,
                                body: MarkBadVersionRequest) -> web.StreamResponse:
    """Mark a version of a target a policy names bad: `to: previous` skips it, `to: N` refuses it."""
    key = _scope(body.target)
    if key == DAEMON_SCOPE:
        raise FreezeError(422, "target: required")
    reason = f"{body.reason} (by {caller.name} via api)"
    if not await svc.mark_bad_version(key, body.version, reason):
        return error(409, f"version {body.version} of {key} is already marked bad")
    log.warning("version marked bad", target=key, version=body.version, by=caller.name, reason=body.reason)
    return web.json_response({"marked": {"target": key, "version": body.version, "reason": reason}}, status=201)


@operator_call(WRITE, UnpinRequest)
async def post_unpin(request: web.Request, svc: Operator, caller: Caller, body: UnpinRequest) -> web.StreamResponse:
    key = _scope(body.target)
    if key == DAEMON_SCOPE:
        raise FreezeError(422, "target: required")
    ended = await svc.unpin(key, f"{body.reason} (by {caller.name} via api)")
    if ended is None:
        return error(409, f"no pin on {key}")
    log.warning("unpinned", target=key, by=caller.name, reason=body.reason)
    return web.json_response({"unpinned": {"target": key, "version": ended.version,
                                           "fromVersion": ended.from_version, "decision": ended.decision_id}})


async def get_openapi(request: web.Request) -> web.Response:
    return web.json_response(openapi_document())


def add_routes(app: web.Application, operator: Operator, expect_handler: Any) -> None:
    app[OPERATOR] = operator
    app.router.add_get("/api/v1/status", get_status, expect_handler=expect_handler)
    app.router.add_get("/api/v1/approvals", get_approvals, expect_handler=expect_handler)
    app.router.add_post("/api/v1/freeze", post_freeze, expect_handler=expect_handler)
    app.router.add_post("/api/v1/unfreeze", post_unfreeze, expect_handler=expect_handler)
    app.router.add_post("/api/v1/approvals/{approval}/approve", post_approve, expect_handler=expect_handler)
    app.router.add_post("/api/v1/unpin", post_unpin, expect_handler=expect_handler)
    app.router.add_get("/api/v1/bad-versions", get_bad_versions, expect_handler=expect_handler)
    app.router.add_post("/api/v1/bad-versions/clear", post_clear_bad_version, expect_handler=expect_handler)
    app.router.add_post("/api/v1/bad-versions/mark", post_mark_bad_version, expect_handler=expect_handler)
    app.router.add_get("/api/v1/openapi.json", get_openapi, expect_handler=expect_handler)
