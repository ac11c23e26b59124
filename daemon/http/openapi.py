"""The OpenAPI 3.1 document of the HTTP API (served at /api/v1/openapi.json, committed as
docs/openapi.json; a test keeps the two equal). Request bodies come from the same pydantic models
the handlers validate with, so the document cannot drift from what is accepted."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from daemon.http.bodies import (ApproveRequest, ClearBadVersionRequest, FreezeRequest, MarkBadVersionRequest,
                                UnfreezeRequest, UnpinRequest)

_ERROR = {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}}


def _body(model: type[BaseModel]) -> dict[str, Any]:
    schema = model.model_json_schema(by_alias=True)
    schema.pop("title", None)
    return {"required": False, "content": {"application/json": {"schema": schema}}}


def _answers(ok: int, ok_text: str, *codes: int) -> dict[str, Any]:
    texts = {400: "malformed JSON or unsupported Content-Encoding", 401: "missing or invalid token",
             403: "the token lacks the scope", 404: "no such approval", 408: "body not received in time",
             409: "conflicts with the current state (not frozen, held by the ConfigMap, not pending ...)",
             413: "body too large", 422: "invalid field (named in the reason)",
             503: "this replica may not answer it (a follower with a journal of its own, or approve on a follower; "
                  "the `leader` field names the leader), or the journal is unavailable"}
    out: dict[str, Any] = {str(ok): {"description": ok_text, "content": {"application/json": {"schema": {"type": "object"}}}}}
    for code in codes:
        out[str(code)] = {"description": texts[code], "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    return out


def openapi_document() -> dict[str, Any]:
    read = [{"bearer": ["read"]}]
    write = [{"bearer": ["write"]}]
    body_errors = (400, 401, 403, 408, 409, 413, 422, 503)
    return {
        "openapi": "3.1.0",
        "info": {"title": "tailguard operator API", "version": "1",
                 "description": "Status, runtime freezes, approvals and pins of a tailguard daemon. Every call "
                                "but this document needs `Authorization: Bearer <token>` of a named API token "
                                "(scopes read, write); the Alertmanager webhook token is not one. Only the "
                                "leader acts: on a journal the replicas share (PostgreSQL) any replica "
                                "answers all but approve; otherwise a follower answers 503 naming the "
                                "leader. Errors are "
                                "`{\"error\": \"<one line>\"}`."},
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {"Error": _ERROR},
        },
        "paths": {
            "/api/v1/status": {"get": {
                "summary": "The leader's state: policies, per target last signal and decision, cooldown left, "
                           "actions in the rate window, pin, freeze; pending approvals; stale queries.",
                "operationId": "getStatus", "security": read,
                "responses": _answers(200, "the status document", 401, 403, 503)}},
            "/api/v1/approvals": {"get": {
                "summary": "Pending approvals.", "operationId": "listApprovals", "security": read,
                "responses": _answers(200, "{approvals: [...]}", 401, 403, 503)}},
            "/api/v1/freeze": {"post": {
                "summary": "Freeze the whole daemon (no target) or one target; journaled with the token's name.",
                "operationId": "freeze", "security": write, "requestBody": _body(FreezeRequest),
                "responses": _answers(201, "{frozen: {...}}", *body_errors)}},
            "/api/v1/unfreeze": {"post": {
                "summary": "Lift the freezes on the daemon (no target) or one target; a freeze the control "
                           "ConfigMap holds must be cleared there (409).",
                "operationId": "unfreeze", "security": write, "requestBody": _body(UnfreezeRequest),
                "responses": _answers(200, "{lifted: [...]}", *body_errors)}},
            "/api/v1/approvals/{approval}/approve": {"post": {
                "summary": "Approve a pending plan before its deadline; it is applied in the background.",
                "operationId": "approve", "security": write,
                "parameters": [{"name": "approval", "in": "path", "required": True, "schema": {"type": "integer"}}],
                "requestBody": _body(ApproveRequest),
                "responses": _answers(202, "{message, approval}", 404, *body_errors)}},
            "/api/v1/unpin": {"post": {
                "summary": "End a target's rollback pin (the reconciler stops re-applying it).",
                "operationId": "unpin", "security": write, "requestBody": _body(UnpinRequest),
                "responses": _answers(200, "{unpinned: {...}}", *body_errors)}},
            "/api/v1/bad-versions": {"get": {
                "summary": "The versions of a target marked bad (rolled back from), which `to: previous` skips; "
                           "`&all` includes cleared marks.",
                "operationId": "badVersions", "security": read,
                "parameters": [{"name": "target", "in": "query", "required": True, "schema": {"type": "string"},
                                "description": "namespace/model (a bare model means default/model)"},
                               {"name": "all", "in": "query", "required": False,
                                "schema": {"type": "string"}, "description": "present: cleared marks too"}],
                "responses": _answers(200, "{target, badVersions: [...]}", 401, 403, 422, 503)}},
            "/api/v1/bad-versions/clear": {"post": {
                "summary": "Clear a version's bad mark (journaled), so `to: previous` may choose it again.",
                "operationId": "clearBadVersion", "security": write, "requestBody": _body(ClearBadVersionRequest),
                "responses": _answers(200, "{cleared: {target, version}}", *body_errors)}},
            "/api/v1/bad-versions/mark": {"post": {
                "summary": "Mark a version of a target a policy names bad (journaled with the token's name): "
                           "`to: previous` skips it and `to: N` refuses it until it is cleared; 409 when "
                           "already marked.",
                "operationId": "markBadVersion", "security": write, "requestBody": _body(MarkBadVersionRequest),
                "responses": _answers(201, "{marked: {target, version, reason}}", *body_errors)}},
            "/api/v1/openapi.json": {"get": {
                "summary": "This document.", "operationId": "openapi", "security": [],
                "responses": {"200": {"description": "OpenAPI 3.1"}}}},
            "/api/v1/alerts": {"post": {
                "summary": "Alertmanager webhook (v4 payload); its own token (webhook.tokenFile), not an API token.",
                "operationId": "receiveAlerts", "security": [{"bearer": []}],
                "responses": {"200": {"description": "every alert journaled"},
                              **{str(c): {"description": d} for c, d in (
                                  (400, "malformed body"), (401, "missing or wrong webhook token"),
                                  (408, "body too slow"), (413, "body too large"),
                                  (422, "not an Alertmanager v4 payload"),
                                  (503, "retry: journal, backlog, busy or not the leader"))}}}},
            "/healthz": {"get": {"summary": "Liveness.", "operationId": "healthz", "security": [],
                                 "responses": {"200": {"description": "alive"}}}},
            "/readyz": {"get": {"summary": "Readiness, leadership, freezes, stale queries.", "operationId": "readyz",
                                "security": [], "responses": {"200": {"description": "ready"},
                                                              "503": {"description": "not ready"}}}},
            "/metrics": {"get": {"summary": "Prometheus metrics.", "operationId": "metrics", "security": [],
                                 "responses": {"200": {"description": "text exposition"}}}},
        },
    }
