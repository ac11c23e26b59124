"""Daemon settings: one YAML file, strict, every field with a default and its unit in the name."""
from __future__ import annotations

import os
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import PydanticCustomError


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class TlsSettings(_Section):
    """Serve HTTPS with this certificate (PEM files, e.g. a kubernetes.io/tls Secret mounted)."""

    cert_file: Path = Field(alias="certFile")
    key_file: Path = Field(alias="keyFile")


class ListenSettings(_Section):
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    shutdown_timeout_seconds: float = Field(10.0, ge=0, alias="shutdownTimeoutSeconds")
    """On stop, how long requests in progress may finish before they are cancelled (below the pod's grace period)."""
    tls: TlsSettings | None = None
    """None: plain HTTP (TLS terminated in front of the daemon, or a lab)."""


class WebhookSettings(_Section):
    token_file: Path | None = Field(None, alias="tokenFile")
    """File holding the bearer token Alertmanager sends; env TAILGUARD_WEBHOOK_TOKEN also works."""
    max_body_bytes: int = Field(1_048_576, ge=1024, alias="maxBodyBytes")
    allow_unauthenticated: bool = Field(False, alias="allowUnauthenticated")
    """Only for local experiments: accept webhooks without a token."""
    body_read_timeout_seconds: float = Field(10.0, gt=0, alias="bodyReadTimeoutSeconds")
    """A webhook body not received in full within this is answered 408 and its connection closed."""
    max_concurrent_requests: int = Field(64, ge=1, alias="maxConcurrentRequests")
    """Webhook requests in progress at once; one more is answered 503 with Retry-After."""


API_SCOPES = ("read", "write")


class ApiSettings(_Section):
    """The operator API (status, freeze, approvals): named bearer tokens with scopes, separate from
    the Alertmanager webhook token."""

    tokens_file: Path | None = Field(None, alias="tokensFile")
    """YAML list of {name, token, scopes: [read, write]}; env TAILGUARD_API_TOKENS (same YAML) also works."""
    allow_unauthenticated: bool = Field(False, alias="allowUnauthenticated")
    """Only for local experiments: requests without a token act as `anonymous` with every scope."""
    external_url: str | None = Field(None, alias="externalUrl", pattern=r"^https?://")
    """How operators reach the API (named in approval notifications); None: http(s)://<listen host>:<port>."""
    max_body_bytes: int = Field(65_536, ge=1024, alias="maxBodyBytes")
    body_read_timeout_seconds: float = Field(10.0, gt=0, alias="bodyReadTimeoutSeconds")


class ControlSettings(_Section):
    """Runtime freezes declared in a ConfigMap (`kubectl edit` it), read by the leader."""

    config_map: str | None = Field(None, alias="configMap", min_length=1, max_length=253)
    """None: no ConfigMap is read. Keys: freeze ("true": the whole daemon), freezeTargets
    (namespace/model, space or comma separated), freezeReason."""
    namespace: str | None = None
    """None: leaderElection.leaseNamespace."""
    poll_interval_seconds: float = Field(5.0, gt=0, alias="pollIntervalSeconds")


class PolicySettings(_Section):
    path: Path = Path("policies.d")
    reload_interval_seconds: float = Field(10.0, gt=0, alias="reloadIntervalSeconds")


