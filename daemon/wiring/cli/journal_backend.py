"""The operator backend on the pod itself: the journal (SQLite file or PostgreSQL) the settings
name, opened for each call and closed after it. Who acts is the OS user; the running daemon reads
what is written here at its next decision. Status and approve need the running daemon: refused."""
from __future__ import annotations

import getpass
import os
import time
from pathlib import Path

from daemon.storage.records import DAEMON_SCOPE, FOREVER
from daemon.wiring.cli.records import (Approved, BadVersion, Cleared, CommandFailed, Frozen, Lifted, Marked,
                                       Status, Unpinned)
from daemon.wiring.cli.stores import settings_journal


def target_key(target: str) -> str:
    """A target as operators write it: `namespace/model`, or a bare model in `default`."""
    return target if "/" in target else f"default/{target}"


def local_user() -> str:
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no user name in this environment (a container's numeric uid)
        return f"uid-{os.getuid()}"


class JournalBackend:
    """The operator calls on the journal the settings at `config` name (None: the defaults')."""

    def __init__(self, config: Path | None) -> None:
        self._config = config

    def freeze(self, target: str | None, reason: str, seconds: float | None) -> Frozen:
        from daemon.workers.freezes import freeze_as_dict

        key = target_key(target) if target is not None else DAEMON_SCOPE
        by = local_user()
        with settings_journal(self._config) as journal:
            until = FOREVER if seconds is None else time.time() + seconds
            freeze_id = journal.freezes.record(key, f"{reason} (by {by} via cli)", until, by=by, source="cli")
            (freeze,) = [f for f in journal.freezes.all(key) if f.id == freeze_id]
            return Frozen.from_view(freeze_as_dict(freeze, time.time()))

    def unfreeze(self, target: str | None, reason: str) -> list[Lifted]:
        from daemon.workers.freezes import freeze_as_dict, held_by_configmap

        key = target_key(target) if target is not None else DAEMON_SCOPE
        by = local_user()
        with settings_journal(self._config) as journal:
            held = [f for f in journal.freezes.active() if f.target == key and held_by_configmap(f)]
            if held:
                raise CommandFailed(f"{key} is frozen by the control ConfigMap ({held[0].reason}); clear it there")
            lifted = journal.freezes.lift(key, reason, by=by)  # who in lifted_by; the reason as given
            if not lifted:
                active = sorted({f.target for f in journal.freezes.all()
                                 if f.lifted_at is None and f.until > time.time()})
                raise CommandFailed(f"no freeze in force on {key} (frozen now: {', '.join(active) or 'none'})")
            now = time.time()
            return [Lifted.from_view(freeze_as_dict(f, now)) for f in lifted]

    def unpin(self, target: str, reason: str) -> Unpinned:
        key = target_key(target)
        with settings_journal(self._config) as journal:
            ended = journal.pins.end(key, reason)
            if ended is None:
                pinned = sorted(p["target"] for p in journal.pins.live())
                raise CommandFailed(f"no pin on {key} (pinned now: {', '.join(pinned) or 'none'})")
        return Unpinned(target=key, version=ended["version"], from_version=ended["from_version"],
                        decision=ended["decision_id"])

    def bad_versions(self, target: str) -> list[BadVersion]:
        key = target_key(target)
        with settings_journal(self._config) as journal:
            marks = journal.bad_versions.of(key)
        return [BadVersion(target=key, version=m["version"], reason=m["reason"], decision=m["decision_id"],
                           at=m["at"]) for m in marks]

    def mark_bad_version(self, target: str, version: int, reason: str) -> Marked:
        key = target_key(target)
        journaled = f"{reason} (by {local_user()} via cli)"
        with settings_journal(self._config) as journal:
            if not journal.bad_versions.mark(key, version, journaled):
                raise CommandFailed(f"error: version {version} of {key} is already marked bad")
        return Marked(target=key, version=version, reason=journaled)

    def clear_bad_version(self, target: str, version: int, reason: str) -> Cleared:
        key = target_key(target)
        with settings_journal(self._config) as journal:
            if not journal.bad_versions.clear(key, version, reason):
                raise CommandFailed(f"version {version} of {key} is not marked bad")
        return Cleared(target=key, version=version)

    def status(self) -> Status:
        raise CommandFailed(_needs_the_api("status"))

    def approve(self, approval: int, reason: str) -> Approved:
        raise CommandFailed(_needs_the_api("approve"))


def _needs_the_api(verb: str) -> str:
    return f"error: {verb} asks the running daemon: give its API with --url (or TAILGUARD_URL)"
