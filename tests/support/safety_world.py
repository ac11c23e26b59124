"""The world the model-based safety test (tests/unit/test_stateful_safety.py) drives the real daemon
components against: a fake clock, in-process Triton, Kubernetes and Prometheus ports, and daemon
processes (executor, pin reconciler, recovery watches, journal) rebuilt over one SQLite file.

Everything runs on one event loop with no thread: the journal's `in_thread` calls run inline (an
executor that runs the call at once), so a run is a pure function of its rules and Hypothesis can
shrink it. Every Triton write is checked at the moment it is made against what the journal says
then (freezes, bad marks, the fence term), through an observer connection to the same file; what
it finds is kept in `World.violations` for the machine's invariants.

The Triton port answers what `tritonclient.http.aio.InferenceServerClient` answers (repository
index, model config, load with a config), with a replica down refusing connections, a restarted
replica on the newest version of its repository (as a new pod starts), and a redeploy loading the
newest version on every replica. The Kubernetes port is the EndpointSlices (ready and not ready
replicas) and the Event recorder; the Prometheus port answers instant and range queries from the
served versions' health, with whole and partial outages.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import heapq
import importlib
import importlib.util
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from actions.base import Action, ActionDeps, Replicas
from actions.triton import TritonRollback
from core.query import QueryResult, Sample, Series
from core.signal import Signal, SignalSource
from core.target import Target
from daemon.common.config import BlastRadiusSettings
from daemon.common.metrics import Metrics
from daemon.sources.prometheus import RangeResult
from daemon.storage.journal import Journal
from daemon.storage.records import DAEMON_SCOPE
from daemon.workers.context import ActContext
from daemon.workers.executor import Executor, ExecutorLimits
from daemon.workers.freezes import FreezeControl
from daemon.workers.pins import PinReconciler
from daemon.workers.state import ExecutorState
from daemon.wiring.registries import action_registry, detector_registry
from policies.loader import PolicySet, load_policies_text
from policies.recovery import RecoveryCondition
from policies.schema import AlertTrigger

START = 1_800_000_000.0  # the fake clock's start (unix seconds)
MODELS = ("ranker", "scorer")
REPLICAS = 2  # per model
LOAD_SECONDS = 1.5  # a Triton load with a new version policy (docs/stack-facts.md)
ALERT = "TritonTailLatencyHigh"
QUERY = 'p999{model="$model"}'
LINE = 500.0  # the verify line (below is good)
GOOD_MS, BAD_MS = 100.0, 900.0
MAX_ACTIONS, MAX_ACTIONS_WINDOW = 2, 1800.0
VERIFY = {"hold": 30.0, "within": 120.0, "interval": 15.0}
SCRAPE_SECONDS = 15.0
# ranker reverts a rollback that did not help; scorer escalates (freezes its target).
ON_NOT_RECOVERED = {"ranker": "revert", "scorer": "escalate"}


# Where alerts are governed by a detector (policies/governance.py), the model's alert acts as the
# operator's own rule (actsUngoverned): the test is about what acting may touch, not when to act.
UNGOVERNED = ", actsUngoverned: true" if "acts_ungoverned" in AlertTrigger.model_fields else ""


def policies_yaml() -> str:
    """One policy per model: an alert (acting ungoverned) and a threshold detector start
    triton.rollback, under maxActions, with a verify block whose onNotRecovered differs by model."""
    docs = []
    for model in MODELS:
        urls = ", ".join(f"'{replica_url(model, i)}'" for i in range(REPLICAS))
        v = VERIFY
        docs.append(
            f"name: {model}-rollback\n"
            f"target: {{model: {model}, triton: {{endpoints: [{urls}]}}}}\n"
            "triggers:\n"
            f"  - alert: {{name: {ALERT}{UNGOVERNED}}}\n"
            f"  - detector: {{type: threshold, query: '{QUERY}', interval: 15s, params: {{threshold: {LINE:g}}}}}\n"
            "actions:\n  - {type: triton.rollback}\n"
            f"guards: {{cooldown: 60s, maxActions: {MAX_ACTIONS}, maxActionsWindow: {MAX_ACTIONS_WINDOW:g}s}}\n"
            f"verify: {{query: '{QUERY}', below: {LINE:g}, for: {v['hold']:g}s, within: {v['within']:g}s, "
            f"interval: {v['interval']:g}s, onNotRecovered: {ON_NOT_RECOVERED[model]}}}\n")
    return "---\n".join(docs)


def replica_url(model: str, index: int) -> str:
    return f"http://{model}-{index}.triton:8000"


def target_key(model: str) -> str:
    return f"default/{model}"


# ---- the loop: no thread, a fake clock -------------------------------------------------------------

class InlineExecutor(concurrent.futures.ThreadPoolExecutor):
    """Runs what `asyncio.to_thread` hands it at once, in the loop's thread: the journal's calls
    complete in a fixed order, so a run never depends on thread timing."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        done: concurrent.futures.Future[Any] = concurrent.futures.Future()
        try:
            done.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # handed to the awaiting coroutine, as a worker thread would
            done.set_exception(exc)
        return done