class JournalSettings(_Section):
    backend: Literal["sqlite", "postgres"] = "sqlite"
    """sqlite: one file (`path`), for a single replica; postgres: one database shared by every replica."""
    path: Path = Path(".tailguard/journal.db")
    """The SQLite file (backend sqlite)."""
    dsn: str | None = Field(None, pattern=r"^postgres(ql)?://")
    """postgresql://user:password@host:5432/db?sslmode=verify-full (backend postgres); better from
    `dsnFile` or env TAILGUARD_JOURNAL_DSN, which win over it, than with a password in this file."""
    dsn_file: Path | None = Field(None, alias="dsnFile")
    """File holding the DSN (a key of an existing Secret, mounted)."""
    retention_days: float = Field(30.0, ge=1, alias="retentionDays")
    """Processed signals, their decisions and steps older than this are pruned (pending ones never)."""
    max_history_rows: int = Field(100_000, ge=1000, alias="maxHistoryRows")
    """The journal bounded in size as well as age: past this many decisions (or signals) the oldest
    settled ones are pruned at each prune, before retentionDays; never pending signals, unsettled
    decisions, what the guards' windows count, pins, freezes or bad marks (docs/operations.md)."""
    prune_interval_seconds: float = Field(3600.0, gt=0, alias="pruneIntervalSeconds")
    max_pending: int = Field(100_000, ge=1, alias="maxPending")
    """Pending signals past which the webhook answers 503 + Retry-After (Alertmanager retries)."""
    shared_poll_seconds: float = Field(1.0, gt=0, le=60, alias="sharedPollSeconds")
    """PostgreSQL: how often every replica recounts the shared backlog (backpressure) and the leader
    looks for signals other replicas journaled besides their notices (the backstop for a lost one)."""
    statement_timeout_seconds: float = Field(5.0, gt=0, le=300, alias="statementTimeoutSeconds")
    """PostgreSQL: the server's statement_timeout (a transaction left idle is ended after half of
    it); a statement left unanswered 1 s past it has its connection cut (a silent partition).
    Both backends: a write waits at most twice this for another write in progress, then fails (503)."""
    write_failure_seconds: float = Field(5.0, gt=0, le=600, alias="writeFailureSeconds")
    """Journal writes failing, or one stalled, this long: the replica turns not ready (/readyz says
    why) and a leader steps down and hands its Lease back, so a replica that can write takes over."""
    probe_interval_seconds: float = Field(1.0, gt=0, le=60, alias="probeIntervalSeconds")
    """A replica without writes of its own for this long probes the journal (an empty transaction),
    so a journal that went away is noticed before the next signal needs it."""

    @model_validator(mode="after")
    def _dsn_only_for_postgres(self) -> "JournalSettings":
        if self.backend == "sqlite" and (self.dsn is not None or self.dsn_file is not None):
            raise ValueError("dsn and dsnFile are for backend: postgres (backend is sqlite)")
        return self


class PrometheusSettings(_Section):
    url: str | None = None
    timeout_seconds: float = Field(10.0, gt=0, alias="timeoutSeconds")
    max_backoff_seconds: float = Field(15.0, gt=0, alias="maxBackoffSeconds")
    """The longest wait before a failed query group is asked again (the wait doubles per failure):
    a Prometheus back from an outage is read again at most this long after (bench_healthy's gap
    case), at the cost of one failing query per group per wait while it is down."""


class AlertmanagerSettings(_Section):
    """Where operators keep silences: a detector signal an active silence matches is journaled as
    silenced and not acted on (alerts are already silenced by Alertmanager itself)."""

    url: str | None = Field(None, pattern=r"^https?://")
    """Alertmanager's base URL (API v2 under /api/v2); None: silences are not consulted."""
    timeout_seconds: float = Field(2.0, gt=0, le=30, alias="timeoutSeconds")
    """Longest wait for the silences before acting without them (recorded in the decision's plan)."""


class KubernetesSettings(_Section):
    mode: Literal["off", "in-cluster", "kubeconfig"] = "off"
    kubeconfig: Path | None = None
    context: str | None = None


class LeaderElectionSettings(_Section):
    enabled: bool = False
    lease_name: str = Field("tailguard", alias="leaseName")
    lease_namespace: str = Field("default", alias="leaseNamespace")
    lease_duration_seconds: float = Field(15.0, gt=0, alias="leaseDurationSeconds")
    renew_deadline_seconds: float = Field(10.0, gt=0, alias="renewDeadlineSeconds")
    retry_period_seconds: float = Field(2.0, gt=0, alias="retryPeriodSeconds")
    state_config_map: str | None = Field(None, alias="stateConfigMap", min_length=1, max_length=253)
    """ConfigMap (in leaseNamespace) sharing pins and guard history between replicas; None: <leaseName>-state."""

    @property
    def state_config_map_name(self) -> str:
        return self.state_config_map or f"{self.lease_name}-state"


class ShardingSettings(_Section):
    """Targets sharded across replicas (docs/operations.md "Sharding"); 1: one leader acts for all."""

    shards: int = Field(1, ge=1, le=1024)
    """Fixed shard count; every replica must run the same one (the journal refuses another). Above 1
    needs leaderElection.enabled (its namespace and durations) and the PostgreSQL journal."""
    lease_prefix: str | None = Field(None, alias="leasePrefix", min_length=1, max_length=200)
    """Shard Leases are <leasePrefix>-shard-<i>, membership Leases <leasePrefix>-member-<replica>;
    None: leaderElection.leaseName."""

    @property
    def enabled(self) -> bool:
        return self.shards > 1


