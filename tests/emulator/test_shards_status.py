"""The status view of the shards (ShardManager.view + the journal's terms, merged by
daemon/cluster/shard_view.py) against the Kubernetes emulator's Leases: two shard managers driven round
by round on one clock, so that the moment a dead replica's Leases have expired and nobody has taken
them yet is seen, not raced. Each replica's view names every shard's leader as the Leases and the
journal's terms do; a dead replica's shards show as leaderless since their Leases' expiry, then as led
by the survivor under a new term."""
from __future__ import annotations

from datetime import datetime
from pathlib import Path

from kubernetes_asyncio.client import ApiClient

from daemon.cluster.shard_assignment import shard_of
from daemon.cluster.shard_view import shard_rows
from daemon.cluster.shards import ShardManager
from daemon.common.config import ShardingSettings
from daemon.storage.journal import Journal
from daemon.wiring.sharding import sharding_status
from lab.kube.emulator import KubeEmulator
from policies.loader import PolicySet
from tests.emulator.test_shards import ELECTION
from tests.support.kube.conftest_plugin import kube_emulator  # noqa: F401  (fixture)

SHARDS = 4
STEP = ELECTION.retry_period_seconds
LEASE_SECONDS = 2.0  # leaseDurationSeconds 1.5 as written (rounded up)
TARGETS = [f"default/m{i}" for i in range(12)]
WALL0 = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def monotonic(self) -> float:
        return self.t

    def wall(self) -> float:
        return WALL0 + self.t


def _manager(emulator: KubeEmulator, api: ApiClient, journal: Journal, name: str, clock: Clock) -> ShardManager:
    async def take_term(shard: int) -> bool:
        await journal.shard_terms.take.in_thread(shard, SHARDS, name)
        return True

    async def stale_terms(led: frozenset[int]) -> frozenset[int]:
        return await journal.shard_terms.stale.in_thread(led)

    return ShardManager(api, ELECTION, ShardingSettings(shards=SHARDS), name, take_term, stale_terms=stale_terms,
                        wall=clock.wall, monotonic=clock.monotonic)


def _holders(emulator: KubeEmulator) -> dict[int, str | None]:
    return {s: emulator.get("leases", "tailguard", f"tailguard-shard-{s}")["spec"].get("holderIdentity")
            for s in range(SHARDS)}


async def test_status_names_every_shards_leader_and_a_dead_replicas_shards_as_leaderless_until_taken(
        kube_emulator: KubeEmulator, tmp_path: Path) -> None:  # noqa: F811
    clock = Clock()
    apis = [ApiClient(configuration=kube_emulator.configuration()) for _ in range(2)]
    journals = [Journal(tmp_path / "j.db") for _ in range(2)]
    a, b = (_manager(kube_emulator, apis[n], journals[n], f"tailguard-{x}", clock) for n, x in enumerate("ab"))
    try:
        for _ in range(15):  # both alive: settle on two shards each
            await a.round()
            await b.round()
            clock.t += STEP
        assert len(a.led) == len(b.led) == 2 and a.led | b.led == set(range(SHARDS))
        holders = _holders(kube_emulator)
        # Asked of either replica: the same leaders, those of the Leases and of the journal's terms.
        for manager, journal in ((a, journals[0]), (b, journals[1])):
            view = await sharding_status(manager, journal, PolicySet())
            assert view.members == ("tailguard-a", "tailguard-b")
            rows = shard_rows(view, TARGETS, clock.wall())
            assert {r["shard"]: r["leader"] for r in rows} == holders
            assert all(r["state"] == "led" and r["termHolder"] == r["leader"] for r in rows), rows
            assert {r["shard"] for r in rows if r["ledHere"]} == manager.led
            assert all(shard_of(t, SHARDS) == r["shard"] for r in rows for t in r["targets"])
        terms_before = journals[0].shard_terms.current()
        orphans = set(b.led)
        b_last_write = clock.wall() - STEP  # b's last round (it dies now: nothing handed back)

        # Only a goes on. Before each of its rounds, its view: b's shards stay b's until their Leases
        # expire (as a observed them), then show leaderless; a's next round takes them.
        seen_leaderless = False
        for _ in range(int((LEASE_SECONDS + 1) / STEP)):
            clock.t += STEP
            view = await sharding_status(a, journals[0], PolicySet())
            rows = {r["shard"]: r for r in shard_rows(view, TARGETS, clock.wall())}
            for s in orphans:
                if rows[s]["leader"] is None:
                    seen_leaderless = True
                    assert rows[s]["state"] == "leaderless" and rows[s]["lastLeader"] == "tailguard-b"
                    since = datetime.fromisoformat(rows[s]["leaderlessSince"]).timestamp()
                    # the expiry of b's last write as a saw it (a round later at most), to the second
                    assert b_last_write + LEASE_SECONDS - 1 <= since <= b_last_write + LEASE_SECONDS + STEP + 1
                elif rows[s]["leader"] == "tailguard-b":
                    assert clock.wall() < b_last_write + LEASE_SECONDS + STEP + 1e-6
            for s in a.led:
                assert rows[s]["leader"] == "tailguard-a"
            await a.round()
            if a.led == set(range(SHARDS)):
                break
        assert seen_leaderless
        assert a.led == set(range(SHARDS))
        view = await sharding_status(a, journals[0], PolicySet())
        rows = {r["shard"]: r for r in shard_rows(view, TARGETS, clock.wall())}
        assert all(r["leader"] == "tailguard-a" and r["state"] == "led" for r in rows.values())
        for s in orphans:  # taken under a new term
            assert rows[s]["term"] == terms_before[s].term + 1
    finally:
        for api in apis:
            await api.close()
        for j in journals:
            j.close()
