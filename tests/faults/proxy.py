"""TCP relays between brokers, each of which a fault can cut, blackhole or slow down.

Theory of operation: every directed broker -> broker link (metadata Raft and socket API) goes
through its own `Link`, a loopback listener that opens the real connection for each accepted
one and pumps bytes both ways. Brokers are told to dial their peers at the links' ports
(`--raft-routes`, `--peer-routes`); identities do not change, only the path. A link is in one
of three modes:

    up         bytes flow (after `delay_ms`, if set, in order)
    down       every connection is closed at once; new ones are accepted and closed
    blackhole  connections stay open but nothing gets through, both ways: bytes are held
               (and the senders stalled) until the link is up again, as TCP would deliver
               them after a network that drops every packet heals; new connections are
               accepted but not connected onwards until then (a silent network)

All links run on one asyncio loop in a thread of their own (`Relays`), so that a test blocking
its own thread (a broker starting, a file being read) never stalls the network. The control
methods are thread-safe and return once the mode is in force.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

HOST = "127.0.0.1"
CHUNK_BYTES = 256 * 1024
CONNECT_TIMEOUT_S = 2.0
CONTROL_TIMEOUT_S = 10.0
T = TypeVar("T")


class Mode(enum.Enum):
    UP = "up"
    DOWN = "down"
    BLACKHOLE = "blackhole"


class Link:
    """A relay from a listening port to `target` ("host:port"); runs on the Relays' loop."""

    def __init__(self, name: str, target: str) -> None:
        self.name = name
        self.target = target
        self.mode = Mode.UP
        self.delay_ms = 0
        self.port = 0
        self.accepted = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._flowing = asyncio.Event()
        self._flowing.set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, HOST, 0)
        self.port = self._server.sockets[0].getsockname()[1]

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    def set_mode(self, mode: Mode, delay_ms: int = 0) -> None:
        self.mode = mode
        self.delay_ms = delay_ms
        if mode is Mode.BLACKHOLE:
            self._flowing.clear()
        else:
            self._flowing.set()
        if mode is Mode.DOWN:
            for writer in list(self._writers):
                writer.transport.abort()
            self._writers.clear()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        self.set_mode(Mode.DOWN)
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        await self._flowing.wait()
        if self.mode is Mode.DOWN:
            writer.transport.abort()
            return
        host, _, port = self.target.rpartition(":")
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(host, int(port)), CONNECT_TIMEOUT_S)
        except (TimeoutError, OSError):
            writer.transport.abort()
            return
        if self.mode is Mode.DOWN:  # cut while connecting
            writer.transport.abort()
            up_writer.transport.abort()
            return
        self._writers.update((writer, up_writer))
        for src, dst in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.get_running_loop().create_task(self._pump(src, dst, writer, up_writer))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter,
                    *ends: asyncio.StreamWriter) -> None:
        try:
            while True:
                data = await src.read(CHUNK_BYTES)
                await self._flowing.wait()
                if not data or self.mode is Mode.DOWN:
                    break
                if self.delay_ms:
                    await asyncio.sleep(self.delay_ms / 1000)
                dst.write(data)
                await dst.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            for end in ends:
                end.transport.abort()
                self._writers.discard(end)


class Relays:
    """The links of one test, on their own event loop thread."""

    def __init__(self) -> None:
        self.links: dict[str, Link] = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="relays",
                                        daemon=True)
        self._thread.start()

    def add(self, name: str, target: str) -> Link:
        """A new link named `name` relaying to `target`, listening once this returns."""
        link = Link(name, target)
        self._call(link.start())
        self.links[name] = link
        return link

    def set_mode(self, names: list[str], mode: Mode, delay_ms: int = 0) -> None:
        async def apply() -> None:
            for name in names:
                self.links[name].set_mode(mode, delay_ms)

        self._call(apply())

    def heal(self) -> None:
        self.set_mode(list(self.links), Mode.UP)

    def close(self) -> None:
        async def stop_all() -> None:
            for link in self.links.values():
                await link.stop()

        with contextlib.suppress(Exception):
            self._call(stop_all())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(CONTROL_TIMEOUT_S)
        if not self._thread.is_alive():
            self._loop.close()

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(CONTROL_TIMEOUT_S)
