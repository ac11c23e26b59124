"""The webhook against hostile input, on a running daemon: every body gets a 4xx with a one-line
reason or a 2xx, never a 500; slow senders are bounded; the log stays one JSON line per record.

One regression test per class a hostile run found (deep JSON, a 4,301-digit integer, startsAt that
cannot convert to UTC, lone surrogates, a body that is not the gzip it claims, a half-sent body, too
many of them at once, tracebacks in the log), then property-based tests (hypothesis) that mutate
the real Alertmanager sample, its bytes, headers and encodings.
"""
from __future__ import annotations

import asyncio
import gzip
import http.client
import json
import logging
import socket
import sys
import threading
import zlib
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Iterator

import aiohttp
import pytest
import structlog
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from daemon.common.logs import configure_logging
from daemon.wiring.registries import action_registry, detector_registry
from daemon.wiring.service import Service
from tests.support.helpers import TOKEN, local_settings, payload_with, post_alerts, sample_payload
from tests.unit.test_policy_loader_properties import mutations

BODY_READ_TIMEOUT = 0.5
MAX_CONCURRENT = 4


# ---- a service with JSON logs captured ------------------------------------------------------------


@pytest.fixture
def json_logs(capsys: pytest.CaptureFixture[str]) -> Iterator[Callable[[], list[dict[str, Any]]]]:
    """The daemon's logging in JSON format; yields a function returning the lines logged so far,
    each parsed (a line that is not JSON fails the test). Restores the logging setup after."""
    root = logging.getLogger()
    saved = (list(root.handlers), root.level, structlog.get_config(), sys.excepthook, threading.excepthook)
    configure_logging("json", "info")
    captured: list[str] = []

    def lines() -> list[dict[str, Any]]:
        captured.extend(line for line in capsys.readouterr().err.splitlines() if line.strip())
        parsed = []
        for line in captured:
            try:
                parsed.append(json.loads(line))
            except ValueError:
                pytest.fail(f"a log line that is not JSON: {line[:300]!r}")
        return parsed

    yield lines
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])
    structlog.configure(**saved[2])
    sys.excepthook, threading.excepthook = saved[3], saved[4]
    logging.captureWarnings(False)


def _settings(tmp_path: Path) -> Any:
    pol = tmp_path / "policies"  # none: alerts are journaled, matching is not what is tested here
    pol.mkdir(exist_ok=True)
    return local_settings(tmp_path, pol, webhook={"bodyReadTimeoutSeconds": BODY_READ_TIMEOUT,
                                                  "maxConcurrentRequests": MAX_CONCURRENT})


@pytest.fixture
async def service(tmp_path: Path, json_logs: Callable[[], list[dict[str, Any]]]) -> AsyncIterator[Service]:
    async with Service(_settings(tmp_path), action_registry(), detector_registry()) as svc:
        yield svc


def _request(body: bytes, headers: dict[str, str] | None = None, *, token: str | None = TOKEN,
             content_length: int | None = None, raw_headers: bytes = b"") -> bytes:
    """A raw HTTP/1.1 POST to the webhook (raw, so that headers and lengths can lie)."""
    head = {"Host": "tailguard", "Content-Type": "application/json",
            "Content-Length": str(len(body) if content_length is None else content_length)}
    if token is not None:
        head["Authorization"] = f"Bearer {token}"
    head.update(headers or {})
    lines = "".join(f"{k}: {v}\r\n" for k, v in head.items()).encode("utf-8", "surrogateescape")
    return b"POST /api/v1/alerts HTTP/1.1\r\n" + lines + raw_headers + b"\r\n" + body


