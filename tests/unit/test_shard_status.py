"""`tailguard status` with sharding on: every shard merged with the replica that leads it, as a pure
function of the shard Leases (as seen), the journal's shard terms and the targets
(daemon/cluster/shard_view.py), and its place in the status document and table (daemon/http/status.py)."""
from __future__ import annotations

from typing import Any

from core.timestamps import iso_utc
from daemon.cluster.shard_assignment import shard_of
from daemon.cluster.shard_view import LeaseSeen, ShardingInputs, shard_rows
from daemon.http.status import StatusInputs, build_status, render_table
from daemon.storage.records import Term
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
    pins = [{"target": t, "model": t.split("/")[1], "version": 1, "from_version": 2, "at": NOW - 60}
            for t in TARGETS[:6]]
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
