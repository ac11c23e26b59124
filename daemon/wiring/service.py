"""The service: wires settings, journal, policies, executor, poller, scheduler and the HTTP app,
and runs them as components of one supervisor, started together and stopped in a stated order."""
from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import multiprocessing
import time
from typing import Any, Callable, Mapping

import structlog
from aiohttp import web

from actions.base import Action
from core.signal import Signal
from core.target import ServiceRef
from daemon.cluster.cluster_state import ClusterState, guard_horizon
from daemon.cluster.control_configmap import ControlFollower
from daemon.cluster.endpoint_watch import EndpointWatch
from daemon.http.secret_reload import RELOAD_SECONDS, SecretReloader
from daemon.cluster.kube import identity
from daemon.cluster.objects import KubeObjectReader
from daemon.cluster.leader import LeaderElector
from daemon.cluster.shards import ShardManager
from daemon.common.clock import SteadyClock
from daemon.common.config import ApiTokenEntry, Settings, journal_store, resolve_secrets
from daemon.common.lifecycle import Loop, RestartPolicy, Supervisor, wait_or_stop
from daemon.common.logs import configure_logging
from daemon.common.metrics import Metrics
from daemon.http.auth import TokenSet
from daemon.http.status import StatusInputs
from daemon.sources.prometheus import PrometheusClient
from daemon.storage.errors import JournalError
from daemon.storage.journal import Journal
from daemon.wiring.operations import http_app
from daemon.wiring.parts import base_url, build_parts
from daemon.wiring.sharding import start_sharding
from daemon.workers.approvals import ApprovalExpiry
from daemon.workers.backlog import Backlog
from daemon.workers.freezes import FreezeControl
from daemon.workers.journal_upkeep import JournalProbe, JournalPruner, SharedJournalWatch
from daemon.workers.pins import PinReconciler
from daemon.sources.triton_metrics import TritonMetricsSource
from daemon.workers.poller import Poller
from daemon.workers.policy_reload import PolicyReloader
from daemon.workers.scheduler import run_schedules
from daemon.workers.signal_intake import SignalIntake
from detectors.base import Detector
from policies.governance import policy_warnings
from policies.loader import LoadedPolicy, PolicySet

log = structlog.get_logger("tailguard.service")