class LogSettings(_Section):
    format: Literal["auto", "json", "console"] = "auto"
    level: Literal["debug", "info", "warning", "error"] = "info"
    access: Literal["off", "debug", "info"] = "info"
    """The level of the access log (a line per HTTP request; probes and scrapes one level lower:
    /healthz, /readyz and /metrics are at debug); off: none."""


class ExecutorSettings(_Section):
    workers: int = Field(4, ge=1, le=64)
    """Signals processed at once; one target is never acted on by two at a time."""
    triton_timeout_seconds: float = Field(30.0, gt=0, alias="tritonTimeoutSeconds")
    pin_reconcile_interval_seconds: float = Field(30.0, gt=0, alias="pinReconcileIntervalSeconds")
    """How often pins from past rollbacks are re-checked on every replica (new pods load the newest)."""
    max_signal_age_seconds: float = Field(600.0, gt=0, alias="maxSignalAgeSeconds")
    """A signal older than this (since it was journaled) when a worker takes it is decided blocked
    as expired, not acted on: after a long leaderless spell, the incident it describes has moved on."""
    queue_size: int = Field(10_000, ge=1, alias="queueSize")
    """Signals held in memory per class (matching a policy, matching none); more wait in the journal."""
    escalation_freeze_seconds: float = Field(3600.0, gt=0, alias="escalationFreezeSeconds")
    """A target whose remediation did not help (verify, onNotRecovered: escalate) is frozen this long:
    no policy acts on it until then, or until `tailguard unfreeze` lifts it."""
    repin_escalate_after: int = Field(3, ge=1, alias="repinEscalateAfter")
    """Re-pins of a redeployed rolled-back version (the deploy pipeline bringing it back) within
    repinWindowSeconds after which the pin reconciler escalates and stops re-pinning the target until
    an operator answers (`tailguard bad-versions TARGET --clear N`, or `tailguard unpin`)."""
    repin_window_seconds: float = Field(3600.0, gt=0, alias="repinWindowSeconds")
    """The window of repinEscalateAfter."""
    notification_queue_size: int = Field(1000, ge=1, alias="notificationQueueSize")
    """Outcome notifications waiting per receiver; past it a routine notice is dropped before any
    escalation (and counted as a fault)."""


class BlastRadiusSettings(_Section):
    """Daemon-wide limits across targets (a policy's own guards see one target); None turns a limit off.

    On by default (docs/operations.md, "Safe defaults"): a burst on more than 3 targets acts on
    none, and at most 5 distinct targets are changed an hour. The price: every signal that may act is
    held quietHoldSeconds before it does (commonCauseSpanSeconds when another target signalled
    around it), and a real regression on 4 targets at once escalates."""

    max_targets_per_window: int | None = Field(5, ge=1, alias="maxTargetsPerWindow")
    """Distinct targets changed within windowSeconds past which a plan on one more target is blocked."""
    window_seconds: float = Field(3600.0, gt=0, alias="windowSeconds")
    """The window of maxTargetsPerWindow."""
    common_cause_targets: int | None = Field(3, ge=1, alias="commonCauseTargets")
    """More distinct targets than this signalling within commonCauseSpanSeconds: act on none, escalate once."""
    common_cause_share: float | None = Field(None, gt=0, lt=1, alias="commonCauseShare")
    """As commonCauseTargets, as a fraction (0-1) of the targets the policies name. Off by default: in a
    small fleet it would suppress two simultaneous regressions (2 of 3 targets); the count catches bursts."""
    common_cause_span_seconds: float = Field(60.0, gt=0, alias="commonCauseSpanSeconds")
    """The span within which signals on many targets count as one burst with a likely shared cause,
    counted by arrival (when the journal received each): a signal is held until a span after its
    arrival, then judged on the signals that arrived within a span before or after it."""
    quiet_hold_seconds: float | None = Field(15.0, ge=0, alias="quietHoldSeconds")
    """A signal alone (no other target signalled from a span before its arrival to this long after
    it) is judged this long after its arrival instead of a whole span: a lone regression waits
    seconds, a burst whose next target signals within it is held the span. null: always the span."""


