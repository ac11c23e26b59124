"""`tailguard journal [SOURCE]`: the journal's decisions and steps as JSON lines; `journal migrate
--to DSN` (also spelled `journal-migrate`): the journal copied into an empty PostgreSQL database."""
from __future__ import annotations

import argparse
import json

from daemon.wiring.cli.records import CommandFailed
from daemon.wiring.cli.stores import existing_store, is_dsn, open_journal


def show(args: argparse.Namespace) -> int:
    with open_journal(existing_store(args.config, args.source)) as journal:
        for d in journal.decisions.all():
            print(json.dumps({"decision": d.id, "policy": d.policy, "target": d.target, "state": d.state,
                              "reason": d.reason, "plan": d.plan,
                              "steps": [{"action": s.action, "phase": s.phase, "status": s.status,
                                         "message": s.message} for s in journal.decisions.steps(d.id)]}))
    return 0


def migrate(args: argparse.Namespace) -> int:
    from daemon.storage.copy import copy_journal

    source = existing_store(args.config, args.source)
    if not is_dsn(args.to):
        raise CommandFailed("error: --to takes a postgresql:// DSN", 2)
    with open_journal(source) as src, open_journal(args.to) as dst:
        counts = copy_journal(src, dst)
        print(json.dumps({"from": src.describe(), "to": dst.describe(), "rows": counts}))
    return 0
