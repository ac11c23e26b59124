"""Real Alertmanager (Debian 0.25 package) on a free loopback port, routing to one webhook.

Clustering is disabled (empty ``--cluster.listen-address``) so nothing but the web port opens,
and group waits are short so a test sees the webhook in about a second.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from lab.ports import LOOPBACK, free_port
from lab.process import DEFAULT_READY_TIMEOUT_SECONDS, LocalServer

ALERTMANAGER_BIN = "prometheus-alertmanager"
_LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


class AlertmanagerServer(LocalServer):
    """A real Alertmanager whose only receiver POSTs to `webhook_url`."""

    NAME = "Alertmanager"

    def __init__(
        self,
        webhook_url: str,
        bearer_token: str | None = None,
        bearer_token_file: Path | None = None,
        group_by: Sequence[str] = ("alertname",),
        group_wait: str = "1s",
        group_interval: str = "1s",
        repeat_interval: str = "1h",
        send_resolved: bool = True,
        workdir: Path | None = None,
        binary: str = ALERTMANAGER_BIN,
        ready_timeout_seconds: float = DEFAULT_READY_TIMEOUT_SECONDS,
    ) -> None:
        """
        Args:
            webhook_url: Where notifications go; must be loopback.
            bearer_token: Sent as ``Authorization: Bearer <token>`` (inline in the config).
            bearer_token_file: Same, read from a file (``credentials_file``); wins over the inline one.
            group_by: Labels that group alerts into one notification.
            group_wait: Wait before the first notification of a group.
            group_interval: Wait before notifying about changes to a group.
            repeat_interval: Wait before re-sending an unchanged group.
            send_resolved: Also notify when alerts resolve.
            workdir: Holds config, log and storage; a fresh temp dir if omitted.
            binary: The alertmanager binary.
            ready_timeout_seconds: How long `start()` waits for ``/-/ready``.
        """
        if urlsplit(webhook_url).hostname not in _LOOPBACK_HOSTS:
            raise ValueError(f"lab Alertmanager only notifies loopback, got {webhook_url!r}")
        self.webhook_url = webhook_url
        self.bearer_token = bearer_token
        self.bearer_token_file = bearer_token_file
        self.group_by = tuple(group_by)
        self.group_wait = group_wait
        self.group_interval = group_interval
        self.repeat_interval = repeat_interval
        self.send_resolved = send_resolved
        self.workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="tailguard-am-"))
        self.binary = binary
        self.ready_timeout_seconds = ready_timeout_seconds
        self.port = free_port()

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:9093``."""
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def target(self) -> str:
        """``host:port``, the form Prometheus's alerting config takes."""
        return f"{LOOPBACK}:{self.port}"

    @property
    def config_path(self) -> Path:
        """The generated alertmanager.yml."""
        return self.workdir / "alertmanager.yml"

    @property
    def log_path(self) -> Path:
        """The server's combined stdout/stderr."""
        return self.workdir / "alertmanager.log"


    def config(self) -> dict[str, object]:
        """The configuration written to `config_path`."""
        webhook: dict[str, object] = {"url": self.webhook_url, "send_resolved": self.send_resolved}
        if self.bearer_token_file is not None:
            webhook["http_config"] = {"authorization": {"type": "Bearer", "credentials_file": str(self.bearer_token_file)}}
        elif self.bearer_token is not None:
            webhook["http_config"] = {"authorization": {"type": "Bearer", "credentials": self.bearer_token}}
        return {
            "route": {
                "receiver": "webhook",
                "group_by": list(self.group_by),
                "group_wait": self.group_wait,
                "group_interval": self.group_interval,
                "repeat_interval": self.repeat_interval,
            },
            "receivers": [{"name": "webhook", "webhook_configs": [webhook]}],
        }

    def start(self) -> None:
        """Write the config, start Alertmanager, and block until ``/-/ready`` answers."""
        self._not_started()
        if shutil.which(self.binary) is None:
            raise FileNotFoundError(f"{self.binary} not found; install the Debian package 'prometheus-alertmanager'")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(yaml.safe_dump(self.config(), sort_keys=False))
        argv = [
            self.binary,
            f"--config.file={self.config_path}",
            f"--storage.path={self.workdir / 'data'}",
            f"--web.listen-address={LOOPBACK}:{self.port}",
            # Empty disables the gossip cluster: no extra ports, no peer wait before ready.
            "--cluster.listen-address=",
        ]
        self._launch(argv, self.log_path, f"{self.url}/-/ready", self.ready_timeout_seconds)


