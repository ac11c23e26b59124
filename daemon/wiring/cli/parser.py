"""The `tailguard` command: run the daemon, validate policies, export the schema, read the journal,
show the leader's status, freeze and unfreeze the daemon or a target, approve a plan, end a pin,
list, mark and clear known-bad versions.

Operator commands with `--url` call the running daemon's API (a token from --token-file or
TAILGUARD_API_TOKEN); unfreeze, unpin and bad-versions without it work on the journal file the
settings name (on the pod itself)."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Sequence

from daemon.wiring.cli import journal_commands, operator_verbs, policy_commands
from daemon.wiring.cli.records import CommandFailed
from daemon.wiring.cli.run import run

DEFAULT_URL = "http://127.0.0.1:8080"


def main(argv: Sequence[str] | None = None) -> int:
    """Parse `argv` (default: the process's arguments) and run the subcommand's handler; its exit code."""
    words = list(sys.argv[1:] if argv is None else argv)
    if words[:2] == ["journal", "migrate"]:  # a subcommand of `journal` beside its optional SOURCE
        words[:2] = ["journal-migrate"]
    if words[:2] == ["bad-versions", "mark"]:  # a subcommand of `bad-versions` beside its TARGET
        words[:2] = ["bad-versions-mark"]
    args = build_parser().parse_args(words)
    try:
        code: int = args.handler(args)
    except CommandFailed as exc:
        print(exc.line, file=sys.stderr)
        return exc.exit_code
    return code


def build_parser() -> argparse.ArgumentParser:
    """Every subcommand with its flags, and the handler that runs it (`args.handler(args)`)."""
    parser = argparse.ArgumentParser(prog="tailguard", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    run_ = sub.add_parser("run", help="run the daemon")
    run_.add_argument("--config", type=Path, help="settings YAML (defaults apply when omitted)")
    run_.set_defaults(handler=run)

    val = sub.add_parser("validate", help="check policies; exit 1 with readable errors")
    val.add_argument("path", type=Path, help="a policy YAML file or a directory of them")
    val.set_defaults(handler=policy_commands.validate)

    sim = sub.add_parser("simulate", help="print what the daemon would do with an Alertmanager payload; "
                                          "observes targets read-only, applies nothing")
    sim.add_argument("payload", type=Path, help="an Alertmanager webhook body (JSON file)")
    sim.add_argument("--config", type=Path, help="settings YAML (policies, journal, Prometheus, Kubernetes)")
    sim.set_defaults(handler=policy_commands.simulate)

    sub.add_parser("schema", help="print the policy JSON Schema").set_defaults(handler=policy_commands.schema)

    jr = sub.add_parser("journal", help="print the journal's decisions and steps as JSON lines; "
                                        "`journal migrate --to postgresql://...` copies it into PostgreSQL")
    jr.add_argument("source", nargs="?", help="a journal SQLite file or postgresql:// DSN "
                                              "(omitted: the one --config names)")
    jr.add_argument("--config", type=Path, help="settings YAML naming the journal (journal.backend, path, dsn)")
    jr.set_defaults(handler=journal_commands.show)

    jm = sub.add_parser("journal-migrate", help="copy a journal into an empty PostgreSQL database "
                                                "(also spelled `journal migrate`)")
    jm.add_argument("source", nargs="?", help="a journal SQLite file (omitted: the one --config names)")
    jm.add_argument("--config", type=Path, help="settings YAML naming the journal to copy")
    jm.add_argument("--to", required=True, help="postgresql:// DSN of the empty database to copy into")
    jm.set_defaults(handler=journal_commands.migrate)

    st = sub.add_parser("status", help="the leader's state: policies, targets (last signal and decision, "
                                       "cooldown, actions, pin, freeze), approvals, stale queries; sharded, "
                                       "every shard with the replica leading it, asked of any replica")
    _api_arguments(st)
    st.add_argument("--json", action="store_true", help="print the JSON document instead of the table")
    st.set_defaults(handler=operator_verbs.status)

    frz = sub.add_parser("freeze", help="freeze the whole daemon, or one target (journaled with who and why)")
    frz.add_argument("target", nargs="?", help="namespace/model (a bare model means default/model); "
                                               "omitted: the whole daemon")
    frz.add_argument("--reason", required=True, help="recorded with the freeze")
    frz.add_argument("--for", dest="duration", help="how long (30m, 2h); omitted: until unfrozen")
    frz.add_argument("--config", type=Path, help="without --url: settings YAML naming the journal to write")
    _api_arguments(frz, url_default=None)
    frz.set_defaults(handler=operator_verbs.freeze)

    apr = sub.add_parser("approve", help="approve a plan waiting for approval (journaled with the token's name)")
    apr.add_argument("approval", type=int, help="the approval's id (in the notification and in status)")
    apr.add_argument("--reason", default="approved with tailguard approve", help="recorded with the approval")
    _api_arguments(apr)
    apr.set_defaults(handler=operator_verbs.approve)

    unf = sub.add_parser("unfreeze", help="lift the freeze on a target, or on the whole daemon (journaled)")
    unf.add_argument("target", nargs="?", help="the target: namespace/model (a bare model means default/model); "
                                               "omitted: the whole daemon")
    unf.add_argument("--config", type=Path, help="without --url: settings YAML (names the journal)")
    unf.add_argument("--reason", default="lifted by tailguard unfreeze", help="recorded with the lift")
    _api_arguments(unf, url_default=None)
    unf.set_defaults(handler=operator_verbs.unfreeze)

    unp = sub.add_parser("unpin", help="end the rollback pin of a target (journaled); the reconciler "
                                       "stops re-applying it")
    unp.add_argument("target", help="the target: namespace/model (a bare model means default/model)")
    unp.add_argument("--config", type=Path, help="without --url: settings YAML (names the journal)")
    unp.add_argument("--reason", default="ended by tailguard unpin", help="recorded with the end")
    _api_arguments(unp, url_default=None)
    unp.set_defaults(handler=operator_verbs.unpin)

    bad = sub.add_parser("bad-versions", help="list the versions of a target marked bad (rolled back from), "
                                              "which `to: previous` skips; --clear VERSION clears a mark")
    bad.add_argument("target", help="the target: namespace/model (a bare model means default/model)")
    bad.add_argument("--config", type=Path, help="without --url: settings YAML (names the journal)")
    bad.add_argument("--clear", type=int, metavar="VERSION", help="clear the mark on VERSION (journaled)")
    bad.add_argument("--reason", default="cleared by tailguard bad-versions", help="recorded with --clear")
    _api_arguments(bad, url_default=None)
    bad.set_defaults(handler=operator_verbs.bad_versions)

    bm = sub.add_parser("bad-versions-mark", help="mark a version of a target bad (also spelled `bad-versions "
                                                  "mark`): `to: previous` skips it, `to: N` refuses it (journaled)")
    bm.add_argument("target", help="the target: namespace/model (a bare model means default/model); through the "
                                   "API it must be one a policy names")
    bm.add_argument("version", type=int, help="the version to mark bad")
    bm.add_argument("--reason", required=True, help="why it is bad (recorded with the mark and who made it)")
    bm.add_argument("--config", type=Path, help="without --url: settings YAML (names the journal)")
    _api_arguments(bm, url_default=None)
    bm.set_defaults(handler=operator_verbs.mark_bad_version)

    bt = sub.add_parser("backtest", help="replay a range of Prometheus history through the policies: when each "
                                         "signal would have fired and each plan would have run; applies nothing")
    bt.add_argument("--config", type=Path, help="settings YAML (policies, prometheus.url)")
    bt.add_argument("--from", dest="start", required=True, help="ISO 8601 (2026-11-29T17:00:00Z), unix seconds, "
                                                                "or now-2h")
    bt.add_argument("--to", dest="end", default="now", help="as --from (default: now)")
    bt.add_argument("--step", help="one poll cycle every STEP (15s, 1m); default: each trigger's interval")
    bt.add_argument("--report", type=Path, help="write the report here (HTML, and its PNG beside it)")
    bt.add_argument("--json", action="store_true", help="one JSON line per signal and decision")
    bt.set_defaults(handler=policy_commands.backtest)
    return parser


def _api_arguments(parser: argparse.ArgumentParser, url_default: str | None = DEFAULT_URL) -> None:
    """--url, --token-file and --cacert: which daemon the operator verbs call, and how."""
    parser.add_argument("--url", default=os.environ.get("TAILGUARD_URL", url_default) if url_default else None,
                        help="the daemon's API (env TAILGUARD_URL" + (f", default {url_default})" if url_default else ")"))
    parser.add_argument("--token-file", type=Path, help="a file holding an API token (else env TAILGUARD_API_TOKEN)")
    parser.add_argument("--cacert", type=Path, default=os.environ.get("TAILGUARD_API_CACERT") or None,
                        help="CA bundle (PEM) to verify the daemon's TLS certificate (env TAILGUARD_API_CACERT; "
                             "default: the system's CAs)")
