"""Every way to switch a Triton model back to its previous version, measured on the real Triton.

Run: ``PYTHONPATH=. .venv/bin/python bench/bench_switch.py [--repeats 4] [--rate 40]``.

One real Triton (the lab's, explicit model control) serving the lab's Python-backend model `ranker`
(versions 1 and 2, two instances each, 5 ms per request), loopback load at `--rate` req/s with no
version in the URL (Triton picks the served one, as clients do). Each switch is its own row,
repeated `--repeats` times; each run starts the load, waits `--lead` seconds, decides (the clock
starts), makes the switch, and keeps the load going `--tail` seconds:

- today: v2 served alone (``specific [2]``); the switch is one load with ``specific [1]`` (Triton
  loads v1, then unloads v2);
- warm: v1 kept loaded beside v2 (``specific [1, 2]`` from the deploy on: unversioned requests go to
  the highest, v2); the switch is one load with ``specific [1]``, whose policy leaves v2 out (never
  ``unload_model``: it takes every version down);
- beside-then-pin: v2 alone; at the decision v1 is loaded beside it (``[1, 2]``), then ``[1]``: the
  two loads one after the other (the earlier measurement the issue quotes);
- warming (no switch): v2 alone, v1 loaded beside it (`[1, 2]`) and nothing more: what keeping a
  version warm costs the requests on v2 when it is loaded (at the deploy, not during an incident);
- mesh: routing away first needs a mesh (weights to the stable subset); none runs in this lab, so the
  row is skipped and said so.

Per run: `last_bad_s`, from the decision to the send time of the last request v2 answered (admitted
to the bad version); `load_s`, the load call's own time; `failed`, requests not answered 200;
`held`, requests sent from 1 s before the decision to the end of the load whose latency exceeded
`--held-ms`; `new_stubs`, the Python-backend stub processes the switch started (a version loaded
afresh starts one per instance; the warm switch is a config update of a version already loaded and
starts none). Per state (v2 alone, v1+v2 warm):
the RSS of Triton and its Python-backend stubs, and their CPU seconds over `--cpu-window` seconds
under the same load. The load average is printed: ratios within one run are what matter here.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tritonclient.http.aio import InferenceServerClient

from lab.load import LoadResult, run_load
from lab.triton import TritonServer, served_versions, write_model_repository

MODEL = "ranker"
PAGE = os.sysconf("SC_PAGE_SIZE")
TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Switch:
    name: str
    before: list[int]  # the versions served (pinned) before the decision
    steps: list[list[int]]  # the loads the switch makes, in order


SWITCHES = (
    Switch("today", [2], [[1]]),
    Switch("warm", [1, 2], [[1]]),
    Switch("beside-then-pin", [2], [[1, 2], [1]]),
    # Not a switch: what keeping v1 warm costs the requests on v2 when it is loaded (at the deploy).
    Switch("warming (no switch)", [2], [[1, 2]]),
)


# ---- processes: Triton and its stubs ------------------------------------------------------------


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(c) for c in f.read().split()]
    except OSError:
        pass  # the process ended between the listing and the read
    return out


def tree(pid: int) -> list[int]:
    """`pid` and every descendant (Triton's Python-backend stubs are its children)."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo += _children(p)
    return found


def rss_mib(pids: list[int]) -> float:
    total = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/statm") as f:
                total += int(f.read().split()[1]) * PAGE
        except OSError:
            pass  # gone: counts nothing
    return total / 2**20


def cpu_seconds(pids: list[int]) -> float:
    total = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
        except OSError:
            pass
    return total / TICKS


# ---- Triton --------------------------------------------------------------------------------------


async def load(server: TritonServer, versions: list[int]) -> float:
    """One load with `specific versions`; its time in seconds."""
    client = InferenceServerClient(server.http_url, conn_timeout=120)
    try:
        config = await client.get_model_config(MODEL)
        config["version_policy"] = {"specific": {"versions": versions}}
        began = time.monotonic()
        await client.load_model(MODEL, config=json.dumps(config))
        return time.monotonic() - began
    finally:
        await client.close()


# ---- one run --------------------------------------------------------------------------------------


async def one_run(server: TritonServer, switch: Switch, args: argparse.Namespace) -> dict[str, Any]:
    await load(server, switch.before)
    served = await asyncio.to_thread(served_versions, server, MODEL)
    assert served == [str(v) for v in switch.before], f"{switch.name}: serves {served}, wanted {switch.before}"
    await asyncio.sleep(args.settle)  # the stubs of versions the setup unloaded exit
    processes_before = set(tree(server.pid))
    load_task = asyncio.create_task(run_load(server.base_url, MODEL, args.rate, args.lead + args.tail,
                                             request_timeout_seconds=30.0))
    await asyncio.sleep(args.lead)
    decided = time.time()
    load_seconds = [await load(server, versions) for versions in switch.steps]
    done = time.time()
    started = len(set(tree(server.pid)) - processes_before)
    result: LoadResult = await load_task
    bad = [s.sent_at_unix for s in result.samples if s.model_version == "2"]
    last_bad = max(bad) - decided if bad else float("nan")
    held = [s for s in result.samples if decided - 1.0 <= s.sent_at_unix <= done
            and s.status == 200 and s.latency_seconds * 1000 > args.held_ms]
    served_after = sorted({s.model_version for s in result.samples if s.sent_at_unix > done + 0.5 and s.model_version})
    return {
        "switch": switch.name,
        "last_bad_s": max(0.0, last_bad),
        "load_s": sum(load_seconds),
        "failed": len(result.errors),
        "held": len(held),
        "requests": len(result.samples),
        "new_stubs": started,
        "served_after": served_after,
    }


async def state_cost(server: TritonServer, versions: list[int], args: argparse.Namespace) -> dict[str, float]:
    """RSS (MiB) and CPU seconds of Triton and its stubs while `versions` are loaded, under load."""
    await load(server, versions)
    await asyncio.sleep(args.settle)  # the stubs of versions the load unloaded exit
    pids = tree(server.pid)
    task = asyncio.create_task(run_load(server.base_url, MODEL, args.rate, args.cpu_window))
    cpu0 = cpu_seconds(pids)
    await task
    cpu = cpu_seconds(pids) - cpu0
    return {"processes": len(pids), "rss_mib": rss_mib(tree(server.pid)), "cpu_s": cpu}


def _med(rows: list[dict[str, Any]], key: str) -> float:
    return statistics.median(float(r[key]) for r in rows)


async def main(args: argparse.Namespace) -> None:
    root = Path(tempfile.mkdtemp(prefix="tailguard-bench-switch-"))
    write_model_repository(root / "models", MODEL, slow_fraction_by_version={1: 0.0, 2: 0.0}, instances=2,
                           precompile=True)
    server = TritonServer(root / "models", models=[MODEL], workdir=root)
    await asyncio.to_thread(server.start)
    try:
        print(f"# Triton {await _version(server)}, load average {os.getloadavg()[0]:.2f} "
              f"{os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}, {os.cpu_count()} CPUs", flush=True)
        costs = {"v2 alone": await state_cost(server, [2], args),
                 "v1 warm beside v2": await state_cost(server, [1, 2], args)}
        rows: list[dict[str, Any]] = []
        for repeat in range(args.repeats):
            # Interleaved (today, warm, beside, today, ...): a burst of load on the shared host hits all alike.
            for switch in SWITCHES:
                row = await one_run(server, switch, args)
                row["repeat"] = repeat
                rows.append(row)
                print(json.dumps(row), flush=True)
        load_avg = os.getloadavg()
    finally:
        await asyncio.to_thread(server.stop)
        shutil.rmtree(root, ignore_errors=True)  # the repository and Triton's log: nothing to keep
    print()
    print(f"PYTHONPATH=. {sys.executable} bench/bench_switch.py --repeats {args.repeats} --rate {args.rate:g} "
          f"--lead {args.lead:g} --tail {args.tail:g} --held-ms {args.held_ms:g} --settle {args.settle:g} "
          f"--cpu-window {args.cpu_window:g}")
    print(f"load average at the end {load_avg[0]:.2f} {load_avg[1]:.2f} {load_avg[2]:.2f}")
    print()
    print(f"| switch | runs | decision to last request on v2, median (max) ms | load call, median (max) ms | "
          f"failed | held > {args.held_ms:g} ms | new stub processes |")
    print("|---|---|---|---|---|---|---|")
    for switch in SWITCHES:
        mine = [r for r in rows if r["switch"] == switch.name]
        last = (f"{1000 * _med(mine, 'last_bad_s'):.1f} ({1000 * max(r['last_bad_s'] for r in mine):.1f})"
                if switch.steps[-1] == [1] else "n/a: v2 keeps serving")
        print(f"| {switch.name} | {len(mine)} | {last} "
              f"| {1000 * _med(mine, 'load_s'):.1f} ({1000 * max(r['load_s'] for r in mine):.1f}) "
              f"| {sum(r['failed'] for r in mine)} of {sum(r['requests'] for r in mine)} "
              f"| {sum(r['held'] for r in mine)} | {_med(mine, 'new_stubs'):.0f} |")
    print("| mesh (route away first) | 0 | skipped: no mesh (Istio, gateway) runs in this lab | | | | |")
    print()
    print(f"| state | processes | RSS MiB | CPU s over {args.cpu_window:g} s at {args.rate:g} req/s |")
    print("|---|---|---|---|")
    for name, cost in costs.items():
        print(f"| {name} | {cost['processes']:.0f} | {cost['rss_mib']:.0f} | {cost['cpu_s']:.2f} |")
    warm, alone = costs["v1 warm beside v2"], costs["v2 alone"]
    print(f"\nwarmth costs {warm['rss_mib'] - alone['rss_mib']:.0f} MiB RSS "
          f"({warm['processes'] - alone['processes']:.0f} more processes) and "
          f"{warm['cpu_s'] - alone['cpu_s']:+.2f} CPU s over {args.cpu_window:g} s")


async def _version(server: TritonServer) -> str:
    client = InferenceServerClient(server.http_url)
    try:
        meta = await client.get_server_metadata()
        return str(meta.get("version"))
    finally:
        await client.close()


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=4)
    p.add_argument("--rate", type=float, default=40.0, help="requests per second")
    p.add_argument("--lead", type=float, default=2.0, help="seconds of load before the decision")
    p.add_argument("--tail", type=float, default=4.0, help="seconds of load after the decision")
    p.add_argument("--held-ms", type=float, default=250.0, help="latency above which a request was held")
    p.add_argument("--settle", type=float, default=3.0, help="seconds for unloaded versions' stubs to exit")
    p.add_argument("--cpu-window", type=float, default=5.0, help="seconds of load to read CPU over")
    return p.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse()))
