"""Copy one journal into another (`tailguard journal migrate`): every table, ids kept, in one
transaction on the target, so a SQLite journal moves to PostgreSQL with its history, pins,
freezes and approvals, and dedup keeps holding for the signals it already had."""
from __future__ import annotations

from daemon.storage.backend import Backend
from daemon.storage.errors import JournalError
from daemon.storage.journal import Journal

# Parents before children (foreign keys); schema_migrations is each journal's own.
TABLES = ("signals", "decisions", "steps", "approvals", "evaluations", "pins", "pin_history", "bad_versions",
          "guard_marks", "freezes", "leadership", "effects", "version_starts", "shard_terms")
_CHUNK = 5_000  # rows per executemany: bounded memory on the target side


def copy_journal(source: Journal, target: Journal) -> dict[str, int]:
    """Copy every row of `source` into `target`, which must hold no rows yet. Returns rows per table.

    Raises:
        JournalError: the target is not empty, or a row could not be written (nothing was).
    """
    counts: dict[str, int] = {}

    def run(db: Backend) -> dict[str, int]:
        for table in TABLES:
            if db.execute(f"SELECT 1 FROM {table} LIMIT 1").fetchone() is not None:
                raise JournalError(f"the target journal is not empty ({table} has rows); migrate into a new database")
        for table in TABLES:
            rows = source.read(f"SELECT * FROM {table}")
            counts[table] = len(rows)
            if not rows:
                continue
            columns = list(rows[0].keys())
            sql = (f"INSERT INTO {table}({', '.join(_quoted(c) for c in columns)})"
                   f" VALUES ({', '.join('?' for _ in columns)})")
            values = [tuple(r[c] for c in columns) for r in rows]
            for i in range(0, len(values), _CHUNK):
                db.executemany(sql, values[i:i + _CHUNK])
        reset = getattr(db, "reset_sequences", None)
        if reset is not None:  # PostgreSQL: new rows get ids after the copied ones
            reset()
        return counts

    copied = target.write(run)
    target.signals.refresh_pending()  # the copied pending signals count for backpressure
    return copied


def _quoted(column: str) -> str:
    return '"' + column.replace('"', '""') + '"'