class ModelClock:
    """Fake monotonic time: `sleep` wakes once `now` passes its deadline (the machine moves `now`).
    A process's Unix time is this plus the system clock's step when it started (`Process.time`): as
    daemon/common/clock.py's SteadyClock, a running daemon never sees a step, a restarted one adopts it."""

    def __init__(self, loop: asyncio.AbstractEventLoop, start: float = START) -> None:
        self.now = start
        self._loop = loop
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def time(self) -> float:
        return self.now

    async def sleep(self, delay: float) -> None:
        woken: asyncio.Future[None] = self._loop.create_future()
        heapq.heappush(self._sleepers, (self.now + max(0.0, delay), next(self._seq), woken))
        await woken

    def next_deadline(self) -> float | None:
        while self._sleepers and self._sleepers[0][2].done():  # cancelled sleepers
            heapq.heappop(self._sleepers)
        return self._sleepers[0][0] if self._sleepers else None

    def wake_due(self) -> int:
        woken = 0
        while self._sleepers and self._sleepers[0][0] <= self.now:
            _, _, future = heapq.heappop(self._sleepers)
            if not future.done():
                future.set_result(None)
                woken += 1
        return woken


def run_until_idle(loop: asyncio.AbstractEventLoop, rounds: int = 10_000) -> None:
    """Run the loop until nothing is ready to run (every task waits on the fake clock or is done)."""
    async def settle() -> None:
        for _ in range(rounds):
            await asyncio.sleep(0)
            if not loop._ready:  # type: ignore[attr-defined]  # BaseEventLoop's ready queue: idle when empty
                return
        raise AssertionError(f"the loop did not settle within {rounds} rounds")

    loop.run_until_complete(settle())


# ---- Triton ---------------------------------------------------------------------------------------

class TritonDown(ConnectionRefusedError):
    """What a replica that is down answers (the action counts it down, never refusing)."""


@dataclass
class Replica:
    model: str
    repository: set[int]
    up: bool = True
    pinned: list[int] | None = None  # the version policy's `specific` versions; None: latest
    ready: list[int] = field(default_factory=list)
    generation: int = 0  # a new pod each start: a load sent to the old one never lands

    def start(self) -> None:
        """A pod starts: its config from the repository (latest), the newest version loaded."""
        self.generation += 1
        self.pinned = None
        self.ready = [max(self.repository)]

    def index(self) -> list[dict[str, Any]]:
        return [{"name": self.model, "version": str(v), "state": "READY" if v in self.ready else "UNAVAILABLE"}
                for v in sorted(self.repository)]

    def config(self) -> dict[str, Any]:
        policy = {"specific": {"versions": list(self.pinned)}} if self.pinned else {"latest": {"num_versions": 1}}
        return {"name": self.model, "platform": "python", "version_policy": policy}


