"""Two real `tailguard run` processes with sharding on (4 shards), one PostgreSQL journal and the
Kubernetes emulator's Leases: alerts about 8 models land on either replica, one replica is SIGKILLed
mid-burst, and the survivor leads its shards within the Lease duration plus its takeover rounds and
finishes what was pending. Every alert is acted on, none twice (one Idempotency-Key per alert, one
decision per signal, every signal processed), and the survivor holds every shard's term at the end.

How long a shard went unled is read from the Leases' own stamps (each write's renewTime, in the
writers' clock, as the emulator received it), not from this test's loop, which shares the cores with
the replicas: under a loaded CI machine the loop's wake-ups say more about the loop than the Leases.
"""
from __future__ import annotations

import asyncio
import collections
import copy
import datetime
import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from daemon.cluster.shard_assignment import assign_bounded
from daemon.storage.journal import Journal
from lab.kube.emulator import KubeEmulator
from tests.integration.test_ha_postgres import LEASE, NS, Replica, Sink
from tests.support.helpers import TOKEN, notify_policy, sample_payload, wait_for
from tests.support.kube.conftest_plugin import kube_emulator  # noqa: F401  (fixture)
from tests.support.kube_helpers import write_kubeconfig

pytestmark = pytest.mark.integration

SHARDS = 4
MODELS = [f"m{i}" for i in range(8)]
WEBHOOKS, KILL_AFTER = 32, 12
EXPECTED = {f"sk{n:03d}" for n in range(WEBHOOKS)}

# What the replicas' config (test_ha_postgres.LEASE) states about a takeover. A shard round waits
# retryPeriodSeconds, then runs for at most renewDeadlineSeconds (ShardManager.run). A survivor takes an
# orphan within the Lease duration plus three of its rounds: the round that first sees the dead
# holder's last renewal (the expiry counts from then, as observed locally), the round at whose list
# the duration has passed, and that round's own writes before the shard's.
LEASE_DURATION = float(LEASE["leaseDurationSeconds"])
ROUND_BOUND = float(LEASE["retryPeriodSeconds"]) + float(LEASE["renewDeadlineSeconds"])
TAKEOVER_ROUNDS = 3
UNDER_LOAD = 10
"""The waits' multiple of what the config states: a whole-suite CI run on 2 cores stretched the Leases'
convergence from seconds alone to over 30 s. Only waits scale; the asserted bounds are measured."""
SETTLE_WAIT = UNDER_LOAD * (LEASE_DURATION + 5 * ROUND_BOUND)  # membership seen, hand back, take, term
TAKEOVER_WAIT = UNDER_LOAD * (LEASE_DURATION + TAKEOVER_ROUNDS * ROUND_BOUND)


def _webhook(n: int) -> dict[str, Any]:
    body = copy.deepcopy(sample_payload())
    alert = body["alerts"][0]
    alert["fingerprint"] = f"sk{n:03d}"
    alert["labels"]["model"] = MODELS[n % len(MODELS)]
    return body


def _shard_holders(emulator: KubeEmulator) -> dict[int, str | None]:
    """Each shard Lease's holder; None while it is not created yet (the emulator's `get` answers None)
    or has no holder."""
    out: dict[int, str | None] = {}
    for s in range(SHARDS):
        lease = emulator.get("leases", NS, f"tailguard-shard-{s}")
        out[s] = lease["spec"].get("holderIdentity") if lease is not None else None
    return out


@dataclass(frozen=True)
class LeaseWrite:
    """One Lease write the emulator accepted, as its writer stamped it."""

    name: str
    holder: str | None
    renewed: float  # spec.renewTime: the writer's wall clock (every process here shares one host's)
    duration: float  # spec.leaseDurationSeconds as written: what a successor waits out


