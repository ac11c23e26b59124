"""The supervisor and the periodic wait (daemon/common/lifecycle.py): named, guarded tasks, a crash
recorded and restarted with backoff without ending the others, a crash budget, stop steps in order;
the wait that ends on stop, a wake or time."""
from __future__ import annotations

import asyncio
import time

import pytest
import structlog

from daemon.common.lifecycle import Loop, RestartPolicy, Supervisor, wait_or_stop
from daemon.common.metrics import Metrics


def _faults(metrics: Metrics, component: str) -> float | None:
    return metrics.registry.get_sample_value("tailguard_faults_total", {"component": component})


async def test_wait_or_stop_times_out_false_and_ends_at_once_on_stop() -> None:
    """No stop: it waits the time and answers False; stop set during the wait ends it early with True."""
    stop = asyncio.Event()
    started = time.monotonic()
    assert await wait_or_stop(stop, 0.05) is False
    assert time.monotonic() - started >= 0.04
    asyncio.get_running_loop().call_later(0.05, stop.set)
    started = time.monotonic()
    assert await wait_or_stop(stop, 30) is True
    assert time.monotonic() - started < 5
    assert await wait_or_stop(stop, 30) is True  # already set: no wait


async def test_wait_or_stop_ends_on_a_wake_event_or_a_future_it_leaves_to_the_caller() -> None:
    """A wake event or a caller's future cuts the wait short (answer False: not stopped); the future
    is neither cancelled nor consumed, and no waiter is left behind."""
    stop, wake = asyncio.Event(), asyncio.Event()
    asyncio.get_running_loop().call_later(0.02, wake.set)
    assert await wait_or_stop(stop, 30, wake) is False
    loop = asyncio.get_running_loop()
    heard: asyncio.Future[bool] = loop.create_future()
    loop.call_later(0.02, heard.set_result, True)
    assert await wait_or_stop(stop, 30, asyncio.Event(), heard) is False
    assert heard.result() is True
    pending: asyncio.Future[bool] = loop.create_future()
    assert await wait_or_stop(stop, 0.02, pending) is False
    assert not pending.done()  # the caller's to cancel
    pending.cancel()
    assert await wait_or_stop(stop, None, wake) is False  # no bound: the set wake ends it


def _crashes(metrics: Metrics, component: str) -> float | None:
    return metrics.registry.get_sample_value("tailguard_loop_crashes_total", {"component": component})


async def test_a_crashed_component_is_recorded_restarted_and_the_others_keep_running() -> None:
    """A component that raises is counted once (tailguard_faults_total and tailguard_loop_crashes_total
    {component}), logged, and run again after the backoff: its task stays in the running set, and a
    sibling runs on meanwhile."""
    metrics = Metrics()
    sup = Supervisor(metrics, RestartPolicy(initial_seconds=0.05, max_seconds=1.0))
    rounds: list[int] = []
    runs: list[int] = []

    async def steady(stop: asyncio.Event) -> None:
        while not await wait_or_stop(stop, 0.01):
            rounds.append(1)

    async def broken_once(stop: asyncio.Event) -> None:
        runs.append(1)
        if len(runs) == 1:
            raise RuntimeError("a bug")
        await stop.wait()

    sup.on_stop(sup.cancel_tasks)
    sup.start("steady", Loop(steady))
    with structlog.testing.capture_logs() as logs:
        sup.start("broken-1", Loop(broken_once), fault="broken")
        deadline = time.monotonic() + 5
        while len(runs) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
    assert len(runs) == 2, "the crashed loop was not restarted"
    assert _faults(metrics, "broken") == 1.0 and _crashes(metrics, "broken") == 1.0
    (line,) = [e for e in logs if e["event"] == "component crashed"]
    assert (line["component"], line["task"], line["error"]) == ("broken", "broken-1", "RuntimeError: a bug")
    (restart,) = [e for e in logs if e["event"] == "restarting crashed component"]
    assert restart["restart_in_seconds"] == 0.05 and restart["crashes_in_window"] == 1
    assert [t.get_name() for t in sup.tasks] == ["steady", "broken-1"]
    assert sup.crash_counts() == {"broken": 1} and sup.trouble() is None  # one crash: not failing
    assert rounds, "the sibling stopped with the crash"
    await sup.stop()
    assert sup.tasks == []


