"""One printer per operator verb: the lines a record becomes on stdout, whichever backend gave it."""
from __future__ import annotations

import json

from daemon.storage.records import DAEMON_SCOPE
from daemon.wiring.cli.records import Approved, BadVersion, Cleared, Frozen, Lifted, Marked, Status, Unpinned


def _scope(scope: str) -> str:
    return "the daemon" if scope == DAEMON_SCOPE else scope


def frozen(record: Frozen) -> str:
    return f"frozen: {_scope(record.scope)}{' until ' + record.until if record.until else ''}: {record.reason}"


def unfrozen(record: Lifted) -> str:
    of = f" of decision {record.decision}" if record.decision is not None else ""
    return f"unfrozen: {_scope(record.scope)} (freeze {record.id}{of}: {record.reason})"


def unpinned(record: Unpinned) -> str:
    return (f"unpinned: {record.target} (was pinned to version {record.version}"
            + (f" from {record.from_version}" if record.from_version is not None else "")
            + (f" by decision {record.decision}" if record.decision is not None else "") + ")")


def bad_version(record: BadVersion) -> str:
    """One JSON line per mark."""
    return json.dumps({"target": record.target, "version": record.version, "reason": record.reason,
                       "decision": record.decision, "at": record.at})


def cleared(record: Cleared) -> str:
    return f"cleared: version {record.version} of {record.target}"


def marked(record: Marked) -> str:
    return f"marked bad: version {record.version} of {record.target}: {record.reason}"


def status(record: Status, as_json: bool) -> str:
    """The document as indented JSON, or the table (which ends with its own newline)."""
    from daemon.http.status import render_table

    return json.dumps(record.document, indent=2) + "\n" if as_json else render_table(record.document)


def approved(record: Approved) -> str:
    return record.message
