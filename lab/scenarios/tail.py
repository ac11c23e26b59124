"""`tail` (the default): the incident tailguard exists for. ranker v1 is healthy; a deploy of v2 sends
0.5% of requests (rare inputs) down a 900 ms path. Fewer than 1% are slow, so P99 holds while P99.9
jumps past 500 ms. tailguard runs examples/policies/ranker.yaml with its endpoints filled in and, as
the README recommends, `keepWarm: previous` on its rollback (v1 kept loaded beside v2 from the deploy
on: the rollback is a switch, not a load; `keep_warm=False` runs the example as it is), and rolls
ranker back to v1; the run prints its time to remediate beside the range measured over seeds.
"""
from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from daemon.storage.records import EffectRow
from lab import policies
from lab.load import RequestSample, run_load
from lab.policies import SHORT_VERIFY, triton_endpoints
from lab.scenarios.base import MODEL, Run, Scenario, Timings, load_version, served_versions
from lab.scenarios.timeline import answered_at, span_quantiles
from lab.triton import TritonServer, write_model_repository

SLOW_FRACTION = 0.005
SLOW_MS = 900
RATE_PER_SECOND = 40.0
DECISION_BOUND_SECONDS = 300.0
"""Bound on waiting for the rollback; the example's detector decides in well under it at 40 req/s."""
VERDICT_BOUND_SECONDS = 240.0
"""Bound on waiting for the verdict: the example's verify window (`within: 3m`) and a margin."""

MEASURED_TTR = (33.6, 23.5, 55.8, "1-5")
"""(median, fastest, slowest, seeds) of deploy-to-rollback seconds, from `python bench/bench_demo_ttr.py`
on a 2-core machine shared with other work (2026-12-06, 9f5a4ae, before the demo kept v1 warm; the
README's table: detection dominates it, the warm switch saves the rollback's load of a few seconds)."""
COLD_START_SECONDS = 5.0
"""Left out of the incident's client quantiles after v2 starts serving: its Python-backend stubs are
cold (a first answer takes ~0.3 s each, and requests queue behind them), which is the lab's deploy
on one Triton, not the defect; a Deployment's new pods warm up before they take traffic."""
MEASURED_COMMAND = "python bench/bench_demo_ttr.py --seeds 1,2,3,4,5"
HELD_SECONDS = 0.25
"""A request answered later than this is counted as held by the warm load (docs/stack-facts.md, "The switch")."""
WARM_SETTLE_SECONDS = 3.0
"""Left out of the incident's client quantiles after v1's warm load returns, beside the load itself: on
2 shared cores the load still slows some requests on v2 after it returns (over 8 runs, 22 of the 960
sent in the next 3 s took 30-500 ms, against 10 of ~9,200 sent later until the decision): the load,
not the defect."""


def example_policy(triton: TritonServer, short: bool, keep_warm: bool = True) -> str:
    """examples/policies/ranker.yaml with the lab's endpoints filled in and (`keep_warm`)
    `keepWarm: previous` on its rollback. `short` (tests) also shortens its verify window to 10 s
    held, sampled every 5 s: the only other change, and only there."""
    text = policies.example_policy("ranker.yaml", target={"triton": triton_endpoints(triton.base_url, triton.metrics_url)},
                                   **({"verify": SHORT_VERIFY} if short else {}))
    return with_keep_warm(text) if keep_warm else text


def with_keep_warm(policy: str) -> str:
    """`policy` (YAML) with `keepWarm: previous` on its `triton.rollback` actions (pure)."""
    doc = yaml.safe_load(policy)
    rollbacks = [a for a in doc["actions"] if a.get("type") == "triton.rollback"]
    if not rollbacks:
        raise ValueError("the policy has no triton.rollback action to keep a version warm for")
    for action in rollbacks:
        action["keepWarm"] = "previous"
    return str(yaml.safe_dump(doc, sort_keys=False))


def warm_load_spans(effects: Iterable[EffectRow]) -> list[tuple[float, float]]:
    """(start, end) of each warm load the door journaled (writer "warm": its intent, then its result). Pure."""
    spans, started = [], None
    for row in effects:
        if row.writer != "warm" or row.kind != "triton.load":
            continue
        if row.status == "intent":
            started = row.at
        elif started is not None:
            spans.append((started, row.at))
            started = None
    return spans


def overlaps(sample: RequestSample, spans: Sequence[tuple[float, float]]) -> bool:
    """Whether a request was sent or in flight during one of `spans`."""
    return any(sample.sent_at_unix <= end and answered_at(sample) >= start for start, end in spans)


def remediation_line(ttr_seconds: float | None) -> str:
    """This run's time to remediate against the measured range (pure: the demo prints it)."""
    median, low, high, seeds = MEASURED_TTR
    measured = f"over seeds {seeds} ({MEASURED_COMMAND}): median {median:.1f} s, range {low:.1f}-{high:.1f} s"
    if ttr_seconds is None or not math.isfinite(ttr_seconds):
        return f"no rollback within the bound; {measured}"
    where = "within" if low <= ttr_seconds <= high else ("faster than" if ttr_seconds < low else "slower than")
    return f"time to remediate {ttr_seconds:.1f} s (deploy to rollback), {where} the measured range; {measured}"


