"""The `tailguard` command: run the daemon, validate policies, export the schema, read the journal,
lift a target's freeze, end a pin, list and clear known-bad versions."""
from __future__ import annotations

import argparse
import asyncio
import json
import signal as os_signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import structlog

from daemon.common.config import ConfigError, load_settings
from daemon.common.logs import configure_logging
from daemon.wiring.registries import action_registry, detector_registry
from policies.schema import Trigger

if TYPE_CHECKING:
    from daemon.storage.journal import Journal


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tailguard", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the daemon")
    run.add_argument("--config", type=Path, help="settings YAML (defaults apply when omitted)")
    val = sub.add_parser("validate", help="check policies; exit 1 with readable errors")
    val.add_argument("path", type=Path, help="a policy YAML file or a directory of them")
    sim = sub.add_parser("simulate", help="print what the daemon would do with an Alertmanager payload; "
                                          "observes targets read-only, applies nothing")
    sim.add_argument("payload", type=Path, help="an Alertmanager webhook body (JSON file)")
    sim.add_argument("--config", type=Path, help="settings YAML (policies, journal, Prometheus, Kubernetes)")
    sub.add_parser("schema", help="print the policy JSON Schema")
    jr = sub.add_parser("journal", help="print the journal's decisions and steps as JSON lines")
    jr.add_argument("path", type=Path, help="journal SQLite file")
    unf = sub.add_parser("unfreeze", help="lift the freeze an escalation put on a target (journaled)")
    unf.add_argument("target", help="the target: namespace/model (a bare model means default/model)")
    unf.add_argument("--config", type=Path, help="settings YAML (names the journal)")
    unf.add_argument("--reason", default="lifted by tailguard unfreeze", help="recorded with the lift")
    unp = sub.add_parser("unpin", help="end the rollback pin of a target (journaled); the reconciler "
                                       "stops re-applying it")
    unp.add_argument("target", help="the target: namespace/model (a bare model means default/model)")
    unp.add_argument("--config", type=Path, help="settings YAML (names the journal)")
    unp.add_argument("--reason", default="ended by tailguard unpin", help="recorded with the end")
    bad = sub.add_parser("bad-versions", help="list the versions of a target marked bad (rolled back from), "
                                              "which `to: previous` skips; --clear VERSION clears a mark")
    bad.add_argument("target", help="the target: namespace/model (a bare model means default/model)")
    bad.add_argument("--config", type=Path, help="settings YAML (names the journal)")
    bad.add_argument("--clear", type=int, metavar="VERSION", help="clear the mark on VERSION (journaled)")
    bad.add_argument("--reason", default="cleared by tailguard bad-versions", help="recorded with --clear")
    args = parser.parse_args(argv)
    if args.command == "run":
        return _run(args.config)
    if args.command == "validate":
        return _validate(args.path)
    if args.command == "simulate":
        return _simulate(args.config, args.payload)
    if args.command == "schema":
        from policies.json_schema import policy_json_schema

        print(json.dumps(policy_json_schema(action_registry(), detector_registry()), indent=2))
        return 0
    if args.command == "journal":
        return _journal(args.path)
    if args.command == "unfreeze":
        return _unfreeze(args.config, args.target, args.reason)
    if args.command == "unpin":
        return _unpin(args.config, args.target, args.reason)
    if args.command == "bad-versions":
        return _bad_versions(args.config, args.target, args.clear, args.reason)
    return 2


def _validate(path: Path) -> int:
    from policies.loader import PolicyLoadError, load_policies
    from policies.planning import recovery_warning

    try:
        policies = load_policies(path, action_registry(), detector_registry())
    except PolicyLoadError as exc:
        for err in exc.errors:
            print(f"error: {err}", file=sys.stderr)
        print(f"{len(exc.errors)} error(s)", file=sys.stderr)
        return 1
    for p in policies.policies:
        triggers = ", ".join(_describe(t) for t in p.spec.triggers if (t.alert or t.detector or t.schedule))
        print(f"ok: {p.name}: target {p.target.key}; triggers: {triggers}; actions: "
              f"{', '.join(a.kind for a in p.actions)}{' (dry run)' if p.spec.guards.dry_run else ''}")
        warning = recovery_warning(p)
        if warning is not None:
            print(f"warning: {p.name}: {warning}; add a verify block")
    return 0