@dataclass(frozen=True)
class Write:
    """A write to Triton made by a daemon process, with what the journal said at that moment."""

    seq: int
    at: float
    process: str
    term: int | None  # the fence term the writing process held
    current_term: int | None  # the journal's term at the write
    target: str
    url: str
    version: int | None  # the only version the loaded config serves (None: latest)
    writer: str  # executor | revert | recovery_revert | pin | unknown (from the call stack)
    decision_id: int | None
    frozen: str | None  # the freeze in force on the target, or None
    bad: tuple[int, int | None] | None  # (version, the mark's decision) when the version is marked bad


class TritonPort:
    """Every model's replicas, and every write the daemon made to them."""

    def __init__(self, world: "World") -> None:
        self._world = world
        self.replicas: dict[str, Replica] = {}
        for model in MODELS:
            for i in range(REPLICAS):
                replica = Replica(model, {1, 2})
                replica.start()
                self.replicas[replica_url(model, i)] = replica
        self.writes: list[Write] = []
        self.landing: set[asyncio.Future[None]] = set()  # loads sent, not landed yet
        self.slow = False  # loads land LOAD_SECONDS after they are sent (else at once)
        self._seq = itertools.count()

    def of(self, model: str) -> list[tuple[str, Replica]]:
        return [(u, r) for u, r in self.replicas.items() if r.model == model]

    def served(self, model: str) -> set[int]:
        """The versions READY on the replicas that are up."""
        return {v for _, r in self.of(model) if r.up for v in r.ready}

    def client(self, url: str, process: "Process") -> "TritonClient":
        return TritonClient(self, url, process)

    async def load(self, url: str, model: str, config: Mapping[str, Any], process: "Process") -> None:
        """A load request: checked against the journal when it is sent; landing at once, or while
        `slow` LOAD_SECONDS later (rules interleave with it: a freeze, a takeover, a restart, the pod
        going down). The load is the replica's, not the client's: a client that goes away does not stop it."""
        replica = self._replica(url, model)
        specific = (config.get("version_policy") or {}).get("specific")
        versions = sorted(int(v) for v in specific["versions"]) if specific else None
        self.writes.append(self._world.observe_write(next(self._seq), process, model, url, versions))
        missing = [v for v in versions or () if v not in replica.repository]
        if missing:
            raise _triton_error(f"failed to load '{model}' version {missing[0]}: not found in the repository")
        if not self.slow:
            replica.pinned = versions
            replica.ready = list(versions) if versions else [max(replica.repository)]
            return
        landing = asyncio.ensure_future(self._land(url, replica, replica.generation, versions))
        self.landing.add(landing)
        landing.add_done_callback(self._landed)
        await asyncio.shield(landing)

    def _landed(self, landing: asyncio.Future[None]) -> None:
        self.landing.discard(landing)
        if not landing.cancelled():
            landing.exception()  # retrieved: its client may have gone away (a restart) and not await it

    async def _land(self, url: str, replica: Replica, generation: int, versions: list[int] | None) -> None:
        await self._world.clock.sleep(LOAD_SECONDS)
        if replica.generation != generation or not replica.up:  # the pod went down or restarted meanwhile
            raise TritonDown(f"connection to {url} reset")
        replica.pinned = versions
        replica.ready = list(versions) if versions else [max(replica.repository)]

    def _replica(self, url: str, model: str) -> Replica:
        replica = self.replicas.get(url)
        if replica is None or not replica.up:
            raise TritonDown(f"connect to {url} refused")
        if replica.model != model:
            raise _triton_error(f"unknown model '{model}'")
        return replica


def _triton_error(message: str) -> Exception:
    from tritonclient.utils import InferenceServerException
    error: Exception = InferenceServerException(msg=message, status="400")
    return error


