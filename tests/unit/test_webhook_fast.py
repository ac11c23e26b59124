"""The msgspec path of the webhook (daemon/http/webhook_fast.py) takes only bodies the full path
(json with bounds, then pydantic) accepts, and gives the same signals for them; read_webhook
answers every body as the full path does."""
from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from daemon.http.intake import (
    MAX_ANNOTATION_VALUE_CHARS, MAX_FINGERPRINT_CHARS, MAX_LABEL_NAME_CHARS, MAX_LABEL_VALUE_CHARS, MAX_LABELS,
    BodyError, PayloadError, alert_signals, read_payload,
)
from daemon.http.webhook_fast import fast_webhook, read_webhook
from tests.support.helpers import sample_payload


def _full(raw: bytes) -> Any:
    """What the full path answers: the signals (with the text that identifies them) or the error."""
    try:
        payload = read_payload(raw)
    except (BodyError, PayloadError) as exc:
        return (type(exc).__name__, str(exc))
    return ("ok", _facts(alert_signals(payload)), payload.groupKey)


def _facts(signals: list[Any]) -> list[Any]:
    """Each signal, and what equality of datetimes would not show (offset, isoformat), and its
    journal payload's values."""
    return [(s, s.observed_at.isoformat(), s.observed_at.utcoffset(), json.loads(s.summary_json()))
            for s in signals]


def _fast(raw: bytes) -> Any:
    got = fast_webhook(raw)
    return None if got is None else ("ok", _facts(got.signals), got.group_key)


def _through_read_webhook(raw: bytes) -> Any:
    try:
        signals, group_key = read_webhook(raw)
    except (BodyError, PayloadError) as exc:
        return (type(exc).__name__, str(exc))
    return ("ok", _facts(signals), group_key)


def _check(raw: bytes) -> Any:
    full, fast = _full(raw), _fast(raw)
    if fast is not None:
        assert fast == full
    assert _through_read_webhook(raw) == full
    return fast


# ---- bodies of the usual shape, and near misses ----------------------------------------------

def _stamp(y: int, mo: int, d: int, h: int, mi: int, s: int, frac: str, off: str) -> str:
    return f"{y:04d}-{mo:02d}-{d:02d}T{h:02d}:{mi:02d}:{s:02d}{frac}{off}"


fractions = st.sampled_from(["", ".5", ".551", ".551234", ".5512345", ".551234567"])
good_timestamps = st.builds(_stamp, st.integers(1970, 9000), st.integers(1, 12), st.integers(1, 28),
                            st.integers(0, 23), st.integers(0, 59), st.integers(0, 59), fractions,
                            st.sampled_from(["Z", "+01:00", "-01:00", "+00:00", "-00:00", "+23:59"]))
odd_timestamps = st.one_of(
    st.builds(_stamp, st.sampled_from([1, 1969, 1970, 9000, 9001, 9999]), st.integers(1, 13), st.integers(1, 32),
              st.integers(0, 24), st.integers(0, 60), st.integers(0, 60),
              fractions | st.sampled_from([".9999999999", "."]),
              st.sampled_from(["Z", "z", "+01:00", "-01:00", "+24:00", "", "+0100"])),
    st.sampled_from(["2026-11-29 17:26:08Z", "2026-11-29t17:26:08Z", "20261129T172608Z", "2026-W48-7T00:00:00Z",
                     "2026-11-29T17:26:08.551Z ", "\u0661\u0660\u0662\u0666-11-29T17:26:08Z",
                     "0001-01-01T00:00:00Z", "0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00", "", "now"]),
)
text = st.text(alphabet=st.characters(codec="utf-8"), max_size=8)


def mostly(good: Any, odd: Any) -> Any:
    """`good` 19 times in 20: most bodies have the usual shape, the rest are near misses."""
    return st.integers(0, 19).flatmap(lambda n: good if n else odd)


@st.composite
def alerts(draw: Any) -> dict[str, Any]:
    labels = draw(st.dictionaries(text, text, max_size=3))
    if draw(mostly(st.just(True), st.just(False))):
        labels["alertname"] = draw(text)
    alert: dict[str, Any] = {"status": draw(mostly(st.sampled_from(["firing", "resolved"]),
                                                   st.sampled_from(["Firing", "pending", 1]))),
                             "labels": labels, "startsAt": draw(mostly(good_timestamps, odd_timestamps))}
    for key, values in (("annotations", st.dictionaries(text, text, max_size=2)),
                        ("endsAt", mostly(st.none() | good_timestamps | st.just("0001-01-01T00:00:00Z"), odd_timestamps)),
                        ("generatorURL", text), ("fingerprint", text)):
        if draw(st.booleans()):
            alert[key] = draw(values)
    if draw(mostly(st.just(False), st.just(True))):
        alert["extra"] = draw(st.integers())
    return alert


