"""A pull consumer of one partition: an async iterator of Messages.

Theory of operation: on first use the subscription resolves where to start (the log start
offset, the high watermark, an offset or a timestamp, through OffsetForTimestamp) and where
to stop ("latest": the high watermark at that moment; an int; or never). Then it fetches
batch after batch from the partition's leader (or, with `read_isr_replica`, from a replica
of its ISR) through Client.fetch. To overlap the broker's work and the network with the
consumer's, it keeps one fetch in flight: as soon as a fetch returns, the next one (from
its `next_offset`) is started, and only then are the messages handed out. When the
consumer has caught up, that fetch is a long poll (`max_wait_ms`) which returns as soon as
something is committed: `tail -f`. The client's fetch refreshes the metadata and retries at
the leader with backoff after NOT_LEADER and lost connections; when its attempts run out,
iterating raises the error.

The positions are read when the subscription is started: by `await client.subscribe(...)`,
`async with client.subscribe(...)`, or else at the first iteration. `next_batch()` is the
batch-level interface (the sync facade uses it); `async for` hands out one message at a time
from the current batch. A subscription holds a task only while a fetch is in flight;
`close()` (or leaving `async with`) cancels it, and the client closes its subscriptions when
it closes.

A subscription needs of the client only the two reads it makes (`PartitionReader`), so it
does not depend on the client's module, and it can be driven by a stand-in in tests.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable, Generator
from typing import Any, Literal, Protocol

from jetstream.client.types import FetchResult, Message, Start
from jetstream.errors import ProtocolError
from jetstream.protocol import messages as m

StopAt = Literal["latest"] | int | None


class PartitionReader(Protocol):
    """What a subscription calls: Client.fetch and Client.offset_for_timestamp."""

    async def fetch(self, stream: str, partition: int, offset: int, *, max_bytes: int,
                    max_wait_ms: int, read_isr_replica: bool) -> FetchResult: ...

    async def offset_for_timestamp(self, stream: str, partition: int,
                                   timestamp_ms: int) -> int: ...


class Subscription:
    """Iterate with `async for message in subscription`; see Client.subscribe."""

    def __init__(self, reader: PartitionReader, stream: str, partition: int, *, start: Start,
                 offset: int | None, timestamp_ms: int | None, stop: StopAt, max_bytes: int,
                 max_wait_ms: int, read_isr_replica: bool = False,
                 on_close: Callable[[Subscription], None] | None = None) -> None:
        """`on_close` is called with the subscription when it closes (the client forgets
        it)."""
        _check_start(start, offset, timestamp_ms)
        if not (stop is None or stop == "latest"
                or (isinstance(stop, int) and not isinstance(stop, bool) and stop >= 0)):
            raise ProtocolError(f"stop must be None, 'latest' or an offset, got {stop!r}",
                                field="stop")
        # Checks max_bytes and max_wait_ms now rather than at the first fetch.
        m.FetchRequest(stream, partition, 0, max_bytes, max_wait_ms)
        self._reader = reader
        self._on_close = on_close
        self.stream = stream
        self.partition = partition
        self._start = start
        self._start_offset = offset
        self._timestamp_ms = timestamp_ms
        self._stop = stop
        self._max_bytes = max_bytes
        self._max_wait_ms = max_wait_ms
        self._read_isr_replica = read_isr_replica
        #: The offset of the next message to fetch; None until the start is resolved.
        self.position: int | None = None
        #: Offset this subscription stops before; None: never.
        self.stop_offset: int | None = None
        self._buffer: collections.deque[Message] = collections.deque()
        self._inflight: asyncio.Task[FetchResult] | None = None
        self._done = False

    def __repr__(self) -> str:
        return (f"<Subscription {self.stream}/{self.partition} position={self.position} "
                f"stop={self.stop_offset}>")

    # -- iteration ----------------------------------------------------------------------------

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Message:
        buffer = self._buffer
        while not buffer:
            batch = await self.next_batch()
            if batch is None:
                raise StopAsyncIteration
            buffer.extend(batch)
        return buffer.popleft()

    def __await__(self) -> Generator[Any, None, Subscription]:
        return self.start().__await__()

    async def __aenter__(self) -> Subscription:
        return await self.start()

    async def start(self) -> Subscription:
        """Read the start (and stop) position now rather than at the first iteration: with
        NEW_ONLY or LATEST, what is committed after this returns is delivered. `await
        client.subscribe(...)` and `async with client.subscribe(...)` call it."""
        if self.position is None and not self._done:
            await self._resolve()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def next_batch(self) -> list[Message] | None:
        """The next non-empty batch of messages, waiting for one as long as it takes (the
        subscription follows the partition); None once the stop offset is reached or the
        subscription is closed."""
        await self.start()
        while not self._done:
            assert self.position is not None
            if self.stop_offset is not None and self.position >= self.stop_offset:
                break
            result = await self._take_fetch()
            if result is None:
                break
            messages = result.messages
            if self.stop_offset is not None and messages and \
                    messages[-1].offset >= self.stop_offset:
                messages = [msg for msg in messages if msg.offset < self.stop_offset]
            self.position = max(self.position, result.next_offset)
            if self.stop_offset is None or self.position < self.stop_offset:
                self._prefetch()
            if messages:
                return messages
        await self.close()
        return None

    async def close(self) -> None:
        """Stop: cancel the fetch in flight. Iterating afterwards ends at once."""
        self._done = True
        if self._on_close is not None:
            self._on_close(self)
        task, self._inflight = self._inflight, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait({task})  # its outcome (cancelled, or failed first) is dropped

    # -- fetching -----------------------------------------------------------------------------

    def _prefetch(self) -> None:
        assert self.position is not None
        self._inflight = asyncio.ensure_future(self._reader.fetch(
            self.stream, self.partition, self.position, max_bytes=self._max_bytes,
            max_wait_ms=self._max_wait_ms, read_isr_replica=self._read_isr_replica))
        # A prefetch nobody awaits (the consumer stopped early) must not log its failure.
        self._inflight.add_done_callback(_retrieve)

    async def _take_fetch(self) -> FetchResult | None:
        """The result of the fetch in flight (started if none is); None when `close()`
        cancelled it while this waited."""
        if self._inflight is None:
            self._prefetch()
        task = self._inflight
        assert task is not None
        try:
            return await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if self._done and task.cancelled() and current is not None \
                    and not current.cancelling():
                return None  # closed under us, not cancelled ourselves: the iteration ends
            raise
        finally:
            if self._inflight is task:
                self._inflight = None

    async def _resolve(self) -> None:
        """Set `position` from the start, and `stop_offset` from the stop."""
        reader, stream, partition = self._reader, self.stream, self.partition
        hw = -1
        if self._stop == "latest" or self._start in (Start.LATEST, Start.NEW_ONLY):
            hw = await reader.offset_for_timestamp(stream, partition, m.LATEST_TIMESTAMP)
        if self._start is Start.EARLIEST:
            position = await reader.offset_for_timestamp(stream, partition,
                                                         m.EARLIEST_TIMESTAMP)
        elif self._start is Start.NEW_ONLY:
            position = hw
        elif self._start is Start.LATEST:
            oldest = await reader.offset_for_timestamp(stream, partition, m.EARLIEST_TIMESTAMP)
            position = hw - 1 if hw > oldest else hw
        elif self._start is Start.OFFSET:
            assert self._start_offset is not None
            position = self._start_offset
        else:
            assert self._timestamp_ms is not None
            position = await reader.offset_for_timestamp(stream, partition, self._timestamp_ms)
            if position < 0:
                position = await reader.offset_for_timestamp(stream, partition,
                                                             m.LATEST_TIMESTAMP)
        if self._stop == "latest":
            self.stop_offset = hw
        elif isinstance(self._stop, int):
            self.stop_offset = self._stop
        self.position = position


def _check_start(start: Start, offset: int | None, timestamp_ms: int | None) -> None:
    if not isinstance(start, Start):
        raise ProtocolError(f"start must be a Start, got {start!r}", field="start")
    if start is Start.OFFSET and (offset is None or isinstance(offset, bool)
                                  or not isinstance(offset, int) or offset < 0):
        raise ProtocolError("start=Start.OFFSET needs offset= (a non-negative int)",
                            field="offset")
    if start is Start.TIMESTAMP and (timestamp_ms is None or not isinstance(timestamp_ms, int)):
        raise ProtocolError("start=Start.TIMESTAMP needs timestamp_ms= (ms since the epoch)",
                            field="timestamp_ms")


def _retrieve(task: asyncio.Task[FetchResult]) -> None:
    if not task.cancelled():
        task.exception()
