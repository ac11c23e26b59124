"""The service: wires settings, journal, policies, executor, poller, scheduler and the HTTP app,
and runs them as named tasks that start together and stop in order."""
from __future__ import annotations

import asyncio
import concurrent.futures
import multiprocessing
import ssl
import time
from typing import Any, Callable, Mapping

import structlog
from aiohttp import web

from actions.base import Action
from core.signal import Signal
from daemon.cluster.cluster_state import ClusterState, guard_horizon
from daemon.cluster.control_configmap import ControlConfigMapError, clearing_manager, declared_freezes, read_control
from daemon.cluster.kube import identity
from daemon.cluster.leader import LeaderElector
from daemon.common.config import ConfigError, Settings, api_tokens, journal_store, webhook_token
from daemon.common.logs import configure_logging
from daemon.common.metrics import Metrics
from daemon.http.app import build_app
from daemon.http.auth import TokenSet
from daemon.http.status import StatusInputs
from daemon.sources.prometheus import PrometheusClient
from daemon.storage.journal import Approval, Journal, JournalBackpressure, JournalError
from daemon.storage.journal_notices import JournalNotices, notices_for
from daemon.wiring.parts import base_url, build_parts
from daemon.workers.approvals import ApprovalExpiry
from daemon.workers.backlog import Backlog
from daemon.workers.freezes import FreezeControl
from daemon.workers.pins import PinReconciler
from daemon.sources.triton_metrics import TritonMetricsSource
from daemon.workers.poller import Poller
from daemon.workers.scheduler import run_schedules
from detectors.base import Detector
from policies.loader import PolicyLoadError, PolicySet, load_policies

log = structlog.get_logger("tailguard.service")
NOTICE_PAUSE_SECONDS = 0.1
"""After another replica's signals woke the leader: their group commits come in bursts; read once per pause."""


