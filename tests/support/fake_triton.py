"""An in-process Triton for unit tests of the door: `triton.rollback` (the real action, its planning,
apply, verify and revert) over replicas held in memory instead of HTTP.

`FakeTriton` holds each replica's repository versions, served versions and version policy, and
answers the two things the action asks Triton: the repository index with the model config (a
read), and a load with a config (the write), which serves what the config's version policy names
(`specific`: those versions; `latest`: the newest in the repository), as Triton does. Every load is
recorded with whether it was sent from inside a door's `send` (`through_door`): tests assert none
is not. A load naming a version the repository lacks is refused as Triton refuses it (a 400, nothing
changes; the text as tests/support/safety_world.py's port words it); a replica marked `stale`
answers a load and keeps serving what it served (a bad input verify must catch). Each replica
answers the server metadata (`GET /v2`) of its `server`, by default the lab's Triton 2.51 as recorded
in fixtures/triton_metadata/ (None: the read fails).
"""
from __future__ import annotations

import contextvars
import json
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Mapping, TypeVar

from actions.base import Effect
from actions.triton import TritonRollback
from daemon.workers.door import Door
from tests.support.paths import FIXTURES

T = TypeVar("T")

_in_door: contextvars.ContextVar[bool] = contextvars.ContextVar("in_door", default=False)


def triton_metadata(version: str) -> dict[str, Any]:
    """A Triton's `GET /v2` answer from fixtures/triton_metadata/ ("2.51.0" recorded, "2.66.0" written)."""
    return dict(json.loads((FIXTURES / "triton_metadata" / f"triton-{version}.json").read_text()))


@dataclass
class Replica:
    repository: tuple[int, ...] = (1, 2)
    served: list[int] = field(default_factory=lambda: [2])
    policy: dict[str, Any] = field(default_factory=lambda: {"latest": {"num_versions": 1}})
    stale: bool = False  # answers every load (200) and keeps serving the old version
    server: dict[str, Any] | None = field(default_factory=lambda: triton_metadata("2.51.0"))  # GET /v2


@dataclass(frozen=True)
class Load:
    url: str
    model: str
    versions: tuple[int, ...]
    through_door: bool


class FakeTriton:
    def __init__(self, model: str, urls: tuple[str, ...]) -> None:
        self.model = model
        self.replicas = {u: Replica() for u in urls}
        self.loads: list[Load] = []

    def redeploy(self, version: int) -> None:
        """The deploy pipeline: every replica restarts unpinned and serves `version` (the newest)."""
        for rep in self.replicas.values():
            rep.repository = tuple(sorted({*rep.repository, version}))
            rep.served, rep.policy = [version], {"latest": {"num_versions": 1}}

    def served(self) -> dict[str, list[int]]:
        return {u: list(r.served) for u, r in self.replicas.items()}

    def read(self, url: str) -> dict[str, Any]:
        rep = self.replicas[url]
        index = [{"name": self.model, "version": str(v), "state": "READY" if v in rep.served else "UNAVAILABLE"}
                 for v in rep.repository]
        return {"index": index, "config": {"name": self.model, "version_policy": dict(rep.policy)}}

    def load(self, url: str, config: Mapping[str, Any]) -> None:
        rep = self.replicas[url]
        policy = dict(config.get("version_policy") or {"latest": {"num_versions": 1}})
        specific = policy.get("specific")
        served = sorted(int(v) for v in specific["versions"]) if specific else [max(rep.repository)]
        self.loads.append(Load(url, self.model, tuple(served), _in_door.get()))
        missing = [v for v in served if v not in rep.repository]
        if missing:
            from tritonclient.utils import InferenceServerException

            raise InferenceServerException(
                msg=f"failed to load '{self.model}' version {missing[0]}: not found in the repository", status="400")
        if not rep.stale:
            rep.served, rep.policy = served, policy

    def action(self) -> type[TritonRollback]:
        """`triton.rollback` reading and loading this fake instead of HTTP."""
        fake = self

        class FakeTritonRollback(TritonRollback):
            async def _read_replica(self, url: str, model: str, timeout: float) -> dict[str, Any]:
                return fake.read(url)

            async def _send_load(self, url: str, model: str, config: Mapping[str, Any], timeout: float) -> None:
                fake.load(url, config)

            async def _read_server(self, url: str, timeout: float) -> Mapping[str, Any] | None:
                return fake.replicas[url].server

        return FakeTritonRollback


class CountingDoor(Door):
    """The daemon's door, counting what it sends and marking its sends (`Load.through_door`)."""

    sent: int = 0

    async def write(self, effect: Effect, send: Callable[[], Awaitable[T]]) -> T:
        async def marked() -> T:
            token = _in_door.set(True)
            try:
                self.sent += 1
                return await send()
            finally:
                _in_door.reset(token)

        return await super().write(effect, marked)
