"""Which shard a target belongs to, and which replica should lead each shard: pure functions.

Targets map to a fixed number of shards by a stable 64-bit hash of the target key (blake2b, the same
in every process and release: Python's `hash` is salted per process), modulo the shard count, as
Argo CD's application controller shards clusters. Shards map to replicas by rendezvous hashing
(highest random weight): each shard goes to the replica whose hash of (replica, shard) is highest, so a
replica joining takes about 1/N of the shards from the others and one leaving spreads only its own.
"""
from __future__ import annotations

import hashlib
import math
from typing import Iterable, Mapping, Sequence


def stable_hash64(text: str) -> int:
    """A 64-bit hash of `text` that every process and release computes alike."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "big")


def shard_of(target_key: str, shards: int) -> int:
    """The shard (0 .. shards-1) of a target key. Raises ValueError for shards < 1."""
    if shards < 1:
        raise ValueError(f"shards must be at least 1, got {shards}")
    return stable_hash64(target_key) % shards


def rendezvous_owner(shard: int, replicas: Iterable[str]) -> str | None:
    """The replica with the highest weight for `shard` (ties broken by name); None without replicas."""
    best: tuple[int, str] | None = None
    for replica in replicas:
        weight = (stable_hash64(f"{replica}\x00{shard}"), replica)
        if best is None or weight > best:
            best = weight
    return None if best is None else best[1]


def assign(shards: int, replicas: Iterable[str]) -> dict[int, str]:
    """Every shard's rendezvous owner among `replicas` (empty when there are none)."""
    members = sorted(set(replicas))
    if not members:
        return {}
    return {s: rendezvous_owner(s, members) or members[0] for s in range(shards)}


def assign_bounded(shards: int, replicas: Iterable[str]) -> dict[int, str]:
    """Rendezvous hashing with bounded loads: shard by shard (in index order), the highest-weight
    replica that holds less than its fair share. Every replica computes the same answer from the same
    members; no replica gets more than ceil(shards / replicas), and a join or leave still moves few
    shards (measured in bench/bench_shards.py)."""
    members = sorted(set(replicas))
    if not members:
        return {}
    share = fair_share(shards, len(members))
    load = dict.fromkeys(members, 0)
    out: dict[int, str] = {}
    for s in range(shards):
        ranked = sorted(members, key=lambda r: (stable_hash64(f"{r}\x00{s}"), r), reverse=True)
        owner = next(r for r in ranked if load[r] < share)
        load[owner] += 1
        out[s] = owner
    return out


def fair_share(shards: int, replicas: int) -> int:
    """The most shards one replica should hold: ceil(shards / replicas) (all of them when alone)."""
    return math.ceil(shards / max(1, replicas))


def preferred(shards: int, replicas: Iterable[str], me: str) -> set[int]:
    """The shards bounded-load rendezvous hashing gives `me` among `replicas` (`me` counted in)."""
    return {s for s, owner in assign_bounded(shards, {*replicas, me}).items() if owner == me}


def moved(before: Mapping[int, str], after: Mapping[int, str]) -> int:
    """How many shards changed owner between two assignments."""
    return sum(1 for s, owner in after.items() if before.get(s) != owner)


def to_hand_back(held: Sequence[int], wanted: set[int], share: int) -> list[int]:
    """The shards to hand back: past `share`, those rendezvous gives another replica first (highest
    shard number first among them, so the choice is stable), then the rest."""
    excess = len(held) - share
    if excess <= 0:
        return []
    order = sorted(held, key=lambda s: (s in wanted, -s))
    return order[:excess]
