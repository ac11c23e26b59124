"""A warm version that failed to load (issue 44, bad input): the door journals it (intent with the
replica and the version, then `failed`), and it is read back from the journal, so a restart of the
daemon neither forgets it (a load retried every pass, each one starting the version's backend
instances) nor holds it forever (retried after RETRY_AFTER_SECONDS; a later load that succeeded ends it)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from tritonclient.utils import InferenceServerException

from actions.base import ActionDeps
from actions.triton import TritonRollbackParams
from actions.triton_warm import keep_warm
from core.target import Target
from daemon.common.metrics import Metrics
from daemon.storage.effects import DONE, FAILED, INTENT, REFUSED
from daemon.storage.journal import Journal
from daemon.storage.records import EffectRow
from daemon.workers.context import ActContext
from daemon.workers.door import EXECUTOR, acting
from daemon.workers.state import ExecutorState
from daemon.workers.warm import WARM, WarmKeeper
from daemon.workers.warm_failures import RETRY_AFTER_SECONDS, failed_warm_loads, journaled_failures
from policies.loader import PolicySet, load_policies_text
from tests.support.fake_triton import CountingDoor, FakeTriton, Load

MODEL = "ranker"
KEY = f"default/{MODEL}"
A, B = "http://a:8000", "http://b:8000"
TARGET = Target(MODEL, triton_endpoints=(A, B))
PARAMS = TritonRollbackParams.model_validate({"keepWarm": "previous"})


def _row(id_: int, writer: str, status: str, **data: Any) -> EffectRow:
    return EffectRow(id_, 0.0, writer, KEY, "triton.load", status, "", data, None, None)


def test_the_last_warm_load_per_replica_decides_and_other_writers_do_not_count() -> None:
    rows = [_row(1, WARM, INTENT, replica=A, loads=2), _row(2, WARM, FAILED, intent=1),
            _row(3, WARM, INTENT, replica=B, loads=2), _row(4, WARM, DONE, intent=3),
            _row(5, EXECUTOR, INTENT, replica=B, loads=1), _row(6, EXECUTOR, FAILED, intent=5),
            _row(7, WARM, REFUSED, replica=B, loads=2, check="freeze")]
    assert failed_warm_loads(rows, WARM) == {A: 2}
    # A later warm load on the same replica that succeeded ends the failure.
    assert failed_warm_loads([*rows, _row(8, WARM, INTENT, replica=A, loads=2), _row(9, WARM, DONE, intent=8)],
                             WARM) == {}
    # A result whose intent fell out of the window read is not counted (it is retried).
    assert failed_warm_loads([_row(2, WARM, FAILED, intent=1)], WARM) == {}


class Daemon:
    """One daemon's journal and door over the same journal file (a restart is a new one)."""

    def __init__(self, path: Path, clock: list[float]) -> None:
        self.journal = Journal(path, clock=lambda: clock[0])
        self.deps = ActionDeps()
        self.deps.actuator = CountingDoor(self.journal, ExecutorState(PolicySet([])), self.deps, lambda: True,
                                          Metrics(), clock=lambda: clock[0])