class TritonClient:
    """The part of tritonclient's InferenceServerClient that triton.rollback calls."""

    def __init__(self, port: TritonPort, url: str, process: "Process") -> None:
        self._port, self._url, self._process = port, url, process

    async def get_model_repository_index(self) -> list[dict[str, Any]]:
        replica = self._port.replicas.get(self._url)
        if replica is None or not replica.up:
            raise TritonDown(f"connect to {self._url} refused")
        return replica.index()

    async def get_model_config(self, model: str) -> dict[str, Any]:
        return self._port._replica(self._url, model).config()

    async def load_model(self, model: str, config: str | None = None) -> None:
        await self._port.load(self._url, model, json.loads(config) if config else {}, self._process)

    async def close(self) -> None:
        return None


def rollback_action_for(port: TritonPort, process: "Process") -> type[Action]:
    """The real triton.rollback, its Triton client the port's (one class per process, so a write
    is attributed to the process that made it)."""
    class ModelTritonRollback(TritonRollback):
        def _client(self, base_url: str, timeout: float) -> Any:
            return port.client(base_url, process)

    return ModelTritonRollback


# ---- Kubernetes -----------------------------------------------------------------------------------

class KubePort:
    """The target's EndpointSlices (a replica down is listed not ready) and the Events recorded."""

    def __init__(self, triton: TritonPort) -> None:
        self._triton = triton
        self.events: list[tuple[str, str]] = []

    async def replicas(self, target: Target) -> Replicas:
        mine = self._triton.of(target.model)
        return Replicas(tuple(u for u, r in mine if r.up), tuple(u for u, r in mine if not r.up))

    async def record_event(self, *, policy: Any, reason: str, message: str, warning: bool) -> None:
        self.events.append((policy.target.key, reason))


# ---- Prometheus -----------------------------------------------------------------------------------

class PrometheusPort:
    """p999 per model: bad while an up replica serves a bad version, good while up replicas serve
    only good ones, no series while none is up. `outage`: None, "whole" (every query fails) or the
    models whose series are gone (a partial outage: their scrape targets vanished)."""

    def __init__(self, world: "World") -> None:
        self._world = world
        self.bad_versions: dict[str, set[int]] = {m: {2} for m in MODELS}
        self.outage: str | frozenset[str] | None = None
        self.scrapes: dict[str, list[tuple[float, float]]] = {m: [] for m in MODELS}
        self.answered: dict[str, list[tuple[float, float]]] = {m: [] for m in MODELS}  # what any query was told
        self._last_scrape = START

    def truth(self, model: str) -> float | None:
        served = self._world.triton.served(model)
        if not served:
            return None
        return BAD_MS if served & self.bad_versions[model] else GOOD_MS

    def _visible(self, model: str) -> bool:
        return self.outage is None or (self.outage != "whole" and model not in self.outage)

    def scrape_until(self, now: float) -> None:
        """Prometheus scrapes every SCRAPE_SECONDS; what it stores is what a range query reads back."""
        grid = self._last_scrape + SCRAPE_SECONDS
        while grid <= now:
            for model in MODELS:
                value = self.truth(model)
                if value is not None and self._visible(model):
                    # Stamped by Prometheus's clock: the system clock, stepped or not.
                    self.scrapes[model].append((grid + self._world.system_step, value))
            self._last_scrape = grid
            grid += SCRAPE_SECONDS

    def _model(self, promql: str) -> str:
        return next(m for m in MODELS if f'"{m}"' in promql)

    async def query(self, promql: str, offset: float = 0.0) -> QueryResult:
        """An instant query of a process whose clock is `offset` from monotonic time (it stamps the answer)."""
        if self.outage == "whole":
            return QueryResult(promql, error="prometheus unreachable: connection refused")
        model = self._model(promql)
        value = self.truth(model)
        if value is None or not self._visible(model):
            return QueryResult(promql, ())
        self.answered[model].append((self._world.clock.now + offset, value))
        return QueryResult(promql, (Sample({"model": model}, value),))

    async def query_range(self, promql: str, start: float, end: float, step: float) -> RangeResult:
        if self.outage == "whole":
            return RangeResult(promql, error="prometheus unreachable: connection refused")
        model = self._model(promql)
        points = [(t, v) for t, v in self.scrapes[model] if start <= t <= end]
        self.answered[model].extend(points)
        if not points:
            return RangeResult(promql, [])
        return RangeResult(promql, [Series({"model": model}, [t for t, _ in points], [v for _, v in points])])


