"""Outcome notifications against a real local HTTP receiver: formats and subscriptions, the bounded
queue (oldest dropped, counted), retries of 5xx and network errors with backoff, 4xx given up at
once, and a notifier that never raises or blocks its caller."""
from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any, AsyncIterator

import pytest
import yaml
from aiohttp import web

from daemon.common.config import ConfigError, NotificationSettings, Settings, load_settings
from daemon.common.metrics import Metrics
from daemon.workers.notifier import Notifier
from lab.ports import free_port


class Receiver:
    """A loopback endpoint that answers the scripted statuses in turn (the last one repeats)."""

    def __init__(self) -> None:
        self.statuses = [200]
        self.received: list[tuple[dict[str, str], Any]] = []
        self.hold: asyncio.Event | None = None  # when set, requests wait for it
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def _handle(self, request: web.Request) -> web.Response:
        if self.hold is not None:
            await self.hold.wait()
        self.received.append((dict(request.headers), await request.json()))
        return web.Response(status=self.statuses[min(len(self.received), len(self.statuses)) - 1])

    @property
    def bodies(self) -> list[Any]:
        return [body for _, body in self.received]

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/hook", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}/hook"

    async def stop(self) -> None:
        assert self._runner is not None
        await self._runner.cleanup()


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    r = Receiver()
    await r.start()
    yield r
    if r.hold is not None:
        r.hold.set()
    await r.stop()


class Sleeps:
    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)


def _sink(url: str, **kw: Any) -> NotificationSettings:
    return NotificationSettings.model_validate({"url": url, **kw})


def _event(name: str = "escalated", decision: int = 1) -> dict[str, Any]:
    return {"event": name, "policy": "ranker-tail", "target": "default/ranker", "decision": decision,
            "message": "P99.9 did not recover"}


def _faults(metrics: Metrics) -> float:
    return metrics.registry.get_sample_value("tailguard_faults_total", {"component": "notifications"}) or 0.0


async def test_settings_default_to_every_event_and_json():
    """`notifications` in the settings: a receiver subscribes to every outcome unless told."""
    settings = Settings.model_validate({"notifications": [{"url": "http://x/hook"},
                                                          {"url": "https://y", "format": "slack",
                                                           "events": ["escalated"]}]})
    every, slack = settings.notifications
    assert every.format == "json" and every.events == ["acted", "recovered", "not_recovered", "escalated", "failed",
                                                       "approval_requested", "approval_expired", "approved"]
    assert slack.events == ["escalated"]
    with pytest.raises(ValueError):
        Settings.model_validate({"notifications": [{"url": "http://x", "events": ["paged"]}]})


async def test_json_and_slack_receivers_get_the_events_they_subscribe_to(receiver: Receiver):
    """JSON gets the event as is, with the receiver's headers and an idempotency key; slack gets a
    text line; an event nobody subscribes to is not sent."""
    metrics = Metrics()
    notifier = Notifier([_sink(receiver.url, headers={"X-Team": "ml"}),
                         _sink(receiver.url, format="slack", events=["escalated"])], metrics)
    notifier.publish(_event("escalated", 4))
    notifier.publish(_event("acted", 5))
    await notifier.flush()
    await notifier.close()

    assert sorted(map(str, receiver.bodies)) == sorted(map(str, [
        _event("escalated", 4), _event("acted", 5),
        {"text": "tailguard escalated: ranker-tail on default/ranker: P99.9 did not recover"}]))
    headers = [h for h, body in receiver.received if body == _event("escalated", 4)][0]
    assert headers["X-Team"] == "ml" and headers["Idempotency-Key"] == "4/escalated"
    assert notifier.delivered == 3 and _faults(metrics) == 0

    quiet = Notifier([_sink(receiver.url, events=["failed"])], metrics)
    quiet.publish(_event("acted"))
    assert quiet.pending == 0
    await quiet.close()