async def test_a_loop_that_keeps_crashing_backs_off_and_turns_the_supervisor_failing() -> None:
    """Each restart waits twice as long (capped); at max_crashes crashes within the window `trouble`
    names the component, the count and the last error; once the crashes age out of the window it
    clears. A restart waiting out its backoff ends at once on stop."""
    now = [1000.0]
    metrics = Metrics()
    sup = Supervisor(metrics, RestartPolicy(initial_seconds=0.01, max_seconds=0.04, max_crashes=4,
                                            window_seconds=60), clock=lambda: now[0])

    async def always(stop: asyncio.Event) -> None:
        raise ValueError(f"bad row {_crashes(metrics, 'poller') or 0:.0f}")

    with structlog.testing.capture_logs() as logs:
        task = sup.start("poller", Loop(always))
        deadline = time.monotonic() + 5
        while sup.trouble() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
    waits = [e["restart_in_seconds"] for e in logs if e["event"] == "restarting crashed component"]
    assert waits[:4] == [0.01, 0.02, 0.04, 0.04]
    assert sup.trouble() == "poller crashed 4 times in 60s (limit 4): ValueError: bad row 3"
    assert not task.done()  # still restarting: a crash loop is seen, not given up on
    now[0] += 61
    assert sup.trouble() is None and sup.crash_counts() == {}
    started = time.monotonic()
    sup.on_stop(sup.cancel_tasks)
    await sup.stop()
    assert task.done() and time.monotonic() - started < 5


async def test_child_tasks_count_in_their_owners_crash_budget_without_a_second_fault() -> None:
    """A component's child task (a poll of one group) that raises counts one crash of its owner
    (tailguard_loop_crashes_total) but no fault: the owner reads the task and counts its own."""
    metrics = Metrics()
    sup = Supervisor(metrics, RestartPolicy(max_crashes=2))

    async def boom() -> None:
        raise RuntimeError("group 3")

    for i in range(2):
        task = sup.child(f"poll-{i}", boom(), fault="poller")
        await asyncio.gather(task, return_exceptions=True)
        await asyncio.sleep(0)
    assert _crashes(metrics, "poller") == 2.0 and _faults(metrics, "poller") is None
    assert sup.trouble() is not None and sup.trouble().startswith("poller crashed 2 times")
    with pytest.raises(ValueError):
        RestartPolicy(initial_seconds=2, max_seconds=1)


async def test_stop_sets_the_event_then_runs_the_steps_last_pushed_first_even_past_a_failure() -> None:
    """stop() sets the stop event first, runs a step pushed later before those pushed earlier (a list
    given to on_stop_in_order in its own order; sync and async alike), goes on past a step that raises
    (raised at the end), and runs nothing twice."""
    sup = Supervisor(Metrics())
    order: list[str] = []

    async def close_clients() -> None:
        order.append("clients")

    def failing() -> None:
        order.append("failing")
        raise OSError("step failed")

    sup.on_stop_in_order(lambda: order.append("workers"), failing, close_clients)
    sup.on_stop(lambda: order.append(f"webhooks stop={sup.stopping.is_set()}"))
    with pytest.raises(OSError, match="step failed"):
        await sup.stop()
    assert order == ["webhooks stop=True", "workers", "failing", "clients"]
    await sup.stop()
    assert len(order) == 4