def complete_evidence(points: list[tuple[float, float]], acted_at: float, condition: RecoveryCondition) -> bool:
    """The test's own oracle (written from the issue, not from policies/recovery.py): a window is
    seen completely when it has at least ceil(hold / maxGap) + 1 samples and every stretch between
    bad samples (and the window's ends) long enough to hold the condition has no gap longer than
    maxGap. Only then may "not recovered" undo a rollback."""
    deadline = acted_at + condition.within_seconds
    seen = sorted((t, v) for t, v in set(points) if acted_at <= t <= deadline)
    needed = -(-condition.hold_seconds // condition.max_gap_seconds) + 1
    if len(seen) < needed:
        return False
    cuts = [acted_at, *(t for t, v in seen if not condition.good(v)), deadline]
    for lo, hi in zip(cuts, cuts[1:]):
        if hi - lo < condition.hold_seconds:
            continue
        times = [lo, *(t for t, _ in seen if lo < t < hi), hi]
        if any(b - a > condition.max_gap_seconds for a, b in zip(times, times[1:])):
            return False
    return True


# ---- daemon processes -----------------------------------------------------------------------------

class Process:
    """One daemon process: its own journal connection to the shared file, executor, pin reconciler
    and freeze control, under the term it took when it became the leader."""

    def __init__(self, world: "World", name: str) -> None:
        self.world, self.name = world, name
        self.leader = False
        self.offset = world.system_step  # SteadyClock: the system clock read at start, then monotonic
        self.journal = Journal(world.path, clock=self.time)
        registry = {**action_registry(), "triton.rollback": rollback_action_for(world.triton, self)}
        self.state = ExecutorState(PolicySet(load_policies_text(policies_yaml(), "policies.yaml", registry,
                                                                detector_registry()).policies))
        self.deps = ActionDeps(query=functools.partial(world.prometheus.query, offset=self.offset), record_event=world.kube.record_event,
                               replicas=world.kube.replicas, known_bad=self.journal.bad_versions.known.in_thread,
                               write_fence=self._write_fence, triton_timeout_seconds=5.0)
        metrics = Metrics()
        door = _door_class()
        if door is not None:  # as daemon/wiring/parts.py wires it: every action's write passes the door
            self.deps.actuator = door(self.journal, self.state, self.deps, self.may_act, metrics, self.time)
        ctx = ActContext(self.journal, self.state, self.deps, metrics, registry, may_act=self.may_act,
                         clock=self.time, sleep=world.clock.sleep)
        limits = ExecutorLimits(escalation_freeze_seconds=600.0, blast_radius=world.blast_radius)
        self.executor = Executor(ctx, query_range=world.prometheus.query_range, limits=limits)
        self.pins = PinReconciler(ctx)
        self.freezes = FreezeControl(self.journal, metrics, False, clock=self.time)
        self.closed = False
        # Who writes: the executor's plan, its reverts, the revert after no recovery, the pin reconciler.
        steps = self.executor._steps
        _attribute(steps, "run_plan", "executor", 0)
        _attribute(steps, "revert", "revert", 0, keep=("recovery_revert",))
        _attribute(self.executor._watches, "_revert_unrecovered", "recovery_revert", 0)
        _attribute(self.pins, "_reconcile", "pin", None)

    def time(self) -> float:
        return self.world.clock.now + self.offset

    @property
    def term(self) -> int | None:
        fence = self.journal.fence
        return fence.term if fence is not None else None

    def may_act(self) -> bool:
        return self.leader and not self.closed

    async def _write_fence(self, timeout: float) -> str | None:
        return None if self.may_act() else f"{self.name} does not hold the Lease"

    async def close(self) -> None:
        self.closed = True
        await self.executor.close()


def _door_class() -> Any:
    """daemon.workers.door.Door once the one door is built (issue #42), else None (today's wiring)."""
    if importlib.util.find_spec("daemon.workers.door") is None:
        return None
    return importlib.import_module("daemon.workers.door").Door


class World:
    """The ports, the clock, the processes, and what the oracle saw."""

    def __init__(self, path: Path, loop: asyncio.AbstractEventLoop,
                 blast_radius: BlastRadiusSettings | None = None) -> None:
        self.path = path
        # The shipped defaults unless told (the common-cause hold makes every decision wait its span).
        self.blast_radius = blast_radius or BlastRadiusSettings()
        self.loop = loop
        self.clock = ModelClock(loop)
        self.system_step = 0.0  # how far NTP stepped the system clock from monotonic time
        self.triton = TritonPort(self)
        self.kube = KubePort(self.triton)
        self.prometheus = PrometheusPort(self)
        self.observer = Journal(path, clock=self.system_time)  # reads only: what the journal says at a write
        self.processes: dict[str, Process] = {}
        self.incarnations = itertools.count(1)

    def observe_write(self, seq: int, process: Process, model: str, url: str, versions: list[int] | None) -> Write:
        target, now = target_key(model), process.time()
        frozen = None
        for scope in (DAEMON_SCOPE, target):
            freeze = self.observer.freezes.active_on(scope, now)
            if freeze is not None:
                frozen = f"{scope}: {freeze.reason}"
                break
        version = versions[0] if versions and len(versions) == 1 else None
        bad = None
        if versions:
            for mark in self.observer.bad_versions.of(target):
                if int(mark.version) in versions:
                    bad = (int(mark.version), mark.decision_id)
        current = self.observer.terms.current()
        writer, decision = WRITER.get()
        return Write(seq, now, process.name, process.term, current.term if current else None, target, url,
                     version, writer, decision, frozen, bad)

    def system_time(self) -> float:
        return self.clock.now + self.system_step

    def leader(self) -> Process | None:
        return next((p for p in self.processes.values() if p.may_act()), None)

    def close(self) -> None:
        for process in self.processes.values():
            process.journal.close()
        self.observer.close()


WRITER: contextvars.ContextVar[tuple[str, int | None]] = contextvars.ContextVar("writer", default=("unknown", None))
"""Which component is writing, and for which decision: set by `_attribute` around the components'
entry points, and carried into the tasks an action gathers (they copy the context)."""


def _attribute(obj: Any, method: str, writer: str, decision_arg: int | None, keep: tuple[str, ...] = ()) -> None:
    """Wrap `obj.method` so that the writes made under it are attributed to `writer` (and the
    decision id found at positional argument `decision_arg`), unless a writer in `keep` already is."""
    inner = getattr(obj, method)

    @functools.wraps(inner)
    async def attributed(*args: Any, **kwargs: Any) -> Any:
        if WRITER.get()[0] in keep:
            return await inner(*args, **kwargs)
        decision = args[decision_arg] if decision_arg is not None and len(args) > decision_arg else None
        token = WRITER.set((writer, decision if isinstance(decision, int) else None))
        try:
            return await inner(*args, **kwargs)
        finally:
            WRITER.reset(token)

    setattr(obj, method, attributed)


def alert(model: str, key: str) -> Signal:
    from datetime import datetime, timezone
    return Signal(SignalSource.ALERT, ALERT, {"model": model}, datetime.fromtimestamp(START, timezone.utc), key)


def detection(model: str, key: str) -> Signal:
    from datetime import datetime, timezone
    return Signal(SignalSource.DETECTOR, "threshold", {"model": model}, datetime.fromtimestamp(START, timezone.utc),
                  key, value=BAD_MS, policy=f"{model}-rollback", details={"query": QUERY.replace("$model", model)})
