"""Healthy noise must produce no action: the example policy (examples/policies/ranker.yaml, only its
endpoints filled in) on a healthy `ranker` (v1 and v2 2-4 ms, no slow path) through traffic bursts
and drops, a healthy redeploy, a Triton restart (counters reset) and a Prometheus gap, on real
Triton and Prometheus. Each case asserts no decision, no signal, and that the detector kept scoring
the served version through the disturbance (fresh, scored verdicts in the journal and in
`tailguard_detections_total`), so a blind detector cannot pass. The restart case then switches a
real defect on in v2 (2% of requests 900 ms more) and the same policy must roll back: the detector
sees through the reset. The full-length cases are bench/bench_healthy.py."""
from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from daemon.wiring.registries import action_registry, detector_registry
from daemon.wiring.service import Service
from lab import policies
from lab.load import run_load
from lab.policies import triton_endpoints
from lab.prometheus import PrometheusServer
from lab.triton import TritonServer, load_version, served_versions
from tests.support.helpers import local_settings
from tests.support.paths import REPO

pytestmark = pytest.mark.integration

EXAMPLE = REPO / "examples" / "policies" / "ranker.yaml"
POLICY = "ranker-tail"
PROMETHEUS_COPY = "ranker-tail-prometheus"
WARMUP_S = 20.0
"""Load before a disturbance: counters counted per step score a series' steps from its 11th (10
steps behind it, 10 of them quiet: detectors/_slow_counts.py MIN_HISTORY and MIN_QUIET), and a
version's first samples come a few seconds into the load (through Prometheus a few more), so the
served version is scored before the disturbance, not only after it (6 s left it "too little
history" throughout, 15 s the Prometheus copy)."""
RATE = 40.0
# A verdict that ran the test (not stale, no data or waiting for history).
SCORED = ("no excess", "~")


def example_policy(triton: TritonServer) -> str:
    """The example policy, unchanged except for the Triton's endpoints (as bench/bench_ttr.py)."""
    return policies.example_policy(EXAMPLE.name, target={"triton": triton_endpoints(triton.base_url, triton.metrics_url)})


def prometheus_copy(triton: TritonServer) -> str:
    """The same trigger read through Prometheus' range queries (1 s steps, the scrape interval
    here), shadow: its signals are journaled and never acted on."""
    policy = yaml.safe_load(example_policy(triton))
    trigger = policy["triggers"][0]["detector"] | {"source": "prometheus", "interval": "1s"}
    policy |= {"name": PROMETHEUS_COPY, "triggers": [{"detector": trigger, "shadow": True}]}
    return yaml.safe_dump(policy, sort_keys=False)


async def healthy_triton(triton_factory: Any, fault_file: Path | None = None) -> TritonServer:
    """`ranker` v1 and v2, both healthy; v2 takes a slow path only if `fault_file` says so."""
    faults = {2: fault_file} if fault_file is not None else None
    server: TritonServer = await triton_factory(
        name="ranker", slow_fraction_by_version={1: 0.0, 2: 0.0}, fast_ms=2, fast_ms_max=4, instances=2,
        fault_file_by_version=faults)
    return server


@asynccontextmanager
async def daemon(tmp_path: Path, triton: TritonServer, prom: PrometheusServer,
                 with_prometheus_copy: bool = False) -> AsyncIterator[Service]:
    """The daemon's Service in this process with the example policy (and the shadow copy)."""
    pol = tmp_path / "policies"
    pol.mkdir()
    (pol / "ranker.yaml").write_text(example_policy(triton))
    if with_prometheus_copy:
        (pol / "ranker-prometheus.yaml").write_text(prometheus_copy(triton))
    settings = local_settings(tmp_path, pol, prometheus={"url": prom.url, "timeoutSeconds": 5})
    async with Service(settings, action_registry(), detector_registry()) as svc:
        yield svc