class LoopSettings(_Section):
    """How a crashed loop of the daemon restarts, and when one that keeps crashing makes the replica
    fail its probes (daemon/common/lifecycle.py, docs/operations.md "Loops that die")."""

    restart_initial_seconds: float = Field(1.0, gt=0, alias="restartInitialSeconds")
    """The wait before a crashed loop runs again; it doubles with each crash in crashWindowSeconds."""
    restart_max_seconds: float = Field(60.0, gt=0, alias="restartMaxSeconds")
    """The longest wait before a restart."""
    max_crashes: int = Field(5, ge=1, alias="maxCrashes")
    """Crashes of one loop (its child tasks included) within crashWindowSeconds at which /readyz and
    /healthz answer 503 (Kubernetes restarts the pod) and a leader hands its Lease back."""
    crash_window_seconds: float = Field(300.0, gt=0, alias="crashWindowSeconds")
    """The window of maxCrashes."""

    @model_validator(mode="after")
    def _ordered(self) -> "LoopSettings":
        if self.restart_initial_seconds > self.restart_max_seconds:
            raise ValueError("restartInitialSeconds must not exceed restartMaxSeconds")
        return self


BLAST_RADIUS_OFF = BlastRadiusSettings(max_targets_per_window=None, common_cause_targets=None, common_cause_share=None)
"""Every limit across targets off: an Executor built without settings (tests, embedding), never the daemon's."""


NotificationEvent = Literal["acted", "recovered", "not_recovered", "escalated", "failed",
                            "approval_requested", "approval_expired", "approved"]
NOTIFICATION_EVENTS: tuple[NotificationEvent, ...] = ("acted", "recovered", "not_recovered", "escalated", "failed",
                                                     "approval_requested", "approval_expired", "approved")


class NotificationSettings(_Section):
    """One receiver of outcome notifications (chat webhook, pager bridge)."""

    url: str | None = Field(None, pattern=r"^https?://")
    """The receiver's URL; exactly one of url and urlFile."""
    url_file: Path | None = Field(None, alias="urlFile")
    """File holding the URL (a key of an existing Secret, mounted: chat webhook URLs are secrets);
    read when the daemon starts."""
    format: Literal["json", "slack"] = "json"
    """json: the event as a JSON object; slack: `{"text": ...}` for a Slack-compatible incoming webhook."""
    events: list[NotificationEvent] = Field(default_factory=lambda: list(NOTIFICATION_EVENTS))
    headers: dict[str, str] = Field(default_factory=dict)
    timeout_seconds: float = Field(5.0, gt=0, alias="timeoutSeconds")
    max_attempts: int = Field(4, ge=1, le=20, alias="maxAttempts")
    """Tries per event: 5xx answers and network errors are retried with backoff (1 s, 2 s, 4 s ...)."""

    @model_validator(mode="after")
    def _one_url(self) -> "NotificationSettings":
        if (self.url is None) == (self.url_file is None):
            raise ValueError("set exactly one of url and urlFile")
        return self


class Settings(_Section):
    listen: ListenSettings = Field(default_factory=ListenSettings)
    webhook: WebhookSettings = Field(default_factory=WebhookSettings)
    api: ApiSettings = Field(default_factory=ApiSettings)
    control: ControlSettings = Field(default_factory=ControlSettings)
    policies: PolicySettings = Field(default_factory=PolicySettings)
    journal: JournalSettings = Field(default_factory=JournalSettings)
    prometheus: PrometheusSettings = Field(default_factory=PrometheusSettings)
    alertmanager: AlertmanagerSettings = Field(default_factory=AlertmanagerSettings)
    kubernetes: KubernetesSettings = Field(default_factory=KubernetesSettings)
    leader_election: LeaderElectionSettings = Field(default_factory=LeaderElectionSettings, alias="leaderElection")
    sharding: ShardingSettings = Field(default_factory=ShardingSettings)
    executor: ExecutorSettings = Field(default_factory=ExecutorSettings)
    blast_radius: BlastRadiusSettings = Field(default_factory=BlastRadiusSettings, alias="blastRadius")
    loops: LoopSettings = Field(default_factory=LoopSettings)
    freeze: bool = False
    """Global freeze switch: signals are journaled and planned, nothing is applied."""
    notifications: list[NotificationSettings] = Field(default_factory=list)
    """Where outcomes (acted, recovered, not_recovered, escalated, failed) are posted; never blocks acting."""
    log: LogSettings = Field(default_factory=LogSettings)

    @model_validator(mode="after")
    def _fits_together(self) -> "Settings":
        """Checks across sections: a config that cannot run fails at load, in one line naming the field."""
        problem = _cross_field_problem(self)
        if problem is not None:
            raise PydanticCustomError("settings", problem)
        return self


