"""Sharding wired into a service (sharding.shards > 1): the shard manager takes the place of the
single-leader elector, and the door, the executor and the poller follow the shards it leads.

- the door refuses a write on a target whose shard this replica does not lead, and journals the
  write's intent only under the shard's current term (daemon/storage/shard_terms.py);
- the executor leaves a signal whose target's shard another replica leads pending in the shared
  journal, for that replica;
- the poller watches only the policies of the targets of the shards led here, and the pin
  reconciler only their pins;
- a replica leading at least one shard counts as acting (`may_act`): the schedules, the approvals'
  expiry and the webhook intake run as on a leader, each write still passing the door's shard check.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import structlog

from daemon.cluster.query_narrowing import narrow_selector
from daemon.cluster.shard_view import ShardingInputs, fleet_wide_queries, fleet_wide_triggers
from daemon.cluster.shards import ShardManager
from daemon.common.config import Settings
from daemon.common.lifecycle import Supervisor
from daemon.common.metrics import Metrics
from daemon.storage.errors import JournalError
from daemon.storage.journal import Journal
from daemon.workers.door import Door
from daemon.workers.executor import Executor
from daemon.workers.pins import PinReconciler
from daemon.workers.poller import Poller, QueryGroup
from policies.loader import LoadedPolicy, PolicySet

log = structlog.get_logger("tailguard.sharding")


def start_sharding(kube: Any, settings: Settings, identity: str, journal: Journal, metrics: Metrics,
                   actuator: object, executor: Executor, poller: Poller | None, pins: PinReconciler,
                   supervisor: Supervisor,
                   led_changed: Callable[[frozenset[int]], None], wall: Callable[[], float]) -> ShardManager:
    """Build the shard manager, hook the door (`actuator`), the executor and the poller to it, and
    start it under `supervisor` as the component that elects ("leader-election": stopping hands the
    shards back in the stop order the single elector has). `led_changed` hears the shards led."""
    shards = settings.sharding.shards

    async def take_term(shard: int) -> bool:
        try:
            term = await journal.shard_terms.take.in_thread(shard, shards, identity)
        except JournalError as exc:  # a count mismatch or an outage: the Lease goes back
            metrics.faults.labels("journal").inc()
            log.error("could not take the shard's term; handing its lease back", shard=shard, error=str(exc))
            return False
        log.info("shard term taken", shard=shard, term=term.term)
        return True

    async def stale_terms(led: frozenset[int]) -> frozenset[int]:
        try:
            return await journal.shard_terms.stale.in_thread(led)
        except JournalError as exc:  # looked at again next round; the door's own check still holds
            log.warning("could not read the shard terms", error=str(exc))
            return frozenset()

    seen: list[frozenset[int]] = [frozenset()]

    def shards_led(led: frozenset[int]) -> None:
        gained, seen[0] = led - seen[0], led
        led_changed(led)
        if gained and executor.state.policies.policies:
            # The open recovery checks and approved plans of the shards gained (the service resumes
            # them at a takeover; a replica already acting gains shards too). Ones running are left.
            supervisor.spawn("resume-verifications", _resume(executor, metrics))

    manager = ShardManager(kube, settings.leader_election, settings.sharding, identity, take_term, shards_led,
                           stale_terms=stale_terms, wall=wall)
    journal.shard_terms.route(manager.shard_of)  # decision rows fenced per shard, as the door's intents
    if isinstance(actuator, Door):
        actuator.shards = manager
    executor.owns = manager.owns
    pins.owns = manager.owns
    if poller is not None:
        poller.follows = _follows(manager)
        poller.narrow = narrow_group
    supervisor.start("leader-election", manager, joined=True)
    return manager


async def _resume(executor: Executor, metrics: Metrics) -> None:
    """Resume the open recovery checks and approved plans on the targets of the shards led here; a
    journal failure is counted (the next gain or takeover tries again)."""
    try:
        await executor.resume_verifications()
        await executor.resume_approved()
    except JournalError as exc:
        metrics.faults.labels("journal").inc()
        log.error("could not resume recovery checks of the shards gained", error=str(exc))


def _follows(manager: ShardManager) -> Callable[[LoadedPolicy], bool]:
    """The poller's filter (asked per policy at every sync: a reload or a change of the shards led):
    a policy is watched here while its target's shard is led here. A fleet-wide query of a watched
    policy is said once in the log: each replica leading one of its policies fetches it whole."""
    said: set[str] = set()

    def follows(policy: LoadedPolicy) -> bool:
        led = manager.owns(policy.target.key)
        for index, query in fleet_wide_triggers(policy) if led else ():
            if query not in said:
                said.add(query)
                log.warning("a fleet-wide query cannot be narrowed to this replica's shards (it names no $model"
                            " and is no plain selector): fetched and parsed whole here, detection split",
                            query=query, policy=policy.name, trigger=index)
        return led
    return follows


def narrow_group(group: QueryGroup) -> None:
    """A Prometheus group whose query names no target (shared by the led policies of several models)
    asks only for the series of the models led here, where its selector allows (query and companion
    each); the poller routes each series to its policy by the same label, so the watches see the same
    series as on the whole answer. A group with a query naming its target is narrowed already."""
    labels = {w.bound.trigger.model_label for w in group.watches}
    if group.source != "prometheus" or len(labels) != 1 or any(w.scoped for w in group.watches):
        return
    (label,) = labels
    models = [w.policy.target.model for w in group.watches]
    group.query = narrow_selector(group.query, label, models) or group.query
    if group.companion:
        group.companion = narrow_selector(group.companion, label, models) or group.companion


async def sharding_status(manager: ShardManager, journal: Journal, policies: PolicySet) -> ShardingInputs:
    """What the status document's `sharding` section merges: the Leases as `manager` last listed them
    and every shard's term in the (shared) journal (a journal that fails is named, the Leases still
    shown), and the fleet-wide queries of the policies led here."""
    seen = dataclasses.replace(manager.view(), fleet_wide=tuple(fleet_wide_queries(policies, manager.owns)))
    try:
        terms = await journal.shard_terms.current.in_thread()
    except JournalError as exc:
        log.warning("could not read the shard terms for status", error=str(exc))
        return dataclasses.replace(seen, terms_error=str(exc))
    return dataclasses.replace(seen, terms=terms)