class Service:
    def __init__(
        self,
        settings: Settings,
        actions: Mapping[str, type[Action]],
        detectors: Mapping[str, type[Detector]],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.actions = actions
        self.detectors = detectors
        self.clock = clock
        self.metrics = Metrics()
        self.webhook_token = webhook_token(settings.webhook)
        if self.webhook_token is None and not settings.webhook.allow_unauthenticated:
            raise ConfigError("no webhook token: set webhook.tokenFile or TAILGUARD_WEBHOOK_TOKEN "
                              "(or webhook.allowUnauthenticated: true for local experiments)")
        tokens = api_tokens(settings.api)
        if self.webhook_token is not None and any(t.token == self.webhook_token for t in tokens):
            raise ConfigError("an API token equals the webhook token: give Alertmanager and operators "
                              "different secrets")
        self.api_tokens = TokenSet(tokens, allow_anonymous=settings.api.allow_unauthenticated)
        journal = Journal(journal_store(settings.journal), max_pending=settings.journal.max_pending)
        self.parts = build_parts(settings, actions, journal, self.metrics,
                                 may_act=self.may_act, clock=clock, on_recorded=self._state_recorded)
        self.journal, self.state = self.parts.journal, self.parts.state
        self.deps, self.executor = self.parts.deps, self.parts.executor
        self.metrics.frozen.set(int(settings.freeze))
        self.is_leader = not settings.leader_election.enabled
        # Under leader election a replica acts only once the journal handed it a term (its fencing
        # token): the writes of a leader that was replaced meanwhile are refused by the journal.
        self.term_held = not settings.leader_election.enabled
        self._term_task: asyncio.Task[None] | None = None
        self._acting_flipped = asyncio.Event()  # the shared-journal loop looks again at once
        self._was_acting = False  # may_act() as last seen: a takeover resumes open recovery checks
        self.metrics.is_leader.set(int(self.is_leader))
        self.policies_loaded = False
        self.last_reload_error: str | None = None
        self.last_reload_at: float | None = None  # the last reload that read a valid set
        self.freezes = FreezeControl(self.journal, self.metrics, settings.freeze, on_recorded=self._state_recorded,
                                     clock=clock)
        self.approvals = ApprovalExpiry(self.journal, self.parts.notifier.publish, self.metrics,
                                        self.executor.approval_base_url, self.may_act, clock)
        # Pending signals reach the executor only while this replica may act: a follower (or a new
        # leader before it imported the shared state) leaves them in the journal, untouched.
        self.backlog = Backlog(self.journal, lambda: self.state.policies.policies, self.executor.process,
                               self.metrics, settings.executor.queue_size, may_take=self._may_take_signals,
                               max_age_seconds=settings.executor.max_signal_age_seconds,
                               clock=clock)
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[Any]] = []
        self._runner: web.AppRunner | None = None
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self.poller: Poller | None = None
        self.port: int | None = None
        self.identity = identity()  # holderIdentity and Event reportingInstance (POD_NAME or host_pid)
        self.elector: LeaderElector | None = None
        self._elector_task: asyncio.Task[None] | None = None
        self.cluster_state: ClusterState | None = None  # shared pins/guard marks, with leader election
        self.pins = PinReconciler(self.journal, self.state, self.deps, self.metrics, self.may_act,
                                  self.executor.lock_for,
                                  settings.executor.pin_reconcile_interval_seconds,
                                  on_recorded=self._state_recorded)

    @property
    def kube(self) -> Any:
        """The kubernetes_asyncio ApiClient once started, when kubernetes.mode is not off."""
        return self.parts.kube

    @property
    def prometheus(self) -> PrometheusClient | None:
        return self.parts.prometheus

    # ---- state queries ----------------------------------------------------------------------

    def may_act(self) -> bool:
        # A new leader first takes a term and (with a journal per replica) imports the cluster
        # state: acting before would forget the old leader's cooldowns and pins.
        return self.is_leader and self.term_held and (self.cluster_state is None or self.cluster_state.imported)

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
                self._term_task = asyncio.create_task(self._take_term(), name="take-term")
        self.is_leader = leader
        self._acting_changed()

    async def _take_term(self) -> None:
        """Take the journal's next term for this replica (retried while the journal fails and this
        replica still leads), then act."""
        transitions = self.elector.transitions if self.elector is not None else None
        while self.is_leader and not self._stop.is_set():
            try:
                term = await self.journal.take_term(self.identity, transitions)
            except JournalError as exc:
                self.metrics.faults.labels("journal").inc()
                log.error("could not take a leadership term in the journal; retrying", error=str(exc))
                await asyncio.sleep(1.0)
                continue
            log.info("leadership term taken", term=term.term, lease_transitions=transitions)
            self.term_held = True
            self._acting_changed()
            return

    def _acting_changed(self) -> None:
        """may_act() may have flipped (leadership, the shared state imported)."""
        acting = self.may_act()
        if acting != self._was_acting:
            self._acting_flipped.set()
        self.metrics.is_leader.set(int(acting))
        self.backlog.acting_changed()
        took_over, self._was_acting = acting and not self._was_acting, acting
        if took_over and self.policies_loaded and not self._stop.is_set():
            # Recovery checks and reverts a previous leader left open (journaled); idempotent.
            self._tasks.append(asyncio.create_task(self._resume_verifications(),
                                                   name="resume-verifications"))

    def _state_recorded(self) -> None:
        if self.cluster_state is not None:
            self.cluster_state.request_publish()

    def state_recorded(self) -> None:
        """Something shared was journaled by an operator call (the cluster state publishes it)."""
        self._state_recorded()

    def readiness(self) -> dict[str, Any]:
        stale = self.poller.stale_queries() if self.poller else []
        # Followers are ready too: a rolling update waits for readiness, and a follower must be
        # able to take over. Webhooks that reach a follower are journaled when the journal is
        # shared; with a journal per replica they get 503 and Alertmanager retries.
        ready = self.policies_loaded
        view = self.freezes.last
        fence = self.journal.sync.fence
        return {"ready": ready, "policies_loaded": self.policies_loaded, "leader": self.is_leader,
                "acting": self.may_act(), "journal": self.journal.sync.backend,
                "term": fence.term if fence is not None and self.term_held else None,
                "policies": len(self.state.policies.policies), "frozen": view.frozen,
                "freeze": view.as_dict(self.clock()), "frozen_targets": sorted(view.targets),
                "stale_queries": stale, "last_reload_error": self.last_reload_error}

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

    async def approve(self, approval_id: int, by: str, reason: str) -> tuple[int, str, Approval | None]:
        return await self.executor.approve(approval_id, by, reason)

    async def status_inputs(self) -> StatusInputs:
        """What `GET /api/v1/status` shows, read from the journal now. Raises JournalError."""
        now = self.clock()
        policies = self.state.policies
        view = await self.freezes.view()
        guards = {}
        for p in policies.policies:
            guards[(p.name, p.target.key)] = await self.journal.guard_history(
                p.name, p.target.key, p.spec.guards.max_actions_window, now)
        return StatusInputs(
            now=now, replica=self.identity, leader=self.is_leader, acting=self.may_act(), policies=policies,
            policies_loaded=self.policies_loaded, last_reload_at=self.last_reload_at,
            last_reload_error=self.last_reload_error, freezes=view,
            latest=await self.journal.latest_decisions(), guards=guards, pins=await self.journal.pins(),
            approvals=await self.journal.approvals("pending"),
            stale_queries=self.poller.stale_queries() if self.poller else [])

    async def _control_loop(self) -> None:
        """Make the journal's ConfigMap freezes follow the control ConfigMap, on the replica that acts.
        A read that fails concludes nothing (no freeze is lifted because the API was unreachable)."""
        control = self.settings.control
        assert control.config_map is not None
        namespace = control.namespace or self.settings.leader_election.lease_namespace
        where = f"{namespace}/{control.config_map}"
        timeout = min(control.poll_interval_seconds, 10.0)
        while not self._stop.is_set():
            if self.may_act() and self.kube is not None:
                try:
                    read = await read_control(self.kube, namespace, control.config_map, timeout)
                    data, managed = read if read is not None else ({}, [])
                    desired, problems = declared_freezes(data, managed, where)
                    for problem in problems:
                        log.warning("control ConfigMap entry skipped", configmap=where, problem=problem)
                    await self.freezes.apply_configmap(
                        desired, lambda scope: clearing_manager(scope, managed), where)
                except (ControlConfigMapError, JournalError) as exc:
                    self.metrics.faults.labels("control").inc()
                    log.warning("control ConfigMap not applied; will retry", configmap=where, error=str(exc))
            try:
                await asyncio.wait_for(self._stop.wait(), timeout=control.poll_interval_seconds)
            except asyncio.TimeoutError:
                pass

    # ---- signals ----------------------------------------------------------------------------

    async def emit(self, signal: Signal) -> None:
        """Journal a detector or schedule signal; the journal hands it to the backlog (duplicates
        are dropped)."""
        if not self.may_act():
            return
        try:
            new, _ = await self.journal.record_signals([signal])
        except JournalBackpressure as exc:
            self.metrics.faults.labels("journal").inc()
            log.warning("journal backlog full; signal dropped", error=str(exc), signal=signal.dedup_key)
            return
        except JournalError as exc:
            self.metrics.faults.labels("journal").inc()
            log.error("could not journal signal", error=str(exc), signal=signal.dedup_key)
            return
        for _, s in new:
            self.metrics.signals.labels(s.source.value, s.name).inc()

    # ---- policies ---------------------------------------------------------------------------

    def load_policies(self) -> PolicySet:
        """Load and swap in the policy set. Raises PolicyLoadError and keeps the old set."""
        new = load_policies(self.settings.policies.path, self.actions, self.detectors)
        self._swap(new)
        return new

    async def reload_policies(self) -> None:
        """One reload: a changed valid set is swapped in; any failure keeps the active set and is
        reported (`last_reload_error` in /readyz, tailguard_policy_reload_errors_total). Never raises."""
        try:
            new = await asyncio.to_thread(load_policies, self.settings.policies.path, self.actions,
                                          self.detectors)
            self.last_reload_at = self.clock()
            if new.digest != self.state.policies.digest or not self.policies_loaded:
                self._swap(new)
            elif self.last_reload_error is not None:  # fixed back to the active set
                log.info("policy reload valid again; the active set is unchanged", digest=new.digest)
                self.last_reload_error = None
        except PolicyLoadError as exc:
            self._reload_failed(str(exc))
        except Exception as exc:  # a fault outside the loader's checks must not end reloading
            self._reload_failed(f"unexpected error while loading policies: {type(exc).__name__}: {exc}",
                                unexpected=True)

    def _reload_failed(self, error: str, unexpected: bool = False) -> None:
        if error != self.last_reload_error:  # counted once per distinct error, not once per interval
            self.metrics.policy_reload_errors.inc()
            if unexpected:
                log.exception("policy reload failed; keeping the active set", errors=error)
            else:
                log.error("policy reload rejected; keeping the active set", errors=error)
        self.last_reload_error = error

    def _swap(self, new: PolicySet) -> None:
        self.state.policies = new
        self.backlog.policies_changed()
        self.policies_loaded = True
        self.last_reload_error = None
        self.metrics.policies_loaded.set(len(new.policies))
        if self.poller is not None:
            self.poller.sync(new)
        log.info("policies loaded", count=len(new.policies), digest=new.digest,
                 names=[p.name for p in new.policies])

    async def _reload_loop(self) -> None:
        while not self._stop.is_set():
            try:
                await asyncio.wait_for(self._stop.wait(), timeout=self.settings.policies.reload_interval_seconds)
                return
            except asyncio.TimeoutError:
                pass
            await self.reload_policies()

    # ---- workers ----------------------------------------------------------------------------

    async def _resume_verifications(self) -> None:
        """Resume recovery checks in flight before a restart or failover (policies must be loaded:
        a revert needs them). A journal failure is recorded; the next takeover tries again."""
        try:
            await self.executor.resume_verifications()
            await self.executor.resume_approved()
        except JournalError as exc:
            self.metrics.faults.labels("journal").inc()
            log.error("could not resume recovery checks", error=str(exc))

    async def _prune_loop(self) -> None:
        """Keep the journal bounded: a daemon runs for months, schedule ticks alone add 1,440 a day."""
        settings = self.settings.journal
        while not self._stop.is_set():
            try:
                pruned = await self.journal.prune(self.clock() - settings.retention_days * 86400)
                if any(pruned.values()):
                    log.info("journal pruned", retention_days=settings.retention_days, **pruned)
            except JournalError as exc:  # a busy journal is pruned next time; recorded, not fatal
                self.metrics.faults.labels("journal").inc()
                log.warning("journal prune failed", error=str(exc))
            try:
                await asyncio.wait_for(self._stop.wait(), timeout=settings.prune_interval_seconds)
            except asyncio.TimeoutError:
                pass

    async def _shared_journal_loop(self) -> None:
        """On a journal the replicas share: recount the backlog (every replica, for backpressure) and,
        on the leader, take the signals other replicas journaled. A failed read is recorded and
        tried again next round."""
        interval = self.settings.journal.shared_poll_seconds
        notices = notices_for(self.journal.sync)
        try:
            while not self._stop.is_set():
                self._acting_flipped.clear()  # before the look: a flip during it cuts the next wait short
                if notices is not None and self.may_act():
                    await self._listen(notices)  # before the count: a commit after it is heard, one before counted
                try:
                    pending = await self.journal.refresh_pending()
                    if self.backlog.look_again(pending):
                        log.debug("signals journaled by other replicas; reading the pending set", pending=pending)
                except JournalError as exc:
                    self.metrics.faults.labels("journal").inc()
                    log.warning("could not count pending signals in the shared journal", error=str(exc))
                await self._until_next_look(notices, interval)
        finally:
            if notices is not None:
                await notices.close()

    async def _until_next_look(self, notices: JournalNotices | None, interval: float) -> None:
        """The poll interval, cut short by a change of acting (a new leader reads the backlog and
        starts listening at once) and, on the leader of a PostgreSQL journal, by another replica's
        committed signals (then a short pause, so that a burst of them is read once)."""
        waits: set[asyncio.Future[Any]] = {asyncio.ensure_future(self._stop.wait()),
                                           asyncio.ensure_future(self._acting_flipped.wait())}
        heard = asyncio.ensure_future(notices.wait(interval)) if notices is not None and self.may_act() else None
        if heard is not None:
            waits.add(heard)
        try:
            await asyncio.wait(waits, timeout=interval, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in waits:
                waiting.cancel()
            await asyncio.gather(*waits, return_exceptions=True)
        if heard is None or heard.cancelled():
            return
        try:
            noticed = heard.result()
        except JournalError as exc:  # the poll goes on; the next round connects again
            self._notices_failed(exc)
            await self._stopped_within(interval)
            return
        if noticed:
            await self._stopped_within(NOTICE_PAUSE_SECONDS)

    async def _listen(self, notices: JournalNotices) -> None:
        try:
            await notices.listen()
        except JournalError as exc:  # the wait after the count tries again; the poll goes on meanwhile
            self._notices_failed(exc)

    def _notices_failed(self, exc: JournalError) -> None:
        self.metrics.faults.labels("journal").inc()
        log.warning("journal notices failed; polling the shared backlog meanwhile", error=str(exc))

    async def _stopped_within(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self._stop.wait(), timeout=seconds)
        except asyncio.TimeoutError:
            pass

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
        if self.settings.leader_election.enabled and self.settings.kubernetes.mode == "off":
            raise ConfigError("leaderElection.enabled needs kubernetes.mode in-cluster or kubeconfig")
        await self.parts.connect(events_as=self.identity, clock=self.clock)
        if self.parts.prometheus is not None:
            http = self.parts.deps.http
            triton_metrics = TritonMetricsSource(http, clock=self.clock) if http is not None else None
            self.poller = Poller(self.parts.prometheus, self.journal, self.metrics, self.detectors, self.emit,
                                 self.offload, self.settings.prometheus.max_backoff_seconds, self.clock,
                                 triton_metrics)
        if self.settings.leader_election.enabled and self.kube is not None and not self.journal.shared:
            # A journal per replica: pins, guard marks and freezes cross a failover through a ConfigMap.
            # A shared journal already holds them for the next leader.
            le = self.settings.leader_election
            self.cluster_state = ClusterState(
                self.kube, le.lease_namespace, le.state_config_map_name, self.journal, self.metrics,
                lambda: guard_horizon(self.state.policies),
                on_change=self._acting_changed, clock=self.clock,
                retry_seconds=le.retry_period_seconds, request_timeout_seconds=le.renew_deadline_seconds)
            self._tasks.append(asyncio.create_task(self.cluster_state.run(self._stop), name="cluster-state"))
        if self.settings.leader_election.enabled and self.kube is not None:
            self.elector = LeaderElector(self.kube, self.settings.leader_election, self.identity,
                                         self.set_leader)
            self._elector_task = asyncio.create_task(self.elector.run(self._stop), name="leader-election")
        await self.reload_policies()
        if not self.policies_loaded:  # not ready (and nothing taken from the journal) until a reload succeeds
            log.error("no valid policies at start; not ready", errors=self.last_reload_error)
        elif self.may_act():
            await self._resume_verifications()
        # From now on every committed signal reaches the backlog; what was journaled before a crash
        # or restart (acknowledged, not processed) is read back by the refill once this replica may act.
        self.journal.on_signals(self.backlog.admit)
        for n in range(self.settings.executor.workers):
            self._tasks.append(asyncio.create_task(self.backlog.work(), name=f"worker-{n}"))
        self._tasks.append(asyncio.create_task(self.backlog.refill(), name="backlog-refill"))
        self._tasks.append(asyncio.create_task(self.backlog.mark_unmatched(), name="backlog-unmatched"))
        self._tasks.append(asyncio.create_task(self._reload_loop(), name="policy-reload"))
        self._tasks.append(asyncio.create_task(self._prune_loop(), name="journal-prune"))
        if self.journal.shared:
            self._tasks.append(asyncio.create_task(self._shared_journal_loop(), name="shared-journal"))
        self._tasks.append(asyncio.create_task(
            run_schedules(lambda: self.state.policies, self.emit, self._stop, self.clock), name="scheduler"))
        if self.poller is not None:
            self._tasks.append(asyncio.create_task(self.poller.run(self._stop), name="poller"))
        self._tasks.append(asyncio.create_task(self.pins.run(self._stop), name="pin-reconciler"))
        self._tasks.append(asyncio.create_task(self.approvals.run(self._stop), name="approval-expiry"))
        if self.settings.control.config_map is not None:
            if self.kube is None:
                raise ConfigError("control.configMap needs kubernetes.mode in-cluster or kubeconfig")
            self._tasks.append(asyncio.create_task(self._control_loop(), name="control-configmap"))
        try:
            await self.freezes.view()
        except JournalError as exc:  # shown as not frozen until the next read succeeds
            self.metrics.faults.labels("journal").inc()
            log.error("could not read freezes at start", error=str(exc))
        app = build_app(self)
        self._runner = web.AppRunner(app, access_log=None,
                                     shutdown_timeout=self.settings.listen.shutdown_timeout_seconds)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.settings.listen.host, self.settings.listen.port,
                           ssl_context=self._ssl_context())
        await site.start()
        server = getattr(site, "_server", None)
        sockets = getattr(server, "sockets", None) or []
        self.port = sockets[0].getsockname()[1] if sockets else self.settings.listen.port
        if self.settings.api.external_url is None:  # named in approval notifications
            self.executor.approval_base_url = self.approvals.base_url = base_url(self.settings, self.port)
        log.info("tailguard listening", host=self.settings.listen.host, port=self.port,
                 journal=self.journal.sync.describe(), policies=str(self.settings.policies.path))

    def _ssl_context(self) -> ssl.SSLContext | None:
        tls = self.settings.listen.tls
        if tls is None:
            return None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            context.load_cert_chain(str(tls.cert_file), str(tls.key_file))
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"listen.tls: cannot load {tls.cert_file} / {tls.key_file}: {exc}") from exc
        return context

    async def stop(self) -> None:
        self._stop.set()
        if self._runner is not None:
            await self._runner.cleanup()  # stop taking webhooks first
        if self._term_task is not None:
            self._tasks.append(self._term_task)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        self.journal.on_signals(None)
        if self.cluster_state is not None:
            # Share the last plans and pins before the Lease is handed back (bounded per request).
            await self.cluster_state.flush()
        if self._elector_task is not None:
            # It saw _stop: it steps down and hands the Lease back (bounded), after the workers stopped.
            try:
                await asyncio.wait_for(self._elector_task, timeout=2 * self.settings.leader_election.retry_period_seconds + 1)
            except (asyncio.TimeoutError, asyncio.CancelledError):
                pass
            self._elector_task = None
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        await self.parts.close()

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

