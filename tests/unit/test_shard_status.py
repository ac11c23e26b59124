"""`tailguard status` with sharding on: every shard merged with the replica that leads it, as a pure
function of the shard Leases (as seen), the journal's shard terms and the targets
(daemon/cluster/shard_view.py), and its place in the status document and table (daemon/http/status.py)."""
from __future__ import annotations

from typing import Any

from core.timestamps import iso_utc
from daemon.cluster.shard_assignment import shard_of
from daemon.cluster.shard_view import LeaseSeen, ShardingInputs, shard_rows
from daemon.http.status import StatusInputs, build_status, render_table
from daemon.storage.records import Pin, Term
from daemon.workers.freezes import FreezeView
from policies.loader import PolicySet

NOW = 1_800_000_000.0
TARGETS = [f"default/m{i}" for i in range(20)]


def _inputs() -> ShardingInputs:
    """Five shards: led (a), being taken (b holds the Lease, the journal's term is still a's), expired
    under b five seconds ago, handed back three seconds ago, never created."""
    return ShardingInputs(
        shards=5, members=("tailguard-b", "tailguard-a"), led_here=(0,),
        leases={0: LeaseSeen("tailguard-a", NOW - 1, 15), 1: LeaseSeen("tailguard-b", NOW - 2, 15),
                2: LeaseSeen("tailguard-b", NOW - 20, 15), 3: LeaseSeen(None, NOW - 3, 1)},
        leases_seen_at=NOW - 0.5,
        terms={0: Term(4, "tailguard-a", NOW - 100), 1: Term(2, "tailguard-a", NOW - 200),
               2: Term(7, "tailguard-b", NOW - 300), 3: Term(1, "tailguard-a", NOW - 400)})


def test_each_shard_is_shown_with_its_leader_term_and_state() -> None:
    rows = {r["shard"]: r for r in shard_rows(_inputs(), TARGETS, NOW)}
    assert sorted(rows) == [0, 1, 2, 3, 4]
    assert (rows[0]["leader"], rows[0]["state"], rows[0]["term"], rows[0]["ledHere"]) == ("tailguard-a", "led", 4, True)
    assert rows[0]["leaseRenewedAt"] == iso_utc(NOW - 1) and rows[0]["leaderlessSince"] is None
    # a live holder whose term the journal has not handed it yet: it writes nothing until then
    assert (rows[1]["leader"], rows[1]["state"], rows[1]["termHolder"]) == ("tailguard-b", "taking", "tailguard-a")
    # expired: no leader since the end of its duration, the last holder named
    assert (rows[2]["leader"], rows[2]["state"]) == (None, "leaderless")
    assert rows[2]["leaderlessSince"] == iso_utc(NOW - 5) and rows[2]["lastLeader"] == "tailguard-b"
    # handed back: since the hand-back; the last leader from the journal's term
    assert rows[3]["leaderlessSince"] == iso_utc(NOW - 3) and rows[3]["lastLeader"] == "tailguard-a"
    # never created: leaderless, since nothing known
    assert (rows[4]["state"], rows[4]["leaderlessSince"], rows[4]["term"], rows[4]["lastLeader"]) == (
        "leaderless", None, None, None)


def test_a_lease_is_live_until_the_end_of_its_duration() -> None:
    i = ShardingInputs(shards=1, leases={0: LeaseSeen("a", NOW - 15, 15)}, terms={0: Term(1, "a", NOW - 15)})
    assert shard_rows(i, [], NOW - 0.001)[0]["leader"] == "a"
    assert shard_rows(i, [], NOW)[0]["leader"] is None


def test_every_target_is_listed_under_exactly_its_shard() -> None:
    rows = shard_rows(_inputs(), TARGETS + TARGETS[:3], NOW)  # repeated keys counted once
    listed = [t for r in rows for t in r["targets"]]
    assert sorted(listed) == sorted(TARGETS)
    for r in rows:
        assert all(shard_of(t, 5) == r["shard"] for t in r["targets"])
    assert len([r for r in rows if r["targets"]]) >= 3  # 20 targets spread over the shards


def _status(sharding: ShardingInputs | None) -> dict[str, Any]:
    pins = [Pin(t, t.split("/")[1], 1, NOW - 60, from_version=2) for t in TARGETS[:6]]
    return build_status(StatusInputs(now=NOW, replica="tailguard-a", leader=True, acting=True, policies=PolicySet(),
                                      policies_loaded=True, last_reload_at=None, last_reload_error=None,
                                      freezes=FreezeView(config=False), pins=pins, sharding=sharding))


def test_the_status_document_merges_every_shard_and_names_each_targets_leader() -> None:
    doc = _status(_inputs())
    sharding = doc["sharding"]
    assert sharding["shards"] == 5 and sharding["replicas"] == ["tailguard-a", "tailguard-b"]
    assert sharding["ledHere"] == [0] and sharding["leasesSeenAt"] == iso_utc(NOW - 0.5)
    assert [r["shard"] for r in sharding["items"]] == [0, 1, 2, 3, 4]
    assert sorted(t for r in sharding["items"] for t in r["targets"]) == TARGETS[:6]  # the document's targets
    for t in doc["targets"]:
        row = sharding["items"][shard_of(t["target"], 5)]
        assert (t["shard"], t["leader"], t["ledHere"]) == (row["shard"], row["leader"], row["shard"] == 0)


