"""The operator backend over HTTP: the running daemon's API (a bearer token, TLS verified against
`--cacert` or the system's CAs), one blocking request per call."""
from __future__ import annotations

import http.client
import json
import os
import ssl
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from daemon.wiring.cli.records import (Approved, BadVersion, Cleared, CommandFailed, Frozen, Lifted, Marked,
                                       Status, Unpinned)


class ApiBackend:
    """The operator calls as requests to the daemon at `url`; a refusal or a daemon that cannot be
    reached is CommandFailed (exit 1) with the HTTP status and the daemon's one-line reason."""

    def __init__(self, url: str, token: str | None, cacert: Path | None) -> None:
        """Raises OSError or ssl.SSLError for a `cacert` that is missing, unreadable or not PEM."""
        self.url = url.rstrip("/")
        self.token = token
        self.context = ssl.create_default_context(cafile=str(cacert)) if cacert else None

    @classmethod
    def from_arguments(cls, url: str, token_file: Path | None, cacert: Path | None) -> ApiBackend:
        """The backend the flags name: the token from `token_file`, else env TAILGUARD_API_TOKEN.

        Raises:
            SystemExit: a token file or CA bundle that cannot be read (one line, exit 1).
        """
        token = os.environ.get("TAILGUARD_API_TOKEN")
        if token_file is not None:
            try:
                token = token_file.read_text(encoding="utf-8").strip()
            except OSError as exc:
                raise SystemExit(f"error: --token-file: {exc}")
        try:
            return cls(url, token, cacert)
        except (OSError, ssl.SSLError) as exc:  # a missing or unreadable file, not PEM
            raise SystemExit(f"error: --cacert {cacert}: {exc}")

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
        """(HTTP status, JSON body); a network failure is (0, {"error": ...})."""
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Accept": "application/json", **({"Content-Type": "application/json"} if data else {})}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        request = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=30, context=self.context) as resp:
                return resp.status, json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as exc:
            try:
                return exc.code, json.loads(exc.read() or b"{}")
            except ValueError:
                return exc.code, {"error": exc.reason}
        except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as exc:
            return 0, {"error": f"cannot reach {self.url}: {getattr(exc, 'reason', exc)}"}

    def _answer(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        """The JSON body of a 2xx answer. Raises CommandFailed for any other (status 0: not reached)."""
        code, doc = self.call(method, path, body)
        if not 200 <= code < 300:
            raise CommandFailed(f"error: {f'{code}: ' if code else ''}{doc.get('error') or doc}")
        return doc

    def freeze(self, target: str | None, reason: str, seconds: float | None) -> Frozen:
        body: dict[str, Any] = {"reason": reason}
        if target is not None:
            body["target"] = target
        if seconds is not None:
            body["durationSeconds"] = seconds
        return Frozen.from_view(self._answer("POST", "/api/v1/freeze", body)["frozen"])

    def unfreeze(self, target: str | None, reason: str) -> list[Lifted]:
        body: dict[str, Any] = {"reason": reason}
        if target is not None:
            body["target"] = target
        return [Lifted.from_view(f) for f in self._answer("POST", "/api/v1/unfreeze", body)["lifted"]]

    def unpin(self, target: str, reason: str) -> Unpinned:
        ended = self._answer("POST", "/api/v1/unpin", {"target": target, "reason": reason})["unpinned"]
        return Unpinned(target=ended["target"], version=ended["version"], from_version=ended.get("fromVersion"),
                        decision=ended.get("decision"))

    def bad_versions(self, target: str) -> list[BadVersion]:
        doc = self._answer("GET", "/api/v1/bad-versions?" + urllib.parse.urlencode({"target": target}))
        return [BadVersion(target=doc["target"], version=m["version"], reason=m["reason"], decision=m["decision"],
                           at=m["at"]) for m in doc["badVersions"]]

    def mark_bad_version(self, target: str, version: int, reason: str) -> Marked:
        marked = self._answer("POST", "/api/v1/bad-versions/mark",
                              {"target": target, "version": version, "reason": reason})["marked"]
        return Marked(target=marked["target"], version=marked["version"], reason=marked["reason"])

    def clear_bad_version(self, target: str, version: int, reason: str) -> Cleared:
        cleared = self._answer("POST", "/api/v1/bad-versions/clear",
                               {"target": target, "version": version, "reason": reason})["cleared"]
        return Cleared(target=cleared["target"], version=cleared["version"])

    def status(self) -> Status:
        return Status(self._answer("GET", "/api/v1/status"))

    def approve(self, approval: int, reason: str) -> Approved:
        return Approved(self._answer("POST", f"/api/v1/approvals/{approval}/approve", {"reason": reason})["message"])
