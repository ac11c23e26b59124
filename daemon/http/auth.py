"""Operator API access: named bearer tokens with scopes, compared in constant time.

Separate from the Alertmanager webhook token: a webhook token is no API token (it cannot read
status), and an API token cannot post alerts. Every configured token is compared on every request
(SHA-256 digests, `hmac.compare_digest`), so the time taken says nothing about which was close.
"""
from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Iterable

from aiohttp import web

from daemon.common.config import API_SCOPES, ApiTokenEntry

ANONYMOUS = "anonymous"


TOKEN_NAME: web.RequestKey[str] = web.RequestKey("token_name", str)
"""The request key a handler sets to the name of the token that authenticated it (the access log's)."""


@dataclass(frozen=True)
class Caller:
    """Who made an API request: the token's name and what it may do."""

    name: str
    scopes: frozenset[str]


@dataclass(frozen=True)
class Credentials:
    """The tokens in force now: the Alertmanager webhook's (None: webhooks need none) and the
    operator API's. Token files are re-read when they change, so ask for these per request."""

    webhook_token: str | None
    api_tokens: TokenSet


@dataclass(frozen=True)
class _Token:
    name: str
    digest: bytes
    scopes: frozenset[str]


def _digest(secret: bytes) -> bytes:
    return hashlib.sha256(secret).digest()


class TokenSet:
    """The configured operator tokens.

    Args:
        entries: Named tokens with their scopes.
        allow_anonymous: A request without a token acts as `anonymous` with every scope (lab only).
    """

    def __init__(self, entries: Iterable[ApiTokenEntry], allow_anonymous: bool = False) -> None:
        self._tokens = tuple(_Token(e.name, _digest(e.token.encode()), e.scopes) for e in entries)
        self.allow_anonymous = allow_anonymous

    def __len__(self) -> int:
        return len(self._tokens)

    def authenticate(self, authorization: str | None) -> Caller | None:
        """The caller an `Authorization` header names, or None (missing, not Bearer, or unknown)."""
        if not authorization or not authorization.strip():
            return Caller(ANONYMOUS, frozenset(API_SCOPES)) if self.allow_anonymous else None
        scheme, _, given = authorization.strip().partition(" ")
        # aiohttp decodes header bytes that are not UTF-8 as surrogates: encode them back the same way
        digest = _digest(given.strip().encode("utf-8", "surrogateescape"))
        found: _Token | None = None
        for token in self._tokens:  # no early exit: every token is compared every time
            if hmac.compare_digest(digest, token.digest) and found is None:
                found = token
        if scheme.lower() != "bearer" or found is None:
            return None
        return Caller(found.name, found.scopes)