async def staged_load(triton: TritonServer, stages: list[tuple[float, float]]) -> None:
    """(req/s, seconds) back to back; random inputs, as bench_ttr (in [0, 1): a fault file may bite)."""
    rng = np.random.default_rng(1)
    for rate, seconds in stages:
        await run_load(triton.base_url, model="ranker", rate_per_second=rate, duration_seconds=seconds,
                       max_in_flight=256, inputs=lambda: rng.random(16, dtype=np.float32).tolist())


def series_version(series: str) -> str | None:
    """The `version` label of a journaled series key (JSON labels; "*" is the whole query)."""
    return json.loads(series).get("version") if series.startswith("{") else None


def verdicts(svc: Service, policy: str, fired: bool) -> float:
    value = svc.metrics.registry.get_sample_value(
        "tailguard_detections_total", {"policy": policy, "detector": "tail_excess", "fired": str(fired).lower()})
    return value or 0.0


async def wait_for_verdicts(svc: Service, policy: str, since: float, timeout_s: float = 30.0) -> None:
    """Until the policy has judged more than 5 more times than `since` (the poller backs off while its
    source is down, so the first verdict after a disturbance may take a few seconds), bounded."""
    deadline = time.monotonic() + timeout_s
    while verdicts(svc, policy, fired=False) - since <= 5 and time.monotonic() < deadline:
        await asyncio.sleep(0.5)


async def assert_quiet_and_looking(svc: Service, version: str, since: dict[str, float]) -> None:
    """No decision, no signal; each policy in `since` scored `version` in the last seconds and
    judged more than 5 times after its count in `since`."""
    await svc.drain()
    decisions = await svc.journal.decisions.all.in_thread()
    assert decisions == [], [(d.policy, d.reason) for d in decisions]
    signals = await svc.journal.signals.all.in_thread()
    assert signals == [], [s.payload for s in signals]
    for policy, before in since.items():
        rows = [e for e in await svc.journal.evaluations.all.in_thread(policy)
                if series_version(e.series) == version]
        assert rows, await svc.journal.evaluations.all.in_thread(policy)
        assert time.time() - float(rows[0].at) < 5.0 and rows[0].reason.startswith(SCORED), rows
        assert verdicts(svc, policy, fired=True) == 0.0
        assert verdicts(svc, policy, fired=False) - before > 5, (policy, verdicts(svc, policy, fired=False), before)


async def test_traffic_bursts_and_drops_take_no_action(tmp_path: Path, triton_factory, prometheus_factory) -> None:
    triton = await healthy_triton(triton_factory)
    prom = await prometheus_factory(scrape_targets={"triton": [triton.metrics_target]}, scrape_interval="1s")
    async with daemon(tmp_path, triton, prom) as svc:
        # 3x bursts and a 4x drop, several 1 s steps each
        await staged_load(triton, [(RATE, WARMUP_S), (3 * RATE, 6.0), (10.0, 5.0), (3 * RATE, 6.0)])
        await assert_quiet_and_looking(svc, "2", since={POLICY: 0.0})


async def test_healthy_redeploy_takes_no_action(tmp_path: Path, triton_factory, prometheus_factory) -> None:
    triton = await healthy_triton(triton_factory)
    await load_version(triton, "ranker", 1)
    prom = await prometheus_factory(scrape_targets={"triton": [triton.metrics_target]}, scrape_interval="1s")
    async with daemon(tmp_path, triton, prom) as svc:
        # v2 runs 24 s after the deploy: counted per step (detectors/_slow_counts.py, MIN_HISTORY) a
        # version's steps are scored from its 11th second, and v2's first samples come a few seconds
        # after its load returns (its load holds requests); 12 s left it "too little history".
        load = asyncio.create_task(staged_load(triton, [(RATE, WARMUP_S + 24.0)]))
        try:
            await asyncio.sleep(WARMUP_S)
            await load_version(triton, "ranker", None)  # the deploy: v2, no defect; its load holds requests a moment
            assert served_versions(triton, "ranker") == ["2"]
            before = verdicts(svc, POLICY, fired=False)
        finally:
            await load
        await assert_quiet_and_looking(svc, "2", since={POLICY: before})


