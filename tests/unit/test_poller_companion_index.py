"""Companion pairing by an index of identities gives the pairs the scan per series gave."""
from __future__ import annotations

import random
from typing import Mapping

from core.query import Series
from daemon.sources.prometheus import RangeResult
from daemon.workers.series_pairing import IDENTITY_IGNORED, companion_for, pair_companions


def _scan(series: Series, companions: RangeResult) -> Series | None:
    """The pairing as it was before the index: the first companion whose labels, less the
    ignored ones, equal the series' labels less the ignored ones."""
    want = {k: v for k, v in series.labels.items() if k not in IDENTITY_IGNORED}
    for cand in companions.series:
        if {k: v for k, v in cand.labels.items() if k not in IDENTITY_IGNORED} == want:
            return cand
    return None


def _series(labels: Mapping[str, str]) -> Series:
    return Series(dict(labels), (1.0,), (1.0,))


def test_pairs_match_the_scan_including_unpaired_and_duplicates() -> None:
    """Same pairs, by identity, as the scan: ignored labels differ freely, a series with no
    companion gets None, and of two companions with one identity the first wins."""
    rng = random.Random(3)
    latency, requests = [], []
    for i in range(300):
        ident = {"model": "ranker", "version": str(i % 3), "pod": f"p{i // 3}"}
        latency.append(_series({"__name__": "lat_us", **ident}))
        if i % 7 == 0:
            continue  # no request counter for this one
        if i % 11 == 0:
            ident = {**ident, "pod": f"other{i}"}  # a companion of another identity
        requests.append(_series({"__name__": "req_total", "quantile": "0.99", **ident}))
        if i % 13 == 0:
            requests.append(_series({"__name__": "req_dup", **ident}))  # a second one, later
    latency.append(_series({}))  # an unlabeled series pairs with an unlabeled companion
    requests.append(_series({"__name__": "unlabeled", "le": "+Inf"}))
    rng.shuffle(requests)
    companions = RangeResult("q", requests)

    expected = [_scan(s, companions) for s in latency]
    assert pair_companions(latency, companions) == expected
    assert [companion_for(s, companions) for s in latency] == expected
    assert sum(p is None for p in expected) > 0 and sum(p is not None for p in expected) > 0


def test_no_companions_pairs_nothing() -> None:
    """An empty companion answer leaves every series unpaired."""
    latency = [_series({"model": "ranker", "version": "1"})]
    assert pair_companions(latency, RangeResult("q", [])) == [None]