async def test_a_failed_warm_load_is_journaled_and_a_restart_neither_retries_it_nor_forgets_it(tmp_path: Path) -> None:
    clock = [1_000_000.0]
    triton = FakeTriton(MODEL, (A, B))
    triton.redeploy(3)
    broken = {A}  # Triton refuses A's load of version 2 (its folder unreadable there)
    fake_load = triton.load

    def load(url: str, config: Mapping[str, Any]) -> None:
        if url in broken:
            triton.loads.append(Load(url, MODEL, (), True))
            raise InferenceServerException(msg="failed to load 'ranker' version 2: unreadable", status="400")
        fake_load(url, config)

    triton.load = load  # type: ignore[method-assign]
    first = Daemon(tmp_path / "journal.db", clock)
    with acting(WARM, KEY):
        out = await keep_warm(triton.action()(first.deps), TARGET, PARAMS, {})
    assert out.status.value == "failed" and out.data["warmed"] == {B: 2} and A in out.data["errors"]
    assert triton.served() == {A: [3], B: [2, 3]}  # A serves what it served
    assert await journaled_failures(first.journal, KEY, WARM) == {A: 2}
    first.journal.close()

    # A restart: nothing in memory; the journal says A's warm load of 2 failed, so it is not sent again.
    clock[0] += 60.0
    second = Daemon(tmp_path / "journal.db", clock)
    failed = await journaled_failures(second.journal, KEY, WARM)
    assert failed == {A: 2}
    tries = len(triton.loads)
    with acting(WARM, KEY):
        again = await keep_warm(triton.action()(second.deps), TARGET, PARAMS, failed)
    assert again.status.value == "noop" and "failed before" in again.data["skipped"][A]
    assert len(triton.loads) == tries and second.deps.actuator.sent == 0  # type: ignore[attr-defined]

    # After RETRY_AFTER_SECONDS it is tried once more: the repository was fixed meanwhile, the load
    # succeeds, and the success ends the failure.
    clock[0] += RETRY_AFTER_SECONDS
    broken.clear()
    assert await journaled_failures(second.journal, KEY, WARM) == {}
    with acting(WARM, KEY):
        fixed = await keep_warm(triton.action()(second.deps), TARGET, PARAMS, {})
    assert fixed.ok and fixed.data["warmed"] == {A: 2} and triton.served() == {A: [2, 3], B: [2, 3]}
    clock[0] -= RETRY_AFTER_SECONDS / 2  # even the old failure in the window is ended by the later success
    assert await journaled_failures(second.journal, KEY, WARM) == {}
    second.journal.close()


POLICY = (f"name: rollback\ntarget: {{model: {MODEL}, triton: {{endpoints: ['{A}', '{B}']}}}}\n"
          "triggers:\n  - alert: {name: TailLatencyHigh, actsUngoverned: true}\n"
          "actions:\n  - {type: triton.rollback, keepWarm: previous}\n"
          "verify: {query: up, below: 1, onNotRecovered: none}\n")


async def test_the_warm_keeper_after_a_restart_does_not_load_again_what_failed_before(tmp_path: Path) -> None:
    """The keeper itself (the pin reconciler's passes): a failed warm load on A, then a new keeper on the
    same journal file (a restart) makes no load on A, and one more pass makes none either."""
    clock = [1_000_000.0]
    triton = FakeTriton(MODEL, (A, B))
    triton.redeploy(3)
    fake_load = triton.load

    def load(url: str, config: Mapping[str, Any]) -> None:
        if url == A:
            triton.loads.append(Load(url, MODEL, (), True))
            raise InferenceServerException(msg="failed to load 'ranker' version 2: unreadable", status="400")
        fake_load(url, config)

    triton.load = load  # type: ignore[method-assign]
    registry: dict[str, Any] = {"triton.rollback": triton.action()}
    policies = load_policies_text(POLICY, "p.yaml", registry, {})

    def keeper(daemon: Daemon) -> WarmKeeper:
        state = ExecutorState(PolicySet(policies.policies))
        return WarmKeeper(ActContext(daemon.journal, state, daemon.deps, Metrics(), registry, clock=lambda: clock[0]))

    first = Daemon(tmp_path / "journal.db", clock)
    out = (await keeper(first).once())[KEY]
    assert out.status.value == "failed" and out.data["warmed"] == {B: 2}, out.message
    first.journal.close()
    tries = [load.url for load in triton.loads]
    assert tries == [A, B]

    second = Daemon(tmp_path / "journal.db", clock)
    restarted = keeper(second)
    for _ in range(2):
        again = (await restarted.once())[KEY]
        assert again.status.value == "noop" and "failed before" in again.data["skipped"][A], again.message
    assert [load.url for load in triton.loads] == tries  # nothing sent to A (nor to B: it is warm)
    second.journal.close()
