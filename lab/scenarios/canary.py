"""`canary`: ranker v2 takes 10% of the traffic through an Istio VirtualService (held in the
Kubernetes API emulator, beside the DestinationRule that maps its subsets to the pods' `version`
label); tailguard's canary judge compares v2 with v1 serving beside it and shifts the weights back.

The topology as the lab plays it: one Triton serves v1 and v2 (both loaded, explicit model
control); the load generator routes each request to `/v2/models/ranker/versions/<v>/infer` by the
VirtualService's weights as the emulator holds them now (`WeightedRouter`, read per request), as
the mesh would pick a subset's pods (the clients run as their own process, reading the weights
from the Kubernetes API every 0.2 s: lab/scenarios/clients_process.py); the clients' view exports what the mesh's sidecar would
(`istio_request_duration_milliseconds` with `destination_version="v1"`/`"v2"`), which Prometheus
scrapes every second. So the policy is examples/policies/canary.yaml as it is.

Three cases, each a `--scenario`:
- `canary`: the reference defect on v2 (0.5% of its requests take 900 ms more) at 10% weight
  (`--short`: 2%, so the verdict comes within a minute even on a loaded machine; the reference
  defect's delay is bench/bench_canary.py's to measure):
  the judge's verdict, the weights back to v1 100 / v2 0 (verified by reading them back), the route
  timeout retuned from the stable's P99.9, and the stable's tail verified within budget;
- `canary-healthy`: v2 is as good as v1; the canary serves for the whole watch (600 s; 120 s
  `--short`) and is never shifted;
- `canary-shared`: the canary starts healthy, then both versions slow down together (1% of each
  one's requests take 900 ms more: a shared cause). The tail rollback policy
  (examples/policies/ranker.yaml) runs on the same target beside the canary policy, and the lab's
  page alert fires on Triton's P99.9: nothing is shifted, nothing rolled back, and the journal's
  evaluations say "shared slowdown".
"""
from __future__ import annotations

import dataclasses

import asyncio
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from daemon.report import Marker, Series
from lab.kube.emulator import KubeEmulator
from lab.kube.seeds import destination_rule, route_timeout, route_weights, virtual_service
from lab.load import run_load
from lab.policies import EXAMPLES, example_policy, triton_endpoints
from lab.scenarios.base import MODEL, Run, Scenario, Timings, load_version
from lab.scenarios.clients import MESH_HISTOGRAM
from lab.scenarios.timeline import timeout_ms
from lab.triton import TritonServer, write_model_repository

NAMESPACE = "serving"
INITIAL_TIMEOUT = "30s"
CANARY_WEIGHTS = {"v1": 90, "v2": 10}
SLOW_MS = 900
"""What a slow request adds (the reference defect's 900 ms; shared slowdown's alike)."""
DEFECT_SHARE = 0.005
"""The reference defect: 0.5% of v2's requests take 900 ms more."""
SHORT_DEFECT_SHARE = 0.02
"""`--short` (the suite's run, three scenarios side by side on two cores): 2% of v2's requests. At
0.5% the verdict took 80 s on a quiet machine and none came in 380 s on a loaded one."""
SHARED_SHARE = 0.01
"""The shared slowdown: 1% of each version's requests take 900 ms more. At 2% the slow requests
alone keep 3.6 of Triton's 4 instances busy at 200 req/s and every request queues (P50 ~250 ms)."""
RATE_PER_SECOND = 200.0
"""Requests per second over both versions: 20/s reach the canary at 10%. The judge decides on
its evidence, so traffic sets how soon: at 200 req/s the reference defect is called in about
1.5 minutes (docs/canary.md)."""
INPUTS_SEED = 11
CANARY_POLICY = EXAMPLES / "canary.yaml"
TAIL_POLICY = EXAMPLES / "ranker.yaml"
SHARE_QUERY = (f'(sum(rate({MESH_HISTOGRAM}_count{{destination_version="{{v}}"}}[1m])) - '
               f'sum(rate({MESH_HISTOGRAM}_bucket{{destination_version="{{v}}", le="500"}}[1m]))) / '
               f'sum(rate({MESH_HISTOGRAM}_count{{destination_version="{{v}}"}}[1m]))')
"""Each version's share of requests above 500 ms over a minute, as the mesh counts them."""


def canary_policy(short: bool = False) -> str:
    """examples/policies/canary.yaml, unchanged: it names no Triton endpoint (it acts on the mesh).
    `short` (tests) holds its verify for 10 s instead of 60 s: the only change, and only there."""
    if not short:
        return CANARY_POLICY.read_text()
    return example_policy(CANARY_POLICY.name, verify={"for": "10s"})


def tail_policy(triton: TritonServer) -> str:
    """examples/policies/ranker.yaml (the tail rollback) with the lab's endpoints filled in, and on
    the canary policy's target (namespace `serving`), so the two policies share one target."""
    return example_policy(TAIL_POLICY.name, target={"namespace": NAMESPACE,
                                                     "triton": triton_endpoints(triton.base_url, triton.metrics_url)})