def _describe(trigger: Trigger) -> str:
    if trigger.alert is not None:
        return f"alert {trigger.alert.name}"
    if trigger.detector is not None:
        return f"detector {trigger.detector.type}"
    assert trigger.schedule is not None  # the schema requires exactly one kind of trigger
    return f"every {trigger.schedule.every:g}s"


def _simulate(config: Path | None, payload: Path) -> int:
    from daemon.http.intake import PayloadError
    from daemon.wiring.simulate import simulate
    from policies.loader import PolicyLoadError

    try:
        settings = load_settings(config)
        configure_logging("console", "warning")
        results = asyncio.run(simulate(settings, payload, action_registry(), detector_registry()))
    except (ConfigError, PolicyLoadError, PayloadError, OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(results, indent=2))
    return 0


def _journal(path: Path) -> int:
    from daemon.storage.journal import Journal

    if not path.exists():
        print(f"error: no journal at {path}", file=sys.stderr)
        return 1
    journal = Journal(path)
    try:
        for d in journal.decisions():
            print(json.dumps({"decision": d.id, "policy": d.policy, "target": d.target, "state": d.state,
                              "reason": d.reason, "plan": d.plan,
                              "steps": [{k: s[k] for k in ("action", "phase", "status", "message")}
                                        for s in journal.steps(d.id)]}))
    finally:
        journal.close()
    return 0


def _target_key(target: str) -> str:
    """A target as operators write it: `namespace/model`, or a bare model in `default`."""
    return target if "/" in target else f"default/{target}"


def _with_journal(config: Path | None, command: Callable[["Journal"], int]) -> int:
    """Run an operator command on the journal the settings name: exit 2 for bad settings, 1 for
    a missing or failing journal, else the command's own code. The journal is always closed."""
    from daemon.storage.journal import Journal, JournalError

    try:
        settings = load_settings(config)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not settings.journal.path.exists():
        print(f"error: no journal at {settings.journal.path}", file=sys.stderr)
        return 1
    journal = Journal(settings.journal.path)
    try:
        return command(journal)
    except JournalError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        journal.close()


def _unfreeze(config: Path | None, target: str, reason: str) -> int:
    key = _target_key(target)

    def command(journal: "Journal") -> int:
        lifted = journal.lift_freezes(key, reason)
        if not lifted:
            active = sorted({f.target for f in journal.freezes() if f.lifted_at is None and f.until > time.time()})
            print(f"no freeze in force on {key} (frozen now: {', '.join(active) or 'none'})", file=sys.stderr)
            return 1
        for f in lifted:
            print(f"unfrozen: {f.target} (freeze {f.id} of decision {f.decision_id}: {f.reason})")
        return 0

    return _with_journal(config, command)


def _unpin(config: Path | None, target: str, reason: str) -> int:
    key = _target_key(target)

    def command(journal: "Journal") -> int:
        ended = journal.end_pin(key, reason)
        if ended is None:
            pinned = sorted(p["target"] for p in journal.pins())
            print(f"no pin on {key} (pinned now: {', '.join(pinned) or 'none'})", file=sys.stderr)
            return 1
        print(f"unpinned: {key} (was pinned to version {ended['version']}"
              + (f" from {ended['from_version']}" if ended["from_version"] is not None else "")
              + (f" by decision {ended['decision_id']}" if ended["decision_id"] is not None else "") + ")")
        return 0

    return _with_journal(config, command)


def _bad_versions(config: Path | None, target: str, clear: int | None, reason: str) -> int:
    key = _target_key(target)

    def command(journal: "Journal") -> int:
        if clear is not None:
            if not journal.clear_bad(key, clear, reason):
                print(f"version {clear} of {key} is not marked bad", file=sys.stderr)
                return 1
            print(f"cleared: version {clear} of {key}")
            return 0
        for mark in journal.bad_versions(key):
            print(json.dumps({"target": key, "version": mark["version"], "reason": mark["reason"],
                              "decision": mark["decision_id"], "at": mark["at"]}))
        return 0

    return _with_journal(config, command)


def _run(config: Path | None) -> int:
    try:
        settings = load_settings(config)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log.format, settings.log.level)
    try:
        asyncio.run(_serve(settings))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


async def _serve(settings) -> None:  # type: ignore[no-untyped-def]
    from daemon.wiring.service import Service

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (os_signal.SIGINT, os_signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    service = Service(settings, action_registry(), detector_registry())
    async with service:
        await stop.wait()
        structlog.get_logger("tailguard").info("shutting down")


if __name__ == "__main__":
    raise SystemExit(main())
