"""Webhook intake under load, on loopback, each figure against a baseline measured in the same run:

1. intake: 2xx webhooks per second (10 alerts each, all new, none matching a policy) from 16
   keep-alive clients for a fixed time: tailguard (durable journal, committed before the 2xx) on
   each journal backend chosen (`--backends`, default both: SQLite, and PostgreSQL started here)
   against a bare aiohttp handler (read, parse JSON, 200) and a durable floor (read, decode, the
   body as one SQLite row through the journal's group commit, 200), with the journal's write transactions
   per webhook (on PostgreSQL also as the server counts them: commit records in the WAL,
   pg_stat_database.xact_commit, transaction ids);
2. time to action: from the 2xx of a matching alert to its action (the notify call arriving
   here), sent right behind 50,000 alerts that match no policy (sent live; and left pending in the
   journal before a start), against the same on an idle daemon;
3. memory: resident set of the daemon through a burst of 100,000 matching alerts (each needs the
   executor, which cannot keep up), against the same daemon idle.
2 and 3 run on the SQLite journal (they read it directly), when sqlite is among the backends.

PostgreSQL: the Debian package's server, started by tests/support/postgres.py (initdb in a temp
dir, a free loopback port, stopped by PID), then restarted on the same data directory with its
defaults fsync=on and full_page_writes=on (the tests turn both off) so that a commit is as durable
as SQLite's synchronous=FULL; `--pg-fsync off` keeps the tests' settings. One fresh database per run.

Every server runs in a subprocess started here and stopped by its PID; the clients speak raw
HTTP/1.1 over asyncio streams so that the load generator costs little next to the server. Every
loop is bounded (a deadline, a request count, retries per request, timeouts).
Prints a table; not a test. Run: python bench/bench_intake.py [--quick] [--backends sqlite,postgres]
[--pg-fsync on|off]  (make bench BENCH_INTAKE_FLAGS=--quick)
The daemon measured is this checkout's, or the source tree named by TAILGUARD_SRC (a before/after).
With BENCH_PROFILE=DIR each tailguard server's main thread runs under cProfile, its stats copied to DIR.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import importlib.util
import json
import os
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterator, Sequence

from aiohttp import web

SRC = Path(os.environ.get("TAILGUARD_SRC", Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(SRC))

from lab.ports import LOOPBACK, free_port  # noqa: E402
from lab.process import ManagedProcess  # noqa: E402

TOKEN = "bench-token"
CLIENTS = 16
ALERTS_PER_REQUEST = 10
REQUEST_TIMEOUT_SECONDS = 30.0
MAX_RETRIES = 600  # per request, on 503, each after min(Retry-After, RETRY_PAUSE_SECONDS)
RETRY_PAUSE_SECONDS = 0.1
ACTION_TIMEOUT_SECONDS = 120.0
BACKENDS = ("sqlite", "postgres")
PG_IDLE_TIMEOUT_SECONDS = 20.0  # for the daemon's connections to end once it stopped (stats flushed)


# ---- the servers (run in subprocesses) -----------------------------------------------------

def _baseline_app(alerts: Callable[[web.Request], Awaitable[web.Response]]) -> web.Application:
    """A baseline server: `alerts` on the webhook's path, and a health check to wait for."""
    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.router.add_post("/api/v1/alerts", alerts)
    app.router.add_get("/healthz", healthz)
    return app


def _bare_app() -> web.Application:
    async def alerts(request: web.Request) -> web.Response:
        body = json.loads(await request.read())
        return web.json_response({"accepted": len(body["alerts"]), "duplicates": 0})

    return _baseline_app(alerts)


