"""A real PostgreSQL for the tests: the Debian package's binaries, a cluster made by initdb in a
temp dir, served on a free loopback port (its Unix socket in the temp dir), stopped by PID at the
end of the session. Each test gets a fresh database copied from a migrated template.

PostgreSQL refuses to run as root: as root the cluster belongs to the `postgres` user the package
creates (else `nobody`), and the server runs as that user."""
from __future__ import annotations

import glob
import itertools
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from lab.ports import free_port

TEMPLATE = "journal_template"
_names = itertools.count()


def postgres_bin() -> Path | None:
    """The newest /usr/lib/postgresql/<version>/bin holding initdb and postgres, if installed."""
    found = [Path(p).parent for p in glob.glob("/usr/lib/postgresql/*/bin/initdb")
             if (Path(p).parent / "postgres").exists()]
    if not found:
        return None

    def version(d: Path) -> tuple[int, ...]:
        return tuple(int(x) for x in d.parent.name.split(".") if x.isdigit())

    return max(found, key=version)


@dataclass
class PostgresServer:
    """A running cluster on loopback; `superuser` may create databases."""

    port: int
    superuser: str
    process: subprocess.Popen[bytes]
    root: Path

    def dsn(self, database: str = "postgres") -> str:
        return f"postgresql://{self.superuser}@127.0.0.1:{self.port}/{database}"

    def sql(self, statement: str, database: str = "postgres") -> None:
        """Run one statement outside a transaction (CREATE/DROP DATABASE need that)."""
        import psycopg

        with psycopg.connect(self.dsn(database), autocommit=True) as conn:
            conn.execute(statement.encode())

    def create_database(self, template: str = "template0") -> str:
        """A new empty database copied from `template`; its DSN."""
        name = f"t{os.getpid()}_{next(_names)}"
        self.sql(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
        return self.dsn(name)

    def drop_database(self, dsn: str) -> None:
        self.sql(f'DROP DATABASE IF EXISTS "{dsn.rsplit("/", 1)[1]}" WITH (FORCE)')


def _run_as() -> tuple[int, int] | None:
    """The (uid, gid) to run the server as: None when not root."""
    if os.geteuid() != 0:
        return None
    for user in ("postgres", "nobody"):
        try:
            entry = pwd.getpwnam(user)
        except KeyError:
            continue
        return entry.pw_uid, entry.pw_gid
    raise RuntimeError("running as root and neither a postgres nor a nobody user exists")


def _ready(server: PostgresServer, log: Path, deadline: float) -> None:
    """Wait (bounded) until the server accepts a connection; fail with its log if it exits first."""
    import psycopg

    while True:
        if server.process.poll() is not None:
            raise RuntimeError(f"postgres exited with {server.process.returncode}:\n{log.read_text(errors='replace')}")
        try:
            psycopg.connect(server.dsn(), connect_timeout=2).close()
            return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"postgres not ready:\n{log.read_text(errors='replace')}") from None
            time.sleep(0.05)


def start_postgres(root: Path, attempts: int = 3) -> PostgresServer:
    """initdb into `root`/data and start the server on a free loopback port (retrying a port that
    another process took between our probe and the server's bind)."""
    bin_dir = postgres_bin()
    if bin_dir is None:
        raise FileNotFoundError("PostgreSQL is not installed (make system-deps: apt-get install postgresql)")
    ids = _run_as()
    user_args: dict[str, object] = {} if ids is None else {"user": ids[0], "group": ids[1], "extra_groups": []}
    if ids is not None:
        os.chown(root, *ids)
    data, sockets, log = root / "data", root / "sockets", root / "postgres.log"
    sockets.mkdir()
    if ids is not None:
        os.chown(sockets, *ids)
    subprocess.run([str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8",
                    "--locale=C", "--no-sync"], check=True, capture_output=True, cwd=root, **user_args)  # type: ignore[call-overload]
    for attempt in range(attempts):
        port = free_port()
        with open(log, "ab") as out:
            # fsync off: tests never cut the power, and it keeps CREATE DATABASE fast.
            process = subprocess.Popen(
                [str(bin_dir / "postgres"), "-D", str(data), "-p", str(port), "-h", "127.0.0.1", "-k", str(sockets),
                 "-c", "fsync=off", "-c", "full_page_writes=off", "-c", "max_connections=200"],
                stdout=out, stderr=subprocess.STDOUT, cwd=root, **user_args)  # type: ignore[call-overload]
        server = PostgresServer(port, "postgres", process, root)
        try:
            _ready(server, log, time.monotonic() + 30)
            return server
        except RuntimeError:
            stop_postgres(server)
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


def stop_postgres(server: PostgresServer) -> None:
    """Fast shutdown by PID (SIGINT), then SIGKILL if it does not stop in time."""
    if server.process.poll() is None:
        server.process.send_signal(signal.SIGINT)
        try:
            server.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait(timeout=10)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """The session's PostgreSQL, with a migrated journal template; skipped where PostgreSQL is not
    installed, except in CI (CI=true), where that is a failure."""
    if postgres_bin() is None:
        message = "PostgreSQL is not installed (make system-deps)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    from daemon.storage.journal import Journal

    root = Path(tempfile.mkdtemp(prefix="tailguard-pg-"))
    server = start_postgres(root)
    try:
        server.sql(f'CREATE DATABASE "{TEMPLATE}" TEMPLATE template0')
        Journal(server.dsn(TEMPLATE)).close()  # migrated once; each test copies it
        yield server
    finally:
        stop_postgres(server)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def postgres_dsn(postgres_server: PostgresServer) -> Iterator[str]:
    """A fresh database (the journal schema already applied) for one test; dropped after it."""
    dsn = postgres_server.create_database(TEMPLATE)
    yield dsn
    postgres_server.drop_database(dsn)


@pytest.fixture
def empty_postgres_dsn(postgres_server: PostgresServer) -> Iterator[str]:
    """A fresh database without any table (migrations from nothing)."""
    dsn = postgres_server.create_database()
    yield dsn
    postgres_server.drop_database(dsn)