def write_fault(path: Path, rate: float) -> None:
    """Switch a version's slow path: `rate` of its requests take SLOW_MS more (0: off)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"enabled": rate > 0, "fault_rate": rate, "delay_ms": SLOW_MS}))
    tmp.replace(path)  # atomic: the model never reads half a file


@dataclass(frozen=True)
class Case:
    """What differs between the three canary scenarios."""

    defect: tuple[float, float]  # (full, short): v2's own slow share from the deploy on
    shared: float  # both versions' slow share once the shared slowdown begins (0: none)
    with_tail_policy: bool  # the tail rollback policy on the same target too
    watch_seconds: tuple[float, float]  # (full, short): how long the canary serves (or the bound on a verdict)
    shared_after_seconds: tuple[float, float] = (60.0, 20.0)  # (full, short): healthy canary before it


class CanaryScenario(Scenario):
    uses_kube = True
    clients_process = True  # the judge compares shares above 500 ms: no event-loop stall may add to them
    rate_per_second = RATE_PER_SECOND

    def __init__(self, name: str, title: str, case: Case) -> None:
        self.name = name
        self.title = title
        self.case = case
        self.faults: dict[int, Path] = {}
        self.journal: dict[str, Any] = {}  # the healthy/shared cases' journal at the end (final_objects)

    def write_models(self, root: Path) -> None:
        self.faults = {v: root.parent / f"fault-v{v}.json" for v in (1, 2)}
        for path in self.faults.values():
            write_fault(path, 0.0)
        write_model_repository(root, MODEL, slow_ms=SLOW_MS, fast_ms=3, instances=4,
                               fault_file_by_version=self.faults)

    def policy(self, triton_url: str, timings: Timings) -> str:
        return canary_policy()

    def policy_files(self, triton: TritonServer, timings: Timings) -> dict[str, str]:
        files = {"canary": canary_policy(timings.short)}
        if self.case.with_tail_policy:
            files["ranker"] = tail_policy(triton)
        return files

    def rules(self, timings: Timings) -> str:
        # The alert rule as the README recommends it (`for: 1m`), not the other scenarios' short
        # one: the tail rollback policy beside the canary is governed by its tail_excess trigger, so
        # the alert only notifies while that detector sees the target (policies/governance.py).
        return super().rules(dataclasses.replace(timings, rule_for="1m"))

    def clients_options(self, run: Run) -> dict[str, Any]:
        assert run.emulator is not None
        return {"kube_url": run.emulator.url, "virtual_service": f"{NAMESPACE}/{MODEL}", "route": "primary",
                "uniform_inputs": INPUTS_SEED}

    def seed(self, emulator: KubeEmulator) -> None:
        emulator.seed(virtual_service(MODEL, NAMESPACE, timeout=INITIAL_TIMEOUT, weights={"v1": 100, "v2": 0}))
        emulator.seed(destination_rule(MODEL, NAMESPACE))

    async def prepare(self, triton: TritonServer) -> None:
        await load_version(triton, [1, 2])  # both deployments up; the mesh decides who gets traffic
        # Warm every instance of both versions before the daemon and the clients' view count
        # anything: a cold Python-backend stub answers its first request in ~0.3 s, and a burst
        # on cold stubs queues past 500 ms, which is neither version's tail. One at a time first.
        for version in ("1", "2"):
            await run_load(triton.base_url, MODEL, rate_per_second=20.0, duration_seconds=1.0, max_in_flight=1,
                           route=lambda v=version: v)
            await run_load(triton.base_url, MODEL, rate_per_second=100.0, duration_seconds=1.0,
                           route=lambda v=version: v)

    async def play(self, run: Run) -> None:
        assert run.emulator is not None
        short = run.timings.short
        watch = self.case.watch_seconds[1 if short else 0]
        defect = self.case.defect[1 if short else 0]
        run.enter("baseline")
        run.say(f"all traffic on v1 for {run.timings.baseline_seconds:.0f}s ({self.rate_per_second:.0f} req/s)")
        await asyncio.sleep(run.timings.baseline_seconds)
        run.enter("canary")
        if defect:
            write_fault(self.faults[2], defect)

        def to_canary(vs: dict[str, Any]) -> None:
            for dest in vs["spec"]["http"][0]["route"]:
                dest["weight"] = CANARY_WEIGHTS[dest["destination"]["subset"]]

        run.emulator.modify("virtualservices", NAMESPACE, MODEL, to_canary)
        what = (f"{defect:.1%} of its requests take {SLOW_MS} ms more" if defect
                else "as good as v1")
        run.mark("deploy", f"canary: VirtualService ranker sends {CANARY_WEIGHTS['v2']}% to v2 ({what})")
        deployed = time.time()
        if self.case.shared:
            await self._shared_slowdown(run, short)
        run.enter("watching")
        if not defect:  # nothing should happen: watch the whole window
            await asyncio.sleep(max(0.0, watch - (time.time() - deployed)))
            applied = await applied_steps(run)
            weights = route_weights(run.emulator.get("virtualservices", NAMESPACE, MODEL) or {})
            decisions = await run.service.journal.decisions.all.in_thread()
            signals = await run.service.journal.signals.all.in_thread()
            self.journal = {"applied": len(applied), "decisions": [
                {"policy": d.policy, "state": str(d.state), "executed": d.executed, "reason": d.reason}
                for d in decisions], "detector_signals": sorted(
                {str(sig.payload.get("name")) for sig in signals if sig.payload.get("source") == "detector"})}
            run.say(f"{watch:.0f}s of canary: {len(applied)} change(s) applied; the weights stay {weights}")
            for d in decisions:
                run.say(f"journal: {d.policy}: {d.reason[:200]}")
            return
        if await run.wait_for_decision(watch):
            await self._mark_verdict(run)
            run.enter("verifying")
            verdict = await run.wait_for_verdict(360.0)  # the policy's `within: 5m`, and a margin
            run.enter("settling")
            run.say(f"recovery verdict: {verdict['status'] if verdict else 'none within the watch window'}")
        else:
            run.say(f"no verdict in {watch:.0f}s of canary")

    async def _shared_slowdown(self, run: Run, short: bool) -> None:
        await asyncio.sleep(self.case.shared_after_seconds[1 if short else 0])
        for path in self.faults.values():
            write_fault(path, self.case.shared)
        run.mark("phase", f"shared slowdown: {self.case.shared:.0%} of both versions' requests take {SLOW_MS} ms more")

    async def _mark_verdict(self, run: Run) -> None:
        """The judge's verdict as its own marker: when the signal landed, and what it said."""
        signals = await run.service.journal.signals.all.in_thread()
        for signal in signals:
            payload = signal.payload
            if payload.get("name") == "tail_canary":
                reason = str(payload.get("details", {}).get("reason", ""))
                run.markers.append(Marker(signal.received_at, "verdict: " + reason.split(";")[0][:120],
                                          "verdict"))
                run.say(f"VERDICT: {reason[:200]}")
                return

    def prometheus_series(self) -> list[tuple[str, ...] | tuple[str, str, float, str]]:
        shares: list[tuple[str, ...] | tuple[str, str, float, str]] = [
            (f"v{v} above 500 ms (1 min, mesh)", SHARE_QUERY.replace("{v}", f"v{v}"), 100.0, "%", "share above 500 ms")
            for v in (1, 2)]
        return [*super().prometheus_series(), *shares]

    def thresholds(self) -> list[tuple[float, str] | tuple[float, str, str]]:
        return [*super().thresholds(), (0.1, "0.1%: the P99.9 budget", "share above 500 ms")]

    def extra_series(self, run: Run) -> list[Series]:
        times = [t for t, _, _ in run.vs_history]
        subsets = sorted({s for _, w, _ in run.vs_history for s in w})
        series = [Series(f"weight {s}", times, [float(w.get(s, 0)) for _, w, _ in run.vs_history], "%",
                         panel="weights") for s in subsets]
        series.append(Series("route timeout", times, [timeout_ms(raw) for _, _, raw in run.vs_history], "ms",
                             panel="timeout"))
        return series

    def final_objects(self, run: Run) -> Mapping[str, Any]:
        assert run.emulator is not None
        vs = run.emulator.get("virtualservices", NAMESPACE, MODEL) or {}
        return {"weights": route_weights(vs), "timeout": route_timeout(vs),
                "timeout_ms": timeout_ms(route_timeout(vs)), "journal": self.journal}


async def applied_steps(run: Run) -> list[dict[str, Any]]:
    """Every applied step in the journal (what tailguard changed), of every policy."""
    out = []
    for decision in await run.service.journal.decisions.all.in_thread():
        out += [dataclasses.asdict(s) for s in await run.service.journal.decisions.steps.in_thread(decision.id)
                if s.phase == "apply" and s.status == "ok"]
    return out


SCENARIO = CanaryScenario(
    "canary", "canary v2 at 10% with the reference defect; the judge shifts it back and retunes the timeout",
    Case(defect=(DEFECT_SHARE, SHORT_DEFECT_SHARE), shared=0.0, with_tail_policy=False, watch_seconds=(600.0, 300.0)))
HEALTHY = CanaryScenario(
    "canary-healthy", "a healthy canary v2 at 10%: never shifted",
    Case(defect=(0.0, 0.0), shared=0.0, with_tail_policy=False, watch_seconds=(600.0, 120.0)))
SHARED = CanaryScenario(
    "canary-shared", "v1 and v2 slow down together (1% at 900 ms): a shared slowdown shifts and rolls back nothing",
    Case(defect=(0.0, 0.0), shared=SHARED_SHARE, with_tail_policy=True, watch_seconds=(300.0, 120.0)))