async def test_full_queue_drops_the_oldest_and_counts_it(receiver: Receiver):
    """Queue of 2, five events published at once: the three oldest are dropped (faults counted), the
    newest two are delivered, in order."""
    metrics = Metrics()
    notifier = Notifier([_sink(receiver.url)], metrics, queue_size=2)
    for n in range(1, 6):
        notifier.publish(_event("acted", n))
    assert notifier.pending == 2 and notifier.dropped == 3 and _faults(metrics) == 3
    await notifier.flush()
    await notifier.close()
    assert [body["decision"] for body in receiver.bodies] == [4, 5]


async def test_5xx_is_retried_with_backoff_until_delivered(receiver: Receiver):
    """503, 502, then 200: three POSTs, waits of 1 s and 2 s between them, delivered once."""
    receiver.statuses = [503, 502, 200]
    sleeps = Sleeps()
    notifier = Notifier([_sink(receiver.url)], Metrics(), sleep=sleeps)
    notifier.publish(_event())
    await notifier.flush()
    await notifier.close()
    assert len(receiver.received) == 3 and sleeps.delays == [1.0, 2.0]
    assert notifier.delivered == 1 and notifier.given_up == 0


async def test_4xx_is_given_up_at_once_and_a_dead_receiver_after_max_attempts(receiver: Receiver):
    """A 400 is not retried; a receiver that refuses connections is tried maxAttempts times; both are
    counted as faults and nothing raises."""
    receiver.statuses = [400]
    metrics = Metrics()
    sleeps = Sleeps()
    dead = f"http://127.0.0.1:{free_port()}/hook"
    notifier = Notifier([_sink(receiver.url), _sink(dead, maxAttempts=3)], metrics, sleep=sleeps)
    notifier.publish(_event())
    await notifier.flush()
    await notifier.close()
    assert len(receiver.received) == 1
    assert sleeps.delays == [1.0, 2.0]  # the dead receiver's retries only
    assert notifier.given_up == 2 and _faults(metrics) == 2


async def test_publish_never_blocks_and_close_is_bounded(receiver: Receiver):
    """A receiver that never answers: publish returns at once, close gives up after its timeout."""
    receiver.hold = asyncio.Event()
    notifier = Notifier([_sink(receiver.url, timeoutSeconds=30)], Metrics())
    started = time.monotonic()
    for n in range(100):
        notifier.publish(_event("acted", n))
    assert time.monotonic() - started < 0.5
    await asyncio.sleep(0.1)  # the first POST is now waiting on the receiver
    await notifier.close(timeout_seconds=0.3)
    assert time.monotonic() - started < 5


def test_publish_outside_an_event_loop_does_not_raise():
    """No running loop (a misuse): the event is counted as a fault, the caller goes on."""
    metrics = Metrics()
    Notifier([_sink("http://127.0.0.1:1/hook")], metrics).publish(_event())
    assert _faults(metrics) == 1


async def test_url_file_is_read_at_start_and_its_url_never_logged(receiver: Receiver, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]):
    """A receiver's URL from urlFile (a mounted Secret key, relative paths resolved against the config's
    folder): the notifier reads it when built and posts there; a delivery given up names the file, not
    the secret URL."""
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "hook").write_text(receiver.url + "\n")
    dead = f"http://127.0.0.1:{free_port()}/hook/T000/SECRET"
    (secrets / "dead").write_text(dead)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"notifications": [
        {"urlFile": "secrets/hook", "format": "slack"}, {"url_file": "secrets/dead", "maxAttempts": 1}]}))
    sinks = load_settings(tmp_path / "config.yaml").notifications
    assert [s.url_file for s in sinks] == [secrets / "hook", secrets / "dead"] and sinks[0].url is None
    notifier = Notifier(sinks, Metrics())
    notifier.publish(_event())
    await notifier.flush()
    await notifier.close()
    assert receiver.bodies == [{"text": "tailguard escalated: ranker-tail on default/ranker: P99.9 did not recover"}]
    assert notifier.delivered == 1 and notifier.given_up == 1
    logged = "".join(capsys.readouterr())
    assert f"<{secrets / 'dead'}>" in logged and "SECRET" not in logged


