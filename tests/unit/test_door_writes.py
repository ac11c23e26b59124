"""No Triton or Kubernetes write reaches the world except through the door (daemon/workers/door.py).

Behaviour: the executor's apply, the pin reconciler's re-pin, the recovery revert and the executor's
onFailure revert are driven against the in-process Triton (tests/support/fake_triton.py), whose
every load records whether it was sent from inside the door: a load sent any other way fails here.
The daemon's wiring lends the door to every action. And a static guard over the product's source:
the client calls that write (Triton's load/unload, the Kubernetes API's create/patch/replace/delete)
appear only inside the `send` a door's write is given; daemon/cluster (its own Lease, Events and
cluster-state ConfigMap: the daemon's bookkeeping, not effects on the served system) is exempt.
"""
from __future__ import annotations

import ast
import re
from datetime import datetime, timezone
from pathlib import Path

from core.query import QueryResult, Sample
from core.signal import Signal, SignalSource
from daemon.common.config import Settings
from daemon.common.metrics import Metrics
from daemon.storage.journal import Journal
from daemon.wiring.parts import build_parts
from daemon.workers.door import Door
from daemon.workers.context import ActContext
from daemon.workers.executor import Executor
from tests.support.paths import REPO
from tests.unit.test_door import KEY, MODEL, URLS, World

# Triton's model control writes; the Kubernetes API client's writes (namespaced, cluster custom objects,
# collections); cluster-scoped built-in kinds are never written by the product.
WRITE_CALL = re.compile(r"^(load_model|unload_model|(create|patch|replace|delete)_"
                        r"(namespaced_\w+|cluster_custom_object\w*|collection_\w+))$")
SCANNED = ("actions", "daemon/workers", "daemon/wiring", "daemon/http", "daemon/storage", "daemon/sources",
           "policies", "detectors", "core")


def test_the_daemon_lends_its_door_to_every_action(tmp_path: Path) -> None:
    """build_parts (the service and simulate) puts the door in ActionDeps: no action writes unguarded."""
    journal = Journal(tmp_path / "j.db")
    try:
        assert isinstance(build_parts(Settings(), {}, journal, Metrics()).deps.actuator, Door)
    finally:
        journal.close()


async def test_every_triton_load_of_every_writer_is_sent_through_the_door(tmp_path: Path) -> None:
    """A rollback (executor), its revert after no recovery (recovery revert), a re-pin (pins), and a
    rollback whose verify fails reverted by onFailure: each load was sent from inside the door."""
    w = World(tmp_path, verify="{query: 'p999', below: 500, for: 2s, within: 8s, interval: 1s, "
                               "onNotRecovered: revert}")
    try:
        async def sleep(delay: float) -> None:
            w.now += delay

        async def prometheus(promql: str) -> QueryResult:
            return QueryResult(promql, (Sample({"model": MODEL}, 900.0),))

        w.deps.query = prometheus
        executor = Executor(ActContext(w.journal, w.state, w.deps, w.metrics, w.registry, clock=lambda: w.now,
                                       sleep=sleep, notify=w.announced.append))
        signal = Signal(SignalSource.ALERT, "TailLatencyHigh", {"model": MODEL}, datetime.now(timezone.utc), "a1")
        ((signal_id, stored),), _ = await w.journal.signals.intake([signal])
        await executor.process(signal_id, stored)
        await executor.wait_recoveries()
        await executor.close()
        (decision,) = w.journal.decisions.all()
        assert decision.state == "reverted", decision.reason
        assert w.triton.served() == {u: [2] for u in URLS}  # rolled back, then put back by the revert

        w.journal.pins.record(KEY, MODEL, 1, from_version=2, policy="rollback")
        assert (await w.pins.reconcile_once())[KEY].ok

        writers = [r.writer for r in w.effects() if r.status == "done" and r.kind == "triton.load"]
        assert writers == ["executor"] * 2 + ["revert"] * 2 + ["pins"] * 2
        assert len(w.triton.loads) == 6 == w.door.sent
        assert [ld for ld in w.triton.loads if not ld.through_door] == []
    finally:
        w.close()


def _write_calls(tree: ast.AST) -> list[tuple[int, str, str | None]]:
    """(line, call, the enclosing function) of every call of a write method of a client."""
    found: list[tuple[int, str, str | None]] = []

    def visit(node: ast.AST, function: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            if isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute) \
                    and WRITE_CALL.match(child.func.attr):
                found.append((child.lineno, child.func.attr, function))
            visit(child, inner)

    visit(tree, None)
    return found


def test_client_write_calls_appear_only_inside_a_door_send() -> None:
    """Every `load_model`, `unload_model`, `{create,patch,replace,delete}_namespaced_*` ... call of the
    product (daemon/cluster exempt) is made in a function named `send` or `_send_*`, in a module that
    hands it to `actuator.write`."""
    offenders, sends = [], 0
    for root in SCANNED:
        for path in sorted((REPO / root).rglob("*.py")):
            source = path.read_text()
            for line, call, function in _write_calls(ast.parse(source)):
                where = f"{path.relative_to(REPO)}:{line} {call}"
                if function != "send" and not (function or "").startswith("_send_"):
                    offenders.append(f"{where} in {function}")
                elif ".actuator.write(" not in source:
                    offenders.append(f"{where}: its module never hands a send to actuator.write")
                else:
                    sends += 1
    assert offenders == [], "writes outside the door:\n" + "\n".join(offenders)
    assert sends >= 3  # Triton's load, the custom-object patch, the ConfigMap patch


def test_the_static_guard_sees_a_write_outside_the_door() -> None:
    """The guard itself: a patch call in a plain method is found, one in a `send` is not an offender."""
    calls = _write_calls(ast.parse("class A:\n    async def apply(self):\n        await api.patch_namespaced_x()\n"
                                   "    async def ok(self):\n        async def send():\n"
                                   "            return await api.patch_namespaced_y()\n"))
    assert calls == [(3, "patch_namespaced_x", "apply"), (6, "patch_namespaced_y", "send")]

