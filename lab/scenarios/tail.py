"""`tail`: ranker v1 is healthy; a deploy of v2 sends 3% of requests down a 600 ms path. P99 barely
moves, P99.9 jumps; tailguard's tail detector sees it in seconds and rolls ranker back to v1."""
from __future__ import annotations

import asyncio
from pathlib import Path

from lab.scenarios.base import CLIENT_P999, MODEL, Run, Scenario, Timings, load_version, served_versions
from lab.triton import write_model_repository

POLICY = """
name: ranker-tail
target:
  model: ranker
  triton: {{endpoints: ["{url}"]}}
triggers:
  - detector:
      type: tail_anomaly
      query: max by (model) (nv_inference_request_summary_us{{model="$model", quantile="0.999"}})
      companionQuery: max by (model) (nv_inference_request_summary_us{{model="$model", quantile="0.99"}})
      interval: 1s
      params: {{min_absolute_increase: 100000, baseline_window_seconds: 20, evaluation_window_seconds: 8,
                min_baseline_points: 8, max_staleness_seconds: 10}}
  - alert: {{name: TritonTailLatencyHigh, matchers: {{severity: page}}}}
actions:
  - type: triton.rollback
    to: previous
guards: {{cooldown: 10m}}
verify:
  query: '{verify}'
  below: 500
  for: {verify_for}
  within: 2m
  interval: 1s
"""


class TailScenario(Scenario):
    name = "tail"
    title = "a deploy of ranker v2 lifts P99.9 (3% of requests take 600 ms); tailguard rolls back"

    def write_models(self, root: Path) -> None:
        write_model_repository(root, MODEL, slow_fraction_by_version={1: 0.0, 2: 0.03}, slow_ms=600, fast_ms=3,
                               instances=2)

    def policy(self, triton_url: str, timings: Timings) -> str:
        return POLICY.format(url=triton_url, verify=CLIENT_P999, verify_for=timings.verify_for)

    async def setup(self, run: Run) -> None:
        await load_version(run.triton, 1)

    async def play(self, run: Run) -> None:
        run.enter("baseline")
        run.say(f"sending {self.rate_per_second:.0f} req/s to ranker v1 for {run.timings.baseline_seconds:.0f}s")
        await asyncio.sleep(run.timings.baseline_seconds)
        run.enter("deploy")
        await load_version(run.triton, None)
        versions = await asyncio.to_thread(served_versions, run.triton)
        run.mark("deploy", f"ranker now serves v{','.join(versions)} (3% of requests take 600 ms)")
        run.enter("watching")
        if await run.wait_for_decision(run.timings.watch_seconds):
            run.enter("verifying")
        verdict = await run.wait_for_verdict(run.timings.watch_seconds)
        run.enter("settling")
        run.say(f"recovery verdict: {verdict['status'] if verdict else 'none within the watch window'}")


SCENARIO = TailScenario()