async def test_triton_restart_takes_no_action_and_a_defect_after_it_still_rolls_back(
        tmp_path: Path, triton_factory, prometheus_factory) -> None:
    fault_file = tmp_path / "fault.json"
    triton = await healthy_triton(triton_factory, fault_file)
    prom = await prometheus_factory(scrape_targets={"triton": [triton.metrics_target]}, scrape_interval="1s")
    async with daemon(tmp_path, triton, prom) as svc:
        load = asyncio.create_task(staged_load(triton, [(RATE, 90.0)]))  # cancelled once rolled back
        try:
            await asyncio.sleep(WARMUP_S)
            await asyncio.to_thread(triton.restart)  # by PID, same ports: counters from zero
            before = verdicts(svc, POLICY, fired=False)
            await wait_for_verdicts(svc, POLICY, before)
            await assert_quiet_and_looking(svc, "2", since={POLICY: before})
            # Not blind: a real defect on the restarted server (2% of requests 900 ms more). Its own
            # check: test_tail_excess_integration fires on a defect too, but with an inline policy of
            # the same trigger, not examples/policies/ranker.yaml (alert trigger, guards, verify).
            write_fault(fault_file, {"enabled": True, "fault_rate": 0.02, "delay_ms": 900})
            decision = await first_decision(svc, POLICY, timeout_s=40.0)
        finally:
            load.cancel()
            await asyncio.gather(load, return_exceptions=True)
        assert decision.executed, decision.reason
        assert await served_within(triton, ["1"], timeout_s=20.0), served_versions(triton, "ranker")
        fired = [s.payload for s in await svc.journal.signals.all.in_thread() if s.payload.get("policy") == POLICY]
        assert fired and fired[0]["labels"]["version"] == "2", fired[:1]
        # The series' history spans the restart (one reset, read as increase() does) and still fires.
        assert fired[0]["details"]["counter_resets"] == 1, fired[0]["details"]


async def test_prometheus_gap_takes_no_action(tmp_path: Path, triton_factory, prometheus_factory) -> None:
    triton = await healthy_triton(triton_factory)
    prom = await prometheus_factory(scrape_targets={"triton": [triton.metrics_target]}, scrape_interval="1s")
    async with daemon(tmp_path, triton, prom, with_prometheus_copy=True) as svc:
        load = asyncio.create_task(staged_load(triton, [(RATE, 90.0)]))  # cancelled once judged again
        try:
            await asyncio.sleep(WARMUP_S)
            await asyncio.to_thread(prom.stop)  # the load goes on; nothing scrapes it for 8 s
            await asyncio.sleep(8.0)
            before = {policy: verdicts(svc, policy, fired=False) for policy in (POLICY, PROMETHEUS_COPY)}
            await asyncio.to_thread(prom.restart)  # same port and data: the gap stays in the TSDB
            await wait_for_verdicts(svc, PROMETHEUS_COPY, before[PROMETHEUS_COPY])
            await assert_quiet_and_looking(svc, "2", since=before)
        finally:
            load.cancel()
            await asyncio.gather(load, return_exceptions=True)


def write_fault(path: Path, fault: dict[str, Any]) -> None:
    """Replace the fault file in one rename, so the model never reads half of it."""
    staging = path.with_suffix(".tmp")
    staging.write_text(json.dumps(fault))
    os.replace(staging, path)


async def first_decision(svc: Service, policy: str, timeout_s: float) -> Any:
    """The policy's first decision, polled every 0.5 s up to `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not (found := [d for d in await svc.journal.decisions.all.in_thread() if d.policy == policy]):
        assert time.monotonic() < deadline, await svc.journal.evaluations.all.in_thread(policy)
        await asyncio.sleep(0.5)
    return found[0]


async def served_within(triton: TritonServer, versions: list[str], timeout_s: float) -> bool:
    """Whether Triton serves exactly `versions` within `timeout_s` (the rollback's load takes a moment)."""
    deadline = time.monotonic() + timeout_s
    while (served := await asyncio.to_thread(served_versions, triton, "ranker")) != versions and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
    return served == versions