def _floor_app(db_path: Path) -> web.Application:
    """The least any durable intake does: read the body, decode it, write it to SQLite (WAL,
    synchronous=FULL, as the journal) through the journal's own group commit, answer once committed.
    No validation past JSON, one row per webhook body, no Signals, no backlog, no metrics, no log:
    what is left of a durable webhook's cost when tailguard's own work is taken away."""
    import msgspec

    from daemon.storage.group_commit import GroupCommit

    db = sqlite3.connect(db_path, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE IF NOT EXISTS bodies (id INTEGER PRIMARY KEY, received_at REAL, body BLOB)")

    def write(bodies: list[bytes]) -> list[int]:
        db.execute("BEGIN IMMEDIATE")
        db.executemany("INSERT INTO bodies(received_at, body) VALUES (?, ?)", [(time.time(), b) for b in bodies])
        db.execute("COMMIT")
        return [1] * len(bodies)

    group: GroupCommit[bytes, int] = GroupCommit(write, "floor-writer")
    decoder = msgspec.json.Decoder()

    async def alerts(request: web.Request) -> web.Response:
        raw = await request.read()
        count = len(decoder.decode(raw)["alerts"])
        await asyncio.wrap_future(group.submit(raw))
        return web.json_response({"accepted": count, "duplicates": 0})

    return _baseline_app(alerts)


async def _serve_tailguard(port: int, work: Path, sink_url: str, cooldown: str, backend: str) -> None:
    from daemon.common.config import Settings
    from daemon.common.logs import configure_logging
    from daemon.wiring.registries import action_registry, detector_registry
    from daemon.wiring.service import Service

    policies = work / "policies"
    policies.mkdir(parents=True, exist_ok=True)
    # One policy (JSON is YAML): notify `sink_url` on TritonTailLatencyHigh about model ranker.
    # An alert-only policy needs a verify block; with no Prometheus configured it settles at once
    # as unknown, and onNotRecovered none keeps that from freezing the target.
    policy = {"name": "ranker-notify", "target": {"model": "ranker"},
              "triggers": [{"alert": {"name": "TritonTailLatencyHigh"}}],
              "actions": [{"type": "notify", "url": sink_url}],
              "guards": {"cooldown": cooldown, "maxActions": 1_000_000},
              "verify": {"query": "vector(0)", "below": 1, "onNotRecovered": "none"}}
    (policies / "p.yaml").write_text(json.dumps(policy))
    configure_logging("json", "info")  # the daemon's default level, into its log file
    # backend postgres: the DSN comes from env TAILGUARD_JOURNAL_DSN, as in a deployment.
    settings = Settings.model_validate({"listen": {"host": LOOPBACK, "port": port},
                                        "policies": {"path": str(policies)},
                                        "journal": {"backend": backend, "path": str(work / "journal.db")},
                                        # Intake is measured, not the common-cause hold (on by default).
                                        "blastRadius": {"maxTargetsPerWindow": None, "commonCauseTargets": None}})
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with Service(settings, action_registry(), detector_registry()) as svc:
        await stop.wait()
    # Write transactions the journal committed (this version counts them), for the table.
    (work / "stats.json").write_text(json.dumps({"commits": getattr(svc.journal, "commits", None)}))


@contextmanager
def _profiled(out: Path) -> Iterator[None]:
    """With BENCH_PROFILE set, the daemon's main thread runs under cProfile (stats written to `out`,
    and copied to BENCH_PROFILE when it names a directory): where the intake's CPU goes."""
    target = os.environ.get("BENCH_PROFILE")
    if not target:
        yield
        return
    import cProfile

    profile = cProfile.Profile()
    profile.enable()
    try:
        yield
    finally:
        profile.disable()
        profile.dump_stats(out)
        if Path(target).is_dir():
            shutil.copy(out, Path(target) / f"{out.parent.name}.prof")


@dataclass
class Server:
    kind: str
    port: int
    work: Path
    process: ManagedProcess

    def rss_mib(self) -> tuple[float, float]:
        """(VmRSS, VmHWM) of the server process, MiB."""
        lines = Path(f"/proc/{self.process.pid}/status").read_text().splitlines()
        fields = dict(line.split(":", 1) for line in lines if ":" in line)
        return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024

    def commits(self) -> int | None:
        """Journal write transactions, once the daemon has stopped (None where it does not count them)."""
        stats = self.work / "stats.json"
        return json.loads(stats.read_text())["commits"] if stats.exists() else None

    def pending(self) -> int:
        """Pending signals in the daemon's journal (read-only)."""
        db = sqlite3.connect(f"file:{self.work / 'journal.db'}?mode=ro", uri=True, timeout=10)
        try:
            return int(db.execute("SELECT COUNT(*) FROM signals WHERE state='pending'").fetchone()[0])
        finally:
            db.close()


@contextmanager
def server(kind: str, root: Path, sink_url: str = "http://127.0.0.1:9/hook", cooldown: str = "0s",
           pending: int = 0, dsn: str | None = None) -> Iterator[Server]:
    """A server subprocess started here, ready for webhooks; stopped by its PID on exit.
    `pending`: unmatched alerts journaled before the start (acknowledged before a restart);
    `dsn`: tailguard journals into this PostgreSQL database instead of a SQLite file."""
    port = free_port()
    work = Path(tempfile.mkdtemp(prefix=f"{kind}-", dir=root))
    if pending:
        _journal_unmatched(work / "journal.db", pending)
    argv = [sys.executable, str(Path(__file__).resolve()), "serve", kind, "--port", str(port),
            "--work", str(work), "--sink-url", sink_url, "--cooldown", cooldown,
            "--backend", "sqlite" if dsn is None else "postgres"]
    env = dict(os.environ, TAILGUARD_WEBHOOK_TOKEN=TOKEN, PYTHONPATH=str(SRC))
    env.pop("TAILGUARD_JOURNAL_DSN", None)
    if dsn is not None:
        env["TAILGUARD_JOURNAL_DSN"] = dsn
    process = ManagedProcess(argv=argv, log_path=work / "server.log", env=env)
    process.start()
    try:
        process.wait_ready(f"http://{LOOPBACK}:{port}/" + ("readyz" if kind == "tailguard" else "healthz"))
        yield Server(kind, port, work, process)
    finally:
        process.stop()


def _journal_unmatched(path: Path, count: int) -> None:
    from daemon.http.intake import alert_signals, parse_payload
    from daemon.storage.journal import Journal

    alerts, journal = Alerts(), Journal(path)
    try:
        for _ in range(count // 1_000):
            journal.signals.record(alert_signals(parse_payload(json.loads(alerts.body("other", 1_000)))))
    finally:
        journal.close()


# ---- PostgreSQL (started here for the postgres backend) --------------------------------------

def _pg_support() -> Any:
    """tests/support/postgres.py of this checkout (not of TAILGUARD_SRC), loaded as it is."""
    name = "_bench_tests_support_postgres"
    if name not in sys.modules:
        path = Path(__file__).resolve().parents[1] / "tests" / "support" / "postgres.py"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # its dataclasses look themselves up there
        spec.loader.exec_module(module)
    return sys.modules[name]


def postgres_installed() -> bool:
    return _pg_support().postgres_bin() is not None


def _restart_durable(pg: Any, old: Any, attempts: int = 3) -> Any:
    """Stop the tests' server (fsync=off, full_page_writes=off) and start the same cluster again
    with PostgreSQL's defaults for both, as the tests' starter does otherwise (same user, socket
    dir, max_connections, loopback only, a free port, bounded readiness wait)."""
    pg.stop_postgres(old)
    bin_dir, ids, root = pg.postgres_bin(), pg._run_as(), old.root
    user_args: dict[str, Any] = {} if ids is None else {"user": ids[0], "group": ids[1], "extra_groups": []}
    log = root / "postgres.log"
    for attempt in range(attempts):
        port = pg._free_port()
        with open(log, "ab") as out:
            process = subprocess.Popen(
                [str(bin_dir / "postgres"), "-D", str(root / "data"), "-p", str(port), "-h", LOOPBACK,
                 "-k", str(root / "sockets"), "-c", "max_connections=200"],
                stdout=out, stderr=subprocess.STDOUT, cwd=root, **user_args)
        server = pg.PostgresServer(port, old.superuser, process, root)
        try:
            pg._ready(server, log, time.monotonic() + 30)
            return server
        except RuntimeError:
            pg.stop_postgres(server)
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


@contextmanager
def postgres(fsync: bool) -> Iterator[Any]:
    """A PostgreSQL cluster in its own temp dir (the server may run as another user, so not under
    the bench's root-only dir), stopped by PID and removed on exit."""
    pg = _pg_support()
    root = Path(tempfile.mkdtemp(prefix="bench-intake-pg-"))
    server = None
    try:
        server = pg.start_postgres(root)
        if fsync:
            server = _restart_durable(pg, server)
        yield server
    finally:
        if server is not None:
            pg.stop_postgres(server)
        shutil.rmtree(root, ignore_errors=True)


def _pg_row(cursor: Any) -> Any:
    row = cursor.fetchone()
    assert row is not None
    return row


def _pg_query(server: Any, sql: str, params: Sequence[Any] = ()) -> Any:
    import psycopg

    with psycopg.connect(server.dsn(), autocommit=True, connect_timeout=10) as conn:
        return _pg_row(conn.execute(sql, params))


def pg_counters(server: Any, dsn: str) -> dict[str, Any]:
    """Once nothing is connected to the database of `dsn` (a stopped daemon's backends flush their
    statistics as they exit): its committed transactions (reads included: each pool checkout is
    one), the cluster's transaction-id counter (advanced by writing transactions and by savepoints
    that write; this call takes one id itself), and the WAL position."""
    import psycopg

    database = dsn.rsplit("/", 1)[1]
    with psycopg.connect(server.dsn(), autocommit=True, connect_timeout=10) as conn:
        deadline = time.monotonic() + PG_IDLE_TIMEOUT_SECONDS
        while _pg_row(conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (database,)))[0]:
            if time.monotonic() > deadline:
                raise RuntimeError(f"connections to {database} still open {PG_IDLE_TIMEOUT_SECONDS:g} s "
                                   "after the daemon stopped")
            time.sleep(0.05)
        time.sleep(0.5)  # the last backend's exit hooks (statistics flush) run as it leaves
        conn.execute("SELECT pg_stat_clear_snapshot()")
        commits = _pg_row(conn.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = %s", (database,)))[0]
        xid = _pg_row(conn.execute("SELECT pg_current_xact_id()::text::bigint"))[0]
        lsn = _pg_row(conn.execute("SELECT pg_current_wal_lsn()::text"))[0]
    return {"xact_commit": int(commits), "xid": int(xid), "lsn": str(lsn)}


def wal_commits(server: Any, start: str, end: str) -> int | None:
    """Commit records in the WAL between two positions: one per transaction that wrote (read-only
    ones write none; a savepoint's is its parent's). pg_waldump's record statistics; None where it
    cannot tell."""
    waldump = _pg_support().postgres_bin() / "pg_waldump"
    try:
        done = subprocess.run([str(waldump), "-p", str(server.root / "data" / "pg_wal"), "-s", start, "-e", end,
                               "--stats=record"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in done.stdout.splitlines():
        fields = line.split()
        if len(fields) > 1 and fields[0] == "Transaction/COMMIT":
            return int(fields[1])
    return 0 if done.returncode == 0 else None


# ---- the clients ---------------------------------------------------------------------------

class Alerts:
    """Webhook bodies of new alerts (fingerprints never repeat) about a model."""

    MARK = "@@FP@@"

    def __init__(self) -> None:
        self._next = 0
        self._templates: dict[tuple[str, int], list[str]] = {}

    def body(self, model: str, count: int = ALERTS_PER_REQUEST) -> bytes:
        parts = self._template(model, count)
        out = [parts[0]]
        for part in parts[1:]:
            out += [f"{self._next:016x}", part]
            self._next += 1
        return "".join(out).encode()

    def _template(self, model: str, count: int) -> list[str]:
        if (model, count) not in self._templates:
            alert = {"status": "firing", "fingerprint": self.MARK,
                     "labels": {"alertname": "TritonTailLatencyHigh", "model": model, "severity": "page"},
                     "annotations": {"summary": "P99.9 request latency above 500 ms"},
                     "startsAt": "2026-11-29T17:26:08.551Z", "endsAt": "0001-01-01T00:00:00Z"}
            body = {"version": "4", "status": "firing", "receiver": "bench", "alerts": [alert] * count,
                    "groupKey": '{}:{alertname="TritonTailLatencyHigh"}', "groupLabels": {},
                    "commonLabels": {}, "externalURL": "http://alertmanager.invalid", "truncatedAlerts": 0}
            self._templates[model, count] = json.dumps(body).split(self.MARK)
        return self._templates[model, count]


class Connection:
    """One keep-alive HTTP/1.1 connection to the webhook, one request at a time."""

    HEAD = (f"POST /api/v1/alerts HTTP/1.1\r\nHost: {LOOPBACK}\r\nAuthorization: Bearer {TOKEN}\r\n"
            "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n").encode()

    def __init__(self, port: int) -> None:
        self.port = port
        self._streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def post(self, body: bytes) -> tuple[int, dict[str, str]]:
        if self._streams is None:
            self._streams = await asyncio.open_connection(LOOPBACK, self.port)
        reader, writer = self._streams
        writer.write(self.HEAD % len(body) + body)
        async with asyncio.timeout(REQUEST_TIMEOUT_SECONDS):
            lines = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
            headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:] if x)}
            await reader.readexactly(int(headers.get("content-length", "0")))
        if headers.get("connection", "").lower() == "close":
            self.close()
        return int(lines[0].split()[1]), headers

    async def post_until_accepted(self, body: bytes, refused: collections.Counter[int]) -> int:
        """Post, and post again after each 503 (as Alertmanager does), a bounded number of times."""
        for _ in range(MAX_RETRIES):
            status, headers = await self.post(body)
            if status != 503:
                return status
            refused[status] += 1
            await asyncio.sleep(min(float(headers.get("retry-after", "1")), RETRY_PAUSE_SECONDS))
        raise RuntimeError(f"still refused after {MAX_RETRIES} tries")

    def close(self) -> None:
        if self._streams is not None:
            self._streams[1].close()
            self._streams = None


async def load_for(port: int, seconds: float, body: Callable[[], bytes]) -> collections.Counter[int]:
    """CLIENTS connections posting back to back until the deadline; statuses counted."""
    statuses: collections.Counter[int] = collections.Counter()
    deadline = time.monotonic() + seconds

    async def client() -> None:
        conn = Connection(port)
        try:
            while time.monotonic() < deadline:
                statuses[(await conn.post(body()))[0]] += 1
        finally:
            conn.close()

    await asyncio.gather(*(client() for _ in range(CLIENTS)))
    return statuses


async def send_all(port: int, requests: int, body: Callable[[], bytes]) -> collections.Counter[int]:
    """`requests` webhooks over CLIENTS connections, each until accepted; the refusals counted."""
    refused: collections.Counter[int] = collections.Counter()
    left = [requests]

    async def client() -> None:
        conn = Connection(port)
        try:
            while left[0] > 0:
                left[0] -= 1
                status = await conn.post_until_accepted(body(), refused)
                if status != 200:
                    raise RuntimeError(f"webhook answered {status}")
        finally:
            conn.close()

    await asyncio.gather(*(client() for _ in range(CLIENTS)))
    return refused


@dataclass
class Sink:
    """The notify action's target, here: when each call arrived."""

    arrivals: list[float] = field(default_factory=list)
    event: asyncio.Event = field(default_factory=asyncio.Event)
    url: str = ""
    _runner: web.AppRunner | None = None

    async def start(self) -> None:
        async def hook(request: web.Request) -> web.Response:
            await request.read()
            self.arrivals.append(time.monotonic())
            self.event.set()
            return web.Response()

        app = web.Application()
        app.router.add_post("/hook", hook)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        port = free_port()
        await web.TCPSite(self._runner, LOOPBACK, port).start()
        self.url = f"http://{LOOPBACK}:{port}/hook"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def time_to_action(self, port: int, alerts: Alerts) -> float:
        """Seconds from the 2xx of one matching alert to its notify call arriving."""
        self.event.clear()
        conn = Connection(port)
        try:
            await conn.post_until_accepted(alerts.body("ranker", 1), collections.Counter())
        finally:
            conn.close()
        accepted = time.monotonic()
        await asyncio.wait_for(self.event.wait(), ACTION_TIMEOUT_SECONDS)
        return self.arrivals[-1] - accepted


# ---- the measurements ----------------------------------------------------------------------

async def intake(root: Path, seconds: float, backends: Sequence[str], pg_fsync: bool) -> dict[str, Any]:
    """The bare handler, then tailguard on each backend, one after another under the same load.
    Per variant: rate (2xx/s), errors (not 2xx), and for tailguard the journal's committed write
    transactions per accepted webhook (warm-up included, over the daemon's whole life); on
    PostgreSQL also the server's own counts over the same span."""
    alerts = Alerts()
    out: dict[str, dict[str, Any]] = {}
    with ExitStack() as stack:
        pg = stack.enter_context(postgres(pg_fsync)) if "postgres" in backends else None
        for variant in ("bare", "floor", *backends):
            dsn = pg.create_database() if variant == "postgres" and pg is not None else None
            before = pg_counters(pg, dsn) if dsn is not None else None
            with server(variant if variant in ("bare", "floor") else "tailguard", root, dsn=dsn) as srv:
                warm = await load_for(srv.port, min(1.0, seconds / 3), lambda: alerts.body("other"))
                statuses = await load_for(srv.port, seconds, lambda: alerts.body("other"))
            accepted = warm[200] + statuses[200]
            result: dict[str, Any] = {"rate": statuses[200] / seconds,
                                      "errors": sum(statuses.values()) - statuses[200], "accepted": accepted}
            if srv.kind == "tailguard":
                commits = srv.commits()  # stopped: it wrote its count on the way out
                result["tx_per_webhook"] = None if commits is None else commits / accepted
            if dsn is not None and before is not None:
                after = pg_counters(pg, dsn)
                result["pg_xids_per_webhook"] = (after["xid"] - before["xid"] - 1) / accepted
                result["pg_commits_per_webhook"] = (after["xact_commit"] - before["xact_commit"]) / accepted
                wal = wal_commits(pg, before["lsn"], after["lsn"])
                result["pg_wal_commits_per_webhook"] = None if wal is None else wal / accepted
                version, fsync, fpw, sync_commit = _pg_query(
                    pg, "SELECT current_setting('server_version'), current_setting('fsync'), "
                        "current_setting('full_page_writes'), current_setting('synchronous_commit')")
                result["pg"] = (f"PostgreSQL {version}, fsync={fsync}, full_page_writes={fpw}, "
                                f"synchronous_commit={sync_commit}")
            out[variant] = result
    for variant in ("floor", *backends):
        out[variant]["ratio"] = out[variant]["rate"] / out["bare"]["rate"]
        out[variant]["to_floor"] = out[variant]["rate"] / out["floor"]["rate"]
    return out


async def behind(root: Path, backlog_alerts: int) -> dict[str, Any]:
    """Time to action on an idle daemon (median of 5), right behind a live flood of unmatched
    alerts, and right after a start with as many unmatched alerts left pending in the journal."""
    alerts = Alerts()
    sink = Sink()
    await sink.start()
    try:
        with server("tailguard", root, sink.url) as srv:
            idle = statistics.median([await sink.time_to_action(srv.port, alerts) for _ in range(5)])
            started = time.monotonic()
            refused = await send_all(srv.port, backlog_alerts // ALERTS_PER_REQUEST, lambda: alerts.body("other"))
            intake_seconds = time.monotonic() - started
            live_pending = srv.pending()
            live = await sink.time_to_action(srv.port, alerts)
        with server("tailguard", root, sink.url, pending=backlog_alerts) as srv:
            restart_pending = srv.pending()
            restart = await sink.time_to_action(srv.port, alerts)
    finally:
        await sink.stop()
    return {"idle": idle, "live": live, "live_pending": live_pending, "restart": restart,
            "restart_pending": restart_pending, "refused": sum(refused.values()), "intake_seconds": intake_seconds}


async def burst(root: Path, burst_alerts: int) -> dict[str, Any]:
    alerts = Alerts()
    sink = Sink()
    await sink.start()
    try:
        with server("tailguard", root, sink.url, cooldown="1h") as srv:
            await asyncio.sleep(1.0)
            idle, _ = srv.rss_mib()
            samples: list[float] = []

            async def sample(stop: asyncio.Event) -> None:
                while not stop.is_set():
                    samples.append(srv.rss_mib()[0])
                    try:
                        await asyncio.wait_for(stop.wait(), 0.05)
                    except TimeoutError:
                        pass

            stop = asyncio.Event()
            sampler = asyncio.create_task(sample(stop))
            started = time.monotonic()
            refused = await send_all(srv.port, burst_alerts // ALERTS_PER_REQUEST, lambda: alerts.body("ranker"))
            seconds = time.monotonic() - started
            await asyncio.sleep(2.0)  # the backlog keeps being worked on
            stop.set()
            await sampler
            rss_end, hwm = srv.rss_mib()
            pending = srv.pending()
    finally:
        await sink.stop()
    return {"idle": idle, "peak": max(samples + [hwm]), "end": rss_end, "ratio": max(samples + [hwm]) / idle,
            "refused": sum(refused.values()), "seconds": seconds, "pending": pending}


JOURNALS = {"sqlite": "SQLite journal", "postgres": "PostgreSQL journal"}


async def main(quick: bool, backends: Sequence[str], pg_fsync: bool) -> None:
    seconds, backlog, burst_size = (1.5, 5_000, 10_000) if quick else (5.0, 50_000, 100_000)
    sqlite_rows = "sqlite" in backends
    with tempfile.TemporaryDirectory(prefix="bench-intake-") as tmp:
        root = Path(tmp)
        print(f"loopback, {CLIENTS} keep-alive clients, {ALERTS_PER_REQUEST} alerts per webhook; "
              f"daemon from {SRC}; journal backends: {', '.join(backends)}\n")
        i = await intake(root, seconds, backends, pg_fsync)
        if sqlite_rows:
            b = await behind(root, backlog)
            m = await burst(root, burst_size)
    print("| measure | tailguard | baseline (same run) | ratio |")
    print("|---|---|---|---|")
    for backend in backends:
        r = i[backend]
        print(f"| intake, {seconds:g} s, 2xx webhooks/s, {JOURNALS[backend]} | {r['rate']:,.0f} "
              f"({r['rate'] * ALERTS_PER_REQUEST:,.0f} alerts/s, {r['errors']} not 2xx) "
              f"| bare aiohttp {i['bare']['rate']:,.0f} | {r['ratio']:.3f} |")
    f = i["floor"]
    print(f"| intake, {seconds:g} s, durable floor (read, decode, group-committed SQLite row per body, 200) "
          f"| {f['rate']:,.0f} ({f['errors']} not 2xx) | bare aiohttp {i['bare']['rate']:,.0f} | {f['ratio']:.3f} |")
    if not sqlite_rows:
        _footer(i, backends)
        return
    print(f"| 2xx to action, right behind {backlog:,} unmatched alerts sent live | {1000 * b['live']:,.1f} ms "
          f"({b['live_pending']:,} of them still pending when it was sent) "
          f"| idle daemon {1000 * b['idle']:,.1f} ms | {b['live'] / b['idle']:.1f} |")
    print(f"| 2xx to action, just after a start with {backlog:,} unmatched pending | {1000 * b['restart']:,.1f} ms "
          f"({b['restart_pending']:,} pending when it was sent) "
          f"| idle daemon {1000 * b['idle']:,.1f} ms | {b['restart'] / b['idle']:.1f} |")
    print(f"| RSS through a {burst_size:,}-alert matching burst | peak {m['peak']:,.0f} MiB, "
          f"end {m['end']:,.0f} MiB ({m['pending']:,} pending in journal) | idle {m['idle']:,.0f} MiB "
          f"| {m['ratio']:.2f} |")
    _footer(i, backends)
    print(f"backlog of {backlog:,} taken in {b['intake_seconds']:.1f} s ({b['refused']} answered 503 and retried); "
          f"burst taken in {m['seconds']:.1f} s ({m['refused']} answered 503 and retried)")


def _footer(i: dict[str, Any], backends: Sequence[str]) -> None:
    print()
    print("tailguard intake / durable floor: " + ", ".join(
        f"{JOURNALS[b]} {i[b]['to_floor']:.3f}" for b in backends))
    if "sqlite" in backends and "postgres" in backends:
        print(f"PostgreSQL journal / SQLite journal intake: {i['postgres']['rate'] / i['sqlite']['rate']:.3f}")
    for backend in backends:
        r = i[backend]
        if r.get("tx_per_webhook") is not None:
            print(f"{JOURNALS[backend]}: write transactions per accepted webhook (the journal's count, "
                  f"marking processed included): {r['tx_per_webhook']:.2f}")
    if "postgres" in backends:
        r = i["postgres"]
        wal = r["pg_wal_commits_per_webhook"]
        print(f"PostgreSQL's own count per accepted webhook, over {r['accepted']:,} webhooks: "
              f"{'?' if wal is None else f'{wal:.2f}'} commit records in the WAL (transactions that wrote), "
              f"{r['pg_commits_per_webhook']:.2f} in pg_stat_database.xact_commit (reads included), "
              f"{r['pg_xids_per_webhook']:.2f} transaction ids (savepoints that wrote included)")
        print(r["pg"])


def _backends(text: str) -> list[str]:
    chosen = [b.strip() for b in text.split(",") if b.strip()]
    unknown = sorted(set(chosen) - set(BACKENDS))
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"choose among {', '.join(BACKENDS)} (comma-separated), not {text!r}")
    return [b for b in BACKENDS if b in chosen]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter run, smaller backlog and burst")
    parser.add_argument("--backends", type=_backends, default=None,
                        help="journal backends for the intake, comma-separated: sqlite,postgres (default: both; "
                             "postgres left out, with a note, where PostgreSQL is not installed). Time to "
                             "action and memory run on sqlite only, when it is chosen")
    parser.add_argument("--pg-fsync", choices=["on", "off"], default="on",
                        help="PostgreSQL with fsync and full_page_writes on (default, as durable as SQLite's "
                             "synchronous=FULL) or off (the tests' settings)")
    sub = parser.add_subparsers(dest="command")
    serve = sub.add_parser("serve", help="(internal) run one server")
    serve.add_argument("kind", choices=["bare", "floor", "tailguard"])
    serve.add_argument("--port", type=int, required=True)
    serve.add_argument("--work", type=Path, required=True)
    serve.add_argument("--sink-url", required=True)
    serve.add_argument("--cooldown", required=True)
    serve.add_argument("--backend", choices=BACKENDS, default="sqlite")
    args = parser.parse_args()
    if args.command == "serve":
        if args.kind == "bare":
            web.run_app(_bare_app(), host=LOOPBACK, port=args.port, print=None, access_log=None)
        elif args.kind == "floor":
            web.run_app(_floor_app(args.work / "floor.db"), host=LOOPBACK, port=args.port, print=None,
                        access_log=None)
        else:
            with _profiled(args.work / "tailguard.prof"):
                asyncio.run(_serve_tailguard(args.port, args.work, args.sink_url, args.cooldown, args.backend))
    else:
        backends = args.backends
        if backends is None:
            backends = list(BACKENDS)
            if not postgres_installed():
                print("PostgreSQL is not installed (make system-deps): intake on the SQLite journal only\n")
                backends.remove("postgres")
        asyncio.run(main(args.quick, backends, args.pg_fsync == "on"))
