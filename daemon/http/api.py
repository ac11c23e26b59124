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
from typing import Any, Awaitable, Callable, Protocol

import aiohttp
import structlog
from aiohttp import hdrs, web
from pydantic import ValidationError

from daemon.common.config import Settings
from daemon.http.auth import TOKEN_NAME, Caller, TokenSet
from daemon.http.bodies import (ApproveRequest, Body, ClearBadVersionRequest, FreezeRequest, MarkBadVersionRequest,
                                UnfreezeRequest, UnpinRequest)
from daemon.http.intake import BodyError, decode_body, field_path
from daemon.http.openapi import openapi_document
from daemon.http.responses import answer_and_close, error
from daemon.http.status import StatusInputs, build_status
from daemon.storage.errors import JournalError, JournalValueError
from daemon.storage.journal import Journal
from daemon.storage.records import DAEMON_SCOPE, FOREVER
from daemon.workers.approvals import ApprovalOutcome, ApprovalResult, approval_view
from daemon.workers.freezes import FreezeControl, FreezeError, freeze_as_dict, target_key

log = structlog.get_logger("tailguard.api")

READ, WRITE = "read", "write"
CONTENT_CODINGS = frozenset({"identity", "gzip", "deflate"})  # what aiohttp decodes; others are refused


class Operator(Protocol):
    """What the operator API needs from the running daemon (the service implements it)."""

    settings: Settings
    identity: str
    api_tokens: TokenSet
    journal: Journal
    freezes: FreezeControl

    def may_act(self) -> bool:
        """Whether this replica acts now (the leader, with the shared state imported)."""

    async def leader_identity(self) -> str | None:
        """The Lease holder (the leader pod's name), None when unknown."""

    async def status_inputs(self) -> StatusInputs:
        """What the status document shows, read now."""

    async def approve(self, approval_id: int, by: str, reason: str) -> ApprovalResult:
        """Approve a pending plan: what came of it (`approval_status` gives its HTTP status)."""

    def known_targets(self) -> set[str]:
        """The targets the active policies name."""

    def state_recorded(self) -> None:
        """Something shared was journaled (the cluster state publishes it)."""


OPERATOR: web.AppKey[Operator] = web.AppKey("operator")


# ---- gates ---------------------------------------------------------------------------------------


async def _admit(request: web.Request, scope: str, *, leader_only: bool = False) -> Caller | web.Response:
    """The caller when its token has `scope` and this replica answers for the leader (it is the
    leader, or the call only reads or writes a journal the leader shares and is not `leader_only`);
    else the answer."""
    svc = request.app[OPERATOR]
    caller = svc.api_tokens.authenticate(request.headers.get("Authorization"))
    if caller is None:
        why = ("no API tokens are configured (api.tokensFile)" if not len(svc.api_tokens)
               else "missing or invalid bearer token")
        return await answer_and_close(request, error(401, why, **{"WWW-Authenticate": "Bearer"}))
    request[TOKEN_NAME] = caller.name
    if scope not in caller.scopes:
        return await answer_and_close(request, error(403, f"token {caller.name!r} lacks the {scope!r} scope"))
    if not svc.may_act() and (leader_only or not svc.journal.shared):
        leader = await svc.leader_identity()
        here = svc.identity
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
    settings = request.app[OPERATOR].settings.api
    codings = [c.strip().lower() for value in request.headers.getall(hdrs.CONTENT_ENCODING, [])
               for c in value.split(",") if c.strip()]
    if len(codings) > 1 or not set(codings) <= CONTENT_CODINGS:
        return await answer_and_close(request, error(
            400, f"unsupported Content-Encoding {', '.join(codings)!r}; send one of {', '.join(sorted(CONTENT_CODINGS))}"))
    if request.content_length is not None and request.content_length > settings.max_body_bytes:
        return await answer_and_close(request, error(413, f"body larger than {settings.max_body_bytes} bytes"))
    try:
        async with asyncio.timeout(settings.body_read_timeout_seconds):
            raw = await request.read()
    except TimeoutError:
        return await answer_and_close(request, error(408, f"body not received within "
                                                          f"{settings.body_read_timeout_seconds:g} s"))
    except web.HTTPRequestEntityTooLarge:
        return await answer_and_close(request, error(413, f"body larger than {settings.max_body_bytes} bytes"))
    except (web.RequestPayloadError, aiohttp.ClientError, ConnectionError) as exc:
        cause = exc.__cause__ or exc
        return await answer_and_close(request, error(400, f"unreadable body: {getattr(cause, 'message', None) or cause}"))
    if len(raw) > settings.max_body_bytes:
        return error(413, f"body larger than {settings.max_body_bytes} bytes")
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


