"""The shard terms: a fencing token per shard when targets are sharded across replicas.

A replica that takes a shard's Lease takes the shard's next term here; the door's intent for a write
on one of the shard's targets is journaled only while that term is still the shard's (checked inside
the intent's own transaction). Taking a shard term also moves the single-leader `leadership` row into
the sharded regime (holder SHARDED, term + 1) once, so a replica of the single-leader release, whose
fenced writes check that row's term, is refused from then on: shard terms supersede the old term. A
single leader that takes a term afterwards moves the row out of the regime again, and the sharded
replicas' writes are refused until one of them takes a shard term anew: never both at once.
"""
from __future__ import annotations

from typing import Callable

from daemon.storage.backend import Backend
from daemon.storage.blocking import blocking
from daemon.storage.core import JournalCore, checked
from daemon.storage.errors import JournalError, JournalFenced
from daemon.storage.records import Term

SHARDED = "<sharded>"
"""The `leadership` row's holder while shard terms fence the writes."""


class ShardFenced(JournalFenced):
    """A write on a shard's target from a replica whose term for that shard is not current."""


class ShardCountMismatch(JournalError):
    """This replica's shard count differs from the one the journal's shard terms were taken under."""


class ShardTerms:
    """The journal's shard terms, and the terms this process holds (kept after a shard is lost: an
    in-flight write must still be checked against them)."""

    def __init__(self, core: JournalCore) -> None:
        self._core = core
        self._held: dict[int, Term] = {}
        # With sharding on (`route`): a target's shard, so that decision rows are fenced per shard too.
        self._shard_of: Callable[[str], int] | None = None

    def route(self, shard_of: Callable[[str], int]) -> None:
        """Sharding is on in this process: from now on a decision write of a target (its record,
        steps, end, verdict: daemon/storage/decisions.py) is refused (ShardFenced) unless this
        process holds the current term of the target's shard, as the door's intents are."""
        self._shard_of = shard_of

    def fence_target(self, db: Backend, target: str) -> None:
        """Inside a write transaction: with sharding on, raise ShardFenced unless this process's term
        for `target`'s shard is current (`check`); without it, nothing (the core term fences)."""
        if self._shard_of is not None:
            self._check(db, self._shard_of(target))

    def held(self, shard: int) -> Term | None:
        """The term this process took last for `shard`, if any."""
        return self._held.get(shard)

    @blocking
    def take(self, shard: int, shards: int, holder: str) -> Term:
        """Take `shard`'s next term for `holder` (which just acquired the shard's Lease).

        Raises:
            ShardCountMismatch: the journal's shard terms were taken under another shard count.
        """
        checked(holder=holder)
        if not 0 <= shard < shards:
            raise ValueError(f"shard {shard} is not in 0..{shards - 1}")
        core = self._core
        now = core.clock()

        def run(db: Backend) -> Term:
            other = db.execute("SELECT shards FROM shard_terms WHERE shards != ? LIMIT 1", (shards,)).fetchone()
            if other is not None:
                raise ShardCountMismatch(
                    f"the journal's shard terms were taken with sharding.shards={other['shards']}, this replica "
                    f"has {shards}: every replica must run one shard count (scale the old release to zero, then "
                    "clear the shard_terms table, before changing it)")
            row = db.execute(
                "INSERT INTO shard_terms(shard, term, holder, shards, since) VALUES (?, 1, ?, ?, ?)"
                " ON CONFLICT(shard) DO UPDATE SET term=shard_terms.term + 1, holder=excluded.holder,"
                " shards=excluded.shards, since=excluded.since RETURNING term",
                (shard, holder, shards, now)).fetchone()
            # Into the sharded regime, once: a single leader's term is superseded.
            db.execute(
                "INSERT INTO leadership(id, term, holder, lease_transitions, since) VALUES (1, 1, ?, NULL, ?)"
                " ON CONFLICT(id) DO UPDATE SET term=leadership.term + 1, holder=excluded.holder,"
                " since=excluded.since WHERE leadership.holder != excluded.holder",
                (SHARDED, now))
            return Term(int(row["term"]), holder, now)

        term = core.write(run)
        self._held[shard] = term
        return term

    @blocking
    def current(self) -> dict[int, Term]:
        """Every shard's term now."""
        rows = self._core.read("SELECT shard, term, holder, since FROM shard_terms ORDER BY shard")
        return {int(r["shard"]): Term(int(r["term"]), str(r["holder"]), float(r["since"])) for r in rows}

    @blocking
    def stale(self, shards: frozenset[int]) -> frozenset[int]:
        """Of `shards`, those whose term this process took is no longer current: the shard's term was
        replaced, or a single leader took the journal out of the sharded regime (then all of them)."""
        regime = self._core.read("SELECT holder FROM leadership WHERE id=1")
        if not regime or regime[0]["holder"] != SHARDED:
            return frozenset(shards)
        now = {int(r["shard"]): int(r["term"]) for r in self._core.read("SELECT shard, term FROM shard_terms")}
        return frozenset(s for s in shards if (held := self._held.get(s)) is None or now.get(s) != held.term)

    @blocking
    def sharded(self) -> bool:
        """Whether shard terms fence the writes now (no single leader took a term since)."""
        rows = self._core.read("SELECT holder FROM leadership WHERE id=1")
        return bool(rows) and rows[0]["holder"] == SHARDED

    def check(self, shard: int) -> None:
        """Inside a write transaction (else in one of its own): raise ShardFenced unless this process's term for `shard` is the
        shard's current one and the journal is in the sharded regime. Rows read are held shared."""
        self._core.joined(lambda db: self._check(db, shard))

    def _check(self, db: Backend, shard: int) -> None:
        mine = self._held.get(shard)
        if mine is None:
            raise ShardFenced(f"this replica holds no term for shard {shard}; write refused")
        regime = db.execute("SELECT term, holder FROM leadership WHERE id=1" + db.share_lock).fetchone()
        if regime is None or regime["holder"] != SHARDED:
            who = "none" if regime is None else f"term {regime['term']} ({regime['holder']})"
            raise ShardFenced(f"a single leader took the journal's term since ({who}): shard {shard}'s term "
                              f"{mine.term} no longer fences; write refused")
        row = db.execute("SELECT term, holder FROM shard_terms WHERE shard=?" + db.share_lock, (shard,)).fetchone()
        if row is None or int(row["term"]) != mine.term:
            now = "none" if row is None else f"{row['term']} ({row['holder']})"
            raise ShardFenced(f"shard {shard}'s term {mine.term} of {mine.holder} was replaced by term {now}: "
                              "this replica no longer leads the shard; write refused")