@st.composite
def bodies(draw: Any) -> bytes:
    body: dict[str, Any] = {"version": draw(mostly(st.just("4"), st.sampled_from([4, "3", None]))),
                            "status": draw(mostly(st.sampled_from(["firing", "resolved"]), st.just("x"))),
                            "alerts": draw(st.lists(alerts(), min_size=draw(mostly(st.just(1), st.just(0))), max_size=3))}
    for key, values in (("receiver", text), ("groupKey", text), ("groupLabels", st.dictionaries(text, text, max_size=2)),
                        ("commonLabels", st.dictionaries(text, text, max_size=2)),
                        ("commonAnnotations", mostly(st.dictionaries(text, text, max_size=2), st.integers())),
                        ("externalURL", text),
                        ("truncatedAlerts", mostly(st.integers(-(2**63), 2**63 - 1), st.one_of(
                            st.integers(10**18, 10**45), st.just("2"), st.floats(allow_nan=False, allow_infinity=False))))):
        if draw(st.booleans()):
            body[key] = draw(values)
    return json.dumps(body, ensure_ascii=draw(st.booleans())).encode()


@pytest.mark.slow
@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bodies())
def test_the_fast_path_takes_only_what_the_full_path_takes_alike(raw: bytes):
    _check(raw)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64) | st.text(max_size=40).map(lambda t: t.encode("utf-8", "surrogatepass")))
def test_any_bytes_get_the_full_paths_answer(raw: bytes):
    _check(raw)


# ---- what the fast path takes, and the cases that go to the full path ------------------------

def _raw(body: dict[str, Any]) -> bytes:
    return json.dumps(body).encode()


@pytest.mark.parametrize("name", ["alertmanager_webhook_v4.json", "alertmanager_webhook_v4_resolved.json"])
def test_alertmanagers_own_bodies_take_the_fast_path(name: str):
    assert _check(_raw(sample_payload(name))) is not None


@pytest.mark.parametrize("starts_at", ["2026-11-29T17:26:08.551234567Z", "2026-11-29T17:26:08.9999999Z",
                                       "2026-11-29T17:26:08+05:30", "2026-11-29T17:26:08-00:00"])
def test_go_timestamps_read_as_the_full_path_reads_them(starts_at: str):
    body = sample_payload()
    body["alerts"][0]["startsAt"] = starts_at
    assert _check(_raw(body)) is not None  # nanoseconds truncated, as pydantic does (msgspec would round)


def _mutated(edit: Any) -> bytes:
    body = sample_payload()
    edit(body)
    return _raw(body)


@pytest.mark.parametrize("edit", [
    lambda b: b.update(unknown={"nested": [1]}),                                # a field it does not know
    lambda b: b["alerts"][0].update(startsAt="2026-11-29 17:26:08Z"),          # a form pydantic reads too
    lambda b: b["alerts"][0].update(startsAt="1969-12-31T23:59:59Z"),          # before 1970: 422
    lambda b: b["alerts"][0].update(startsAt="0001-01-01T00:00:00+01:00"),     # no UTC for it: 422
    lambda b: b["alerts"][0]["labels"].pop("alertname"),                        # 422
    lambda b: b["alerts"][0]["labels"].update({f"l{i}": "v" for i in range(MAX_LABELS)}),
    lambda b: b["alerts"][0]["labels"].update(x="v" * (MAX_LABEL_VALUE_CHARS + 1)),
    lambda b: b["alerts"][0]["labels"].update({"k" * (MAX_LABEL_NAME_CHARS + 1): "v"}),
    lambda b: b["alerts"][0]["annotations"].update(x="v" * (MAX_ANNOTATION_VALUE_CHARS + 1)),
    lambda b: b["alerts"][0].update(fingerprint="f" * (MAX_FINGERPRINT_CHARS + 1)),
    lambda b: b.update(truncatedAlerts=10**30),                                 # past int64: pydantic takes it
    lambda b: b.update(truncatedAlerts=10**45),                                 # a number too long: 400
    lambda b: b.update(truncatedAlerts="3"),                                    # pydantic's lax int
    lambda b: b.update(alerts=[]),
    lambda b: b.update(version=4),
    lambda b: b["alerts"][0].update(status="FIRING"),
])
def test_other_bodies_go_to_the_full_path(edit: Any):
    assert _check(_mutated(edit)) is None


def test_bounds_are_inclusive_as_in_the_full_path():
    def edit(b: dict[str, Any]) -> None:
        labels = b["alerts"][0]["labels"]
        labels.update({f"l{i}": "v" for i in range(MAX_LABELS - len(labels))})
        labels["l0"] = "v" * MAX_LABEL_VALUE_CHARS
        b["alerts"][0]["fingerprint"] = "f" * MAX_FINGERPRINT_CHARS
    assert _check(_mutated(edit)) is not None


@pytest.mark.parametrize("raw", [
    b'{"version": "4", "receiver": "a", "receiver": "b"',                         # cut short
    b'\xef\xbb\xbf{"version": "4"}',                                              # a byte order mark
    b'{"version": "4", "status": "firing", "receiver": "\\ud800", "alerts": []}',  # a surrogate escape
    b'{"version": "4", "status": "firing", "receiver": "\xed\xa0\x80", "alerts": []}',  # an encoded one
])
def test_malformed_bodies_get_the_full_paths_error(raw: bytes):
    assert _check(raw) is None


def test_a_repeated_key_keeps_the_last_value_on_both_paths():
    raw = _raw(sample_payload())
    raw = raw.replace(b'"receiver": ', b'"receiver": "first", "receiver": ', 1)
    assert _check(raw) is not None
