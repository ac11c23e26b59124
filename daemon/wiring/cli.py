"""The `tailguard` command: run the daemon, validate policies, export the schema, read the journal,
show the leader's status, freeze and unfreeze the daemon or a target, approve a plan, end a pin,
list and clear known-bad versions.

Operator commands with `--url` call the running daemon's API (a token from --token-file or
TAILGUARD_API_TOKEN); unfreeze, unpin and bad-versions without it work on the journal file the
settings name (on the pod itself)."""
from __future__ import annotations

import argparse
import asyncio
import getpass
import http.client
import json
import os
import signal as os_signal
import ssl
import urllib.error
import urllib.parse
import urllib.request
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import structlog

from daemon.common.config import ConfigError, load_settings
from daemon.common.heap import freeze_startup_heap
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
    jr = sub.add_parser("journal", help="print the journal's decisions and steps as JSON lines; "
                                        "`journal migrate --to postgresql://...` copies it into PostgreSQL")
    jr.add_argument("source", nargs="?", help="a journal SQLite file or postgresql:// DSN "
                                              "(omitted: the one --config names)")
    jr.add_argument("--config", type=Path, help="settings YAML naming the journal (journal.backend, path, dsn)")
    jm = sub.add_parser("journal-migrate", help="copy a journal into an empty PostgreSQL database "
                                                "(also spelled `journal migrate`)")
    jm.add_argument("source", nargs="?", help="a journal SQLite file (omitted: the one --config names)")
    jm.add_argument("--config", type=Path, help="settings YAML naming the journal to copy")
    jm.add_argument("--to", required=True, help="postgresql:// DSN of the empty database to copy into")
    st = sub.add_parser("status", help="the leader's state: policies, targets (last signal and decision, "
                                       "cooldown, actions, pin, freeze), approvals, stale queries")
    _api_arguments(st)
    st.add_argument("--json", action="store_true", help="print the JSON document instead of the table")
    frz = sub.add_parser("freeze", help="freeze the whole daemon, or one target (journaled with who and why)")
    frz.add_argument("target", nargs="?", help="namespace/model (a bare model means default/model); "
                                               "omitted: the whole daemon")
    frz.add_argument("--reason", required=True, help="recorded with the freeze")
    frz.add_argument("--for", dest="duration", help="how long (30m, 2h); omitted: until unfrozen")
    frz.add_argument("--config", type=Path, help="without --url: settings YAML naming the journal to write")
    _api_arguments(frz, url_default=None)
    apr = sub.add_parser("approve", help="approve a plan waiting for approval (journaled with the token's name)")
    apr.add_argument("approval", type=int, help="the approval's id (in the notification and in status)")
    apr.add_argument("--reason", default="approved with tailguard approve", help="recorded with the approval")
    _api_arguments(apr)
    unf = sub.add_parser("unfreeze", help="lift the freeze on a target, or on the whole daemon (journaled)")
    unf.add_argument("target", nargs="?", help="the target: namespace/model (a bare model means default/model); "
                                               "omitted: the whole daemon")
    unf.add_argument("--config", type=Path, help="without --url: settings YAML (names the journal)")
    unf.add_argument("--reason", default="lifted by tailguard unfreeze", help="recorded with the lift")
    _api_arguments(unf, url_default=None)
    unp = sub.add_parser("unpin", help="end the rollback pin of a target (journaled); the reconciler "
                                       "stops re-applying it")
    unp.add_argument("target", help="the target: namespace/model (a bare model means default/model)")
    unp.add_argument("--config", type=Path, help="without --url: settings YAML (names the journal)")
    unp.add_argument("--reason", default="ended by tailguard unpin", help="recorded with the end")
    _api_arguments(unp, url_default=None)
    bad = sub.add_parser("bad-versions", help="list the versions of a target marked bad (rolled back from), "
                                              "which `to: previous` skips; --clear VERSION clears a mark")
    bad.add_argument("target", help="the target: namespace/model (a bare model means default/model)")
    bad.add_argument("--config", type=Path, help="without --url: settings YAML (names the journal)")
    bad.add_argument("--clear", type=int, metavar="VERSION", help="clear the mark on VERSION (journaled)")
    bad.add_argument("--reason", default="cleared by tailguard bad-versions", help="recorded with --clear")
    _api_arguments(bad, url_default=None)
    bt = sub.add_parser("backtest", help="replay a range of Prometheus history through the policies: when each "
                                         "signal would have fired and each plan would have run; applies nothing")
    bt.add_argument("--config", type=Path, help="settings YAML (policies, prometheus.url)")
    bt.add_argument("--from", dest="start", required=True, help="ISO 8601 (2026-11-29T17:00:00Z), unix seconds, "
                                                                "or now-2h")
    bt.add_argument("--to", dest="end", default="now", help="as --from (default: now)")
    bt.add_argument("--step", help="one poll cycle every STEP (15s, 1m); default: each trigger's interval")
    bt.add_argument("--report", type=Path, help="write the report here (HTML, and its PNG beside it)")
    bt.add_argument("--json", action="store_true", help="one JSON line per signal and decision")
    words = list(sys.argv[1:] if argv is None else argv)
    if words[:2] == ["journal", "migrate"]:  # a subcommand of `journal` beside its optional SOURCE
        words[:2] = ["journal-migrate"]
    args = parser.parse_args(words)
    if args.command == "backtest":
        return _backtest(args.config, args.start, args.end, args.step, args.report, args.json)
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
        return _journal_command(args.source, args.config, None)
    if args.command == "journal-migrate":
        return _journal_command(args.source, args.config, args.to)
    if args.command == "status":
        return _status(_api_from(args), args.json)
    if args.command == "freeze":
        return _freeze(args.config, _api_from(args), args.target, args.reason, args.duration)
    if args.command == "approve":
        return _approve(_api_from(args), args.approval, args.reason)
    if args.command == "unfreeze":
        api = _api_from(args)
        if api is not None:
            return _unfreeze_api(api, args.target, args.reason)
        return _unfreeze(args.config, args.target, args.reason)
    if args.command == "unpin":
        api = _api_from(args)
        if api is not None:
            return _unpin_api(api, args.target, args.reason)
        return _unpin(args.config, args.target, args.reason)
    if args.command == "bad-versions":
        api = _api_from(args)
        if api is not None:
            return _bad_versions_api(api, args.target, args.clear, args.reason)
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
    from daemon.wiring.simulate import simulate, summary
    from policies.loader import PolicyLoadError

    try:
        settings = load_settings(config)
        configure_logging("console", "warning")
        results = asyncio.run(simulate(settings, payload, action_registry(), detector_registry()))
    except (ConfigError, PolicyLoadError, PayloadError, OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(results, indent=2))
    print(summary(results), file=sys.stderr)
    return 0


