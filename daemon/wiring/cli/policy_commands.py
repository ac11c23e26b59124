"""The commands that read policies and apply nothing: `validate`, `schema`, `simulate` (what the
daemon would do with one Alertmanager payload) and `backtest` (a range of Prometheus history)."""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

from daemon.common.config import ConfigError, load_settings
from daemon.common.logs import configure_logging
from daemon.wiring.registries import action_registry, detector_registry
from policies.schema import Trigger


def validate(args: argparse.Namespace) -> int:
    from policies.governance import policy_warnings
    from policies.loader import PolicyLoadError, load_policies
    from policies.evidence_price import price_lines
    from policies.planning import recovery_warning

    try:
        policies = load_policies(args.path, action_registry(), detector_registry())
    except PolicyLoadError as exc:
        for err in exc.errors:
            print(f"error: {err}", file=sys.stderr)
        print(f"{len(exc.errors)} error(s)", file=sys.stderr)
        return 1
    for p in policies.policies:
        triggers = ", ".join(_describe(t) for t in p.spec.triggers if (t.alert or t.detector or t.schedule))
        print(f"ok: {p.name}: target {p.target.key}; triggers: {triggers}; actions: "
              f"{', '.join(a.kind for a in p.actions)}{' (dry run)' if p.spec.guards.dry_run else ''}")
        for line in price_lines(p):  # what each trigger's evidence costs (policies/evidence_price.py)
            print(f"  {line}")
        warning = recovery_warning(p)
        if warning is not None:
            print(f"warning: {p.name}: {warning}; add a verify block")
        for promise in policy_warnings(p):  # triggers that cannot keep the policy's promise
            print(f"warning: {p.name}: {promise}")
    return 0


def _describe(trigger: Trigger) -> str:
    if trigger.alert is not None:
        return f"alert {trigger.alert.name}"
    if trigger.detector is not None:
        return f"detector {trigger.detector.type}"
    assert trigger.schedule is not None  # the schema requires exactly one kind of trigger
    return f"every {trigger.schedule.every:g}s"


def schema(args: argparse.Namespace) -> int:
    from policies.json_schema import policy_json_schema

    print(json.dumps(policy_json_schema(action_registry(), detector_registry()), indent=2))
    return 0


def simulate(args: argparse.Namespace) -> int:
    from daemon.http.intake import PayloadError
    from daemon.wiring.simulate import simulate, summary
    from policies.loader import PolicyLoadError

    try:
        settings = load_settings(args.config)
        configure_logging("console", "warning")
        results = asyncio.run(simulate(settings, args.payload, action_registry(), detector_registry()))
    except (ConfigError, PolicyLoadError, PayloadError, OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(results, indent=2))
    print(summary(results), file=sys.stderr)
    return 0


def backtest(args: argparse.Namespace) -> int:
    """Exit 0 with the replay printed; 2 for bad arguments or settings; 1 when it cannot run."""
    from core.durations import parse_duration
    from daemon.wiring.backtest import BacktestError, backtest, json_records, parse_time, text_lines, write_report
    from policies.loader import PolicyLoadError, load_policies

    try:
        settings = load_settings(args.config)
        now = time.time()
        span = (parse_time(args.start, now), parse_time(args.end, now))
        every = parse_duration(args.step) if args.step else None
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
    if args.json:
        for record in json_records(result):
            print(json.dumps(record, default=str))
    else:
        print("\n".join(text_lines(result)))
    if args.report is not None:
        written = write_report(result, args.report)
        print(f"report: {', '.join(map(str, written))}", file=sys.stderr if args.json else sys.stdout)
    return 0
