"""Prometheus queries narrowed per shard (#45): a plain selector shared by the policies of several
models asks, on a sharded replica, only for the series of the models it leads
(daemon/cluster/query_narrowing.py, hooked into the poller by daemon/wiring/sharding.py); a query
naming its target is narrowed already, and anything but a plain selector is fetched whole."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from core.query import Series
from daemon.cluster.query_narrowing import narrow_selector, narrowable, regex_escape
from daemon.cluster.shard_view import fleet_wide_triggers
from daemon.common.metrics import Metrics
from daemon.sources.prometheus import RangeResult
from daemon.storage.journal import Journal
from daemon.wiring.registries import action_registry, detector_registry
from daemon.wiring.sharding import narrow_group
from daemon.workers.poller import Poller
from policies.loader import PolicySet, load_policies_text

M = ["a.b", 'c"d', "e|f"]
EXPECTED = 'model=~"a\\\\.b|c\\"d|e\\\\|f"'  # each regex-escaped, then escaped for the PromQL string


@pytest.mark.parametrize("query, narrowed", [
    ("lab_latency", "lab_latency{" + EXPECTED + "}"),
    ("lab_latency{}", "lab_latency{" + EXPECTED + "}"),
    ('lab_latency{quantile="0.999"}', 'lab_latency{quantile="0.999", ' + EXPECTED + "}"),
    ('lab_latency{quantile="0.999",}', 'lab_latency{quantile="0.999", ' + EXPECTED + "}"),
    ('{__name__="lab_latency"}', '{__name__="lab_latency", ' + EXPECTED + "}"),
    ('lab_latency{path="/}{"}', 'lab_latency{path="/}{", ' + EXPECTED + "}"),  # braces inside a value
    ('lab_latency{path="a\\"}"}', 'lab_latency{path="a\\"}", ' + EXPECTED + "}"),  # an escaped quote
    ('lab_latency{model=~"a.*"}', 'lab_latency{model=~"a.*", ' + EXPECTED + "}"),  # matchers on one label AND
])
def test_a_plain_selector_gains_the_led_models_matcher(query: str, narrowed: str) -> None:
    assert narrow_selector(query, "model", M) == narrowed
    assert narrowable(query, "model")


@pytest.mark.parametrize("query", [
    "rate(lab_latency[1m])", "lab_latency[5m]", "lab_latency offset 5m", "sum by (model) (lab_latency)",
    "lab_latency > 1", "{}", "lab_latency{a='}'}", 'lab_latency{a="unclosed}', "lab_latency or other",
])
def test_anything_but_a_plain_selector_is_fetched_whole(query: str) -> None:
    assert narrow_selector(query, "model", M) is None and not narrowable(query, "model")


def test_no_models_or_a_bad_label_narrows_nothing() -> None:
    assert narrow_selector("x", "model", []) is None
    assert narrow_selector("x", "not a label", ["a"]) is None


def test_regex_escape_matches_literally() -> None:
    for value in ["a.b", "e|f", "(x)", "a+b*c?", "[1]", "{2}", "^s$", "back\\slash"]:
        assert re.fullmatch(regex_escape(value), value)
        assert not re.fullmatch(regex_escape(value), value + "x")
    assert re.fullmatch(regex_escape("a.b"), "axb") is None


def _policies(*models_queries: tuple[str, str]) -> PolicySet:
    text = "\n---\n".join(f"""
name: p-{i}
target: {{model: {model}}}
triggers:
  - detector: {{type: threshold, query: '{query}', params: {{threshold: 500}}}}
actions:
  - type: notify
    url: http://127.0.0.1:9/hook
""" for i, (model, query) in enumerate(models_queries))
    return load_policies_text(text, "p.yaml", action_registry(), detector_registry())


class _Prometheus:
    """Answers a selector's model matcher as Prometheus would (anchored regex), and records the asks."""

    def __init__(self, series: list[Series]) -> None:
        self.series, self.asked = series, []  # type: tuple[list[Series], list[str]]

    async def query_range(self, query: str, start: float, end: float, step: float) -> RangeResult:
        self.asked.append(query)
        found = re.search(r'model=~"((?:\\.|[^"\\])*)"', query)
        pattern = found[1].replace('\\"', '"').replace("\\\\", "\\") if found else ".*"
        return RangeResult(query, [s for s in self.series if re.fullmatch(pattern, s.labels.get("model", ""))])


