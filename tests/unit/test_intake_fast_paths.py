"""The webhook intake's fast paths give what the plain ones gave: the nesting walk, the skipped
surrogate search (read_payload), the journal payload (Signal.summary_json) and the signals row's
text check (signal_row)."""
from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.signal import Signal, SignalSource, SignalStatus
from daemon.http.intake import (
    MAX_JSON_DEPTH, BodyError, PayloadError, alert_signals, decode_body, nesting_deeper_than, parse_payload,
    read_payload,
)
from daemon.storage.core import checked
from daemon.storage.errors import JournalValueError
from daemon.storage.signals import signal_row
from tests.support.helpers import sample_payload


def _reference_nesting_deeper_than(value: Any, limit: int) -> bool:
    """The walk as it was: depth first, one (container, depth) pair per container."""
    stack = [(value, 1)] if isinstance(value, (dict, list)) else []
    while stack:
        container, depth = stack.pop()
        if depth > limit:
            return True
        children = container.values() if isinstance(container, dict) else container
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=2), inner, max_size=3),
    max_leaves=40,
)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(json_values, st.integers(min_value=0, max_value=8))
def test_nesting_walk_agrees_with_the_reference(value: Any, limit: int):
    assert nesting_deeper_than(value, limit) == _reference_nesting_deeper_than(value, limit)


def _nested(depth: int, kinds: str) -> str:
    opens = "".join("[" if kinds[i % len(kinds)] == "a" else '{"k":' for i in range(depth))
    closes = "".join("]" if kinds[i % len(kinds)] == "a" else "}" for i in reversed(range(depth)))
    return opens + "0" + closes


@pytest.mark.parametrize("kinds", ["a", "o", "ao", "oa"])
def test_depth_limit_is_exact(kinds: str):
    decode_body(_nested(MAX_JSON_DEPTH, kinds).encode())
    with pytest.raises(BodyError, match=f"nested deeper than {MAX_JSON_DEPTH} levels"):
        decode_body(_nested(MAX_JSON_DEPTH + 1, kinds).encode())


def test_brackets_inside_strings_are_not_nesting():
    body = {"text": "[" * 100 + "{" * 100, "list": [["x"]]}
    assert decode_body(json.dumps(body).encode()) == body


def _payload_with(text: str, where: str) -> dict[str, Any]:
    """The sample webhook with `text` in a label value, an annotation key or the receiver."""
    body = sample_payload()
    if where == "label":
        body["alerts"][0]["labels"]["extra"] = text
    elif where == "key":
        body["alerts"][0]["annotations"][text] = "v"
    else:
        body["receiver"] = text
    return body


def _outcome(fn: Any, *args: Any) -> Any:
    try:
        return ("ok", fn(*args).model_dump())
    except (BodyError, PayloadError) as exc:
        return (type(exc).__name__, str(exc))


def _reference(raw: bytes) -> Any:
    return parse_payload(decode_body(raw))  # the surrogate search always runs


@pytest.mark.parametrize("where", ["label", "key", "receiver"])
@pytest.mark.parametrize("text", ["\ud800", "a\udfffb", "\udbff", "\ud83d\ude00", "\U0001f600", "é", "plain"])
def test_read_payload_finds_every_lone_surrogate(text: str, where: str):
    raw = json.dumps(_payload_with(text, where)).encode("utf-8")  # ensure_ascii: every non-ASCII character escaped
    got = _outcome(read_payload, raw)
    assert got == _outcome(_reference, raw)
    lone = any(0xD800 <= ord(c) <= 0xDFFF for c in text) and text != "\ud83d\ude00"
    assert (got[0] == "PayloadError" and "lone surrogate" in got[1]) == lone


@pytest.mark.parametrize("escape", ["\\ud800", "\\uD800", "\\uDc00", "\\udBfF"])
def test_surrogate_escape_in_any_hex_case_is_searched(escape: str):
    raw = json.dumps(sample_payload()).replace('"receiver": "', '"receiver": "' + escape, 1).encode()
    assert _outcome(read_payload, raw)[0] == "PayloadError"
    assert _outcome(read_payload, raw) == _outcome(_reference, raw)


def test_escaped_backslash_before_u_is_text_not_a_surrogate():
    raw = json.dumps(sample_payload()).replace('"receiver": "', '"receiver": "\\\\ud800', 1).encode()
    got = _outcome(read_payload, raw)
    assert got[0] == "ok" and got[1]["receiver"].startswith("\\ud800")
    assert got == _outcome(_reference, raw)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x10FFFF), max_size=6),
       st.sampled_from(["label", "key", "receiver"]), st.booleans())