def _cross_field_problem(settings: Settings) -> str | None:
    """The first setting that does not fit with the others, worded for the operator; None when all fit."""
    le, kube_off = settings.leader_election, settings.kubernetes.mode == "off"
    if le.enabled and kube_off:
        return "leaderElection.enabled needs kubernetes.mode in-cluster or kubeconfig"
    if settings.control.config_map is not None and kube_off:
        return "control.configMap needs kubernetes.mode in-cluster or kubeconfig"
    if le.enabled and le.renew_deadline_seconds >= le.lease_duration_seconds:
        return (f"leaderElection.renewDeadlineSeconds ({le.renew_deadline_seconds:g}) must be below "
                f"leaseDurationSeconds ({le.lease_duration_seconds:g}): a leader must stop acting before "
                "its Lease can be taken")
    if settings.sharding.enabled and not le.enabled:
        return (f"sharding.shards ({settings.sharding.shards}) above 1 needs leaderElection.enabled "
                "(the shard Leases use its namespace and durations)")
    if settings.sharding.enabled and settings.journal.backend != "postgres":
        return (f"sharding.shards ({settings.sharding.shards}) above 1 needs the PostgreSQL journal "
                "(journal.backend: postgres): every replica reads the signals the others journaled")
    if le.enabled and le.retry_period_seconds >= le.renew_deadline_seconds:
        return (f"leaderElection.retryPeriodSeconds ({le.retry_period_seconds:g}) must be below "
                f"renewDeadlineSeconds ({le.renew_deadline_seconds:g})")
    return None


class ConfigError(Exception):
    pass


def load_settings(path: Path | None) -> Settings:
    """Read settings from YAML (relative paths resolve against the file's folder)."""
    if path is None:
        return Settings()
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the config must be a mapping")
    try:
        settings = Settings.model_validate(raw)
    except ValidationError as exc:
        # A check across sections has no location of its own: its message names the field.
        lines = [f"{path}: {'.'.join(map(str, e['loc'])) + ': ' if e['loc'] else ''}{e['msg']}"
                 for e in exc.errors()]
        raise ConfigError("\n".join(lines)) from exc
    base = path.parent
    settings.policies.path = _resolve(base, settings.policies.path)
    settings.journal.path = _resolve(base, settings.journal.path)
    if settings.journal.dsn_file is not None:
        settings.journal.dsn_file = _resolve(base, settings.journal.dsn_file)
    if settings.webhook.token_file is not None:
        settings.webhook.token_file = _resolve(base, settings.webhook.token_file)
    if settings.api.tokens_file is not None:
        settings.api.tokens_file = _resolve(base, settings.api.tokens_file)
    if settings.listen.tls is not None:
        settings.listen.tls.cert_file = _resolve(base, settings.listen.tls.cert_file)
        settings.listen.tls.key_file = _resolve(base, settings.listen.tls.key_file)
    for sink in settings.notifications:
        if sink.url_file is not None:
            sink.url_file = _resolve(base, sink.url_file)
    return settings


def _resolve(base: Path, p: Path) -> Path:
    return p if p.is_absolute() else (base / p)


def journal_store(settings: JournalSettings) -> Path | str:
    """Where the journal lives: the SQLite file, or the PostgreSQL DSN (env TAILGUARD_JOURNAL_DSN
    first, else `dsnFile`, else `dsn`).

    Raises:
        ConfigError: backend postgres without a DSN, or a DSN file that cannot be read.
    """
    if settings.backend == "sqlite":
        return settings.path
    dsn = os.environ.get("TAILGUARD_JOURNAL_DSN", "").strip()
    if not dsn and settings.dsn_file is not None:
        try:
            dsn = settings.dsn_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ConfigError(f"cannot read journal DSN file {settings.dsn_file}: {exc}") from exc
    dsn = dsn or (settings.dsn or "")
    if not dsn.startswith(("postgres://", "postgresql://")):
        raise ConfigError("journal.backend postgres needs a postgresql:// DSN: journal.dsn, journal.dsnFile "
                          "or TAILGUARD_JOURNAL_DSN")
    return dsn