async def test_a_sharded_poller_asks_only_for_its_models_series_and_each_watch_sees_its_own(tmp_path: Path) -> None:
    now = 10_000.0
    models = ["m.0", "m10", "m2", "m3"]  # m10 would match an unescaped "m.0"
    series = [Series({"model": m, "pod": f"{m}-{k}"}, tuple(now - 15.0 * i for i in range(4, -1, -1)), (100.0,) * 5)
              for m in models for k in range(2)]
    policies = _policies(*[(m, "lab_latency") for m in models], ("m2", 'lab_p99{model="$model"}'),
                         ("m3", "max by (model) (lab_latency)"))
    prom = _Prometheus(series)
    journal = Journal(tmp_path / "j.db")

    async def emit(signal: Any) -> None:
        raise AssertionError("nothing fires")

    async def offload(fn: Any, *args: Any) -> Any:
        return fn(*args)

    try:
        poller = Poller(prom, journal, Metrics(), detector_registry(), emit, offload,  # type: ignore[arg-type]
                        incremental_range_queries=False)
        led = {"m.0", "m2", "m3"}
        poller.follows = lambda p: p.target.model in led
        poller.narrow = narrow_group
        poller.sync(policies)
        queries = sorted(g.query for g in poller.groups.values())
        assert queries == sorted(['lab_latency{model=~"m\\\\.0|m2|m3"}',  # the plain selector, led models only
                                  'lab_p99{model="m2"}',  # names its target: narrowed already
                                  "max by (model) (lab_latency)"])  # not a plain selector: whole
        for group in list(poller.groups.values()):
            await poller.poll_group(group, now)
        whole = {g.query for g in poller.groups.values() if g.query.startswith("lab_latency")}
        asked = [q for q in prom.asked if q in whole]
        assert asked and all("m10" not in q for q in asked)
        narrowed = next(g for g in poller.groups.values() if g.query.startswith("lab_latency"))
        for w in narrowed.watches:  # each led policy's watch read exactly its model's two series
            assert w.latest is not None and {dict(s)["model"] for s in w.latest.series} == {w.policy.target.model}
            assert len(w.latest.series) == 2
        # A change of the shards led: the next sync narrows to the new set.
        led.discard("m3")
        poller.sync(policies)
        assert sorted(g.query for g in poller.groups.values()) == sorted(
            ['lab_latency{model=~"m\\\\.0|m2"}', 'lab_p99{model="m2"}'])
    finally:
        journal.close()


def test_only_what_cannot_be_narrowed_counts_as_fleet_wide() -> None:
    (plain, scoped, whole) = _policies(("a", "lab_latency"), ("b", 'lab_latency{model="$model"}'),
                                       ("c", "max by (model) (lab_latency)")).policies
    assert fleet_wide_triggers(plain) == [] and fleet_wide_triggers(scoped) == []
    assert fleet_wide_triggers(whole) == [(0, "max by (model) (lab_latency)")]


def test_start_sharding_hooks_the_pollers_filter_and_narrowing(tmp_path: Path) -> None:
    """The service's wiring: the poller follows the shards led and narrows its groups (not only when a
    test sets the hooks by hand)."""
    from types import SimpleNamespace

    from daemon.common.config import LeaderElectionSettings, ShardingSettings
    from daemon.wiring.sharding import start_sharding

    class Started:
        def __init__(self) -> None:
            self.started: list[str] = []

        def start(self, name: str, component: Any, **kw: Any) -> None:
            self.started.append(name)

    class Stub:
        owns: Any = None

    settings = SimpleNamespace(sharding=ShardingSettings(shards=4),  # what start_sharding reads
                               leader_election=LeaderElectionSettings.model_validate({"enabled": True}))
    journal = Journal(tmp_path / "j.db")
    try:
        poller = Poller(_Prometheus([]), journal, Metrics(), detector_registry(), None, None)  # type: ignore[arg-type]
        supervisor = Started()
        manager = start_sharding(object(), settings, "tailguard-a", journal, Metrics(), object(), Stub(),  # type: ignore[arg-type]
                                 poller, Stub(), supervisor, lambda led: None, lambda: 0.0)  # type: ignore[arg-type]
        assert supervisor.started == ["leader-election"] and poller.narrow is narrow_group
        assert poller.follows is not None
        poller.sync(_policies(("a", "lab_latency"), ("b", "lab_latency")))
        assert poller.groups == {}  # nothing led yet: nothing watched
        manager._led = frozenset(range(4))  # every shard led, within its renew deadline
        manager._renewed = dict.fromkeys(range(4), float("inf"))
        poller.sync(_policies(("a", "lab_latency"), ("b", "lab_latency")))
        assert [g.query for g in poller.groups.values()] == ['lab_latency{model=~"a|b"}']
    finally:
        journal.close()
