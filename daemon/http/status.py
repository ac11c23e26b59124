"""The operator status document (`GET /api/v1/status`, `tailguard status`) and its table.

`build_status` is pure: what the service and its journal hold now in, the document out;
`render_table` turns the document into the readable default of `tailguard status`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from core.timestamps import iso_utc
from daemon.cluster.shard_assignment import shard_of
from daemon.cluster.shard_view import ShardingInputs, sharding_document
from daemon.storage.records import Approval, LatestDecision, Pin
from daemon.workers.approvals import approval_view
from daemon.workers.freezes import FreezeView, freeze_as_dict
from policies.governance import policy_warnings
from policies.evidence_price import policy_prices
from policies.loader import PolicySet


def _iso_or_none(unix: float | None) -> str | None:
    return None if unix is None else iso_utc(unix)


@dataclass(frozen=True)
class StatusInputs:
    """Everything the status document shows, read at `now`."""

    now: float
    replica: str
    leader: bool
    acting: bool
    policies: PolicySet
    policies_loaded: bool
    last_reload_at: float | None
    last_reload_error: str | None
    freezes: FreezeView
    latest: Sequence[LatestDecision] = ()
    guards: Mapping[tuple[str, str], tuple[float | None, int]] = field(default_factory=dict)  # guard_history
    pins: Sequence[Pin] = ()
    approvals: Sequence[Approval] = ()  # pending
    stale_queries: Sequence[Mapping[str, Any]] = ()
    vanished: Sequence[Mapping[str, Any]] = ()  # detector triggers whose answers hold no series of their model
    # (policy, trigger index) -> the last cycle's most telling verdict: what the test assumed
    detectors: Mapping[tuple[str, int], Mapping[str, Any]] = field(default_factory=dict)
    sharding: ShardingInputs | None = None  # sharding.shards > 1: the Leases and the journal's shard terms


def build_status(i: StatusInputs) -> dict[str, Any]:
    """The status document: replica and leadership, policies, freezes, and per target its last
    signal and decision, each policy's cooldown left and actions in its rate window, pin and freeze."""
    latest = {(d.policy, d.target): d for d in i.latest}
    pins = {p.target: p for p in i.pins}
    waiting = {(a.policy, a.target): a for a in i.approvals}
    keys = ({p.target.key for p in i.policies.policies} | set(pins) | set(i.freezes.targets)
            | {d.target for d in i.latest})
    targets = []
    shards = sharding_document(i.sharding, keys, i.now) if i.sharding is not None else None
    for key in sorted(keys):
        rows = []
        for p in (p for p in i.policies.policies if p.target.key == key):
            guards = p.spec.guards
            last, count = i.guards.get((p.name, key), (None, 0))
            decision = latest.get((p.name, key))
            approval = waiting.get((p.name, key))
            rows.append({
                "policy": p.name, "enabled": p.spec.enabled, "approval": p.spec.approval,
                "dryRun": guards.dry_run,
                "lastDecision": _decision(decision) if decision else None,
                "lastActionAt": _iso_or_none(last),
                "cooldownSeconds": guards.cooldown,
                "cooldownLeftSeconds": round(max(0.0, last + guards.cooldown - i.now), 1) if last is not None else 0.0,
                "actionsInWindow": count, "maxActions": guards.max_actions,
                "windowSeconds": guards.max_actions_window,
                "pendingApproval": approval.id if approval else None,
                "detectors": [{"trigger": index, **dict(view)} for (name, index), view in sorted(i.detectors.items())
                              if name == p.name],
                # each tail_excess trigger's evidence and its price at the traffic its last cycle saw
                "evidence": [{"trigger": index, **price.as_dict()}
                             for index, price in policy_prices(p, _seen_traffic(i.detectors, p.name))],
            })
        own = [d for (_, t), d in latest.items() if t == key]
        newest = max(own, key=lambda d: d.id) if own else None
        pin = pins.get(key)
        freeze = i.freezes.targets.get(key)
        targets.append({
            "target": key,
            "lastSignal": {"name": newest.signal_name, "source": newest.signal_source,
                           "at": _iso_or_none(newest.signal_at)} if newest else None,
            "lastDecision": _decision(newest) if newest else None,
            "pin": {"model": pin.model, "version": pin.version, "fromVersion": pin.from_version,
                    "at": _iso_or_none(pin.at), "decision": pin.decision_id, "reason": pin.reason or ""}
            if pin else None,
            "freeze": freeze_as_dict(freeze, i.now) if freeze else None,
            "policies": rows,
            **(_shard_of_target(shards, key) if shards is not None else {}),
        })
    return {
        "replica": i.replica, "role": "leader" if i.leader else "follower", "acting": i.acting,
        "generatedAt": _iso_or_none(i.now),
        "freeze": i.freezes.as_dict(i.now),
        "policies": {"loaded": i.policies_loaded, "count": len(i.policies.policies),
                     "enabled": len(i.policies.enabled), "digest": i.policies.digest,
                     "lastReloadAt": _iso_or_none(i.last_reload_at), "errors": i.last_reload_error,
                     "items": [{"name": p.name, "enabled": p.spec.enabled, "target": p.target.key,
                                "approval": p.spec.approval, "source": p.source,
                                # why its triggers cannot keep its promise (policies.governance)
                                "warnings": policy_warnings(p)} for p in i.policies.policies]},
        "targets": targets,
        "approvals": [approval_view(a, i.now) for a in i.approvals],
        "staleQueries": [dict(q) for q in i.stale_queries],
        "vanishedMetrics": [dict(v) for v in i.vanished],
        "sharding": shards,
    }


