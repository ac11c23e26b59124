"""The forecast policies on the forecast library's capacity knee (and its leaks, as the control):
examples/policies/forecast.yaml must roll back nothing on a knee, examples/policies/forecast-capacity.yaml
must scale out before the crossing; on a leak, the other way round.

Run: ``python bench/bench_forecast_policy.py [--seeds 5]``. Each series of the committed library
(fixtures/forecast_library, 30 s steps, ms) is served as version 2 of ranker (in µs, as Triton's
summary) with its request rate beside it, and both policies' detectors (built from the example
files, as the loader builds them) judge it once per step from an hour before the incident to the
level's crossing, through `detect_many` as the poller calls them (a leak's series has no rate in the
library: a steady one is served beside it). For the first firing of the
capacity policy, its kubernetes.scale step is planned, applied and verified against the Kubernetes
emulator (a Deployment of 4 replicas).
"""
from __future__ import annotations

import argparse
import asyncio
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from actions.base import ActionDeps  # noqa: E402
from actions.scale import Scale, ScaleParams  # noqa: E402
from core.query import Series  # noqa: E402
from core.signal import Signal, SignalSource  # noqa: E402
from daemon.wiring.registries import action_registry, detector_registry  # noqa: E402
from detectors.forecast import ForecastBreachDetector  # noqa: E402
from evaluation import forecast_library  # noqa: E402
from policies.loader import LoadedPolicy, load_policies_text  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
LABELS = {"model": "ranker", "version": "2"}
BEFORE_INCIDENT_SECONDS = 3600.0


def policy(name: str) -> LoadedPolicy:
    text = (REPO / "examples" / "policies" / name).read_text()
    (loaded,) = load_policies_text(text, name, action_registry(), detector_registry()).policies
    return loaded


def detector(p: LoadedPolicy) -> ForecastBreachDetector:
    return ForecastBreachDetector(p.detectors[0].params.model_dump(exclude_defaults=True))


@dataclass(frozen=True)
class Run:
    series: str
    first_fire: float | None  # seconds before the level's crossing (None: never fired)
    why_not: str  # the last reason of a firing kept from acting, if any


def judge(s: forecast_library.LibrarySeries, p: LoadedPolicy) -> Run:
    """One policy's detector over one series, a step at a time up to the crossing."""
    det = detector(p)
    assert s.incident_start is not None and s.crossing_time is not None
    ts, vs = s.timestamps, s.values * 1000.0
    # A leak's shape has no rate: a steady 100 req/s with 3% noise (the load does not explain it).
    rate = s.rate if s.rate is not None else 100.0 * np.exp(np.random.default_rng(1).normal(0.0, 0.03, ts.size))
    start = int(np.searchsorted(ts, s.incident_start - BEFORE_INCIDENT_SECONDS))
    end = int(np.searchsorted(ts, s.crossing_time))
    why = ""
    for i in range(start, end):
        keep = ~np.isnan(vs[: i + 1])
        latency = Series(LABELS, ts[: i + 1][keep], vs[: i + 1][keep])
        load = Series(LABELS, ts[: i + 1], rate[: i + 1])
        (d,) = det.detect_many([latency], float(ts[i]), [load])
        if d.fired:
            return Run(s.name, float(s.crossing_time - ts[i]), why)
        if "not acted on" in d.reason:
            why = d.reason.split(";")[0]
    return Run(s.name, None, why)


async def scale_out(p: LoadedPolicy) -> str:
    """The capacity policy's step against the emulator: plan, apply, verify."""
    from lab.kube.emulator import KubeEmulator
    from kubernetes_asyncio.client import ApiClient

    params = p.actions[0].params
    assert isinstance(params, ScaleParams)
    ref = params.deployment
    labels = {"app": ref.name}
    async with KubeEmulator() as emulator:
        emulator.seed({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": ref.name, "namespace": ref.namespace},
                       "spec": {"replicas": 4, "selector": {"matchLabels": labels}, "template": {
                           "metadata": {"labels": labels}, "spec": {"containers": [{"name": "triton", "image": "triton"}]}}}})
        async with ApiClient(configuration=emulator.configuration()) as api:
            action = Scale(ActionDeps(kube=api))
            signal = Signal(SignalSource.DETECTOR, "forecast_breach", LABELS, datetime.now(timezone.utc), "bench")
            step = action.plan(p.target, params, await action.observe(p.target, params), signal)
            applied = await action.apply(step, p.target, params)
            verified = await action.verify(step, p.target, params)
        found = emulator.get("deployments", ref.namespace, ref.name)
        assert found is not None
        return (f"{step.summary}; apply {applied.status.value}, verify {verified.status.value}; "
                f"Deployment now {found['spec']['replicas']} replicas")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5, help="library seeds per shape (of 20)")
    args = ap.parse_args(argv)
    print(f"command: python bench/bench_forecast_policy.py --seeds {args.seeds}")
    rollback, capacity = policy("forecast.yaml"), policy("forecast-capacity.yaml")
    shapes = {"knee": "knee", "leak (12 ms/min)": "leak_12"}
    library = forecast_library.load(shapes=set(shapes.values()))
    started = time.process_time()
    print("| shape | series | ranker-forecast (rollback) fires | ranker-capacity (scale) fires | "
          "capacity's median lead (s) |")
    print("| --- | --- | --- | --- | --- |")
    fired_capacity = False
    for shape, name in shapes.items():
        chosen = sorted((s for s in library if s.shape == name), key=lambda s: s.name)[: args.seeds]
        if not chosen:
            print(f"| {shape} | 0 (shape {name!r} not in the library) | | | |")
            continue
        rb = [judge(s, rollback) for s in chosen]
        cap = [judge(s, capacity) for s in chosen]
        leads = [r.first_fire for r in cap if r.first_fire is not None]
        fired_capacity |= shape == "knee" and bool(leads)
        print(f"| {shape} | {len(chosen)} | {sum(r.first_fire is not None for r in rb)} | {len(leads)} | "
              f"{np.median(leads):.0f} |" if leads else
              f"| {shape} | {len(chosen)} | {sum(r.first_fire is not None for r in rb)} | 0 | - |")
        for r in rb + cap:
            if r.why_not:
                print(f"    {r.series}: {r.why_not}")
    if fired_capacity:
        print("kubernetes.scale on the first knee firing:", asyncio.run(scale_out(capacity)))
    print(f"CPU: {time.process_time() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
