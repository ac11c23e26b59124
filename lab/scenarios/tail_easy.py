"""`tail-easy`: an easier incident than the one tailguard exists for, kept for a quick look. A deploy
of v2 sends 3% of requests down a 600 ms path, which lifts P99 itself (3% > 1%) as well as P99.9, and
the lab's short-window `tail_anomaly` trigger on Triton's summary quantile sees it in seconds. The
real incident (0.5% at 900 ms, P99 holds) is `tail`."""
from __future__ import annotations

import asyncio
from pathlib import Path

from lab.policies import PAGE_ALERT_TRIGGER, TAIL_ANOMALY_TRIGGER, rollback_policy, verify_block
from lab.scenarios.base import CLIENT_P999, MODEL, Run, Scenario, Timings, load_version, served_versions
from lab.triton import write_model_repository


class EasyTailScenario(Scenario):
    name = "tail-easy"
    title = "(easier incident) a deploy of ranker v2 sends 3% of requests to 600 ms, P99 moves too; rolled back"

    def write_models(self, root: Path) -> None:
        write_model_repository(root, MODEL, slow_fraction_by_version={1: 0.0, 2: 0.03}, slow_ms=600, fast_ms=3,
                               instances=2, seed=self.model_seed)

    def policy(self, triton_url: str, timings: Timings) -> str:
        return rollback_policy(triton_url, triggers=TAIL_ANOMALY_TRIGGER + PAGE_ALERT_TRIGGER,
                               verify=verify_block(CLIENT_P999, 500, timings.verify_for))

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


SCENARIO = EasyTailScenario()
