"""The journal's seams (issue 43): the repositories reach the core only through its public face,
nothing outside the core touches its private members, and `joined` runs a check inside the
caller's own transaction (its writes roll back with it) or in one of its own."""
from __future__ import annotations

import ast
import threading
from pathlib import Path

import pytest

from daemon.storage.backend import Backend
from daemon.storage.core import JournalCore
from daemon.storage.errors import JournalError
from daemon.storage.journal import Journal

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("core", "daemon", "policies", "detectors", "actions")
# What JournalCore keeps to itself: its attributes and methods that begin with one underscore.
PRIVATE = frozenset(name for name in vars(JournalCore) if name.startswith("_") and not name.startswith("__")) | {
    "_db", "_lock", "_fence", "_lock_timeout", "_failing_since", "_last_error", "_writing_since", "_last_ok",
    "_stalled_after", "_tx_thread"}


def _private_uses(path: Path) -> list[str]:
    """`x._name` for a core private `_name` where `x` is not `self` (other classes' own members of
    those names: a backend's sqlite3 connection, the cluster state's read)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr in PRIVATE:
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue  # the module's own members
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_nothing_but_the_core_touches_its_private_members():
    assert {"_tx", "_db", "_opening"} <= PRIVATE  # what the repositories used to reach for
    offenders = []
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.relative_to(ROOT) != Path("daemon/storage/core.py"):
                offenders += _private_uses(path)
    assert offenders == []


def test_the_repositories_hold_the_core_and_use_its_public_face(tmp_path: Path):
    j = Journal(tmp_path / "j.db")
    try:
        for name, repository in vars(j).items():
            if getattr(repository, "_core", None) is not None:
                assert repository._core is j, name
        assert j.write(lambda db: db.execute("SELECT 1 AS one").fetchone()["one"]) == 1
        assert [dict(r) for r in j.read("SELECT COUNT(*) AS n FROM signals")] == [{"n": 0}]
        assert "?" in j.sql.json_ids and j.sql.json_text("plan", "k")
    finally:
        j.close()


def test_joined_runs_inside_the_caller_s_transaction_or_in_its_own(tmp_path: Path):
    j = Journal(tmp_path / "j.db")
    try:
        def insert(db: Backend) -> None:
            db.execute("INSERT INTO pins(target, model, version, at) VALUES ('ns/a', 'a', 1, 1.0)")

        def then_fail(db: Backend) -> None:
            j.joined(insert)  # the same transaction: it rolls back with the caller's
            raise RuntimeError("the caller's write fails")

        with pytest.raises(JournalError, match="the caller's write fails"):
            j.write(then_fail)
        assert j.pins.live() == []
        commits = j.commits
        j.joined(insert)  # no transaction in progress: one of its own, committed
        assert [p.target for p in j.pins.live()] == ["ns/a"] and j.commits == commits + 1

        # Another thread's transaction in progress is not this thread's: it waits for its own.
        inside, release, order = threading.Event(), threading.Event(), []

        def hold(db: Backend) -> None:
            inside.set()
            release.wait(10)
            order.append("holder")

        holder = threading.Thread(target=lambda: j.write(hold))
        holder.start()
        assert inside.wait(10)
        joiner = threading.Thread(target=lambda: (j.joined(lambda db: None), order.append("joined")))
        joiner.start()
        joiner.join(0.2)
        assert order == []
        release.set()
        holder.join(10)
        joiner.join(10)
        assert order == ["holder", "joined"]
    finally:
        j.close()
