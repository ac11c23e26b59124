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

    def named_target(self, target: str) -> str:
        """The key of `target` when a policy names it (as the API's freeze and mark ask): an unknown
        scope is refused before anything is stored, never journaled as a freeze that guards nothing.

        Raises:
            CommandFailed: (exit 2) not namespace/model, no policy names it, or the policies do not load.
        """
        from daemon.common.config import ConfigError, load_settings
        from daemon.wiring.registries import action_registry, detector_registry
        from daemon.workers.freezes import target_key as checked_key
        from policies.loader import PolicyLoadError, load_policies

        try:
            key = checked_key(target)
            policies = load_policies(load_settings(self._config).policies.path, action_registry(), detector_registry())
        except (ValueError, ConfigError) as exc:
            raise CommandFailed(f"error: target: {exc}", 2) from None
        except PolicyLoadError as exc:  # cannot tell what is known: refuse (freezing the daemon needs no target)
            raise CommandFailed(f"error: cannot read the policies to check the target: {exc}", 2) from None
        known = {p.target.key for p in policies.policies}
        if key not in known:
            raise CommandFailed(f"error: target: no policy names {key} (known: {', '.join(sorted(known)) or 'none'})", 2)
        return key

    def freeze(self, target: str | None, reason: str, seconds: float | None) -> Frozen:
        from daemon.workers.freezes import freeze_as_dict

        key = self.named_target(target) if target is not None else DAEMON_SCOPE
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
                pinned = sorted(p.target for p in journal.pins.live())
                raise CommandFailed(f"no pin on {key} (pinned now: {', '.join(pinned) or 'none'})")
        return Unpinned(target=key, version=ended.version, from_version=ended.from_version,
                        decision=ended.decision_id)

    def bad_versions(self, target: str) -> list[BadVersion]:
        key = target_key(target)
        with settings_journal(self._config) as journal:
            marks = journal.bad_versions.of(key)
        return [BadVersion(target=key, version=m.version, reason=m.reason, decision=m.decision_id, at=m.at)
                for m in marks]

    def mark_bad_version(self, target: str, version: int, reason: str) -> Marked:
        key = self.named_target(target)
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