def test_url_file_missing_or_without_a_url_is_a_config_error_at_start(tmp_path: Path):
    """An unreadable urlFile, or one that holds no http(s) URL, stops the start with one line naming
    the file (never its content)."""
    missing = tmp_path / "nope"
    with pytest.raises(ConfigError, match=f"^cannot read notification URL file {missing}: ") as excinfo:
        Notifier([NotificationSettings.model_validate({"urlFile": missing})], Metrics())
    assert "\n" not in str(excinfo.value)
    bad = tmp_path / "bad"
    bad.write_text("hooks.example.com/T000/SECRET")
    with pytest.raises(ConfigError, match="does not hold one http:// or https:// URL") as excinfo:
        Notifier([NotificationSettings.model_validate({"urlFile": bad})], Metrics())
    assert "SECRET" not in str(excinfo.value)


@pytest.mark.parametrize("receiver_settings", [
    {"url": "https://x/hook", "urlFile": "/var/run/secrets/hook"},
    {"format": "slack"},
], ids=["both", "neither"])
def test_exactly_one_of_url_and_url_file(receiver_settings: dict[str, Any], tmp_path: Path):
    """url and urlFile together (or neither) are refused by the settings, as load_settings reports it."""
    with pytest.raises(ValueError, match="exactly one of url and urlFile"):
        NotificationSettings.model_validate(receiver_settings)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"notifications": [receiver_settings]}))
    with pytest.raises(ConfigError, match="notifications.0: Value error, set exactly one of url and urlFile"):
        load_settings(tmp_path / "config.yaml")


async def test_a_hanging_receiver_delays_no_other(receiver: Receiver):
    """One receiver holds every request; the other gets all ten events while the first has not
    answered one: each receiver has its own sender."""
    hanging = Receiver()
    await hanging.start()
    hanging.hold = asyncio.Event()
    try:
        notifier = Notifier([_sink(hanging.url, timeoutSeconds=30), _sink(receiver.url)], Metrics())
        for n in range(10):
            notifier.publish(_event("acted", n))
        for _ in range(2000):  # bounded: the healthy receiver's ten deliveries
            if len(receiver.received) == 10:
                break
            await asyncio.sleep(0.01)
        assert [body["decision"] for body in receiver.bodies] == list(range(10))
        assert hanging.received == [] and notifier.pending == 9  # the hanging one's first is in flight
        await notifier.close(timeout_seconds=0.1)
    finally:
        hanging.hold.set()
        await hanging.stop()


async def test_a_full_queue_drops_routine_notices_before_any_escalation(receiver: Receiver):
    """Queue of 3 behind a held receiver: routine notices give way to escalations (the oldest
    routine first; a routine newcomer at a queue of escalations is dropped itself), and the
    escalations are sent first once the receiver answers."""
    receiver.hold = asyncio.Event()
    metrics = Metrics()
    notifier = Notifier([_sink(receiver.url)], metrics, queue_size=3)
    notifier.publish(_event("acted", 0))  # taken by the sender at once: in flight, not queued
    await asyncio.sleep(0.05)
    notifier.publish(_event("acted", 1))
    notifier.publish(_event("recovered", 2))
    notifier.publish(_event("escalated", 3))
    notifier.publish(_event("failed", 4))  # full: routine 1 dropped
    notifier.publish(_event("not_recovered", 5))  # full: routine 2 dropped
    notifier.publish(_event("acted", 6))  # full of urgent ones: 6 itself dropped
    assert notifier.dropped == 3 and _faults(metrics) == 3
    receiver.hold.set()
    await notifier.flush()
    await notifier.close()
    assert [(b["event"], b["decision"]) for b in receiver.bodies] == [
        ("acted", 0), ("escalated", 3), ("failed", 4), ("not_recovered", 5)]
