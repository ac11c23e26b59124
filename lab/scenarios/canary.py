"""`canary`: v2 takes 20% of ranker's traffic through an Istio VirtualService (held in the Kubernetes
API emulator); the load generator routes each request by the VirtualService's current weights, as
the mesh would. tailguard shifts the weights back to v1 and retunes the route's timeout from live
P99.9; the report shows weights and timeout over time."""
from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from daemon.report import Series
from lab.kube.emulator import KubeEmulator
from lab.kube.seeds import route_timeout, route_weights, virtual_service
from lab.scenarios.base import CLIENT_P999, MODEL, Run, Scenario, Timings, load_version
from lab.scenarios.clients import WeightedRouter
from lab.scenarios.timeline import timeout_ms
from lab.triton import write_model_repository

NAMESPACE = "serving"
INITIAL_TIMEOUT = "30s"
CANARY_WEIGHTS = {"v1": 80, "v2": 20}
SLOW_FRACTION = 0.10
"""Of v2's requests: at 20% of the traffic, Triton's summary needs ~5 slow ones in its window to show."""

POLICY = """
name: ranker-canary
target:
  model: ranker
  namespace: serving
  triton: {{endpoints: ["{url}"]}}
triggers:
  - detector:
      type: tail_anomaly
      # max over versions: the canary's own P99.9 shows even at 20% of the traffic
      query: max by (model) (nv_inference_request_summary_us{{model="$model", quantile="0.999"}})
      companionQuery: max by (model) (nv_inference_request_summary_us{{model="$model", quantile="0.99"}})
      interval: 1s
      params: {{min_absolute_increase: 100000, baseline_window_seconds: 20, evaluation_window_seconds: 8,
                min_baseline_points: 8, max_staleness_seconds: 10}}
actions:
  - type: istio.shift_weights
    virtualService: {{namespace: serving, name: ranker}}
    route: primary
    set: {{v1: 100, v2: 0}}
  - type: gateway.retune_timeout
    query: 'max(nv_inference_request_summary_us{{model="$model", quantile="0.999"}})'
    unit: us
    floorMs: 2000
    factor: 1.5
    maxMs: 30000
    sink: {{kind: istio, namespace: serving, name: ranker, route: primary}}
guards: {{cooldown: 10m}}
verify:
  query: '{verify}'
  below: 500
  for: {verify_for}
  within: 2m
  interval: 1s
"""


class CanaryScenario(Scenario):
    name = "canary"
    title = "canary v2 takes 20% through Istio; tailguard shifts it back and retunes the timeout"
    uses_kube = True
    rate_per_second = 30.0

    def write_models(self, root: Path) -> None:
        write_model_repository(root, MODEL, slow_fraction_by_version={1: 0.0, 2: SLOW_FRACTION}, slow_ms=600, fast_ms=3,
                               instances=2)

    def policy(self, triton_url: str, timings: Timings) -> str:
        return POLICY.format(url=triton_url, verify=CLIENT_P999, verify_for=timings.verify_for)

    def seed(self, emulator: KubeEmulator) -> None:
        emulator.seed(virtual_service(MODEL, NAMESPACE, timeout=INITIAL_TIMEOUT, weights={"v1": 100, "v2": 0}))

    def router(self, run: Run) -> Callable[[], str | None] | None:
        emulator = run.emulator
        assert emulator is not None

        def weights() -> Mapping[str, int]:
            return route_weights(emulator.get("virtualservices", NAMESPACE, MODEL) or {})

        return WeightedRouter(weights)

    async def setup(self, run: Run) -> None:
        await load_version(run.triton, [1, 2])  # both deployments up; the mesh decides who gets traffic

    async def play(self, run: Run) -> None:
        assert run.emulator is not None
        run.enter("baseline")
        run.say(f"all traffic on v1 for {run.timings.baseline_seconds:.0f}s")
        await asyncio.sleep(run.timings.baseline_seconds)
        run.enter("canary")

        def to_canary(vs: dict[str, Any]) -> None:
            for dest in vs["spec"]["http"][0]["route"]:
                dest["weight"] = CANARY_WEIGHTS[dest["destination"]["subset"]]

        run.emulator.modify("virtualservices", NAMESPACE, MODEL, to_canary)
        run.mark("deploy", f"canary: VirtualService ranker sends 20% to v2 ({SLOW_FRACTION:.0%} of its requests take 600 ms)")
        run.enter("watching")
        if await run.wait_for_decision(run.timings.watch_seconds):
            run.enter("verifying")
        verdict = await run.wait_for_verdict(run.timings.watch_seconds)
        run.enter("settling")
        run.say(f"recovery verdict: {verdict['status'] if verdict else 'none within the watch window'}")

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
                "timeout_ms": timeout_ms(route_timeout(vs))}


SCENARIO = CanaryScenario()
