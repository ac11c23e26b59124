"""A small TCP proxy a test controls, in front of a real server (Triton, PostgreSQL): faults a real
server cannot be made to produce on cue.

- `down()` closes the listening socket and cuts every connection: the next connect is refused, as
  for a pod that is gone; `up()` listens again on the same port (the pod is back).
- `cut_on(pattern)`: the next `times` client chunks containing `pattern` (an HTTP request line, a
  SQL word) cut their connection, before the chunk is forwarded (`after=False`: the request never
  reached the server, a replica refusing mid-load) or after it (`after=True`: the server acted, its
  answer is lost); with `down_for_seconds` the proxy then refuses connections that long (a replica
  restarting mid-load).
- `on(pattern, callback)`: call `callback` (on the proxy's loop) when a client chunk contains
  `pattern`, before it is forwarded (a test pauses a process there, by its PID).
- `delay_seconds`: latency added before each chunk is forwarded, either way.
- `count(pattern)`: how many client chunks contained `pattern` (how many loads were sent).

Bytes are forwarded as they come; patterns are matched per chunk read (a request line arrives whole
on loopback).
"""
from __future__ import annotations

import asyncio
import contextlib
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from lab.ports import LOOPBACK, free_port

READ_BYTES = 65536


@dataclass
class _Cut:
    pattern: bytes
    times: int | None  # None: every time
    after: bool
    down_for_seconds: float = 0.0


@dataclass
class _Tap:
    pattern: bytes
    callback: Callable[[], None]
    once: bool
    fired: bool = False


@dataclass
class FaultProxy:
    """Forwards `host`:`port` to `upstream_host`:`upstream_port` until told otherwise."""

    upstream_host: str
    upstream_port: int
    port: int = field(default_factory=free_port)
    delay_seconds: float = 0.0
    host: str = LOOPBACK  # any 127.0.0.0/8 address: several proxies may share a port, as pods do
    _server: asyncio.Server | None = None
    _writers: set[asyncio.StreamWriter] = field(default_factory=set)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _cuts: list[_Cut] = field(default_factory=list)
    _taps: list[_Tap] = field(default_factory=list)
    _seen: list[bytes] = field(default_factory=list)
    _closed: bool = False

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``: what a client of an HTTP upstream is given."""
        return f"http://{self.host}:{self.port}"

    @property
    def is_up(self) -> bool:
        return self._server is not None

    async def start(self) -> "FaultProxy":
        await self.up()
        return self

    async def up(self) -> None:
        """Listen (again) on `port`."""
        if self._server is None:
            self._server = await asyncio.start_server(self._serve, self.host, self.port, reuse_address=True)

    async def down(self) -> None:
        """Refuse new connections and cut every open one."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        if server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), timeout=5)

    async def close(self) -> None:
        """Stop for good: down (every connection aborted), and every task of the proxy ended."""
        self._closed = True
        await self.down()
        tasks = list(self._tasks)
        if tasks:
            _, stuck = await asyncio.wait(tasks, timeout=5)
            for task in stuck:
                task.cancel()
            await asyncio.gather(*stuck, return_exceptions=True)

    async def __aenter__(self) -> "FaultProxy":
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def cut_on(self, pattern: bytes, times: int | None = 1, *, after: bool = False,
               down_for_seconds: float = 0.0) -> None:
        """Cut the connection of the next `times` client chunks containing `pattern` (None: all);
        `down_for_seconds`: then refuse connections for that long."""
        self._cuts.append(_Cut(pattern, times, after, down_for_seconds))

    def clear_cuts(self) -> None:
        self._cuts.clear()

    def on(self, pattern: bytes, callback: Callable[[], None], *, once: bool = True) -> None:
        """Call `callback` when a client chunk contains `pattern`, before forwarding it."""
        self._taps.append(_Tap(pattern, callback, once))

    def count(self, pattern: bytes) -> int:
        """Client chunks seen so far that contained `pattern`."""
        return sum(1 for chunk in self._seen if pattern in chunk)

    # ---- forwarding -------------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        self._writers.add(writer)
        try:
            try:
                up_reader, up_writer = await asyncio.open_connection(self.upstream_host, self.upstream_port)
            except OSError:
                writer.transport.abort()
                return
            self._writers.add(up_writer)
            try:
                await asyncio.gather(self._pump(reader, up_writer, from_client=True, back=writer),
                                     self._pump(up_reader, writer, from_client=False, back=up_writer))
            finally:
                self._writers.discard(up_writer)
                up_writer.transport.abort()
        finally:
            self._writers.discard(writer)
            writer.transport.abort()
            if task is not None:
                self._tasks.discard(task)

    def _spawn(self, work: "asyncio.Future[None] | Any") -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _away(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
        if not self._closed:
            await self.up()

    def _cut_for(self, chunk: bytes) -> _Cut | None:
        for cut in self._cuts:
            if cut.pattern in chunk and (cut.times is None or cut.times > 0):
                if cut.times is not None:
                    cut.times -= 1
                return cut
        return None

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, from_client: bool,
                    back: asyncio.StreamWriter) -> None:
        """Copy one direction until EOF or a cut; a cut aborts both sides."""
        try:
            while True:
                chunk = await reader.read(READ_BYTES)
                if not chunk:
                    writer.write_eof() if writer.can_write_eof() else None
                    return
                cut = None
                if from_client:
                    self._seen.append(chunk)
                    for tap in self._taps:
                        if tap.pattern in chunk and not (tap.once and tap.fired):
                            tap.fired = True
                            tap.callback()
                    cut = self._cut_for(chunk)
                if cut is not None and not cut.after:
                    raise ConnectionAbortedError("cut before forwarding")
                if self.delay_seconds:
                    await asyncio.sleep(self.delay_seconds)
                writer.write(chunk)
                await writer.drain()
                if cut is not None:
                    await asyncio.sleep(0.05)  # the server has the request; its answer is lost
                    if cut.down_for_seconds:
                        self._spawn(self._away(cut.down_for_seconds))
                        await self.down()
                    raise ConnectionAbortedError("cut after forwarding")
        except (ConnectionError, OSError):
            writer.transport.abort()
            back.transport.abort()


class FaultProxyThread:
    """A FaultProxy on an event loop of its own thread, controlled with plain calls: for a server
    whose client blocks the caller's event loop (a journal opened synchronously would starve a proxy
    on that same loop). Callbacks given to `on` run in the proxy's thread."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.proxy = FaultProxy(upstream_host, upstream_port)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxy", daemon=True)

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=30)

    @property
    def port(self) -> int:
        return self.proxy.port

    @property
    def is_up(self) -> bool:
        return self.proxy.is_up

    def start(self) -> "FaultProxyThread":
        self._thread.start()
        self._run(self.proxy.start())
        return self

    def up(self) -> None:
        self._run(self.proxy.up())

    def down(self) -> None:
        self._run(self.proxy.down())

    def count(self, pattern: bytes) -> int:
        return self.proxy.count(pattern)

    def close(self) -> None:
        try:
            self._run(self.proxy.close())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop.close()
