"""Ready-to-pinned: how soon a Triton replica that turns ready after a rollback serves the pinned
version, through the EndpointSlice watch, against the floor of loading that version directly.

Run: ``PYTHONPATH=. python bench/bench_pin_follow.py [--rounds 5]``.

Two real Tritons (CPU, the lab's test model) stand for two pods of one Service: the same port on
127.0.0.1 and 127.0.0.2, one EndpointSlice in the Kubernetes API emulator. A page alert rolls
`ranker` back to version 1 and pins it. Each round: the second replica loads the newest version
(version 2) again, as a pod restarted from the repository serves it, then
- baseline: tailguard is out of it; version 1 is loaded on the replica directly (`load_model` with
  the pinned version policy, what the pin must do anyway), timed until it serves only version 1;
- measured: the replica loads the newest version again, its endpoint goes not ready then ready
  (a restart as the watch sees it), timed from the ready update until it serves only version 1.
The ratio measured/baseline is what the watch, the reconciler and its checks add to the load.
The periodic pass is set to 600 s, so it never runs during the rounds (checked); without the
watch a replica would wait up to `pinReconcileIntervalSeconds` (30 s by default), half of it on
average, before that load.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import aiohttp

from daemon.common.config import Settings
from daemon.wiring.registries import action_registry, detector_registry
from daemon.wiring.service import Service
from lab.kube.emulator import KubeEmulator
from lab.kube.seeds import kube_settings, write_kubeconfig
from lab.policies import PAGE_ALERT_TRIGGER, rollback_policy
from lab.triton import TritonServer, load_version, served_versions, write_model_repository

NS, SERVICE, SLICE, MODEL = "default", "ranker-triton", "ranker-triton-x1", "ranker"
TOKEN = "bench-webhook-token-0123456789"
INTERVAL = 600.0
DEFAULT_PASS_SECONDS = 30.0


def endpoint_slice(port: int, ready: dict[str, bool]) -> dict[str, Any]:
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
            "metadata": {"name": SLICE, "namespace": NS, "labels": {"kubernetes.io/service-name": SERVICE}},
            "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
            "endpoints": [{"addresses": [ip], "conditions": {"ready": r}} for ip, r in ready.items()]}


def set_ready(ready: dict[str, bool]) -> Callable[[dict[str, Any]], None]:
    def change(obj: dict[str, Any]) -> None:
        obj["endpoints"] = [{"addresses": [ip], "conditions": {"ready": r}} for ip, r in ready.items()]
    return change


async def until_pinned(server: TritonServer, limit: float = 300.0) -> float:
    """Seconds until `server` serves only version 1 (bounded)."""
    start = time.monotonic()
    while await asyncio.to_thread(served_versions, server, MODEL) != ["1"]:
        if time.monotonic() - start > limit:
            raise RuntimeError(f"{server.base_url} never served version 1")
        await asyncio.sleep(0.02)
    return time.monotonic() - start


async def newest(server: TritonServer) -> None:
    """Serve version 2, the newest (loading without a config would keep the pinned override)."""
    await load_version(server, MODEL, 2)
    assert await asyncio.to_thread(served_versions, server, MODEL) == ["2"]


def alert() -> dict[str, Any]:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    labels = {"alertname": "TritonTailLatencyHigh", "severity": "page", "model": MODEL}
    return {"version": "4", "groupKey": "{}:{alertname=\"TritonTailLatencyHigh\"}", "status": "firing",
            "receiver": "tailguard", "groupLabels": {"alertname": "TritonTailLatencyHigh"}, "commonLabels": labels,
            "commonAnnotations": {}, "externalURL": "http://alertmanager", "truncatedAlerts": 0,
            "alerts": [{"status": "firing", "labels": labels, "annotations": {}, "startsAt": now,
                        "endsAt": "0001-01-01T00:00:00Z", "generatorURL": "", "fingerprint": "bench0001"}]}


async def run(rounds: int, root: Path) -> dict[str, Any]:
    servers = []
    for n, host in enumerate(("127.0.0.1", "127.0.0.2")):
        repo = write_model_repository(root / f"triton-{n}" / "models", name=MODEL)
        servers.append(TritonServer(repo.parent, models=[MODEL], workdir=root / f"triton-{n}", host=host))
    first, second = servers
    second.http_port = first.http_port  # the Service's port on the second pod's address
    try:
        for server in servers:
            await asyncio.to_thread(server.start)
        async with KubeEmulator() as kube:
            port = first.http_port
            kube.seed(endpoint_slice(port, {"127.0.0.1": True, "127.0.0.2": True}))
            policies = root / "policies"
            policies.mkdir()
            (policies / "ranker.yaml").write_text(rollback_policy("X", triggers=PAGE_ALERT_TRIGGER, guards="cooldown: 0s")
                                                  .replace('triton: {endpoints: ["X"]}',
                                                           f"triton: {{service: {{namespace: {NS}, name: {SERVICE}, "
                                                           f"port: {port}}}}}"))
            os.environ["TAILGUARD_WEBHOOK_TOKEN"] = TOKEN
            settings = Settings.model_validate({
                "listen": {"host": "127.0.0.1", "port": 0},
                "policies": {"path": str(policies), "reloadIntervalSeconds": 0.2},
                "journal": {"path": str(root / "journal.db")},
                "executor": {"workers": 2, "pinReconcileIntervalSeconds": INTERVAL},
                "kubernetes": kube_settings(write_kubeconfig(root / "kc", kube)),
                # One target: the common-cause hold (on by default) would only delay the rollback.
                "blastRadius": {"maxTargetsPerWindow": None, "commonCauseTargets": None},
            })
            async with Service(settings, action_registry(), detector_registry()) as svc:
                async with aiohttp.ClientSession() as http:
                    async with http.post(f"http://127.0.0.1:{svc.port}/api/v1/alerts", json=alert(),
                                         headers={"Authorization": f"Bearer {TOKEN}"}) as r:
                        assert r.status == 200, await r.text()
                await svc.drain()
                await until_pinned(first)
                await until_pinned(second)
                deadline = time.monotonic() + 60
                while kube.watchers < 1:
                    assert time.monotonic() < deadline, "the endpoint watch never started"
                    await asyncio.sleep(0.05)
                passes = svc.pins.passes
                baseline, measured = [], []
                for _ in range(rounds):
                    await newest(second)
                    started = time.monotonic()  # load_model returns once the load is done
                    await load_version(second, MODEL, 1)
                    await until_pinned(second)
                    baseline.append(time.monotonic() - started)
                    await newest(second)
                    kube.modify("endpointslices", NS, SLICE, set_ready({"127.0.0.1": True, "127.0.0.2": False}))
                    await asyncio.sleep(0.2)  # the watch sees it not ready first, as during a restart
                    kube.modify("endpointslices", NS, SLICE, set_ready({"127.0.0.1": True, "127.0.0.2": True}))
                    measured.append(await until_pinned(second))
                assert svc.pins.passes == passes, "a periodic pass ran during the rounds"
    finally:
        for server in reversed(servers):
            await asyncio.to_thread(server.stop)
    b, m = statistics.median(baseline), statistics.median(measured)
    return {"rounds": rounds, "baseline_load_seconds": [round(x, 3) for x in baseline],
            "ready_to_pinned_seconds": [round(x, 3) for x in measured],
            "median_baseline_seconds": round(b, 3), "median_ready_to_pinned_seconds": round(m, 3),
            "ratio_median": round(m / b, 2),
            "without_watch_mean_seconds": round(DEFAULT_PASS_SECONDS / 2 + b, 3),
            "command": "PYTHONPATH=. python bench/bench_pin_follow.py --rounds %d" % rounds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tailguard-bench-pin-") as tmp:
        result = asyncio.run(run(args.rounds, Path(tmp)))
    json.dump(result, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
