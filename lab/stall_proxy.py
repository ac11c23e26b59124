"""A TCP proxy on loopback that can stall silently: the fault of a silent network partition.

While stalled, it forwards nothing in either direction and closes nothing: the client's kernel
still gets its bytes acknowledged (by the proxy's), so the client sees neither an error nor a
reset, only no answer, as behind a partition where the peer's packets are dropped. New
connections are accepted and held the same way. `resume()` forwards what was held back.

It runs its own event loop in a thread of the caller's process (no process of its own), so that
a caller blocking its loop on a connection through it (a journal opened synchronously) cannot
stall it; `start`, `stall`, `resume` and `stop` may be called from any thread.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from typing import Any, Coroutine


class StallProxy:
    """Forwards 127.0.0.1:`port` to `target_host`:`target_port` until `stall()`.

    Args:
        target_host: Where connections go.
        target_port: Its port.
    """

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target_host, self.target_port = target_host, target_port
        self.port = 0
        self.connections = 0  # accepted so far
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="stall-proxy", daemon=True)
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._stalled = False
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._closed = False

    @property
    def stalled(self) -> bool:
        return self._stalled

    def _call(self, coro: Coroutine[Any, Any, Any]) -> concurrent.futures.Future[Any]:
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    async def start(self) -> None:
        self._thread.start()
        await asyncio.wrap_future(self._call(self._listen()))

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def stall(self) -> None:
        """From now on nothing is forwarded (bytes already read are held, not dropped)."""
        self._stalled = True
        self._call(self._set(False)).result(10)

    def resume(self) -> None:
        self._stalled = False
        if self._thread.is_alive():
            self._call(self._set(True)).result(10)

    async def _set(self, flowing: bool) -> None:
        if flowing:
            self._flowing.set()
        else:
            self._flowing.clear()

    async def stop(self) -> None:
        """Close the listener and every connection (unstalled first, so nothing waits), then the loop."""
        if not self._thread.is_alive():
            return
        await asyncio.wrap_future(self._call(self._close()))
        self._loop.call_soon_threadsafe(self._loop.stop)
        await asyncio.to_thread(self._thread.join, 10)
        self._loop.close()

    async def _close(self) -> None:
        self._closed = True
        if self._server is not None:
            self._server.close()
            self._server = None
        self._flowing.set()
        for writer in list(self._writers):
            writer.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def __aenter__(self) -> "StallProxy":
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.add(writer)
        await self._flowing.wait()  # a connection made while stalled is held, not refused
        if self._closed:
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(self.target_host, self.target_port)
        except OSError:
            writer.close()
            return
        self._writers.add(up_writer)
        self._spawn(self._pump(reader, up_writer))
        self._spawn(self._pump(up_reader, writer))

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                await self._flowing.wait()
                data = await reader.read(65536)
                if not data:
                    break
                await self._flowing.wait()  # read just before a stall: held until resumed
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass  # one side went away: so does the other
        finally:
            with contextlib.suppress(Exception):
                writer.close()