class TailScenario(Scenario):
    name = "tail"
    title = "a deploy of ranker v2 sends 0.5% of requests to 900 ms: P99 holds, P99.9 jumps; rolled back"
    rate_per_second = RATE_PER_SECOND
    clients_process = True  # the clients' quantiles are not held up by the daemon's event loop

    def __init__(self, model_seed: int = 0, keep_warm: bool = True) -> None:
        self.model_seed = model_seed
        self.keep_warm = keep_warm
        """`keepWarm: previous` on the example's rollback (the demo's default; `--no-keep-warm`)."""
        self.ttr_seconds: float | None = None
        """Deploy to rollback applied, once played (None: no rollback within the bound)."""
        self.clients: dict[str, dict[str, float]] = {}
        """The clients' quantiles (ms) before the deploy and from v2 serving to the rollback."""

    def write_models(self, root: Path) -> None:
        write_model_repository(root, MODEL, slow_fraction_by_version={1: 0.0, 2: SLOW_FRACTION}, slow_ms=SLOW_MS,
                               fast_ms=2, fast_ms_max=4, instances=4, seed=self.model_seed)

    def policy(self, triton_url: str, timings: Timings) -> str:
        raise NotImplementedError("the tail scenario needs the Triton server: policy_files()")

    def policy_files(self, triton: TritonServer, timings: Timings) -> dict[str, str]:
        return {MODEL: example_policy(triton, timings.short, self.keep_warm)}

    async def prepare(self, triton: TritonServer) -> None:
        await load_version(triton, 1)
        # Warm every instance before the daemon and the clients count anything: a cold Python-backend
        # stub answers its first request in ~0.3 s, and a burst on cold stubs queues past 500 ms,
        # which Triton's summary (what the alert reads) would keep for its window. One at a time first.
        await run_load(triton.base_url, MODEL, rate_per_second=20.0, duration_seconds=1.0, max_in_flight=1)
        await run_load(triton.base_url, MODEL, rate_per_second=100.0, duration_seconds=1.0)

    async def play(self, run: Run) -> None:
        run.enter("baseline")
        run.say(f"sending {self.rate_per_second:.0f} req/s to ranker v1 for {run.timings.baseline_seconds:.0f}s")
        await asyncio.sleep(run.timings.baseline_seconds)
        run.enter("deploy")
        deploying_at = time.time()
        await load_version(run.triton, None)
        deployed_at = time.time()  # v2 serves from here: the defect's onset
        versions = await asyncio.to_thread(served_versions, run.triton)
        run.mark("deploy", f"ranker now serves v{','.join(versions)} "
                           f"({SLOW_FRACTION:.1%} of requests take {SLOW_MS} ms)")
        run.enter("watching")
        acted_at = None
        decided_at = await run.first_decision_time(DECISION_BOUND_SECONDS)
        if decided_at is not None:
            acted_at = await run.first_apply_time(DECISION_BOUND_SECONDS)
            run.enter("verifying")
        self.ttr_seconds = None if acted_at is None else acted_at - deployed_at
        run.clients.quantiles()  # reads the clients' latest answers
        # The incident's window runs from v2 serving to the decision: requests sent or in flight
        # while Triton loads a version (the deploy, v2's cold start, the rollback, v1's warm load)
        # are left out, because on a starved host a model load itself holds requests for seconds,
        # which is not the defect. keepWarm moves the rollback's load to the warm load after the
        # deploy; what that load held is said below (and in the README), not hidden.
        warm = warm_load_spans(await run.service.journal.effects.of.in_thread(None, "triton.load"))
        settled = [(start, end + WARM_SETTLE_SECONDS) for start, end in warm]
        before = span_quantiles(run.clients.samples, run.live_since, deploying_at)
        during = span_quantiles([s for s in run.clients.samples if not overlaps(s, settled)],
                                deployed_at + COLD_START_SECONDS, decided_at if decided_at is not None else time.time())
        self.clients = {"before": before, "during": during}
        for start, end in warm:
            held = sum(1 for s in run.clients.samples if overlaps(s, [(start, end)]) and s.latency_seconds > HELD_SECONDS)
            run.say(f"v1 kept warm (keepWarm: previous): loaded beside v2 {start - deployed_at:.1f} s after the deploy "
                    f"in {end - start:.1f} s; {held} request(s) in flight then took over {HELD_SECONDS * 1000:.0f} ms "
                    f"(the load and {WARM_SETTLE_SECONDS:.0f} s after it left out of the incident's quantiles, as the "
                    "deploy's own load)")
        run.say(f"v2 loaded in {deployed_at - deploying_at:.1f} s; clients, before the deploy -> until the decision: " + ", ".join(
            f"{name} {before[name]:.0f} -> {during[name]:.0f} ms" for name in before)
            + (f" (P99 x{during['P99'] / before['P99']:.2f})" if before["P99"] > 0 else ""))
        run.say(remediation_line(self.ttr_seconds))
        verdict = await run.wait_for_verdict(VERDICT_BOUND_SECONDS)
        run.enter("settling")
        run.say(f"recovery verdict: {verdict['status'] if verdict else 'none within the watch window'}")

    def final_objects(self, run: Run) -> Mapping[str, Any]:
        return {"ttr_seconds": self.ttr_seconds, "clients_ms": self.clients}


SCENARIO = TailScenario()
