"""Issue 42's bad input at the Triton edge, each through the real `triton.rollback`, executor, pin
reconciler and door over the in-process Triton (tests/support/fake_triton.py): a pin or a rollback
to a version the repository lacks is Triton's refusal recorded with its reason (nothing served
changes), and a Triton that answers the load (200) but keeps serving the old version is caught by
verify and recorded as a failure, never reported as success.
"""
from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from core.signal import Signal, SignalSource
from daemon.workers.context import ActContext
from daemon.workers.executor import Executor
from policies.loader import PolicySet, load_policies_text
from tests.unit.test_door import KEY, MODEL, URLS, World, _policy


async def _rollback(w: World) -> None:
    """One alert through the executor (its apply and verify run on the fake Triton)."""
    async def sleep(delay: float) -> None:
        w.now += delay

    executor = Executor(ActContext(w.journal, w.state, w.deps, w.metrics, w.registry, clock=lambda: w.now,
                                   sleep=sleep, notify=w.announced.append))
    signal = Signal(SignalSource.ALERT, "TailLatencyHigh", {"model": MODEL}, datetime.now(timezone.utc), "a1")
    ((signal_id, stored),), _ = await w.journal.signals.intake([signal])
    await executor.process(signal_id, stored)
    await executor.wait_recoveries()
    await executor.close()


MISSING = "InferenceServerException: [400] failed to load 'ranker' version 9: not found in the repository"


def _policy_to(w: World, version: int) -> None:
    """The world's policy with `to: <version>` (an explicit version, which planning cannot check
    against the repository: Triton's index lists only the versions it has loaded)."""
    text = _policy().replace("{type: triton.rollback}", f"{{type: triton.rollback, to: {version}}}")
    w.state.policies = PolicySet(load_policies_text(text, "p.yaml", w.registry, {}).policies)


async def test_a_pin_to_a_version_the_repository_lacks_records_tritons_refusal(tmp_path: Path) -> None:
    """The pin says version 9, the repository has 1 and 2: the re-pin fails naming Triton's refusal
    per replica, each load's result is journaled failed with Triton's error, nothing served changes."""
    w = World(tmp_path)
    try:
        w.journal.pins.record(KEY, MODEL, 9, from_version=2, policy="rollback")
        w.journal.bad_versions.mark(KEY, 2, "rolled back from")

        outcome = (await w.pins.reconcile_once())[KEY]

        assert outcome.status.value == "failed" and outcome.message.startswith("version 9 refused on 2 of 2 replica(s)")
        assert outcome.data["refused"] == {u: f"Triton: {MISSING.split('] ')[1]}; serves [2]" for u in URLS}
        assert w.triton.served() == {u: [2] for u in URLS}
        assert [(r.status, r.message) for r in w.effects() if r.status != "intent"] == [("failed", MISSING)] * 2
    finally:
        w.close()


async def test_a_rollback_to_a_version_the_repository_lacks_fails_with_tritons_reason(tmp_path: Path) -> None:
    """A policy's `to: 9` on a repository of 1 and 2: the decision fails (never succeeded) saying the
    version was refused, Triton's error is journaled on every load's result, nothing served changes."""
    w = World(tmp_path)
    try:
        _policy_to(w, 9)
        await _rollback(w)

        (decision,) = w.journal.decisions.all()
        assert decision.state.value == "failed" and not w.journal.pins.live()
        assert "step 0 (triton.rollback) failed: version 9 refused on 2 of 2 replica(s)" in decision.reason
        results = [r for r in w.effects() if r.status != "intent"]
        assert results and {(r.status, r.message) for r in results} == {("failed", MISSING)}
        assert w.triton.served() == {u: [2] for u in URLS}
    finally:
        w.close()


async def test_a_triton_that_answers_the_load_but_serves_the_old_version_is_a_failure(tmp_path: Path) -> None:
    """Replica b answers every load (200) and keeps serving version 2: the load's result is `done`, but
    verify reads the served versions and the decision fails naming the replica not confirmed; no pin,
    never `succeeded`. The pin reconciler's pass on it fails the same way, naming what b serves."""
    w = World(tmp_path)
    try:
        w.triton.replicas[URLS[1]].stale = True
        await _rollback(w)

        (decision,) = w.journal.decisions.all()
        assert decision.state.value == "failed", decision.reason
        assert decision.reason.endswith("failed: version 1 not confirmed on 1 replica(s) that answer")
        assert w.triton.served() == {URLS[0]: [1], URLS[1]: [2]}
        assert {r.status for r in w.effects()} == {"intent", "done"}  # Triton said yes; verify said no

        w.journal.pins.record(KEY, MODEL, 1, from_version=2, policy="rollback")
        outcome = (await w.pins.reconcile_once())[KEY]
        assert not outcome.ok and outcome.data["problems"] == {URLS[1]: "serves versions [2], expected only 1"}
    finally:
        w.close()