class Service:
    """The daemon: builds its parts from the settings, runs its loops as components of one
    supervisor (start), and stops them in a stated order (stop)."""

    def __init__(
        self,
        settings: Settings,
        actions: Mapping[str, type[Action]],
        detectors: Mapping[str, type[Detector]],
        clock: Callable[[], float] | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.actions = actions
        self.detectors = detectors
        # The daemon's Unix time: by default one that a step of the system clock does not move
        # (daemon/common/clock.py), shared with the journal's stamps, which its windows compare
        # with. A clock a test passes is the daemon's only; the journal keeps the system clock.
        # `wall` is the system clock the steady one starts from (a test steps it).
        steady = SteadyClock(wall=wall) if clock is None else None
        self.clock: Callable[[], float] = steady if steady is not None else clock or time.time
        clock = self.clock
        self.metrics = Metrics()
        if steady is not None:
            self.metrics.clock_step.set_function(steady.step_seconds)
        secrets = resolve_secrets(settings)  # before anything opens: a bad secret fails here, in one line
        self.webhook_token, self._tls = secrets.webhook_token, secrets.tls
        self.secret_reload_seconds = RELOAD_SECONDS  # token files are looked at this often (tests shorten it)
        self.api_tokens = TokenSet(secrets.api_tokens, allow_anonymous=settings.api.allow_unauthenticated)
        js = settings.journal
        journal = Journal(journal_store(js), max_pending=js.max_pending,
                          statement_timeout_seconds=js.statement_timeout_seconds,
                          lock_timeout_seconds=2 * js.statement_timeout_seconds,
                          clock=steady if steady is not None else time.time)
        self.parts = build_parts(settings, actions, journal, self.metrics,
                                 may_act=self.may_act, clock=clock, on_recorded=self._state_recorded,
                                 approval_base_url=self.approval_base_url, latest=self._latest_verdicts)
        self.journal, self.state = self.parts.journal, self.parts.state
        self.deps, self.executor = self.parts.deps, self.parts.executor
        if settings.leader_election.enabled:
            self.deps.write_fence = self._write_fence  # every Triton write passes it first
        self.metrics.frozen.set(int(settings.freeze))
        self.intake = SignalIntake(self.journal, self.metrics)  # the webhook's and the detectors' one path
        loops = settings.loops
        self.supervisor = Supervisor(self.metrics, RestartPolicy(loops.restart_initial_seconds, loops.restart_max_seconds,
                                                                 loops.max_crashes, loops.crash_window_seconds),
                                     outages=(JournalError,))  # the journal down: not ready, but no restart
        self._stop = self.supervisor.stopping
        self.is_leader = not settings.leader_election.enabled
        # Under leader election a replica acts only once the journal handed it a term (its fencing
        # token): the writes of a leader that was replaced meanwhile are refused by the journal.
        self.term_held = not settings.leader_election.enabled
        self._term_task: asyncio.Task[None] | None = None
        self._was_acting = False  # may_act() as last seen: a takeover resumes open recovery checks
        self.metrics.is_leader.set(int(self.is_leader))
        self.freezes = FreezeControl(self.journal, self.metrics, settings.freeze, on_recorded=self._state_recorded,
                                     clock=clock)
        self.approvals = ApprovalExpiry(self.journal, self.parts.notifier.publish, self.metrics,
                                        self.approval_base_url, self.may_act, clock)
        # Pending signals reach the executor only while this replica may act: a follower (or a new
        # leader before it imported the shared state) leaves them in the journal, untouched.
        self.backlog = Backlog(self.journal, lambda: self.state.policies.policies, self.executor.process,
                               self.metrics, settings.executor.queue_size, may_take=self._may_take_signals,
                               max_age_seconds=settings.executor.max_signal_age_seconds,
                               clock=clock)
        self.reloader = PolicyReloader(settings.policies, actions, detectors, self.state, self.metrics,
                                       self._policies_swapped, clock)
        self.journal_watch = SharedJournalWatch(self.journal, self.metrics, self.backlog, self.may_act,
                                                settings.journal.shared_poll_seconds)
        self._runner: web.AppRunner | None = None
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self.poller: Poller | None = None
        self.port: int | None = None
        self.identity = identity()  # holderIdentity and Event reportingInstance (POD_NAME or host_pid)
        self.elector: LeaderElector | None = None
        self.shards: ShardManager | None = None  # sharding.shards > 1 (daemon/wiring/sharding.py)
        self.cluster_state: ClusterState | None = None  # shared pins/guard marks, with leader election
        self.pins = PinReconciler(self.parts.ctx, settings.executor.pin_reconcile_interval_seconds,
                                  repin_escalate_after=settings.executor.repin_escalate_after,
                                  repin_window_seconds=settings.executor.repin_window_seconds)
        # How stop() ends what start() began (each step copes with a start that failed before it),
        # after the HTTP runner's cleanup, which start() pushes: no webhook is taken from then on.
        self.supervisor.on_stop_in_order(
            self.supervisor.cancel_tasks,  # the workers, loops and takeover work; the elector goes on
            lambda: self.journal.signals.on_intake(None),
            self._flush_cluster_state,  # the last plans and pins shared while this replica holds the Lease
            self._hand_back_lease,
            self._shut_pool,
            self.parts.close)  # the clients, then the journal

    @property
    def kube(self) -> Any:
        """The kubernetes_asyncio ApiClient once started, when kubernetes.mode is not off."""
        return self.parts.kube

    @property
    def prometheus(self) -> PrometheusClient | None:
        return self.parts.prometheus

    @property
    def policies_loaded(self) -> bool:
        """A valid policy set is active (before that, nothing is taken from the journal)."""
        return self.reloader.loaded

    @property
    def last_reload_error(self) -> str | None:
        return self.reloader.last_error

    @property
    def last_reload_at(self) -> float | None:
        """When the last reload read a valid set."""
        return self.reloader.last_at

    # ---- state queries ----------------------------------------------------------------------

    def _latest_verdicts(self, policy: str, trigger_index: int) -> Any:
        """The poller's last verdicts of a detector trigger (the alert gates weigh them)."""
        return self.poller.latest(policy, trigger_index) if self.poller is not None else None

    def may_act(self) -> bool:
        # A new leader first takes a term and (with a journal per replica) imports the cluster
        # state: acting before would forget the old leader's cooldowns and pins.
        return self.is_leader and self.term_held and (self.cluster_state is None or self.cluster_state.imported)

    async def _write_fence(self, request_timeout_seconds: float) -> str | None:
        """Before a write nothing downstream fences (Triton): wait until a takeover's fence has
        passed (`LeaderElector.write_fence_seconds`), then None when this replica may write now,
        else why not. The caller re-observes after it returns (what it read before may be stale)."""
        elector = self.elector
        if elector is None:
            return None if self.may_act() else "this replica may not act"
        while (wait := elector.write_fence_seconds(request_timeout_seconds)) > 0 and not self._stop.is_set():
            log.info("waiting out the takeover fence before a Triton write: the old leader's writes land or time "
                     "out first", seconds=round(wait, 1))
            await wait_or_stop(self._stop, wait)
        if self._stop.is_set():
            return "stopping"
        if not (elector.may_write() and self.may_act()):
            why = "this replica no longer holds the Lease (its renew deadline passed, or it was replaced)"
            log.warning("Triton write not sent", reason=why)
            return why
        return None

    def _may_take_signals(self) -> bool:
        """Whether the backlog may hand pending signals to the executor (or mark them processed):
        only while this replica may act, and once valid policies are loaded (before that, every
        signal would look unmatched and be marked processed without a decision)."""
        return self.policies_loaded and self.may_act()

    def set_leader(self, leader: bool) -> None:
        if leader != self.is_leader:
            log.info("leadership changed", leader=leader)
            if self.cluster_state is not None:
                self.cluster_state.leadership_changed(leader)
            if self._term_task is not None:
                self._term_task.cancel()
                self._term_task = None
            self.term_held = False
            if leader and not self._stop.is_set():
                self._term_task = self.supervisor.spawn("take-term", self._take_term())
        self.is_leader = leader
        self._acting_changed()

    def _shards_led(self, led: frozenset[int]) -> None:
        """Sharding: the shards this replica leads changed (their terms taken). Leading any counts as
        acting; the journal's pending signals are read again and the poller follows the new set."""
        self.is_leader = self.term_held = bool(led)
        self._acting_changed()
        self.backlog.policies_changed()
        if self.poller is not None:
            self.poller.sync(self.state.policies)

    async def _take_term(self) -> None:
        """Take the journal's next term for this replica (retried while the journal fails and this
        replica still leads), then act."""
        transitions = self.elector.transitions if self.elector is not None else None
        while self.is_leader and not self._stop.is_set():
            try:
                term = await self.journal.terms.take.in_thread(self.identity, transitions)
            except JournalError as exc:
                self.metrics.faults.labels("journal").inc()
                log.error("could not take a leadership term in the journal; retrying", error=str(exc))
                await wait_or_stop(self._stop, 1.0)
                continue
            log.info("leadership term taken", term=term.term, lease_transitions=transitions)
            self.term_held = True
            self._acting_changed()
            return

    def _acting_changed(self) -> None:
        """may_act() may have flipped (leadership, the shared state imported)."""
        acting = self.may_act()
        if acting != self._was_acting:
            self.journal_watch.acting_flipped()
        self.metrics.is_leader.set(int(acting))
        self.backlog.acting_changed()
        took_over, self._was_acting = acting and not self._was_acting, acting
        if took_over and self.policies_loaded and not self._stop.is_set():
            # Recovery checks and reverts a previous leader left open (journaled); idempotent.
            self.supervisor.spawn("resume-verifications", self._resume_verifications())

    def _state_recorded(self) -> None:
        if self.cluster_state is not None:
            self.cluster_state.request_publish()

    def state_recorded(self) -> None:
        """Something shared was journaled by an operator call (the cluster state publishes it)."""
        self._state_recorded()

    def journal_trouble(self) -> str | None:
        """Why the journal counts as unavailable now: its writes failing (or one stalled) for
        journal.writeFailureSeconds; None while it works. Never blocks."""
        return self.journal.write_health().trouble(self.settings.journal.write_failure_seconds)

    def _guarded_seconds(self) -> float:
        """How far back the guards count executed plans and signals (the policies' cooldown and
        maxActions windows, the target budget's window, common cause's two spans): never pruned for size."""
        br = self.settings.blast_radius
        return max(guard_horizon(self.state.policies)[0], br.window_seconds, 2 * br.common_cause_span_seconds)

    def loop_trouble(self) -> str | None:
        """Why this replica's loops count as failing: one crashed loops.maxCrashes times within
        loops.crashWindowSeconds (restarts do not help); None while they run. Never blocks."""
        return self.supervisor.trouble()

    def lead_trouble(self) -> str | None:
        """Why this replica must not hold the Lease now: its journal cannot be written, or a loop keeps
        crashing (a leader whose poller is dead never acts again); the elector hands the Lease back."""
        return self.journal_trouble() or self.loop_trouble()

    def readiness(self) -> dict[str, Any]:
        stale = self.poller.stale_queries() if self.poller else []
        # Followers are ready too: a rolling update waits for readiness, and a follower must be
        # able to take over. Webhooks that reach a follower are journaled when the journal is
        # shared; with a journal per replica they get 503 and Alertmanager retries. A replica
        # whose journal cannot be written is not ready: it would answer every webhook 503.
        journal_error = self.journal_trouble()
        loop_error = self.loop_trouble()  # a loop that keeps crashing: not ready, and not live either
        ready = self.policies_loaded and journal_error is None and loop_error is None
        view = self.freezes.last
        fence = self.journal.fence
        return {"ready": ready, "policies_loaded": self.policies_loaded, "leader": self.is_leader,
                "acting": self.may_act(), "journal": self.journal.backend, "journal_error": journal_error,
                "term": fence.term if fence is not None and self.term_held else None,
                "policies": len(self.state.policies.policies), "frozen": view.frozen,
                "freeze": view.as_dict(self.clock()), "frozen_targets": sorted(view.targets),
                "stale_queries": stale, "vanished_metrics": self.poller.vanished() if self.poller else [],
                "last_reload_error": self.last_reload_error, "loop_error": loop_error,
                "loop_crashes": self.supervisor.crash_counts()}

    # ---- operator API ---------------------------------------------------------------------------

    async def leader_identity(self) -> str | None:
        """The Lease holder (the leader pod's name); this replica's own name without leader election."""
        if self.elector is None or self.is_leader:
            return self.identity
        from kubernetes_asyncio.client import CoordinationV1Api
        from kubernetes_asyncio.client.exceptions import ApiException

        le = self.settings.leader_election
        try:
            lease = await asyncio.wait_for(
                CoordinationV1Api(self.kube).read_namespaced_lease(le.lease_name, le.lease_namespace),
                timeout=le.retry_period_seconds)
        except (ApiException, OSError, asyncio.TimeoutError) as exc:  # named as unknown in the answer
            log.info("could not read the lease to name the leader", error=f"{type(exc).__name__}: {exc}")
            return None
        holder = lease.spec.holder_identity if lease.spec is not None else None
        return str(holder) if holder else None

    def known_targets(self) -> set[str]:
        return {p.target.key for p in self.state.policies.policies}

    def approval_base_url(self) -> str:
        """Named in approval notifications: api.externalUrl, else the port the API listens on once
        it does (the configured one before)."""
        return base_url(self.settings, self.port)

    async def status_inputs(self) -> StatusInputs:
        """What `GET /api/v1/status` shows, read from the journal now. Raises JournalError."""
        now = self.clock()
        policies = self.state.policies
        view = await self.freezes.view()
        guards = {}
        for p in policies.policies:
            guards[(p.name, p.target.key)] = await self.journal.decisions.guard_history.in_thread(
                p.name, p.target.key, p.spec.guards.max_actions_window, now)
        return StatusInputs(
            now=now, replica=self.identity, leader=self.is_leader, acting=self.may_act(), policies=policies,
            policies_loaded=self.policies_loaded, last_reload_at=self.last_reload_at,
            last_reload_error=self.last_reload_error, freezes=view,
            latest=await self.journal.decisions.latest.in_thread(), guards=guards,
            pins=await self.journal.pins.live.in_thread(),
            approvals=await self.journal.approvals.all.in_thread("pending"),
            stale_queries=self.poller.stale_queries() if self.poller else [],
            vanished=self.poller.vanished() if self.poller else [],
            detectors=self.poller.telling() if self.poller else {})

    # ---- signals ----------------------------------------------------------------------------

    async def emit(self, signal: Signal) -> None:
        """Journal a detector or schedule signal through the intake (the journal hands it to the
        backlog; duplicates are dropped); nothing while this replica may not act."""
        if self.may_act():
            await self.intake.record([signal], resent=False)

    # ---- policies ---------------------------------------------------------------------------

    def load_policies(self) -> PolicySet:
        """Load and swap in the policy set. Raises PolicyLoadError and keeps the old set."""
        return self.reloader.load()

    async def reload_policies(self) -> None:
        """One reload (PolicyReloader.reload): a failure keeps the active set and is reported. Never raises."""
        await self.reloader.reload()

    def _policies_swapped(self, new: PolicySet) -> None:
        self.backlog.policies_changed()
        if self.poller is not None:
            self.poller.sync(new)
        if self.deps.record_event is not None:  # a policy whose triggers cannot keep its promise: a Warning Event
            for policy in new.policies:
                for warning in policy_warnings(policy):
                    self.supervisor.spawn("policy-warning-event", self._policy_warning_event(policy, warning))

    async def _policy_warning_event(self, policy: LoadedPolicy, warning: str) -> None:
        assert self.deps.record_event is not None
        try:
            await self.deps.record_event(policy=policy, reason="PolicyPromiseWarning", message=warning, warning=True)
        except Exception as exc:  # an Event is a courtesy: its failure is recorded, never fatal
            self.metrics.faults.labels("events").inc()
            log.warning("could not record Kubernetes event", error=str(exc))

    # ---- workers ----------------------------------------------------------------------------

    def _tokens_changed(self, webhook_token: str | None, api_tokens: list[ApiTokenEntry]) -> None:
        """Rotated token files (daemon/http/secret_reload.py): the next request is checked against them."""
        self.webhook_token = webhook_token
        self.api_tokens = TokenSet(api_tokens, allow_anonymous=self.settings.api.allow_unauthenticated)

    def _watched_services(self) -> set[ServiceRef]:
        """The Triton Services of enabled policies: their EndpointSlices are watched."""
        return {p.target.triton_service for p in self.state.policies.enabled if p.target.triton_service is not None}

    def _endpoints_ready(self, service: ServiceRef, urls: list[str]) -> None:
        """Replicas of `service` turned ready: the pins of its targets are looked at now."""
        self.pins.follow(p.target.key for p in self.state.policies.enabled if p.target.triton_service == service)

    async def _resume_verifications(self) -> None:
        """Resume recovery checks in flight before a restart or failover (policies must be loaded:
        a revert needs them). A journal failure is recorded; the next takeover tries again."""
        try:
            await self.executor.resume_verifications()
            await self.executor.resume_approved()
        except JournalError as exc:
            self.metrics.faults.labels("journal").inc()
            log.error("could not resume recovery checks", error=str(exc))

    async def drain(self) -> None:
        """Wait until every signal journaled so far is processed (tests, demo, simulate)."""
        await self.backlog.drain()

    async def offload(self, fn: Callable[..., Any], *args: Any) -> Any:
        if self._pool is None:
            # spawn: a forked child of a threaded process can deadlock; Prophet fits are slow anyway
            self._pool = concurrent.futures.ProcessPoolExecutor(
                max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                # The worker's own logs (Prophet, cmdstanpy) in the daemon's format, not plain text.
                initializer=configure_logging, initargs=(self.settings.log.format, self.settings.log.level))
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    # ---- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        sup = self.supervisor
        # Every child task runs under the supervisor too: a crash is counted in its owner's budget.
        self.executor.spawn_under(functools.partial(sup.child, fault="recovery"),
                                  functools.partial(sup.child, fault="approvals", logged=True))
        self.parts.notifier.spawn = functools.partial(sup.child, fault="notifier", logged=True)
        await self.parts.connect(events_as=self.identity, clock=self.clock)
        if self.parts.prometheus is not None:
            http = self.parts.deps.http
            triton_metrics = TritonMetricsSource(http, clock=self.clock) if http is not None else None
            cluster = KubeObjectReader(self.kube) if self.kube is not None else None
            self.poller = Poller(self.parts.prometheus, self.journal, self.metrics, self.detectors, self.emit,
                                 self.offload, self.settings.prometheus.max_backoff_seconds, self.clock,
                                 triton_metrics, cluster=cluster)
        if self.settings.leader_election.enabled and self.kube is not None and not self.journal.shared:
            # A journal per replica: pins, guard marks and freezes cross a failover through a ConfigMap.
            # A shared journal already holds them for the next leader.
            le = self.settings.leader_election
            self.cluster_state = ClusterState(
                self.kube, le.lease_namespace, le.state_config_map_name, self.journal, self.metrics,
                lambda: guard_horizon(self.state.policies),
                on_change=self._acting_changed, clock=self.clock,
                retry_seconds=le.retry_period_seconds, request_timeout_seconds=le.renew_deadline_seconds)
            sup.start("cluster-state", self.cluster_state)
        if self.settings.sharding.enabled and self.kube is not None:
            # A Lease per shard instead of the one leader's (#45).
            self.shards = start_sharding(self.kube, self.settings, self.identity, self.journal, self.metrics,
                                         self.deps.actuator, self.executor, self.poller, self.pins, sup,
                                         self._shards_led,
                                         self.clock)
        elif self.settings.leader_election.enabled and self.kube is not None:
            self.elector = LeaderElector(self.kube, self.settings.leader_election, self.identity,
                                         self.set_leader, may_lead=self.lead_trouble)
            sup.start("leader-election", self.elector, joined=True)
        await self.reload_policies()
        if not self.policies_loaded:  # not ready (and nothing taken from the journal) until a reload succeeds
            log.error("no valid policies at start; not ready", errors=self.last_reload_error)
        elif self.may_act():
            await self._resume_verifications()
        # From now on every committed signal reaches the backlog; what was journaled before a crash
        # or restart (acknowledged, not processed) is read back by the refill once this replica may act.
        self.journal.signals.on_intake(self.backlog.admit)
        # The backlog's loops end only when cancelled.
        for n in range(self.settings.executor.workers):
            sup.start(f"worker-{n}", Loop(lambda _: self.backlog.work()), fault="backlog")
        sup.start("backlog-refill", Loop(lambda _: self.backlog.refill()), fault="backlog")
        sup.start("backlog-unmatched", Loop(lambda _: self.backlog.mark_unmatched()), fault="backlog")
        sup.start("policy-reload", self.reloader)
        sup.start("journal-prune", JournalPruner(self.journal, self.metrics, self.settings.journal, self.clock,
                                                 self._guarded_seconds))
        sup.start("journal-probe", JournalProbe(self.journal, self.metrics, self.settings.journal.probe_interval_seconds,
                                                self.journal_trouble))
        if self.journal.shared:
            sup.start("shared-journal", self.journal_watch)
        sup.start("scheduler", Loop(functools.partial(run_schedules, lambda: self.state.policies, self.emit,
                                                      clock=self.clock)))
        if self.poller is not None:
            self.poller.spawn = functools.partial(sup.child, fault="poller")  # its poll tasks count as its crashes
            sup.start("poller", self.poller)
        sup.start("pin-reconciler", self.pins)
        if self.kube is not None:  # replicas that turn ready get their pins at once (the pass is the backstop)
            endpoints = EndpointWatch(self.kube, self._watched_services, self._endpoints_ready, self.metrics)
            endpoints.spawn = functools.partial(sup.child, fault="endpoint-watch", logged=True)
            sup.start("endpoint-watch", endpoints)
        sup.start("secret-reload", SecretReloader(self.settings, self._tokens_changed, self.metrics,
                                                  self.secret_reload_seconds))
        sup.start("approval-expiry", self.approvals)
        control = self.settings.control
        if control.config_map is not None and self.kube is not None:  # kubernetes.mode is not off (checked at load)
            namespace = control.namespace or self.settings.leader_election.lease_namespace
            sup.start("control-configmap", ControlFollower(
                self.kube, namespace, control.config_map, control.poll_interval_seconds,
                self.freezes.apply_configmap, self.may_act, self.metrics, self.known_targets))
        try:
            await self.freezes.view()
        except JournalError as exc:  # shown as not frozen until the next read succeeds
            self.metrics.faults.labels("journal").inc()
            log.error("could not read freezes at start", error=str(exc))
        app = http_app(self)
        self._runner = web.AppRunner(app, access_log=None,
                                     shutdown_timeout=self.settings.listen.shutdown_timeout_seconds)
        sup.on_stop(self._runner.cleanup)  # the first step of stop(): no more webhooks
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.settings.listen.host, self.settings.listen.port,
                           ssl_context=self._tls)
        await site.start()
        server = getattr(site, "_server", None)
        sockets = getattr(server, "sockets", None) or []
        self.port = sockets[0].getsockname()[1] if sockets else self.settings.listen.port
        log.info("tailguard listening", host=self.settings.listen.host, port=self.port,
                 journal=self.journal.describe(), policies=str(self.settings.policies.path))

    async def _flush_cluster_state(self) -> None:
        if self.cluster_state is not None:
            # Share the last plans and pins before the Lease is handed back (bounded per request).
            await self.cluster_state.flush()

    async def _hand_back_lease(self) -> None:
        # The elector saw stop: it steps down and hands the Lease back (bounded).
        await self.supervisor.join(self.supervisor.task("leader-election"),
                                   2 * self.settings.leader_election.retry_period_seconds + 1)

    def _shut_pool(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    async def stop(self) -> None:
        """Stop taking webhooks, stop the workers and loops, share the cluster state, hand the Lease
        back, close the clients (the steps start() pushed); a second call does nothing."""
        await self.supervisor.stop()

    async def __aenter__(self) -> "Service":
        try:
            await self.start()
        except BaseException:
            # A half-started service (port taken, bad kubeconfig ...) must not leave tasks,
            # sessions or a held Lease behind.
            await self.stop()
            raise
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()
