"""The policy set in force: loaded at start, reloaded every interval; a set that fails to load is
reported and the active one kept."""
from __future__ import annotations

import asyncio
from typing import Callable, Mapping

import structlog

from actions.base import Action
from daemon.common.config import PolicySettings
from daemon.common.lifecycle import wait_or_stop
from daemon.common.metrics import Metrics
from daemon.workers.state import ExecutorState
from detectors.base import Detector
from policies.governance import policy_warnings
from policies.loader import PolicyLoadError, PolicySet, load_policies

log = structlog.get_logger("tailguard.service")


class PolicyReloader:
    """Loads the policy set into `state.policies` and keeps it current.

    Args:
        settings: policies.path and the reload interval.
        actions: The action registry the loader builds params with.
        detectors: The detector registry.
        state: Where the active set lives (the executor reads it there).
        metrics: tailguard_policies_loaded, tailguard_policy_reload_errors_total.
        on_swap: Called with each new set once it is active (the backlog and the poller follow it).
        clock: Unix time of the last valid read.
    """

    def __init__(self, settings: PolicySettings, actions: Mapping[str, type[Action]],
                 detectors: Mapping[str, type[Detector]], state: ExecutorState, metrics: Metrics,
                 on_swap: Callable[[PolicySet], None], clock: Callable[[], float]) -> None:
        self._settings = settings
        self._actions = actions
        self._detectors = detectors
        self._state = state
        self._metrics = metrics
        self._on_swap = on_swap
        self._clock = clock
        self.loaded = False
        """A valid set is active (before that, nothing is taken from the journal)."""
        self.last_error: str | None = None
        self.last_at: float | None = None
        """When the last reload read a valid set."""

    def load(self) -> PolicySet:
        """Load and swap in the policy set. Raises PolicyLoadError and keeps the old set."""
        new = load_policies(self._settings.path, self._actions, self._detectors)
        self._swap(new)
        return new

    async def reload(self) -> None:
        """One reload: a changed valid set is swapped in; any failure keeps the active set and is
        reported (`last_reload_error` in /readyz, tailguard_policy_reload_errors_total). Never raises."""
        try:
            new = await asyncio.to_thread(load_policies, self._settings.path, self._actions, self._detectors)
            self.last_at = self._clock()
            if new.digest != self._state.policies.digest or not self.loaded:
                self._swap(new)
            elif self.last_error is not None:  # fixed back to the active set
                log.info("policy reload valid again; the active set is unchanged", digest=new.digest)
                self.last_error = None
        except PolicyLoadError as exc:
            self._failed(str(exc))
        except Exception as exc:  # a fault outside the loader's checks must not end reloading
            self._failed(f"unexpected error while loading policies: {type(exc).__name__}: {exc}", unexpected=True)

    async def run(self, stop: asyncio.Event) -> None:
        """Reload every interval until stop (the first load is the service's, at start)."""
        while not await wait_or_stop(stop, self._settings.reload_interval_seconds):
            await self.reload()

    def _failed(self, error: str, unexpected: bool = False) -> None:
        if error != self.last_error:  # counted once per distinct error, not once per interval
            self._metrics.policy_reload_errors.inc()
            if unexpected:
                log.exception("policy reload failed; keeping the active set", errors=error)
            else:
                log.error("policy reload rejected; keeping the active set", errors=error)
        self.last_error = error

    def _swap(self, new: PolicySet) -> None:
        self._state.policies = new
        self.loaded = True
        self.last_error = None
        self._on_swap(new)
        self._metrics.policies_loaded.set(len(new.policies))
        log.info("policies loaded", count=len(new.policies), digest=new.digest,
                 names=[p.name for p in new.policies])
        for policy in new.policies:  # triggers that cannot keep the policy's promise (policies.governance)
            for warning in policy_warnings(policy):
                log.warning("policy cannot keep its promise", policy=policy.name, warning=warning)