def _journal_command(given: str | None, config: Path | None, to: str | None) -> int:
    """`journal [SOURCE]` prints it; with `to` (journal migrate --to DSN) it is copied there."""
    return _on_existing_store(config, given, _journal if to is None else lambda source: _migrate_journal(source, to))


def _migrate_journal(source: Path | str, to: str) -> int:
    from daemon.storage.copy import copy_journal

    if not to.startswith(("postgres://", "postgresql://")):
        print("error: --to takes a postgresql:// DSN", file=sys.stderr)
        return 2

    def copy(src: "Journal", dst: "Journal") -> int:
        counts = copy_journal(src, dst)
        print(json.dumps({"from": src.describe(), "to": dst.describe(), "rows": counts}))
        return 0

    return _on_journal(source, lambda src: _on_journal(to, lambda dst: copy(src, dst)))


def _journal(store: Path | str) -> int:
    def show(journal: "Journal") -> int:
        for d in journal.decisions():
            print(json.dumps({"decision": d.id, "policy": d.policy, "target": d.target, "state": d.state,
                              "reason": d.reason, "plan": d.plan,
                              "steps": [{k: s[k] for k in ("action", "phase", "status", "message")}
                                        for s in journal.steps(d.id)]}))
        return 0

    return _on_journal(store, show)


def _target_key(target: str) -> str:
    """A target as operators write it: `namespace/model`, or a bare model in `default`."""
    return target if "/" in target else f"default/{target}"


def _with_journal(config: Path | None, command: Callable[["Journal"], int]) -> int:
    """Run an operator command on the journal the settings name: exit 2 for bad settings, 1 for
    a missing or failing journal, else the command's own code. The journal is always closed."""
    return _on_existing_store(config, None, lambda store: _on_journal(store, command))


def _on_existing_store(config: Path | None, given: str | None, run: Callable[[Path | str], int]) -> int:
    """`run` on the journal `given` names (a file or a DSN), else the one the settings name: exit 2
    for bad settings, 1 for a journal file that does not exist, else `run`'s own code."""
    from daemon.common.config import journal_store

    try:
        store: Path | str = journal_store(load_settings(config).journal) if given is None else (
            given if given.startswith(("postgres://", "postgresql://")) else Path(given))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if isinstance(store, Path) and not store.exists():
        print(f"error: no journal at {store}", file=sys.stderr)
        return 1
    return run(store)


def _on_journal(store: Path | str, command: Callable[["Journal"], int]) -> int:
    """Open the journal at `store`, run `command` on it and close it: exit 1 with one line for a
    journal that cannot be opened or fails, else the command's own code."""
    from daemon.storage.journal import Journal, JournalError

    try:
        journal = Journal(store)
    except JournalError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    try:
        return command(journal)
    except JournalError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        journal.close()