def _shard_of_target(shards: Mapping[str, Any], key: str) -> dict[str, Any]:
    """A target's shard and the replica leading it. Its detectors, stale queries and vanished metrics
    are the answering replica's own: shown only where `ledHere`."""
    row = shards["items"][shard_of(key, shards["shards"])]
    return {"shard": row["shard"], "leader": row["leader"], "ledHere": row["ledHere"]}


def _seen_traffic(detectors: Mapping[tuple[str, int], Mapping[str, Any]], policy: str) -> dict[int, float | None]:
    """Requests per second per version each detector trigger of `policy` assumed at its last cycle."""
    out: dict[int, float | None] = {}
    for (name, index), view in detectors.items():
        assumed = view.get("assumed") if name == policy else None
        rps = assumed.get("requests_per_second") if isinstance(assumed, Mapping) else None
        out[index] = float(rps) if isinstance(rps, (int, float)) and rps > 0 else None
    return out


def _decision(d: LatestDecision) -> dict[str, Any]:
    return {"id": d.id, "policy": d.policy, "state": d.state, "reason": d.reason, "at": _iso_or_none(d.at)}


def _short(text: str, limit: int) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[:limit - 3] + "..."


def _duration(seconds: float) -> str:
    s = int(round(seconds))
    if s <= 0:
        return "-"
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    return (f"{h}h" if h else "") + (f"{m}m" if m else "") + (f"{sec}s" if sec and not h else "") or "0s"


def _freeze_text(f: Mapping[str, Any] | None) -> str:
    if not f:
        return "-"
    until = f" until {f['until']}" if f.get("until") else ""
    return _short(f"frozen{until}: {f['reason']}", 60)