async def test_cancel_tasks_leaves_a_joined_task_to_end_by_itself_and_join_is_bounded() -> None:
    """cancel_tasks cancels the loops but not a joined component (the elector): that one sees stop,
    finishes its own way (hands its Lease back); join waits for it, and cancels one that takes too long."""
    sup = Supervisor(Metrics())
    handed_back: list[bool] = []

    async def elector(stop: asyncio.Event) -> None:
        await stop.wait()
        await asyncio.sleep(0.02)
        handed_back.append(True)

    async def stuck(stop: asyncio.Event) -> None:
        await asyncio.Event().wait()

    worker = sup.start("worker-0", Loop(stuck))
    sup.start("leader-election", Loop(elector), joined=True)
    hung = sup.start("hung", Loop(stuck), joined=True)
    sup.stopping.set()
    await sup.cancel_tasks()
    assert worker.cancelled() and [t.get_name() for t in sup.tasks] == ["leader-election", "hung"]
    await sup.join(sup.task("leader-election"), 5)
    assert handed_back == [True]
    started = time.monotonic()
    await sup.join(hung, 0.05)
    assert hung.cancelled() and time.monotonic() - started < 5
    await sup.join(None, 5)  # never started: nothing to wait for


async def test_spawned_work_is_named_and_cancelled_with_the_loops() -> None:
    """One-off work (a takeover's resume) runs as a named task; cancel_tasks ends it if still running."""
    sup = Supervisor(Metrics())
    task = sup.spawn("resume-verifications", asyncio.Event().wait())
    assert sup.task("resume-verifications") is task
    await sup.cancel_tasks()
    assert task.cancelled() and sup.tasks == []


class _DatabaseDown(Exception):
    pass


async def test_an_outage_restarts_the_loop_but_spends_no_crash_budget() -> None:
    """A loop (or a child) failing on an outage type (the journal down) is restarted with backoff and
    counted as a fault, not as a crash: a new pod would find the same database down, so the probes
    are left to the journal's own health."""
    metrics = Metrics()
    sup = Supervisor(metrics, RestartPolicy(initial_seconds=0.01, max_seconds=0.02, max_crashes=2),
                     outages=(_DatabaseDown,))
    runs: list[int] = []

    async def down(stop: asyncio.Event) -> None:
        runs.append(1)
        raise _DatabaseDown("journal write failed")

    async def child() -> None:
        raise _DatabaseDown("journal read failed")

    with structlog.testing.capture_logs() as logs:
        sup.start("journal-prune", Loop(down))
        await asyncio.gather(sup.child("poll-1", child(), fault="poller", logged=True), return_exceptions=True)
        deadline = time.monotonic() + 5
        while len(runs) < 4 and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
    assert len(runs) >= 4 and sup.trouble() is None and sup.crash_counts() == {}
    assert _crashes(metrics, "journal-prune") is None and (_faults(metrics, "journal-prune") or 0) >= 4
    assert _faults(metrics, "poller") == 1.0
    assert any(e["event"] == "component failed on an outage" for e in logs)
    assert not any(e["event"] == "component crashed" for e in logs)
    sup.on_stop(sup.cancel_tasks)
    await sup.stop()


# Calls that start a task outside the supervisor, each with why it may: a wait awaited (or cancelled)
# in the same function is not background work.
_IN_PLACE = {("daemon/common/lifecycle.py", "ensure_future"): "wait_or_stop's waiters, cancelled before it returns",
             ("daemon/common/lifecycle.py", "create_task"): "the supervisor itself, and plain_spawn for tools",
             ("daemon/workers/journal_upkeep.py", "ensure_future"): "a notice wait cancelled in the same function"}


def test_every_background_task_of_the_daemon_starts_through_the_supervisor() -> None:
    """No module of the daemon starts a task of its own (asyncio.create_task, loop.create_task,
    ensure_future) but the supervisor and the in-place waits named above: per-group polls, recovery
    watches, approved plans, notifier lanes and endpoint follows take a Spawn the service hands them."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    found = set()
    for path in sorted((root / "daemon").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in ("create_task", "ensure_future"):
                found.add((str(path.relative_to(root)), node.func.attr))
    assert found <= set(_IN_PLACE), sorted(found - set(_IN_PLACE))