def _scope(svc: Operator, text: str | None, *, must_be_known: bool) -> str:
    """DAEMON_SCOPE for None, else the target key. Raises FreezeError (422) for an unknown target."""
    if text is None:
        return DAEMON_SCOPE
    try:
        key = target_key(text)
    except ValueError as exc:
        raise FreezeError(422, f"target: {exc}") from None
    if must_be_known and key not in svc.known_targets():
        known = ", ".join(sorted(svc.known_targets())) or "none"
        raise FreezeError(422, f"target: no policy names {key} (known: {known})")
    return key


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
    return web.json_response(build_status(await svc.status_inputs()))


@operator_call(READ)
async def get_approvals(request: web.Request, svc: Operator, caller: Caller, _: None) -> web.StreamResponse:
    inputs = await svc.status_inputs()
    return web.json_response({"approvals": [approval_view(a, inputs.now) for a in inputs.approvals]})


@operator_call(WRITE, FreezeRequest)
async def post_freeze(request: web.Request, svc: Operator, caller: Caller, body: FreezeRequest) -> web.StreamResponse:
    scope = _scope(svc, body.target, must_be_known=True)
    until = FOREVER if body.duration_seconds is None else svc.freezes.now() + body.duration_seconds
    freeze = await svc.freezes.freeze(scope, body.reason, caller.name, "api", until)
    return web.json_response({"frozen": freeze_as_dict(freeze, svc.freezes.now())}, status=201)


@operator_call(WRITE, UnfreezeRequest)
async def post_unfreeze(request: web.Request, svc: Operator, caller: Caller,
                        body: UnfreezeRequest) -> web.StreamResponse:
    scope = _scope(svc, body.target, must_be_known=False)
    lifted = await svc.freezes.unfreeze(scope, body.reason, caller.name, "api")
    now = svc.freezes.now()
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
                              "approval": approval_view(result.approval, svc.freezes.now())}, status=status)


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


def _bad_version_view(mark: Any) -> dict[str, Any]:
    return {"version": mark["version"], "reason": mark["reason"], "decision": mark["decision_id"], "at": mark["at"],
            "clearedAt": mark.get("cleared_at"), "clearedReason": mark.get("cleared_reason")}


@operator_call(READ)
async def get_bad_versions(request: web.Request, svc: Operator, caller: Caller, _: None) -> web.StreamResponse:
    """The versions of `?target=` marked bad (rolled back from), which `to: previous` skips."""
    key = _scope(svc, request.query.get("target") or "", must_be_known=False)
    marks = await svc.journal.bad_versions.of.in_thread(key, include_cleared="all" in request.query)
    return web.json_response({"target": key, "badVersions": [_bad_version_view(m) for m in marks]})


@operator_call(WRITE, ClearBadVersionRequest)
async def post_clear_bad_version(request: web.Request, svc: Operator, caller: Caller,
                                 body: ClearBadVersionRequest) -> web.StreamResponse:
    key = _scope(svc, body.target, must_be_known=False)
    if not await svc.journal.bad_versions.clear.in_thread(key, body.version,
                                                          f"{body.reason} (by {caller.name} via api)"):
        return error(409, f"version {body.version} of {key} is not marked bad")
    svc.state_recorded()
    log.warning("bad-version mark cleared", target=key, version=body.version, by=caller.name, reason=body.reason)
    return web.json_response({"cleared": {"target": key, "version": body.version}})


@operator_call(WRITE, MarkBadVersionRequest)
async def post_mark_bad_version(request: web.Request, svc: Operator, caller: Caller,
                                body: MarkBadVersionRequest) -> web.StreamResponse:
    """Mark a version of a target a policy names bad: `to: previous` skips it, `to: N` refuses it."""
    key = _scope(svc, body.target, must_be_known=True)
    if key == DAEMON_SCOPE:
        raise FreezeError(422, "target: required")
    reason = f"{body.reason} (by {caller.name} via api)"
    if not await svc.journal.bad_versions.mark.in_thread(key, body.version, reason):
        return error(409, f"version {body.version} of {key} is already marked bad")
    svc.state_recorded()
    log.warning("version marked bad", target=key, version=body.version, by=caller.name, reason=body.reason)
    return web.json_response({"marked": {"target": key, "version": body.version, "reason": reason}}, status=201)


@operator_call(WRITE, UnpinRequest)
async def post_unpin(request: web.Request, svc: Operator, caller: Caller, body: UnpinRequest) -> web.StreamResponse:
    key = _scope(svc, body.target, must_be_known=False)
    if key == DAEMON_SCOPE:
        raise FreezeError(422, "target: required")
    ended = await svc.journal.pins.end.in_thread(key, f"{body.reason} (by {caller.name} via api)")
    if ended is None:
        return error(409, f"no pin on {key}")
    svc.state_recorded()
    log.warning("unpinned", target=key, by=caller.name, reason=body.reason)
    return web.json_response({"unpinned": {"target": key, "version": ended["version"],
                                           "fromVersion": ended["from_version"], "decision": ended["decision_id"]}})


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