def test_the_table_shows_each_shard_and_since_when_one_has_no_leader() -> None:
    table = render_table(_status(_inputs()))
    assert "shards: 5 across 2 replicas (tailguard-a, tailguard-b)" in table
    lines = {line.split()[0]: line for line in table.splitlines()[table.splitlines().index(
        next(x for x in table.splitlines() if x.startswith("SHARD"))) + 1:][:5]}
    assert "tailguard-a" in lines["0"] and "4" in lines["0"].split()
    assert "tailguard-b (taking its term)" in lines["1"]
    assert f"NO LEADER since {iso_utc(NOW - 5)}, last tailguard-b" in lines["2"]
    assert "NO LEADER (never led)" in lines["4"]


def test_without_sharding_the_document_and_table_keep_their_shape() -> None:
    doc = _status(None)
    assert doc["sharding"] is None and not any("shard" in t for t in doc["targets"])
    assert "shards:" not in render_table(doc)


def test_unreadable_terms_are_named_and_the_leases_still_shown() -> None:
    i = ShardingInputs(shards=2, leases={0: LeaseSeen("a", NOW - 1, 15)}, terms_error="journal down")
    doc = _status(i)
    assert doc["sharding"]["termsError"] == "journal down"
    assert doc["sharding"]["items"][0]["leader"] == "a" and doc["sharding"]["items"][0]["state"] == "unknown"
    assert "shard terms unreadable: journal down" in render_table(doc)


def _policies(*docs: tuple[str, str, str]) -> PolicySet:
    """(name, model (and more of the target), detector trigger YAML) each: one notify policy per model."""
    from daemon.wiring.registries import action_registry, detector_registry
    from policies.loader import load_policies_text

    text = "\n---\n".join(f"""
name: {name}
target: {{model: {model}}}
triggers:
  - detector: {trigger}
actions:
  - type: notify
    url: http://127.0.0.1:9/hook
""" for name, model, trigger in docs)
    return load_policies_text(text, "p.yaml", action_registry(), detector_registry())


FLEET = "{type: threshold, query: 'max by (model) (p999_latency_ms)', params: {threshold: 500}}"
SCOPED = "{type: threshold, query: 'p999_latency_ms{model=\"$model\"}', params: {threshold: 500}}"
TRITON = "{type: threshold, query: 'p999_latency_ms', source: triton, params: {threshold: 500}}"


def test_a_query_naming_no_target_is_fleet_wide_and_listed_for_the_led_policies_only() -> None:
    from daemon.cluster.shard_view import fleet_wide_queries

    policies = _policies(("a-fleet", "a", FLEET), ("b-fleet", "b", FLEET), ("c-scoped", "c", SCOPED),
                         ("d-triton", "d, triton: {endpoints: ['http://127.0.0.1:8000']}", TRITON),
                         ("e-fleet", "e", FLEET))
    led = {"default/a", "default/b", "default/c", "default/d"}.__contains__
    assert fleet_wide_queries(policies, led) == [
        {"query": "max by (model) (p999_latency_ms)", "policies": ["a-fleet trigger 0", "b-fleet trigger 0"]}]
    # $model narrows a query to its target by its own label matcher; source: triton reads the target's pods
    assert fleet_wide_queries(policies, {"default/c", "default/d"}.__contains__) == []


def test_the_poller_filter_says_each_fleet_wide_query_once(monkeypatch: Any) -> None:
    from daemon.wiring import sharding

    class Led:
        def owns(self, target: str) -> bool:
            return target != "default/e"

    said: list[dict[str, Any]] = []
    monkeypatch.setattr(sharding.log, "warning", lambda event, **kw: said.append({"event": event, **kw}))
    follows = sharding._follows(Led())  # type: ignore[arg-type]
    policies = _policies(("a-fleet", "a", FLEET), ("b-fleet", "b", FLEET), ("c-scoped", "c", SCOPED),
                         ("e-fleet", "e", FLEET))
    for _ in range(3):  # three syncs
        assert [follows(p) for p in policies.policies] == [True, True, True, False]
    assert [(s["query"], s["policy"]) for s in said] == [("max by (model) (p999_latency_ms)", "a-fleet")]
    assert "cannot be narrowed" in said[0]["event"]


def test_the_status_names_the_fleet_wide_queries_fetched_whole_here() -> None:
    i = ShardingInputs(shards=2, fleet_wide=({"query": "max(x)", "policies": ["a trigger 0", "b trigger 1"]},))
    doc = _status(i)
    assert doc["sharding"]["fleetWideQueries"] == [{"query": "max(x)", "policies": ["a trigger 0", "b trigger 1"]}]
    assert "fleet-wide query, fetched whole here (not narrowed to these shards): max(x) (a trigger 0, b trigger 1)" \
        in render_table(doc)
