"""The door's cost per write, and the fence window it leaves on a Triton load.

Run: ``PYTHONPATH=. python bench/bench_door.py [--writes 300] [--freezes 20] [--marks 20]``.

A SQLite journal on disk (synchronous=FULL, as the daemon opens it) holding `--freezes` runtime
freezes of other targets and `--marks` bad-version marks of the target (what the door reads), and
a loopback stand-in for Triton's model-control endpoint (POST /v2/repository/models/<m>/load answers
200 at once) so that the load itself costs next to nothing and the door's part shows. Each round
sends one `triton.rollback` load request through `tritonclient` (the action's own `_send_load`):

- baseline: the request alone;
- through the door (writer "pins", as the reconciler): the checks (two journal reads: the freezes in
  force, the target's bad marks), the intent (one fenced write transaction: it reads the journal's
  term, then inserts), the write fence (a callable returning at once, as with leader election on
  and no takeover), the request, the result (one write transaction).

Reported: the median and p99 of each, the door's added time, and the fence window: from the
moment the write fence returned to the moment the stand-in received the request (what a leader
paused in between could still send after losing the Lease, besides the network's own delay).
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from actions.base import ActionDeps, Effect
from actions.triton import TritonRollback
from daemon.common.metrics import Metrics
from daemon.storage.journal import Journal
from daemon.workers.door import PINS, Door, acting
from daemon.workers.state import ExecutorState
from policies.loader import PolicySet

TARGET = "serving/ranker"
CONFIG = {"name": "ranker", "version_policy": {"specific": {"versions": [1]}}}


def _ms(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return 1000.0 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run(writes: int, freezes: int, marks: int) -> dict[str, Any]:
    arrivals: list[float] = []

    async def load(request: web.Request) -> web.Response:
        arrivals.append(time.perf_counter())
        await request.read()
        return web.json_response({})

    app = web.Application()
    app.router.add_post("/v2/repository/models/{model}/load", load)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    url = f"http://127.0.0.1:{port}"

    with tempfile.TemporaryDirectory() as tmp:
        journal = Journal(Path(tmp) / "journal.db")
        for i in range(freezes):
            journal.freezes.record(f"other/model-{i}", "operator", float("inf"))
        for v in range(2, 2 + marks):
            journal.bad_versions.mark(TARGET, v, "rolled back")
        deps = ActionDeps()
        fenced_at: list[float] = []

        async def write_fence(timeout: float) -> str | None:
            fenced_at.append(time.perf_counter())
            return None

        deps.write_fence = write_fence
        door = Door(journal, ExecutorState(PolicySet()), deps, lambda: True, Metrics())
        action = TritonRollback(deps)

        async def send() -> None:
            await action._send_load(url, "ranker", CONFIG, 10.0)

        base: list[float] = []
        through: list[float] = []
        windows: list[float] = []
        effect = Effect("triton.load", f"load ranker version 1 on {url}", target=TARGET, loads=1)
        for _ in range(5):  # warm-up: connections, the journal's pages
            await send()
        arrivals.clear()
        with acting(PINS, TARGET):
            for _ in range(writes):
                started = time.perf_counter()
                await send()
                base.append(time.perf_counter() - started)
                started = time.perf_counter()
                await door.write(effect, send)
                through.append(time.perf_counter() - started)
                windows.append(arrivals[-1] - fenced_at[-1])
        rows = len(journal.effects.of(TARGET))
        journal.close()
    await runner.cleanup()
    added = [t - b for t, b in zip(through, base)]
    return {"writes": writes, "rows": rows, "base": base, "through": through, "added": added, "windows": windows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writes", type=int, default=300)
    parser.add_argument("--freezes", type=int, default=20, help="runtime freezes of other targets in force")
    parser.add_argument("--marks", type=int, default=20, help="bad-version marks of the target")
    args = parser.parse_args()
    result = asyncio.run(run(args.writes, args.freezes, args.marks))
    print(f"$ PYTHONPATH=. {sys.executable.rsplit('/', 1)[-1]} bench/bench_door.py --writes {args.writes} "
          f"--freezes {args.freezes} --marks {args.marks}")
    print(f"writes: {result['writes']} through the door ({result['rows']} effect rows journaled: intent + result each)")
    print("journal per write: 2 reads (freezes in force, the target's bad marks) + 2 write transactions "
          "(the fenced intent, which reads the term, and the result)")
    for name in ("base", "through", "added", "windows"):
        label = {"base": "load request alone", "through": "through the door", "added": "added by the door",
                 "windows": "fence window (fence returned -> request received)"}[name]
        values = result[name]
        print(f"{label:>50}: median {_ms(values, 0.5):7.3f} ms  p99 {_ms(values, 0.99):7.3f} ms  "
              f"max {1000 * max(values):7.3f} ms  (mean {1000 * statistics.fmean(values):.3f} ms)")


if __name__ == "__main__":
    main()
