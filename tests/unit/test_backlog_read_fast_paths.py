"""The backlog's read of the pending set gives what the plain path gave: payloads decoded as json
reads them (decode_payload), a journaled signal's head as its Signal has it (SignalHead), and the
class a memo remembers as matching gives it (ClassMemo)."""
from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.signal import Signal, SignalHead, SignalSource, SignalStatus
from daemon.storage.core import decode_payload
from daemon.wiring.registries import action_registry, detector_registry
from daemon.workers.backlog import MATCHING, UNMATCHED, ClassMemo, signal_class
from policies.loader import LoadedPolicy, load_policies_text

# Text json.dumps writes and msgspec refuses: NaN and infinities, numbers past a double, lone surrogates.
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=4)
    | st.sampled_from(["\ud800", "a\udfff", "\U0001f600"]) | st.integers(min_value=2**64, max_value=2**200),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=30,
)


def _same(a: Any, b: Any) -> bool:
    """Equal values of equal types (1 is not 1.0 here); NaN equals NaN."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    return bool(a == b)


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(json_values, st.booleans())
def test_decode_payload_reads_what_json_reads(value: Any, ensure_ascii: bool):
    text = json.dumps(value, default=str, ensure_ascii=ensure_ascii)
    assert _same(decode_payload(text), json.loads(text))


@pytest.mark.parametrize("text", ["[NaN, Infinity, -Infinity]", "1e400", '"\\ud800"', '{"a": 1, "a": 2}'])
def test_decode_payload_falls_back_to_json_for_what_msgspec_refuses(text: str):
    assert _same(decode_payload(text), json.loads(text))


labels = st.dictionaries(st.sampled_from(["alertname", "model", "severity", "pod"]),
                         st.sampled_from(["TritonTailLatencyHigh", "Other", "ranker", "other", "page", "p-1"]),
                         max_size=4)


@st.composite
def signals(draw: st.DrawFn) -> Signal:
    source = draw(st.sampled_from(list(SignalSource)))
    return Signal(source=source, name=draw(st.sampled_from(["TritonTailLatencyHigh", "Other", "tail_anomaly"])),
                  labels=draw(labels), observed_at=datetime(2026, 12, 1, tzinfo=timezone.utc),
                  dedup_key=f"k{draw(st.integers(0, 10**6))}", status=draw(st.sampled_from(list(SignalStatus))),
                  policy=draw(st.sampled_from([None, "ranker-page", "other"])))


def _policies(text: str) -> list[LoadedPolicy]:
    return list(load_policies_text(text, "p.yaml", action_registry(), detector_registry()).policies)


def _policy(name: str, model: str, matchers: dict[str, str], include_resolved: bool) -> dict[str, Any]:
    return {"name": name, "target": {"model": model},
            "triggers": [{"alert": {"name": "TritonTailLatencyHigh", "matchers": matchers,
                                    "includeResolved": include_resolved}}],
            "actions": [{"type": "notify", "url": "http://127.0.0.1:9/hook"}],
            "verify": {"query": "vector(0)", "below": 1, "onNotRecovered": "none"}}


POLICY_SETS = [
    _policies(json.dumps(_policy("ranker-page", "ranker", {"severity": "page"}, False))),
    _policies(json.dumps(_policy("ranker-page", "ranker", {}, True)) + "\n---\n"
              + json.dumps(_policy("other", "other", {"severity": "page"}, False))),
    [],
]


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(POLICY_SETS) - 1), signals()), max_size=40), st.integers(1, 4))
def test_class_memo_gives_the_class_matching_gives(reads: list[tuple[int, Signal]], size: int):
    """Signals of a few kinds, read under policy sets that change between rows, with a memo small
    enough to be cleared while it is used: every class as matching the rebuilt Signal gives it."""
    memo = ClassMemo(size=size)
    for which, signal in reads:
        policies = POLICY_SETS[which]
        summary = json.loads(signal.summary_json())
        assert SignalHead.from_summary(summary) == SignalHead(signal.source, signal.name, signal.status,
                                                              signal.labels, signal.policy)
        assert memo.summary_class(policies, summary) == signal_class(policies, Signal.from_summary(summary))


def test_the_policy_sets_sort_signals_both_ways():
    """The property above would hold vacuously if every signal fell in one class."""
    firing = Signal(SignalSource.ALERT, "TritonTailLatencyHigh", {"alertname": "TritonTailLatencyHigh",
                    "model": "ranker", "severity": "page"}, datetime(2026, 12, 1, tzinfo=timezone.utc), "k")
    assert signal_class(POLICY_SETS[0], firing) == MATCHING
    assert signal_class(POLICY_SETS[0], Signal(**{**firing.__dict__, "labels": {"model": "other"}})) == UNMATCHED
    assert signal_class(POLICY_SETS[2], firing) == UNMATCHED


@pytest.mark.parametrize("summary", [
    {"name": "x"}, {"source": "nope", "name": "x"}, {"source": "alert", "name": "x", "status": "maybe"},
    {"source": "alert", "name": "x", "labels": {"model": ["a"]}},
])
def test_a_summary_that_cannot_be_read_raises(summary: dict[str, Any]):
    with pytest.raises((KeyError, ValueError, TypeError)):
        ClassMemo().summary_class(POLICY_SETS[0], summary)
