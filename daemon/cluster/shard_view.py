"""Every shard with the replica that leads it, for the status document: a pure merge of the shard
Leases (as this replica last saw them), the journal's shard terms and the targets the policies name.

Any replica can answer: the Leases are listed by every replica each round, and the terms sit in
the shared journal, so the merge is the same fleet-wide picture wherever it is asked.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from core.promql import render_query
from core.timestamps import iso_utc
from daemon.cluster.query_narrowing import narrowable
from daemon.cluster.shard_assignment import shard_of
from daemon.storage.records import Term
from policies.loader import LoadedPolicy, PolicySet


@dataclass(frozen=True)
class LeaseSeen:
    """One shard Lease as this replica last saw it written: its holder (None once handed back), when
    (Unix time, from the local observation, as the manager decides expiry) and its duration."""

    holder: str | None
    written_at: float
    duration: float


@dataclass(frozen=True)
class ShardingInputs:
    """What the shard rows are merged from, read at one time."""

    shards: int
    members: tuple[str, ...] = ()  # live members as this replica counts them
    led_here: tuple[int, ...] = ()
    leases: Mapping[int, LeaseSeen] = field(default_factory=dict)
    leases_seen_at: float | None = None  # Unix time of the last successful listing; None: never
    terms: Mapping[int, Term] = field(default_factory=dict)
    terms_error: str | None = None  # the journal's terms could not be read
    fleet_wide: tuple[Mapping[str, Any], ...] = ()  # fleet_wide_queries of the policies led here


def _iso(unix: float | None) -> str | None:
    return None if unix is None else iso_utc(unix)


def leader_of(lease: LeaseSeen | None, now: float) -> str | None:
    """The holder of a Lease still within its duration; None when handed back, expired or absent."""
    if lease is None or lease.holder is None or now >= lease.written_at + lease.duration:
        return None
    return lease.holder


def leaderless_since(lease: LeaseSeen | None) -> float | None:
    """When a shard without a leader lost it: handed back, when it was; expired, at the end of its
    duration; never created, None."""
    if lease is None:
        return None
    return lease.written_at if lease.holder is None else lease.written_at + lease.duration


def shard_rows(i: ShardingInputs, targets: Iterable[str], now: float) -> list[dict[str, Any]]:
    """One row per shard (0 .. shards-1): its leader and term, its state, and the targets it owns.

    state: `led` (a live holder with the journal's current term), `taking` (a live holder whose term
    is not yet the journal's: it does not write until it takes it), `leaderless` (no live holder;
    `leaderlessSince` says since when, None for a shard never led), `unknown` (a live holder, the
    journal's terms unreadable)."""
    owned: dict[int, list[str]] = {s: [] for s in range(i.shards)}
    for key in sorted(set(targets)):
        owned[shard_of(key, i.shards)].append(key)
    rows = []
    for s in range(i.shards):
        lease = i.leases.get(s)
        leader = leader_of(lease, now)
        term = i.terms.get(s)
        state = ("leaderless" if leader is None else "unknown" if i.terms_error is not None
                 else "led" if term is not None and term.holder == leader else "taking")
        rows.append({
            "shard": s, "leader": leader, "state": state,
            "term": term.term if term else None, "termHolder": term.holder if term else None,
            "termSince": _iso(term.since) if term else None,
            "leaseRenewedAt": _iso(lease.written_at) if lease and lease.holder else None,
            "leaderlessSince": _iso(leaderless_since(lease)) if leader is None else None,
            # whoever held it last (the expired Lease's holder, else the journal's term), for the operator
            "lastLeader": None if leader is not None else (lease.holder if lease and lease.holder else
                                                           term.holder if term else None),
            "ledHere": s in i.led_here,
            "targets": owned[s],
        })
    return rows


def sharding_document(i: ShardingInputs, targets: Iterable[str], now: float) -> dict[str, Any]:
    """The status document's `sharding` section."""
    return {"shards": i.shards, "replicas": sorted(i.members), "ledHere": sorted(i.led_here),
            "leasesSeenAt": _iso(i.leases_seen_at), "termsError": i.terms_error,
            "items": shard_rows(i, targets, now), "fleetWideQueries": [dict(q) for q in i.fleet_wide]}


def fleet_wide_triggers(policy: LoadedPolicy) -> list[tuple[int, str]]:
    """The Prometheus detector queries of `policy` (trigger index, query) that are fetched whole by
    every replica leading a policy that shares them: they name no target ($model, $namespace: then
    their own label matcher narrows them) and are not a plain selector the poller narrows to the
    led models (daemon/cluster/query_narrowing.py). PromQL has no hash function to cut them by shard."""
    values = {"model": policy.target.model, "namespace": policy.target.namespace}
    out = []
    for bound in policy.detectors:
        for query in (bound.trigger.query, bound.trigger.companion_query):
            if (query and bound.trigger.source == "prometheus" and render_query(query, values) == query
                    and not narrowable(query, bound.trigger.model_label)):
                out.append((bound.index, query))
    return out


def fleet_wide_queries(policies: PolicySet, led: Callable[[str], bool]) -> list[dict[str, Any]]:
    """Per fleet-wide query of the enabled policies whose target is led here (`led(target key)`): the
    query and those policies, each with the trigger."""
    found: dict[str, list[str]] = {}
    for p in policies.enabled:
        if led(p.target.key):
            for index, query in fleet_wide_triggers(p):
                found.setdefault(query, []).append(f"{p.name} trigger {index}")
    return [{"query": q, "policies": sorted(set(names))} for q, names in sorted(found.items())]