def test_read_payload_agrees_with_decode_then_parse(text: str, where: str, ascii_only: bool):
    raw = json.dumps(_payload_with(text, where), ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")
    assert _outcome(read_payload, raw) == _outcome(_reference, raw)


def _signal(**overrides: Any) -> Signal:
    fields: dict[str, Any] = dict(
        source=SignalSource.ALERT, name="TritonTailLatencyHigh", labels={"alertname": "TritonTailLatencyHigh", "m": "é"},
        observed_at=datetime(2026, 11, 29, 17, 26, 8, 551000, tzinfo=timezone(timedelta(hours=2))),
        dedup_key="alert:fp:2026-11-29T15:26:08.551000+00:00:firing", status=SignalStatus.RESOLVED, value=1.5,
        policy="p", details={"annotations": {"summary": "x"}, "when": datetime(2026, 1, 1), "n": [1, 2.5, None]})
    fields.update(overrides)
    return Signal(**fields)


def _reference_summary_json(s: Signal) -> str:
    line = {"recovery_line": None} if s.source is SignalSource.DETECTOR else {}  # a detector's line, null: none drawn
    return json.dumps({"source": s.source.value, "name": s.name, "labels": dict(s.labels),
                       "observed_at": s.observed_at.isoformat(), "dedup_key": s.dedup_key,
                       "status": s.status.value, "value": s.value, "policy": s.policy, "details": s.details,
                       **line}, default=str)


@pytest.mark.parametrize("signal", [
    _signal(), _signal(policy=None, value=None, status=SignalStatus.FIRING, details={}),
    _signal(source=SignalSource.DETECTOR, labels={}),
    _signal(value=None, details={"annotations": {"s": "é\u2028"}, "fingerprint": "f"}),
    _signal(value=None, details={"annotations": {"s": "lone \ud800"}}),  # msgspec refuses: json escapes it
    _signal(value=None, details={"n": 1, "s": "x"}),
    _signal(value=None, details={"when": datetime(2026, 1, 1)}),  # msgspec would write it otherwise
    _signal(value=float("nan"), details={}),
    *alert_signals(parse_payload(sample_payload())),
])
def test_summary_json_holds_the_same_values_and_reads_back(signal: Signal):
    text = signal.summary_json()
    if signal.value is None and all(isinstance(v, str) or isinstance(v, dict) and all(isinstance(x, str) for x in v.values())
                                    for v in signal.details.values()):
        # text only (an alert's): written by msgspec, the same values, UTF-8 as it is
        assert json.loads(text) == json.loads(_reference_summary_json(signal))
        text.encode("utf-8")
    else:
        assert text == _reference_summary_json(signal)
        assert text.isascii()
    back = Signal.from_summary(json.loads(text))
    assert _values(back.summary_json()) == _values(text)
    if all(isinstance(v, (str, dict)) for v in signal.details.values()) and signal.value == signal.value:  # not NaN
        assert back == signal


def _values(text: str) -> str:
    """The values of a JSON text, written one way (NaN included, which never equals itself)."""
    return json.dumps(json.loads(text), sort_keys=True)


def _reference_signal_row(n: int, s: Signal, now: float) -> tuple[Any, ...]:
    prefix = f"signal {n} "
    checked(**{prefix + "dedup_key": s.dedup_key, prefix + "source": s.source.value, prefix + "name": s.name,
               prefix + "policy": s.policy})
    return (s.dedup_key, s.source.value, s.name, s.policy, now, s.summary_json())


def _row_outcome(fn: Any, s: Signal) -> Any:
    try:
        return fn(3, s, 12.5)
    except JournalValueError as exc:
        return str(exc)


@pytest.mark.parametrize("overrides", [
    {}, {"policy": None}, {"name": "é-name"}, {"name": "bad\ud800"}, {"dedup_key": "k\udfff"},
    {"policy": "pé\udc80"}, {"policy": "ok\u00e9"}, {"name": "\U0001f600"},
])
def test_signal_row_checks_text_as_before(overrides: dict[str, Any]):
    s = _signal(**overrides)
    got = _row_outcome(signal_row, s)
    assert got == _row_outcome(_reference_signal_row, s)
    if any("\ud800" <= c <= "\udfff" for v in overrides.values() if v for c in v):
        assert isinstance(got, str) and "not storable as UTF-8 text" in got and got.startswith("signal 3 ")