async def _exchange(port: int, data: bytes, timeout: float = 10.0) -> tuple[int, dict[str, str], bytes]:
    """Send `data`, read one response until the server closes or Content-Length is met."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        return await asyncio.wait_for(_read_response(reader), timeout)
    finally:
        writer.close()
        await writer.wait_closed()


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines if h)}
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return int(status_line.split()[1]), headers, body


def _json(body: Any) -> bytes:
    return json.dumps(body).encode()


async def _metrics(svc: Service) -> str:
    async with aiohttp.ClientSession() as http_session:
        async with http_session.get(f"http://127.0.0.1:{svc.port}/metrics") as r:
            return await r.text()


def _no_tracebacks(lines: list[dict[str, Any]]) -> None:
    """No record carries a traceback, and the catch-all never answered."""
    assert [ln for ln in lines if "exception" in ln or "Traceback" in json.dumps(ln)] == []
    assert [ln for ln in lines if "unhandled" in ln["event"].lower()] == []


# ---- regression: one test per class that reached a 500 ----------------------------------------------


def _with_alert(**fields: Any) -> dict[str, Any]:
    body = sample_payload()
    body["alerts"][0].update(fields)
    return body


def _with_labels(**labels: str) -> dict[str, Any]:
    body = sample_payload()
    body["alerts"][0]["labels"].update(labels)
    return body


@pytest.mark.parametrize(("raw", "status", "reason"), [
    (b"[" * 100_000 + b"]" * 100_000, 400, "nested deeper than"),
    (b'{"a": ' * 50_000 + b"1" + b"}" * 50_000, 400, "nested deeper than"),
    (_json(sample_payload()).replace(b'"truncatedAlerts": 0', b'"truncatedAlerts": ' + b"9" * 4301),
     400, "a number of 4301 characters"),
    (_json(sample_payload()).replace(b'"truncatedAlerts": 0', b'"truncatedAlerts": 1e999'), 400, "out of range"),
    (_json(sample_payload()).replace(b'"truncatedAlerts": 0', b'"truncatedAlerts": NaN'), 400, "NaN"),
    (_json(_with_alert(startsAt="0001-01-01T00:00:00+01:00")), 422, "alerts.0.startsAt: Value error, must be within"),
    (_json(_with_alert(startsAt="9999-12-31T23:59:59-01:00")), 422, "alerts.0.startsAt: Value error, must be within"),
    (_json(_with_alert(startsAt="1969-12-31T23:59:59Z")), 422, "alerts.0.startsAt"),
    (_json(_with_labels(model="\ud800")), 422, "alerts.0.labels.model: not valid Unicode text"),
    (_json(_with_labels(alertname="x\udfff")), 422, "alerts.0.labels.alertname: not valid Unicode text"),
    (_json(_with_alert(fingerprint="\ud800")), 422, "alerts.0.fingerprint: not valid Unicode text"),
    (_json(_with_labels(**{"\ud800": "x"})), 422, r"alerts.0.labels.'\ud800': not valid Unicode text"),
    (_json(sample_payload()).replace(b'"ranker"', b'"\xed\xa0\x80"', 1), 400, "not UTF-8"),
    (_json(_with_labels(**{f"l{i}": "v" for i in range(200)})), 422, "alerts.0.labels: Dictionary should have at most 128"),
    (_json(_with_labels(model="m" * 20_000)), 422, "alerts.0.labels.model: String should have at most 16384"),
    (_json(_with_alert(fingerprint="f" * 300)), 422, "alerts.0.fingerprint: String should have at most 256"),
], ids=["deep-array", "deep-object", "int-4301-digits", "float-overflow", "nan", "starts-year-1", "starts-year-9999",
        "starts-before-1970", "surrogate-label", "surrogate-alertname", "surrogate-fingerprint", "surrogate-key",
        "encoded-surrogate", "too-many-labels", "huge-label-value", "huge-fingerprint"])
async def test_hostile_body_gets_a_4xx_with_one_line_reason(service: Service, json_logs: Callable[[], Any],
                                                            raw: bytes, status: int, reason: str):
    """Each class that once reached a 500 gets its 4xx, the reason says why on one line, nothing is
    journaled, the journal still takes the next valid alert, and the log has no traceback."""
    got, body = await post_alerts(service, raw)
    assert (got, reason in body["error"]) == (status, True), body
    assert "\n" not in body["error"] and len(body["error"]) <= 300
    assert await service.journal.signals.all.in_thread() == []
    assert await post_alerts(service, _json(sample_payload())) == (200, {"accepted": 1, "duplicates": 0})
    assert len(await service.journal.signals.all.in_thread()) == 1
    metrics = await _metrics(service)
    assert f'tailguard_webhooks_total{{code="{status}"}} 1.0' in metrics
    assert 'code="500"' not in metrics and "tailguard_faults_total{" not in metrics
    _no_tracebacks(json_logs())


async def test_firing_alert_with_zero_ends_at_is_accepted_and_ends_at_is_never_converted(service: Service):
    """A firing alert's endsAt is 0001-01-01T00:00:00Z (Go's zero time): accepted, like an endsAt that
    would overflow on conversion; only startsAt is checked. A naive startsAt reads as UTC."""
    assert sample_payload()["alerts"][0]["endsAt"] == "0001-01-01T00:00:00Z"
    assert (await post_alerts(service, _json(sample_payload())))[0] == 200
    body = _with_alert(endsAt="9999-12-31T23:59:59-01:00", startsAt="2026-11-29T18:00:00")
    assert await post_alerts(service, _json(body)) == (200, {"accepted": 1, "duplicates": 0})
    keys = sorted(s.dedup_key for s in await service.journal.signals.all.in_thread())
    assert keys[0].endswith(":2026-11-29T17:26:08.551000+00:00:firing")
    assert keys[1].endswith(":2026-11-29T18:00:00+00:00:firing")


@pytest.mark.parametrize(("encoding", "body", "status", "reason"), [
    ("gzip", b"this is not gzip", 400, "unreadable body: Can not decode content-encoding: gzip"),
    ("deflate", b"nor deflate", 400, "unreadable body"),
    ("x-gzip", gzip.compress(_json(sample_payload())), 400, "unsupported Content-Encoding 'x-gzip'"),
    ("gzip, gzip", gzip.compress(gzip.compress(_json(sample_payload()))), 400, "unsupported Content-Encoding"),
    ("br", b"\x00\x01", 400, "unsupported Content-Encoding 'br'"),
    ("gzip", gzip.compress(_json(sample_payload())), 200, ""),
    ("deflate", zlib.compress(_json(sample_payload())), 200, ""),
    ("identity", _json(sample_payload()), 200, ""),
], ids=["bad-gzip", "bad-deflate", "x-gzip", "gzip-twice", "br", "gzip", "deflate", "identity"])
async def test_content_encoding_is_decoded_or_refused(service: Service, json_logs: Callable[[], Any],
                                                     encoding: str, body: bytes, status: int, reason: str):
    """A body that does not match its Content-Encoding is a 400, and so is an encoding we do not
    decode (it is never read as raw JSON); gzip and deflate are decoded."""
    got, answer = await post_alerts(service, body, headers={"Content-Encoding": encoding})
    assert got == status, answer
    assert reason in answer.get("error", "")
    _no_tracebacks(json_logs())


@pytest.mark.slow
async def test_half_sent_body_is_answered_408_and_closed(service: Service, json_logs: Callable[[], Any]):
    """A sender that stops mid-body gets 408 after bodyReadTimeoutSeconds and its connection is
    closed; it is not waited for."""
    assert service.port is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", service.port)
    loop = asyncio.get_running_loop()
    started = loop.time()
    writer.write(_request(b'{"version": "4", "al', content_length=1000))
    await writer.drain()
    status, headers, body = await asyncio.wait_for(_read_response(reader), 5)
    assert (status, json.loads(body)["error"]) == (408, f"body not received within {BODY_READ_TIMEOUT:g} s")
    assert BODY_READ_TIMEOUT * 0.9 <= loop.time() - started < BODY_READ_TIMEOUT + 2
    assert headers["connection"] == "close"
    assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the daemon
    writer.close()
    assert 'tailguard_webhooks_total{code="408"} 1.0' in await _metrics(service)
    _no_tracebacks(json_logs())


@pytest.mark.slow
async def test_too_many_half_sent_bodies_get_503_with_retry_after(service: Service, json_logs: Callable[[], Any]):
    """Past maxConcurrentRequests unfinished webhooks, one more is answered 503 + Retry-After at once;
    those admitted time out with 408; afterwards a valid alert is accepted."""
    assert service.port is not None
    conns = []
    for _ in range(MAX_CONCURRENT + 3):
        reader, writer = await asyncio.open_connection("127.0.0.1", service.port)
        writer.write(_request(b'{"ver', content_length=500))
        await writer.drain()
        conns.append((reader, writer))
    answers = [await asyncio.wait_for(_read_response(r), 5) for r, _ in conns]
    for _, w in conns:
        w.close()
    assert sorted(a[0] for a in answers) == [408] * MAX_CONCURRENT + [503] * 3
    refused = next(a for a in answers if a[0] == 503)
    assert refused[1]["retry-after"] == "1"
    assert json.loads(refused[2])["error"] == f"more than {MAX_CONCURRENT} webhook requests in progress; retry"
    assert (await post_alerts(service, _json(sample_payload())))[0] == 200
    metrics = await _metrics(service)
    assert 'tailguard_webhooks_total{code="503"} 3.0' in metrics
    assert f'tailguard_webhooks_total{{code="408"}} {MAX_CONCURRENT}.0' in metrics
    _no_tracebacks(json_logs())


async def test_unauthenticated_half_sent_body_is_refused_at_once(service: Service):
    """Without the token the body is not waited for: 401 before bodyReadTimeoutSeconds."""
    assert service.port is not None
    loop = asyncio.get_running_loop()
    started = loop.time()
    status, _, _ = await _exchange(service.port, _request(b"{", token="wrong", content_length=100))
    assert status == 401 and loop.time() - started < BODY_READ_TIMEOUT


@pytest.mark.slow
async def test_stop_does_not_wait_for_a_stalled_sender(tmp_path: Path):
    """A client holding a half-sent body delays stopping by at most bodyReadTimeoutSeconds (aiohttp's
    own shutdown timeout is 60 s; the pod's grace period 30 s)."""
    loop = asyncio.get_running_loop()
    async with Service(_settings(tmp_path), action_registry(), detector_registry()) as svc:
        assert svc.port is not None
        reader, writer = await asyncio.open_connection("127.0.0.1", svc.port)
        writer.write(_request(b'{"ver', content_length=500))
        await writer.drain()
        await asyncio.sleep(0.1)
        stopping = loop.time()
    assert loop.time() - stopping < BODY_READ_TIMEOUT + 2
    writer.close()


async def test_malformed_request_logs_one_json_line_without_traceback(service: Service,
                                                                     json_logs: Callable[[], Any]):
    """aiohttp's own errors (a header with a control character and a bare newline) are one JSON
    warning line each, the header's bytes escaped inside it; no traceback, no plain-text line."""
    assert service.port is not None
    status, _, _ = await _exchange(service.port, _request(b"{}", raw_headers=b"X-Bad: a\x01\nInjected: b\r\n"))
    assert status == 400
    status, _, _ = await _exchange(service.port, _request(b"{}", {"Content-Encoding": "zstd"}))
    assert status == 400
    lines = json_logs()
    errors = [ln for ln in lines if ln.get("logger") == "aiohttp.server"]
    assert len(errors) == 2 and {e["level"] for e in errors} == {"warning"}
    assert "Invalid header value char" in errors[0]["error"]
    _no_tracebacks(lines)


def test_library_logs_are_json_lines_with_their_exception_inside(json_logs: Callable[[], Any]):
    """Standard-library loggers (asyncio's, a library that installed its own stderr handler) come out
    as one JSON line each, the exception inside, newlines escaped."""
    library = logging.getLogger("tests.chatty_library")
    library.addHandler(logging.StreamHandler(sys.stderr))
    library.propagate = False
    configure_logging("json", "info")  # again: a library that prints on its own is routed too
    assert library.handlers == [] and library.propagate
    try:
        raise ValueError("bad\nvalue")
    except ValueError:
        logging.getLogger("asyncio").exception("Task exception was never retrieved")
    library.warning("header %s", "a\nInjected: b")  # raw newline: escaped inside the one line
    library.debug("below the level")
    first, second = json_logs()
    assert (first["logger"], first["level"], first["event"]) == ("asyncio", "error", "Task exception was never retrieved")
    assert first["exception"].startswith("Traceback") and "ValueError: bad\nvalue" in first["exception"]
    assert (second["logger"], second["event"]) == ("tests.chatty_library", "header a\nInjected: b")


async def test_unexpected_error_is_a_counted_json_500_logged_once(service: Service, json_logs: Callable[[], Any],
                                                                  monkeypatch: pytest.MonkeyPatch):
    """The catch-all: an exception nobody expected becomes a JSON 500, counted for the webhook, by
    route and as a fault, and logged once as one JSON line with the exception inside it."""
    async def broken(signals: Any) -> Any:
        raise RuntimeError("disk on fire\nsecond line")

    monkeypatch.setattr(service.journal.signals, "intake", broken)
    status, body = await post_alerts(service, _json(sample_payload()))
    assert (status, body) == (500, {"error": "internal error; the daemon's log has the details"})
    metrics = await _metrics(service)
    assert 'tailguard_webhooks_total{code="500"} 1.0' in metrics
    assert 'tailguard_http_responses_total{code="500",route="/api/v1/alerts"} 1.0' in metrics
    assert 'tailguard_faults_total{component="http"} 1.0' in metrics
    (line,) = [ln for ln in json_logs() if "exception" in ln]
    assert line["event"].startswith("unhandled error in request handler")
    assert "RuntimeError: disk on fire" in line["exception"] and line["route"] == "/api/v1/alerts"


async def test_every_response_is_counted_by_route_and_status(service: Service):
    """/metrics counts each response: the webhook, health, unknown paths (one 'unmatched' route, not
    one per path) and wrong methods."""
    base = f"http://127.0.0.1:{service.port}"
    async with aiohttp.ClientSession() as http_session:
        for path in ("/healthz", "/nope", "/nope/again"):
            async with http_session.get(base + path):
                pass
        async with http_session.get(base + "/api/v1/alerts") as r:
            assert r.status == 405
    await post_alerts(service, b"{", token=None)
    metrics = await _metrics(service)
    for sample in ('{code="200",route="/healthz"} 1.0', '{code="404",route="unmatched"} 2.0',
                   '{code="405",route="/api/v1/alerts"} 1.0', '{code="401",route="/api/v1/alerts"} 1.0'):
        assert "tailguard_http_responses_total" + sample in metrics


# ---- property-based: random and mutated requests against a daemon in its own thread -----------------


class ThreadedService:
    """A Service on its own event loop in a thread: hypothesis drives tests synchronously."""

    def __init__(self, settings: Any) -> None:
        self.settings = settings
        self.svc: Service | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="tailguard-under-test", daemon=True)

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # reported to the test thread
            self._error = exc
            self._ready.set()

    async def _main(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with Service(self.settings, action_registry(), detector_registry()) as svc:
            self.svc = svc
            self._ready.set()
            await self._stop.wait()

    def __enter__(self) -> "ThreadedService":
        self._thread.start()
        assert self._ready.wait(60), "service did not start"
        if self._error is not None:
            raise self._error
        return self

    def __exit__(self, *exc: Any) -> None:
        assert self.loop is not None and self._stop is not None
        self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)
        assert not self._thread.is_alive()

    @property
    def port(self) -> int:
        assert self.svc is not None and self.svc.port is not None
        return self.svc.port

    def run(self, coro: Any) -> Any:
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def send(self, data: bytes) -> tuple[int, bytes]:
        """One raw request on a fresh connection; the final status (100 Continue skipped) and body."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=10) as sock:
            sock.sendall(data)
            response = http.client.HTTPResponse(sock)
            response.begin()
            return response.status, response.read()


@pytest.fixture
def threaded(tmp_path: Path, json_logs: Callable[[], list[dict[str, Any]]]) -> Iterator[ThreadedService]:
    with ThreadedService(_settings(tmp_path)) as ts:
        yield ts


SAMPLE = sample_payload()
FAST = settings(max_examples=120, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# Values a sender could put anywhere: odd text (surrogates, controls), numbers of every size, odd
# timestamps, and nesting.
_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=10**30, max_value=10**60),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=30),
    st.text(st.characters(codec=None, categories=["Cs", "Cc", "Zl", "Zp", "Co"]), min_size=1, max_size=5),
    st.sampled_from(["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00", "0001-01-01T00:00:00Z",
                     "1970-01-01T00:00:00+14:00", "2026-13-01T00:00:00Z", "2026-11-29T17:26:08.551Z", "",
                     "firing", "resolved", "4", "\ud800", "a\nb", "x" * 5000]),
)
_values = st.recursive(_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)), max_leaves=12)


# The real sample with a few of its values replaced, keys added or removed.
mutated_samples = mutations(SAMPLE, _values, keys=st.text(max_size=8))


@st.composite
def encoded_bodies(draw: st.DrawFn) -> bytes:
    """Mutated samples as JSON (escaped or raw UTF-8, surrogates passed through), or their bytes
    flipped, cut and spliced, or random bytes."""
    kind = draw(st.sampled_from(["json", "bytes", "random"]))
    if kind == "random":
        return draw(st.binary(max_size=300))
    text = json.dumps(draw(mutated_samples), ensure_ascii=draw(st.booleans()))
    raw = text.encode("utf-8", "surrogatepass")
    if kind == "bytes" and raw:
        for _ in range(draw(st.integers(1, 4))):
            at = draw(st.integers(0, len(raw) - 1))
            raw = raw[:at] + draw(st.binary(max_size=4)) + raw[at + draw(st.integers(0, 3)):]
    return raw


_header_names = st.sampled_from(["Content-Type", "Content-Encoding", "Authorization", "Expect", "Connection",
                                 "Accept", "User-Agent", "X-Forwarded-For", "Transfer-Encoding"])
_header_values = st.one_of(st.sampled_from(["gzip", "deflate", "br", "zstd", "identity", "gzip, gzip",
                                            "100-continue", "close", "keep-alive", f"Bearer {TOKEN}", "Bearer",
                                            "chunked", "text/plain", ""]),
                           st.text(st.characters(codec="latin-1", exclude_characters="\r\n"), max_size=20),
                           st.text(st.characters(codec="utf-8", exclude_characters="\r\n"), max_size=20))


@st.composite
def requests(draw: st.DrawFn) -> bytes:
    """A webhook request: a body from encoded_bodies, possibly compressed (rightly or not), with
    random extra headers and sometimes no or a wrong token."""
    body = draw(encoded_bodies())
    headers = draw(st.dictionaries(_header_names, _header_values, max_size=3))
    compress = draw(st.sampled_from([None, "gzip", "deflate"]))
    if compress is not None:
        body = gzip.compress(body) if compress == "gzip" else zlib.compress(body)
        headers.setdefault("Content-Encoding", compress)
    if headers.get("Transfer-Encoding", "").lower() == "chunked":
        del headers["Transfer-Encoding"]  # framing is the parser's business; keep Content-Length true
    token = draw(st.sampled_from([TOKEN, TOKEN, TOKEN, None, "wrong"]))
    return _request(body, headers, token=token)


def _acceptable(status: int) -> bool:
    """4xx and 2xx; of 5xx only the documented 503 (busy, journal down, not the leader)."""
    return status < 500 or status == 503


def _after_the_storm(ts: ThreadedService, json_logs: Callable[[], list[dict[str, Any]]]) -> None:
    """No 500 was counted, the log is JSON without tracebacks, and a valid alert is still accepted
    and journaled."""
    assert ts.svc is not None
    metrics = ts.run(_metrics(ts.svc))
    assert 'code="500"' not in metrics and 'component="http"' not in metrics
    _no_tracebacks(json_logs())
    fresh = json.dumps(payload_with(starts_at="2030-01-01T00:00:00Z", fingerprint="feedfacecafebeef")).encode()
    status, body = ts.send(_request(fresh))
    assert (status, json.loads(body)) == (200, {"accepted": 1, "duplicates": 0})
    journaled = ts.run(ts.svc.journal.signals.all.in_thread())
    assert any(s.dedup_key == "alert:feedfacecafebeef:2030-01-01T00:00:00+00:00:firing" for s in journaled)


@pytest.mark.slow
def test_mutated_samples_never_get_a_500(threaded: ThreadedService,
                                         json_logs: Callable[[], list[dict[str, Any]]]):
    """Mutations of the real Alertmanager body (values anywhere replaced with odd text, numbers,
    timestamps, nesting) get 200 or a 4xx with a one-line JSON reason."""
    @FAST
    @given(mutated_samples, st.booleans())
    def check(doc: Any, ascii_only: bool) -> None:
        raw = json.dumps(doc, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")
        status, body = threaded.send(_request(raw))
        assert _acceptable(status), (status, body)
        answer = json.loads(body)
        assert status == 200 or ("\n" not in answer["error"] and answer["error"]), answer

    check()
    _after_the_storm(threaded, json_logs)


@pytest.mark.slow
def test_random_requests_never_get_a_500(threaded: ThreadedService,
                                         json_logs: Callable[[], list[dict[str, Any]]]):
    """Random and mutated bytes, random headers, tokens and content encodings (right or wrong):
    never a 5xx but the documented 503, never a traceback in the log."""
    @FAST
    @given(requests())
    def check(data: bytes) -> None:
        status, body = threaded.send(data)
        assert _acceptable(status), (status, body)

    check()
    _after_the_storm(threaded, json_logs)
