"""The clients as a process of their own: the load generator, the clients' view (/metrics) and the
weighted router, away from the daemon's event loop.

Why: in one process with the daemon, every stall of the shared event loop (a poll cycle, the
journal, a threshold derivation holding the GIL) lands on every request in flight as latency, on
both versions at once; on a busy machine that is a real share of requests above 500 ms that no
server caused. The canary judge compares two versions' shares above the line, so the clients must
measure what the servers did. Here they run as their own process, like the clients and sidecars
of a cluster run on their own.

    python -m lab.scenarios.clients_process --triton URL --port P --samples FILE --rate R
        [--kube URL --virtual-service NS/NAME] [--route primary] [--uniform-inputs SEED]

The router reads the VirtualService's weights from the Kubernetes API (the emulator) every
`--weights-every` seconds (0.2 s; a mesh applies a VirtualService change in about a second), and
every answer is appended to `--samples` as one JSON line, which the parent reads back
(`ClientsProcess`) for the progress line and the report.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import json
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import aiohttp

from lab.kube.seeds import route_weights
from lab.load import RequestSample, run_load
from lab.ports import LOOPBACK, free_port
from lab.process import ManagedProcess
from lab.scenarios.clients import ClientView, WeightedRouter, uniform_inputs
from lab.scenarios.timeline import window_quantiles

ISTIO_PATH = "/apis/networking.istio.io/v1/namespaces/{namespace}/virtualservices/{name}"
READY_TIMEOUT_SECONDS = 60.0


class LiveWeights:
    """The route's weights as the Kubernetes API holds them, re-read every `every` seconds; the
    last answer stands between reads (and when a read fails)."""

    def __init__(self, url: str, route: str, every: float) -> None:
        self.url = url
        self.route = route
        self.every = every
        self.weights: dict[str, int] = {}

    def __call__(self) -> Mapping[str, int]:
        return self.weights

    async def read(self, session: aiohttp.ClientSession) -> None:
        try:
            async with session.get(self.url) as response:
                if response.status == 200:
                    self.weights = route_weights(await response.json(), self.route)
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            pass  # the last weights stand, as a sidecar keeps its last config

    async def follow(self, session: aiohttp.ClientSession) -> None:
        while True:
            await self.read(session)
            await asyncio.sleep(self.every)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m lab.scenarios.clients_process")
    parser.add_argument("--triton", required=True, help="Triton's HTTP API (loopback)")
    parser.add_argument("--model", default="ranker")
    parser.add_argument("--port", type=int, required=True, help="where the clients' /metrics is served")
    parser.add_argument("--samples", type=Path, required=True, help="one JSON line per answer is appended here")
    parser.add_argument("--rate", type=float, required=True, help="requests per second")
    parser.add_argument("--duration", type=float, default=3600.0)
    parser.add_argument("--window", type=float, default=15.0, help="the clients' quantile window (s)")
    parser.add_argument("--namespace", default="serving", help="the mesh series' destination namespace")
    parser.add_argument("--kube", default=None, help="the Kubernetes API to read the VirtualService from")
    parser.add_argument("--virtual-service", default=None, help="NAMESPACE/NAME")
    parser.add_argument("--route", default="primary")
    parser.add_argument("--weights-every", type=float, default=0.2)
    parser.add_argument("--uniform-inputs", type=int, default=None,
                        help="seed: each request's first input uniform in [0, 1) (a rare-input slow path)")
    return parser.parse_args(argv)


async def serve(args: argparse.Namespace) -> None:
    view = ClientView(args.model, args.window, namespace=args.namespace, keep=5000)
    await view.start(args.port)
    args.samples.parent.mkdir(parents=True, exist_ok=True)
    out = open(args.samples, "a", buffering=1)  # a line each: the parent reads whole lines
    inputs = uniform_inputs(args.uniform_inputs) if args.uniform_inputs is not None else None

    def record(sample: RequestSample) -> None:
        view.record(sample)
        out.write(json.dumps(asdict(sample)) + "\n")

    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2.0)) as session:
            router = None
            follow = None
            if args.kube and args.virtual_service:
                namespace, name = args.virtual_service.split("/", 1)
                weights = LiveWeights(args.kube.rstrip("/") + ISTIO_PATH.format(namespace=namespace, name=name),
                                      args.route, args.weights_every)
                await weights.read(session)
                follow = asyncio.create_task(weights.follow(session))
                router = WeightedRouter(weights)
            try:
                await run_load(args.triton, args.model, rate_per_second=args.rate, duration_seconds=args.duration,
                               max_in_flight=64, request_timeout_seconds=10.0, route=router, on_sample=record,
                               inputs=inputs)
            finally:
                if follow is not None:
                    follow.cancel()
                    await asyncio.gather(follow, return_exceptions=True)
    finally:
        out.close()
        await view.stop()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    # A full collection over a long run's objects stalls the loop with requests in flight, which
    # would read as their latency: what exists at the start is frozen out of the collector, and
    # the samples kept are bounded (ClientView keep=).
    gc.collect()
    gc.freeze()
    try:
        asyncio.run(serve(args))
    except KeyboardInterrupt:
        pass
    return 0


class ClientsProcess:
    """The parent's side: what the runner reads of `ClientView` (`target`, `samples`, `quantiles`),
    from a clients process it starts and stops by its PID."""

    def __init__(self, model: str, window_seconds: float, workdir: Path, namespace: str = "serving") -> None:
        self.model = model
        self.window_seconds = window_seconds
        self.namespace = namespace
        self.workdir = workdir
        self.port = free_port()
        self.samples: list[RequestSample] = []
        self.path = workdir / "samples.jsonl"
        self._offset = 0
        self._process: ManagedProcess | None = None

    @property
    def target(self) -> str:
        """``host:port`` for a Prometheus scrape config (known before the process starts)."""
        return f"{LOOPBACK}:{self.port}"

    async def start(self) -> None:
        """Nothing yet: the process starts with the load (`launch`)."""

    def launch(self, triton_url: str, rate_per_second: float, kube_url: str | None = None,
               virtual_service: str | None = None, route: str = "primary", uniform_inputs: int | None = None) -> None:
        """Start the clients (blocking until their /metrics answers)."""
        argv = [sys.executable, "-m", "lab.scenarios.clients_process", "--triton", triton_url, "--model", self.model,
                "--port", str(self.port), "--samples", str(self.path), "--rate", str(rate_per_second),
                "--window", str(self.window_seconds), "--namespace", self.namespace, "--route", route]
        if kube_url and virtual_service:
            argv += ["--kube", kube_url, "--virtual-service", virtual_service]
        if uniform_inputs is not None:
            argv += ["--uniform-inputs", str(uniform_inputs)]
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._process = ManagedProcess(argv=argv, log_path=self.workdir / "clients.log",
                                       cwd=Path(__file__).resolve().parents[2])
        self._process.start()
        try:
            self._process.wait_ready(f"http://{self.target}/metrics", READY_TIMEOUT_SECONDS)
        except BaseException:
            self._process.stop()
            raise

    def refresh(self) -> None:
        """Read the answers written since the last read (whole lines only)."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return
        end = data.rfind(b"\n") + 1
        for line in data[:end].splitlines():
            fields: dict[str, Any] = json.loads(line)
            self.samples.append(RequestSample(**fields))
        self._offset += end

    def quantiles(self) -> dict[str, float]:
        """P50/P99/P99.9 in ms over the trailing window, now (as ClientView's)."""
        self.refresh()
        return window_quantiles(self.samples[-5000:], time.time(), self.window_seconds)

    def stop_process(self) -> None:
        """Stop the clients by their PID (blocking) and read what they wrote last."""
        if self._process is not None:
            self._process.stop()
        self.refresh()

    async def stop(self) -> None:
        await asyncio.to_thread(self.stop_process)


if __name__ == "__main__":
    sys.exit(main())
