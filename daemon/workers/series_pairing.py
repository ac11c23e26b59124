"""Which series goes with which, cycle after cycle, cheaply: a series' companion (the request
counter beside a latency series) by identity, and memos that reuse last cycle's keys and pairings
while the range cache hands back the same label mappings."""
from __future__ import annotations

import operator
from typing import Callable, Iterable, Iterator, Mapping

from core.query import Series
from daemon.sources.prometheus import RangeResult


class LabelMemo:
    """`fn(labels)` computed once per labels mapping object while that object keeps coming back:
    the range cache hands out the same mapping of a series every cycle, so a steady cycle finds
    the series' keys here instead of sorting and encoding 10,000 label sets again. Keyed by the
    mapping's id, the mapping held so that the id stays its own (a Series' labels are never
    changed in place); what a cycle did not ask for is dropped at the next (`next_cycle`). Only
    dicts of ints and strings and lists: nothing more for the cyclic GC to walk."""

    def __init__(self, fn: Callable[[Mapping[str, str]], str]) -> None:
        self._fn = fn
        self._now: dict[int, str] = {}
        self._last: dict[int, str] = {}
        self._held_now: list[Mapping[str, str]] = []
        self._held_last: list[Mapping[str, str]] = []

    def next_cycle(self) -> None:
        self._last, self._held_last = self._now, self._held_now
        self._now, self._held_now = {}, []

    def many(self, labels: Iterable[Mapping[str, str]]) -> Iterator[str]:
        """`fn` of each mapping, in order, each when asked for (as `fn` one call at a time)."""
        now, last, held, fn = self._now, self._last, self._held_now, self._fn
        for mapping in labels:
            value = now.get(id(mapping))
            if value is None:
                value = last.get(id(mapping))
                if value is None:
                    value = fn(mapping)
                now[id(mapping)] = value
                held.append(mapping)
            yield value


class PairingMemo:
    """`pair_companions` of a watch's last cycle, reused while the same series come back in the
    same order (the same labels mapping objects: the range cache keeps them, and a Series' labels
    are never changed in place), so they pair the same way; otherwise paired anew."""

    def __init__(self) -> None:
        self._series: list[Mapping[str, str]] = []
        self._companions: list[Mapping[str, str]] = []
        self._positions: list[int] = []  # per series, its companion's position; -1: none

    def pair(self, series: list[Series], companions: RangeResult) -> list[Series | None]:
        labels = [s.labels for s in series]
        companion_labels = [c.labels for c in companions.series]
        if not (_same_objects(labels, self._series) and _same_objects(companion_labels, self._companions)):
            position = {id(c): i for i, c in enumerate(companions.series)}
            self._positions = [-1 if c is None else position[id(c)] for c in pair_companions(series, companions)]
            self._series, self._companions = labels, companion_labels
        found = companions.series
        return [found[i] if i >= 0 else None for i in self._positions]


def _same_objects(a: list[Mapping[str, str]], b: list[Mapping[str, str]]) -> bool:
    return len(a) == len(b) and all(map(operator.is_, a, b))


IDENTITY_IGNORED = frozenset({"__name__", "quantile", "le"})


def companion_identity(labels: Mapping[str, str]) -> frozenset[tuple[str, str]]:
    """What pairs a series with its companion: its labels other than name, quantile and bound."""
    return frozenset((k, v) for k, v in labels.items() if k not in IDENTITY_IGNORED)


def companion_for(series: Series, companions: RangeResult) -> Series | None:
    """The companion series with the same identity (labels other than name and quantile)."""
    want = companion_identity(series.labels)
    return next((c for c in companions.series if companion_identity(c.labels) == want), None)


def pair_companions(series: list[Series], companions: RangeResult) -> list[Series | None]:
    """`companion_for` of every series through one index by identity: O(S) per cycle, where one
    scan per series was O(S^2) (about a minute of CPU at 10,000 series). The first companion of
    an identity wins, as the scan in order found it."""
    index: dict[frozenset[tuple[str, str]], Series] = {}
    for cand in companions.series:
        index.setdefault(companion_identity(cand.labels), cand)
    return [index.get(companion_identity(s.labels)) for s in series]