def _lease_writes(emulator: KubeEmulator) -> list[LeaseWrite]:
    """Every create or replace of a Lease that landed, in the order the emulator handled them."""
    out = []
    for rec in list(emulator.requests):
        if rec.resource != "leases" or rec.verb not in ("create", "update") or rec.status not in (200, 201):
            continue
        spec = rec.body["spec"]
        renewed = datetime.datetime.strptime(spec["renewTime"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(
            tzinfo=datetime.timezone.utc).timestamp()
        out.append(LeaseWrite(rec.body["metadata"]["name"], spec.get("holderIdentity"), renewed,
                              float(spec["leaseDurationSeconds"])))
    return out


def _takeovers(writes: list[LeaseWrite], shards: list[int], victim: str, survivor: str) -> dict[int, tuple[float, float]]:
    """Per shard the victim led when the fault struck: (how long it went unled, the bound the config and
    the survivor's measured rounds give). Unled: from the victim's last renewal to the survivor's write
    that took it from the victim (the last write of the survivor right after one of the victim: a
    hand-over at start-up passes through a write without holder). Bound: the duration the victim wrote
    plus TAKEOVER_ROUNDS of the survivor's longest round over that span (the interval between two of
    its membership renewals: one per round)."""
    member = f"tailguard-member-{survivor}"
    out: dict[int, tuple[float, float]] = {}
    for s in shards:
        mine = [w for w in writes if w.name == f"tailguard-shard-{s}"]
        last, taken = [(a, b) for a, b in zip(mine, mine[1:]) if a.holder == victim and b.holder == survivor][-1]
        took = taken.renewed
        stamps = [w.renewed for w in writes if w.name == member and w.holder == survivor]
        start = max([t for t in stamps if t <= last.renewed], default=stamps[0])
        span = [t for t in stamps if start <= t <= took]
        longest = max((b - a for a, b in zip(span, span[1:])), default=ROUND_BOUND)
        out[s] = (took - last.renewed, last.duration + TAKEOVER_ROUNDS * longest)
    return out


async def _send(http: aiohttp.ClientSession, replicas: list[Replica], down: set[str], n: int) -> None:
    """As Alertmanager: to one replica, resent to the other until one journals it; bounded."""
    for attempt in range(400):
        replica = replicas[(n + attempt) % 2]
        if replica.name not in down:
            try:
                async with http.post(f"{replica.url}/api/v1/alerts", json=_webhook(n),
                                     headers={"Authorization": f"Bearer {TOKEN}"}) as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
        await asyncio.sleep(0.05)
    raise AssertionError(f"webhook {n} was never acknowledged")


@pytest.mark.parametrize("fault", ["kill", "stop", "add"])
async def test_a_killed_paused_or_added_sharded_replica_loses_nothing_and_repeats_nothing(
        tmp_path: Path, postgres_dsn: str, kube_emulator: KubeEmulator, fault: str) -> None:  # noqa: F811
    """kill: SIGKILL mid-burst; stop: SIGSTOP past the Lease duration, the survivor leads every shard,
    then SIGCONT (the paused replica's renew deadline has passed: it acts on nothing it lost); add: a
    third replica joins mid-burst and the others hand it its share."""
    sink = Sink()
    await sink.start()
    policies = tmp_path / "policies"
    policies.mkdir()
    docs = [notify_policy(sink.url, "cooldown: 0s, maxActions: 100000").replace(
        "name: ranker-notify", f"name: notify-{m}").replace("model: ranker", f"model: {m}") for m in MODELS]
    (policies / "p.yaml").write_text("\n---\n".join(docs))
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", kube_emulator)
    replicas = [Replica(tmp_path, n, postgres_dsn, kubeconfig, policies) for n in "abc"]
    for r in replicas:  # the HA test's config, with sharding on
        config = yaml.safe_load(r.config.read_text())
        config["sharding"] = {"shards": SHARDS}
        r.config.write_text(yaml.safe_dump(config))
    down: set[str] = set()
    try:
        victim, survivor, joining = replicas
        down.add(joining.name)
        await asyncio.gather(victim.start(), survivor.start())
        names = {victim.name, survivor.name}
        await wait_for(lambda: set(_shard_holders(kube_emulator).values()) == names, timeout=SETTLE_WAIT)
        async with aiohttp.ClientSession() as http:
            await asyncio.gather(*(_send(http, replicas[:2], down, n) for n in range(KILL_AFTER)))
            await wait_for(lambda: len(sink.posts) >= 4, timeout=60)
            victims = sorted(s for s, holder in _shard_holders(kube_emulator).items() if holder == victim.name)
            if fault == "kill":
                victim.kill()
                down.add(victim.name)
            elif fault == "stop":
                os.kill(victim.process.pid, signal.SIGSTOP)
                down.add(victim.name)
            else:
                await joining.start()
                down.discard(joining.name)
            rest = asyncio.gather(*(_send(http, replicas[:2] if fault != "add" else replicas[1:], down, n)
                                    for n in range(KILL_AFTER, WEBHOOKS)))
            if fault == "add":
                # The Leases follow the assignment among three (the newcomer's share handed to it); within
                # seconds alone, over 30 s in a CI run of the whole suite on 2 cores.
                everyone = [r.name for r in replicas]
                await wait_for(lambda: _shard_holders(kube_emulator) == assign_bounded(SHARDS, everyone),
                               timeout=SETTLE_WAIT)
                assert joining.name in _shard_holders(kube_emulator).values()
            else:
                await wait_for(lambda: set(_shard_holders(kube_emulator).values()) == {survivor.name},
                               timeout=TAKEOVER_WAIT)
                # No shard unled past the Lease duration plus the survivor's takeover rounds, as long as
                # those rounds measurably took (the webhooks sent meanwhile share the two cores with it).
                unled = _takeovers(_lease_writes(kube_emulator), victims, victim.name, survivor.name)
                assert victims and all(gap <= bound for gap, bound in unled.values()), unled
            if fault == "stop":
                os.kill(victim.process.pid, signal.SIGCONT)
                down.discard(victim.name)
            await rest
        await wait_for(lambda: {d.split(":")[1] for _, d in sink.posts} >= EXPECTED, timeout=90)
        journal = Journal(postgres_dsn)
        try:
            await wait_for(lambda: journal.signals.refresh_pending() == 0, timeout=60, interval=0.2)
            signals, decisions = journal.signals.all(), journal.decisions.all()
            terms = journal.shard_terms.current()
        finally:
            journal.close()
    finally:
        if fault == "stop" and victim.name in down:
            os.kill(victim.process.pid, signal.SIGCONT)  # never leave a paused process behind
        for r in replicas:
            await asyncio.to_thread(r.process.stop)
        await sink.stop()
    keys: dict[str, set[str]] = collections.defaultdict(set)
    for key, dedup in sink.posts:
        keys[dedup.split(":")[1]].add(key)
    assert set(keys) == EXPECTED and {a: k for a, k in keys.items() if len(k) != 1} == {}
    assert len(signals) == WEBHOOKS and {s.state for s in signals} == {"processed"}
    assert len({d.signal_id for d in decisions}) == len(decisions) == WEBHOOKS
    assert {d.state for d in decisions} == {"succeeded"}, collections.Counter(d.state for d in decisions)
    if fault == "kill":
        assert {t.holder for t in terms.values()} == {survivor.name}  # it took every shard's term
