"""Token files re-read when they change: rotating the webhook token or the operator tokens needs
no restart.

A Kubernetes Secret volume updates a key by an atomic symlink swap (`key -> ..data/key`,
`..data -> ..<timestamp>`; the kubelet writes a new timestamped folder and renames a new
`..data` link over the old one), so the file's own mtime may not change: a change is seen in
the resolved path, its inode, size or mtime. Both files are read and checked together (as at
start); a new set that does not check out (an empty token, tokens not YAML, an API token equal
to the webhook token) is refused: the tokens in force stay, the error is logged and counted
(`tailguard_faults_total{component="secrets"}`). An environment variable set at start
(TAILGUARD_WEBHOOK_TOKEN, TAILGUARD_API_TOKENS) takes precedence, as it does at start.
"""
from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Callable

import structlog

from daemon.common.config import ApiTokenEntry, ConfigError, Settings, resolve_tokens
from daemon.common.lifecycle import wait_or_stop
from daemon.common.metrics import Metrics

log = structlog.get_logger("tailguard.secrets")

RELOAD_SECONDS = 2.0
"""How often the token files are looked at (a stat each: cheap)."""

Apply = Callable[[str | None, list[ApiTokenEntry]], None]
Fingerprint = tuple[tuple[str, str, int, int, int], ...]


def fingerprint(paths: list[Path]) -> Fingerprint:
    """Per file: its path, where it resolves (through the Secret's symlinks), inode, size, mtime."""
    out = []
    for path in paths:
        real = os.path.realpath(path)
        try:
            st = os.stat(real)
            out.append((str(path), real, st.st_ino, st.st_size, st.st_mtime_ns))
        except OSError:
            out.append((str(path), real, -1, -1, -1))  # gone for now: a change too, the read says why
    return tuple(out)


class SecretReloader:
    """Looks at the token files every `interval_seconds`; on a change re-reads and checks both and
    hands a valid set to `apply(webhook_token, api_tokens)`."""

    def __init__(self, settings: Settings, apply: Apply, metrics: Metrics,
                 interval_seconds: float = RELOAD_SECONDS) -> None:
        self._settings = settings
        self._apply = apply
        self._metrics = metrics
        self.interval_seconds = interval_seconds
        self._paths = self._watched(settings)
        self._seen = fingerprint(self._paths)
        self.reloads = 0  # sets applied (tests)
        self.refused = 0  # changed sets that did not check out

    @staticmethod
    def _watched(settings: Settings) -> list[Path]:
        paths = []
        if settings.webhook.token_file is not None and not os.environ.get("TAILGUARD_WEBHOOK_TOKEN"):
            paths.append(settings.webhook.token_file)
        if settings.api.tokens_file is not None and not os.environ.get("TAILGUARD_API_TOKENS"):
            paths.append(settings.api.tokens_file)
        return paths

    def check(self) -> bool:
        """Re-read the tokens if a file changed since the last look; whether a new set was applied."""
        now = fingerprint(self._paths)
        if now == self._seen:
            return False
        self._seen = now  # one look per change: a refused set is not logged again until the next change
        try:
            token, tokens = resolve_tokens(self._settings)
        except ConfigError as exc:
            self.refused += 1
            self._metrics.faults.labels("secrets").inc()
            log.error("token files changed but do not check out; the tokens in force stay", error=str(exc))
            return False
        self._apply(token, tokens)
        self.reloads += 1
        log.info("token files changed; tokens re-read", files=[str(p) for p in self._paths],
                 api_tokens=[t.name for t in tokens])
        return True

    async def run(self, stop: asyncio.Event) -> None:
        if not self._paths:
            return  # nothing on disk to follow (tokens from the environment, or none)
        while not stop.is_set():
            await wait_or_stop(stop, self.interval_seconds)
            try:
                await asyncio.to_thread(self.check)
            except Exception:  # one bad look must not end the loop
                self._metrics.faults.labels("secrets").inc()
                log.exception("token file check failed")