def webhook_token(settings: WebhookSettings) -> str | None:
    """The bearer token: env TAILGUARD_WEBHOOK_TOKEN first, else the token file."""
    env = os.environ.get("TAILGUARD_WEBHOOK_TOKEN")
    if env:
        return env.strip()
    if settings.token_file is not None:
        try:
            return settings.token_file.read_text(encoding="utf-8").strip() or None
        except OSError as exc:
            raise ConfigError(f"cannot read webhook token file {settings.token_file}: {exc}") from exc
    return None


@dataclass(frozen=True)
class ApiTokenEntry:
    """One named operator token as configured (the secret itself stays in memory only)."""

    name: str
    token: str
    scopes: frozenset[str]


class _TokenEntry(_Section):
    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._@:-]*$")
    token: str = Field(min_length=16, max_length=4096)
    scopes: list[Literal["read", "write"]] = Field(min_length=1)


def api_tokens(settings: ApiSettings) -> list[ApiTokenEntry]:
    """The operator tokens: env TAILGUARD_API_TOKENS (YAML) first, else `tokensFile`; [] when neither.

    Raises:
        ConfigError: unreadable, not a list of {name, token, scopes}, or a name or token used twice.
    """
    env = os.environ.get("TAILGUARD_API_TOKENS")
    where = "TAILGUARD_API_TOKENS"
    if env:
        text = env
    elif settings.tokens_file is not None:
        where = str(settings.tokens_file)
        try:
            text = settings.tokens_file.read_text(encoding="utf-8")
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read API tokens file {where}: {exc}") from exc
    else:
        return []
    try:
        raw = yaml.safe_load(text) or []
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: not YAML: {exc}") from exc
    if not isinstance(raw, list):
        raise ConfigError(f"{where}: must be a list of {{name, token, scopes}}")
    out: list[ApiTokenEntry] = []
    for n, item in enumerate(raw):
        try:
            entry = _TokenEntry.model_validate(item)
        except ValidationError as exc:
            first = exc.errors()[0]  # never echo the value: it may be a token
            raise ConfigError(f"{where}: entry {n}: {'.'.join(map(str, first['loc']))}: {first['msg']}") from None
        if any(e.name == entry.name for e in out):
            raise ConfigError(f"{where}: token name {entry.name!r} is used twice")
        if any(e.token == entry.token for e in out):
            raise ConfigError(f"{where}: tokens {entry.name!r} and another entry are the same secret")
        out.append(ApiTokenEntry(entry.name, entry.token.strip(), frozenset(entry.scopes)))
    return out


@dataclass(frozen=True)
class Secrets:
    """What the settings point at in the environment and in mounted files, read and checked
    together where the settings are resolved, before anything starts."""

    webhook_token: str | None
    """The bearer token Alertmanager sends; None only with webhook.allowUnauthenticated."""
    api_tokens: list[ApiTokenEntry]
    tls: ssl.SSLContext | None
    """The server's certificate and key, loaded (listen.tls); None: plain HTTP."""


def resolve_secrets(settings: Settings) -> Secrets:
    """Read the webhook token, the operator tokens and the TLS certificate, and check them together.

    Raises:
        ConfigError: a file cannot be read or holds no valid value, no webhook token without
            webhook.allowUnauthenticated, or an API token equal to the webhook token.
    """
    token, tokens = resolve_tokens(settings)
    return Secrets(token, tokens, server_ssl_context(settings.listen.tls))


def resolve_tokens(settings: Settings) -> tuple[str | None, list[ApiTokenEntry]]:
    """The webhook token and the operator tokens, read and checked together (at start, and again
    when their files change: daemon/http/secret_reload.py).

    Raises:
        ConfigError: as `resolve_secrets`.
    """
    token = webhook_token(settings.webhook)
    if token is None and not settings.webhook.allow_unauthenticated:
        raise ConfigError("no webhook token: set webhook.tokenFile or TAILGUARD_WEBHOOK_TOKEN "
                          "(or webhook.allowUnauthenticated: true for local experiments)")
    tokens = api_tokens(settings.api)
    if token is not None and any(t.token == token for t in tokens):
        raise ConfigError("an API token equals the webhook token: give Alertmanager and operators "
                          "different secrets")
    return token, tokens


def server_ssl_context(tls: TlsSettings | None) -> ssl.SSLContext | None:
    """The HTTPS server context of listen.tls; None for plain HTTP.

    Raises:
        ConfigError: the certificate or key cannot be loaded.
    """
    if tls is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(str(tls.cert_file), str(tls.key_file))
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"listen.tls: cannot load {tls.cert_file} / {tls.key_file}: {exc}") from exc
    return context