def render_table(doc: Mapping[str, Any]) -> str:
    """The readable form of a status document."""
    pol = doc["policies"]
    freeze = doc["freeze"]
    lines = [f"tailguard {doc['replica']}: {doc['role']}{' (acting)' if doc['acting'] else ' (not acting)'}"
             f" at {doc['generatedAt']}",
             f"policies: {pol['count']} loaded ({pol['enabled']} enabled), last reload {pol['lastReloadAt'] or 'never'}"
             f", errors: {_short(pol['errors'], 100) if pol['errors'] else 'none'}"]
    lines.extend(f"warning: {item['name']}: {w}" for item in pol.get("items", []) for w in item.get("warnings", []))
    if freeze["config"]:
        lines.append("freeze: DAEMON FROZEN by config (freeze: true)")
    elif freeze["daemon"]:
        lines.append(f"freeze: DAEMON {_freeze_text(freeze['daemon'])}")
    else:
        lines.append("freeze: daemon not frozen")
    header = ("TARGET", "POLICY", "LAST SIGNAL", "LAST DECISION", "COOLDOWN", "ACTIONS", "PIN", "FREEZE")
    rows: list[tuple[str, ...]] = []
    for t in doc["targets"]:
        pin = t["pin"]
        pin_text = (f"v{pin['version']}" + (f" (from v{pin['fromVersion']})" if pin.get("fromVersion") else "")
                    if pin else "-")
        signal = t["lastSignal"]
        signal_text = f"{signal['source']}/{signal['name']} {signal['at']}" if signal else "-"
        for n, p in enumerate(t["policies"] or [None]):
            if p is None:
                rows.append((t["target"], "-", signal_text, "-", "-", "-", pin_text, _freeze_text(t["freeze"])))
                continue
            d = p["lastDecision"]
            decision = f"#{d['id']} {d['state']}: {_short(d['reason'], 48)}" if d else "-"
            if p["pendingApproval"]:
                decision = f"awaiting approval {p['pendingApproval']}; " + decision
            actions = f"{p['actionsInWindow']}/{p['maxActions']} per {_duration(p['windowSeconds'])}"
            name = p["policy"] + ("" if p["enabled"] else " (disabled)")
            first = n == 0
            rows.append((t["target"] if first else "", name, signal_text if first else "", decision,
                         _duration(p["cooldownLeftSeconds"]), actions, pin_text if first else "",
                         _freeze_text(t["freeze"]) if first else ""))
    widths = [max(len(r[c]) for r in (header, *rows)) for c in range(len(header))]
    lines.append("")
    for r in (header, *rows):
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip())
    lines.extend(_shard_lines(doc.get("sharding")))
    detectors = [(t["target"], p["policy"], d) for t in doc["targets"] for p in t["policies"]
                 for d in p.get("detectors", [])]
    if detectors:
        lines.append("")
        lines.append("detectors (the last cycle's most telling verdict, with what the test assumed):")
        for target, policy, d in detectors:
            lines.append(f"  {target} {policy} trigger {d['trigger']} {d['detector']} {d['series']}: "
                         f"{_short(d['reason'], 160)}")
    prices = [(t["target"], p["policy"], e) for t in doc["targets"] for p in t["policies"]
              for e in p.get("evidence", [])]
    if prices:
        lines.append("")
        lines.append("evidence (what each trigger's evidence costs, at the traffic its last cycle saw):")
        for target, policy, e in prices:
            lines.append(f"  {target} {policy} trigger {e['trigger']}: {e['evidence']}; {e['cost']}")
            lines.extend(f"    note: {note}" for note in e.get("notes", []))
    if doc["approvals"]:
        lines.append("")
        lines.append("pending approvals:")
        for a in doc["approvals"]:
            lines.append(f"  {a['id']}: {a['policy']} on {a['target']} (decision {a['decision']}), "
                         f"deadline {a['deadline']}: tailguard approve {a['id']} --reason ...")
    stale = doc["staleQueries"]
    lines.append("")
    lines.append("stale queries: " + ("none" if not stale else "; ".join(
        _short(f"{q.get('query')} ({q.get('error')})", 240) for q in stale)))  # room for the why
    vanished = doc.get("vanishedMetrics") or []
    if vanished:  # only then: a steady table keeps its shape
        lines.append("no data (not watched): " + "; ".join(
            f"{v.get('policy')} trigger {v.get('trigger')} since {v.get('since')}" for v in vanished))
    return "\n".join(lines) + "\n"


def _shard_lines(sharding: Mapping[str, Any] | None) -> list[str]:
    """The shards table: each shard's leader (or since when it has none), term and targets."""
    if not sharding:
        return []
    lines = ["", f"shards: {sharding['shards']} across {len(sharding['replicas'])} replicas "
                 f"({', '.join(sharding['replicas']) or 'none'}), leases as seen at {sharding['leasesSeenAt'] or 'never'}"]
    if sharding.get("termsError"):
        lines.append(f"shard terms unreadable: {_short(sharding['termsError'], 160)}")
    rows = [("SHARD", "LEADER", "TERM", "TARGETS")]
    for r in sharding["items"]:
        if r["leader"] is None:
            since = f" since {r['leaderlessSince']}" if r["leaderlessSince"] else " (never led)"
            last = f", last {r['lastLeader']}" if r["lastLeader"] else ""
            leader = f"NO LEADER{since}{last}"
        else:
            leader = r["leader"] + (" (taking its term)" if r["state"] == "taking" else "")
        shown = r["targets"][:3]
        more = f" (+{len(r['targets']) - len(shown)})" if len(r["targets"]) > len(shown) else ""
        rows.append((str(r["shard"]), leader, "-" if r["term"] is None else str(r["term"]),
                     f"{len(r['targets'])}: {', '.join(shown)}{more}" if shown else "0"))
    widths = [max(len(r[c]) for r in rows) for c in range(4)]
    lines.extend("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows)
    lines.extend(f"fleet-wide query, fetched whole here (not narrowed to these shards): {_short(q['query'], 120)} "
                 f"({', '.join(q['policies'][:3])}{' ...' if len(q['policies']) > 3 else ''})"
                 for q in sharding.get("fleetWideQueries", []))
    return lines