def _unfreeze(config: Path | None, target: str | None, reason: str) -> int:
    from daemon.storage.journal import DAEMON_SCOPE
    from daemon.workers.freezes import held_by_configmap

    key = _target_key(target) if target is not None else DAEMON_SCOPE
    by = _local_user()

    def command(journal: "Journal") -> int:
        held = [f for f in journal.active_freezes() if f.target == key and held_by_configmap(f)]
        if held:
            print(f"{key} is frozen by the control ConfigMap ({held[0].reason}); clear it there", file=sys.stderr)
            return 1
        lifted = journal.lift_freezes(key, reason, by=by)  # who in lifted_by; the reason as given
        if not lifted:
            active = sorted({f.target for f in journal.freezes() if f.lifted_at is None and f.until > time.time()})
            print(f"no freeze in force on {key} (frozen now: {', '.join(active) or 'none'})", file=sys.stderr)
            return 1
        for f in lifted:
            print(f"unfrozen: {f.target} (freeze {f.id} of decision {f.decision_id}: {f.reason})")
        return 0

    return _with_journal(config, command)


def _local_user() -> str:
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no user name in this environment (a container's numeric uid)
        return f"uid-{os.getuid()}"


def _freeze(config: Path | None, api: "_Api | None", target: str | None, reason: str, duration: str | None) -> int:
    from core.durations import parse_duration
    from daemon.storage.journal import DAEMON_SCOPE, FOREVER

    try:
        seconds = parse_duration(duration) if duration is not None else None
    except ValueError as exc:
        print(f"error: --for: {exc}", file=sys.stderr)
        return 2
    if api is not None:
        body: dict[str, Any] = {"reason": reason}
        if target is not None:
            body["target"] = target
        if seconds is not None:
            body["durationSeconds"] = seconds
        code, doc = api.call("POST", "/api/v1/freeze", body)
        if not 200 <= code < 300:  # 0: not reached
            return _refused(code, doc)
        frozen = doc["frozen"]
        print(f"frozen: {'the daemon' if frozen['scope'] == DAEMON_SCOPE else frozen['scope']}"
              f"{' until ' + frozen['until'] if frozen.get('until') else ''}: {frozen['reason']}")
        return 0
    key = _target_key(target) if target is not None else DAEMON_SCOPE
    by = _local_user()

    def command(journal: "Journal") -> int:
        until = FOREVER if seconds is None else time.time() + seconds
        journal.record_freeze(key, f"{reason} (by {by} via cli)", until, by=by, source="cli")
        print(f"frozen: {'the daemon' if key == DAEMON_SCOPE else key}: {reason} (by {by} via cli)")
        return 0

    return _with_journal(config, command)


def _unfreeze_api(api: "_Api", target: str | None, reason: str) -> int:
    body: dict[str, Any] = {"reason": reason}
    if target is not None:
        body["target"] = target
    code, doc = api.call("POST", "/api/v1/unfreeze", body)
    if not 200 <= code < 300:  # 0: not reached
        return _refused(code, doc)
    for f in doc["lifted"]:
        print(f"unfrozen: {'the daemon' if f['scope'] == '*' else f['scope']} (freeze {f['id']}: {f['reason']})")
    return 0


def _status(api: "_Api | None", as_json: bool) -> int:
    from daemon.http.status import render_table

    assert api is not None  # status always has a URL (default or given)
    code, doc = api.call("GET", "/api/v1/status")
    if not 200 <= code < 300:  # 0: not reached
        return _refused(code, doc)
    print(json.dumps(doc, indent=2) if as_json else render_table(doc), end="\n" if as_json else "")
    return 0


def _approve(api: "_Api | None", approval: int, reason: str) -> int:
    assert api is not None
    code, doc = api.call("POST", f"/api/v1/approvals/{approval}/approve", {"reason": reason})
    if not 200 <= code < 300:  # 0: not reached
        return _refused(code, doc)
    print(doc["message"])
    return 0


def _refused(code: int, doc: dict[str, Any]) -> int:
    """One line on stderr, exit 1: the HTTP status and the reason (no status: not reached)."""
    print(f"error: {f'{code}: ' if code else ''}{doc.get('error') or doc}", file=sys.stderr)
    return 1


DEFAULT_URL = "http://127.0.0.1:8080"


def _api_arguments(parser: argparse.ArgumentParser, url_default: str | None = DEFAULT_URL) -> None:
    parser.add_argument("--url", default=os.environ.get("TAILGUARD_URL", url_default) if url_default else None,
                        help="the daemon's API (env TAILGUARD_URL" + (f", default {url_default})" if url_default else ")"))
    parser.add_argument("--token-file", type=Path, help="a file holding an API token (else env TAILGUARD_API_TOKEN)")
    parser.add_argument("--cacert", type=Path, default=os.environ.get("TAILGUARD_API_CACERT") or None,
                        help="CA bundle (PEM) to verify the daemon's TLS certificate (env TAILGUARD_API_CACERT; "
                             "default: the system's CAs)")


class _Api:
    """A minimal client of the operator API (blocking; one request per call)."""

    def __init__(self, url: str, token: str | None, cacert: Path | None) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.context = ssl.create_default_context(cafile=str(cacert)) if cacert else None

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
        """(HTTP status, JSON body); a network failure is (0, {"error": ...})."""
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Accept": "application/json", **({"Content-Type": "application/json"} if data else {})}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        request = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=30, context=self.context) as resp:
                return resp.status, json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as exc:
            try:
                return exc.code, json.loads(exc.read() or b"{}")
            except ValueError:
                return exc.code, {"error": exc.reason}
        except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as exc:
            return 0, {"error": f"cannot reach {self.url}: {getattr(exc, 'reason', exc)}"}


def _api_from(args: argparse.Namespace) -> "_Api | None":
    if not args.url:
        return None
    token = os.environ.get("TAILGUARD_API_TOKEN")
    if args.token_file is not None:
        try:
            token = args.token_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise SystemExit(f"error: --token-file: {exc}")
    try:
        return _Api(args.url, token, args.cacert)
    except (OSError, ssl.SSLError) as exc:  # a missing or unreadable file, not PEM
        raise SystemExit(f"error: --cacert {args.cacert}: {exc}")


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


def _unpin_api(api: "_Api", target: str, reason: str) -> int:
    code, doc = api.call("POST", "/api/v1/unpin", {"target": target, "reason": reason})
    if not 200 <= code < 300:  # 0: not reached
        return _refused(code, doc)
    ended = doc["unpinned"]
    print(f"unpinned: {ended['target']} (was pinned to version {ended['version']}"
          + (f" from {ended['fromVersion']}" if ended.get("fromVersion") is not None else "")
          + (f" by decision {ended['decision']}" if ended.get("decision") is not None else "") + ")")
    return 0


def _bad_versions_api(api: "_Api", target: str, clear: int | None, reason: str) -> int:
    if clear is not None:
        code, doc = api.call("POST", "/api/v1/bad-versions/clear", {"target": target, "version": clear, "reason": reason})
        if not 200 <= code < 300:  # 0: not reached
            return _refused(code, doc)
        print(f"cleared: version {doc['cleared']['version']} of {doc['cleared']['target']}")
        return 0
    code, doc = api.call("GET", "/api/v1/bad-versions?" + urllib.parse.urlencode({"target": target}))
    if not 200 <= code < 300:
        return _refused(code, doc)
    for mark in doc["badVersions"]:
        print(json.dumps({"target": doc["target"], "version": mark["version"], "reason": mark["reason"],
                          "decision": mark["decision"], "at": mark["at"]}))
    return 0


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


def _backtest(config: Path | None, start: str, end: str, step: str | None, report: Path | None,
              as_json: bool) -> int:
    """Exit 0 with the replay printed; 2 for bad arguments or settings; 1 when it cannot run."""
    from core.durations import parse_duration
    from daemon.wiring.backtest import BacktestError, backtest, json_records, parse_time, text_lines, write_report
    from policies.loader import PolicyLoadError, load_policies

    try:
        settings = load_settings(config)
        now = time.time()
        span = (parse_time(start, now), parse_time(end, now))
        every = parse_duration(step) if step else None
    except (ConfigError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    configure_logging("console", "warning")
    try:
        policies = load_policies(settings.policies.path, action_registry(), detector_registry())
        result = asyncio.run(backtest(settings, policies, detector_registry(), span[0], span[1], every))
    except (PolicyLoadError, BacktestError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if as_json:
        for record in json_records(result):
            print(json.dumps(record, default=str))
    else:
        print("\n".join(text_lines(result)))
    if report is not None:
        written = write_report(result, report)
        print(f"report: {', '.join(map(str, written))}", file=sys.stderr if as_json else sys.stdout)
    return 0


def _run(config: Path | None) -> int:
    try:
        settings = load_settings(config)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log.format, settings.log.level)
    from daemon.storage.journal import JournalError

    try:
        asyncio.run(_serve(settings))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except JournalError as exc:  # the journal cannot be opened (database unreachable, newer schema)
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


async def _serve(settings) -> None:  # type: ignore[no-untyped-def]
    from daemon.wiring.service import Service

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (os_signal.SIGINT, os_signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    service = Service(settings, action_registry(), detector_registry())
    async with service:
        freeze_startup_heap()
        await stop.wait()
        structlog.get_logger("tailguard").info("shutting down")


if __name__ == "__main__":
    raise SystemExit(main())
