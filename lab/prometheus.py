"""Real Prometheus (Debian 2.42 package) on a free loopback port, and promtool backfill.

`PrometheusServer` writes a temp config (scrape targets, rule files, optional Alertmanager) and
data dir. `backfill_openmetrics` writes history into a data dir with
``promtool tsdb create-blocks-from openmetrics`` before the server starts, for forecasting tests.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from lab.ports import LOOPBACK, free_port
from lab.process import DEFAULT_READY_TIMEOUT_SECONDS, LocalServer

PROMETHEUS_BIN = "prometheus"
PROMTOOL_BIN = "promtool"


@dataclass(frozen=True)
class BackfillSeries:
    """One series to backfill: metric name, labels, and (unix seconds, value) samples."""

    name: str
    samples: Sequence[tuple[float, float]]
    labels: Mapping[str, str] = field(default_factory=dict)


def _escape_label_value(value: str) -> str:
    # OpenMetrics label values escape exactly backslash, double quote and newline.
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def openmetrics_text(series: Iterable[BackfillSeries]) -> str:
    """Render series as OpenMetrics gauges with timestamps in seconds, ending in ``# EOF``.

    Series of one metric name are grouped under a single ``# TYPE`` line, because OpenMetrics
    forbids a metric family from appearing twice; samples are sorted by time per series.
    """
    by_name: dict[str, list[BackfillSeries]] = {}
    for one in series:
        by_name.setdefault(one.name, []).append(one)
    lines: list[str] = []
    for name, family in by_name.items():
        lines.append(f"# TYPE {name} gauge")
        for one in family:
            labels = ",".join(f'{k}="{_escape_label_value(v)}"' for k, v in sorted(one.labels.items()))
            selector = f"{name}{{{labels}}}" if labels else name
            for timestamp, value in sorted(one.samples):
                lines.append(f"{selector} {float(value)!r} {float(timestamp)!r}")
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


def backfill_openmetrics(
    data_dir: Path, series: Iterable[BackfillSeries], promtool: str = PROMTOOL_BIN, timeout_seconds: float = 120.0
) -> Path:
    """Write `series` as TSDB blocks into `data_dir`, to be read by a Prometheus started later.

    Samples older than the server's retention (15 days by default) are dropped by it at start.

    Args:
        data_dir: The TSDB folder the server will use (created if missing).
        series: The history to write.
        promtool: The promtool binary.
        timeout_seconds: Bound on promtool's run time.

    Returns:
        The OpenMetrics file that was imported (kept for debugging, beside the data dir).

    Raises:
        subprocess.CalledProcessError: promtool rejected the input.
    """
    data_dir.mkdir(parents=True, exist_ok=True)
    source = data_dir.parent / f"{data_dir.name}-backfill.om"
    source.write_text(openmetrics_text(series))
    subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", "--quiet", str(source), str(data_dir)],
        check=True,
        capture_output=True,
        timeout=timeout_seconds,
    )
    return source


class PrometheusServer(LocalServer):
    """A real Prometheus on a free loopback port with a temp config and data dir."""

    NAME = "Prometheus"

    def __init__(
        self,
        scrape_targets: Mapping[str, Sequence[str]] | None = None,
        scrape_interval: str = "1s",
        evaluation_interval: str | None = None,
        rule_files: Sequence[Path] = (),
        alertmanager_targets: Sequence[str] = (),
        workdir: Path | None = None,
        data_dir: Path | None = None,
        retention: str = "30d",
        binary: str = PROMETHEUS_BIN,
        ready_timeout_seconds: float = DEFAULT_READY_TIMEOUT_SECONDS,
    ) -> None:
        """
        Args:
            scrape_targets: Job name -> ``host:port`` targets, scraped at ``/metrics``.
            scrape_interval: Prometheus duration, e.g. ``"1s"`` or ``"5s"``.
            evaluation_interval: Rule evaluation interval; defaults to `scrape_interval`.
            rule_files: Alerting/recording rule files, loaded as given.
            alertmanager_targets: ``host:port`` of Alertmanagers to send alerts to.
            workdir: Holds the config, log and (by default) data; a fresh temp dir if omitted.
            data_dir: TSDB folder; pass the one `backfill_openmetrics` wrote to.
            retention: ``--storage.tsdb.retention.time``; longer than the default 15d so that
                backfilled history for forecasting is not dropped at start.
            binary: The prometheus binary.
            ready_timeout_seconds: How long `start()` waits for ``/-/ready``.
        """
        self.workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="tailguard-prom-"))
        self.data_dir = Path(data_dir) if data_dir else self.workdir / "data"
        self.scrape_targets = dict(scrape_targets or {})
        self.scrape_interval = scrape_interval
        self.evaluation_interval = evaluation_interval or scrape_interval
        self.rule_files = tuple(Path(p) for p in rule_files)
        self.alertmanager_targets = tuple(alertmanager_targets)
        self.retention = retention
        self.binary = binary
        self.ready_timeout_seconds = ready_timeout_seconds
        self.port = free_port()

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:9090``."""
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def config_path(self) -> Path:
        """The generated prometheus.yml."""
        return self.workdir / "prometheus.yml"

    @property
    def log_path(self) -> Path:
        """The server's combined stdout/stderr."""
        return self.workdir / "prometheus.log"


    def config(self) -> dict[str, object]:
        """The configuration written to `config_path`."""
        config: dict[str, object] = {
            "global": {"scrape_interval": self.scrape_interval, "evaluation_interval": self.evaluation_interval},
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": list(targets)}]}
                for job, targets in self.scrape_targets.items()
            ],
        }
        if self.rule_files:
            config["rule_files"] = [str(p) for p in self.rule_files]
        if self.alertmanager_targets:
            config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": list(self.alertmanager_targets)}]}]}
        return config

    def start(self) -> None:
        """Write the config, start Prometheus, and block until ``/-/ready`` answers."""
        self._not_started()
        if shutil.which(self.binary) is None:
            raise FileNotFoundError(f"{self.binary} not found; install the Debian package 'prometheus'")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(yaml.safe_dump(self.config(), sort_keys=False))
        argv = [
            self.binary,
            f"--config.file={self.config_path}",
            f"--storage.tsdb.path={self.data_dir}",
            f"--storage.tsdb.retention.time={self.retention}",
            f"--web.listen-address={LOOPBACK}:{self.port}",
            # Lets a test reload rule files (POST /-/reload) without a restart.
            "--web.enable-lifecycle",
        ]
        self._launch(argv, self.log_path, f"{self.url}/-/ready", self.ready_timeout_seconds)


