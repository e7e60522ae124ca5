"""A subscription of the ingest connection: the bounded buffer between the reader and ingest.

Theory of operation: the connection's reader (jetstream.server.nats_ingest) hands each
subscription the list of messages one socket read held for it (`deliver`, one call per
subscription per read). The subscription keeps whole lists (chunks) in a deque, with a
message and a byte count, so nothing per message is scheduled, awaited or copied.
- `take_batch(max_msgs, max_bytes)` returns everything buffered up to the limits without
  waiting (a chunk is split only when it straddles a limit); `next_batch` first waits for
  one message (a future the reader resolves), with an optional timeout.
- When the buffer is full (`pending_msgs_max` / `pending_bytes_max`, payload bytes) the rest
  of a read's messages are dropped and counted in `dropped`: nats-py's slow-consumer rule.
  The reader is never paused, so one slow subscription cannot stall the others or the
  PINGs. Drops are reported to the owning connection (`note_drop`), which logs them.
- Closing (`close(error)`, by UNSUB or by the connection closing for good) wakes a waiting
  `next_batch`; what is buffered can still be taken, after which it raises `error`.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Final, Protocol

from jetstream.errors import JetstreamError
from jetstream.server.nats_wire import NatsMsg

#: nats-py's defaults for a subscription's pending limits.
PENDING_MSGS_MAX: Final = 512 * 1024
PENDING_BYTES_MAX: Final = 128 * 1024 * 1024
BATCH_MSGS_MAX: Final = 16_384
BATCH_BYTES_MAX: Final = 8 * 1024 * 1024


class SubscriptionOwner(Protocol):
    """What a subscription asks of its connection."""

    def unsubscribe(self, sub: IngestSubscription) -> None:
        """Send UNSUB for `sub` and close it."""

    def note_drop(self, sub: IngestSubscription, count: int) -> None:
        """`count` messages of `sub` were dropped (its buffer was full)."""


class IngestSubscription:
    """Messages of one SUB, buffered in chunks up to its pending limits."""

    __slots__ = ("_chunks", "_closed", "_conn", "_pending_bytes", "_pending_msgs", "_waiter",
                 "dropped", "pending_bytes_max", "pending_msgs_max", "queue", "received", "sid",
                 "subject")

    def __init__(self, conn: SubscriptionOwner, sid: str, subject: str, queue: str | None,
                 pending_msgs_max: int, pending_bytes_max: int) -> None:
        if pending_msgs_max < 1 or pending_bytes_max < 1:
            raise ValueError("pending limits must be >= 1")
        self._conn = conn
        self.sid = sid
        self.subject = subject
        self.queue = queue
        self.pending_msgs_max = pending_msgs_max
        self.pending_bytes_max = pending_bytes_max
        #: Messages that arrived for this subscription / dropped because its buffer was full.
        self.received = 0
        self.dropped = 0
        self._chunks: collections.deque[tuple[list[NatsMsg], int]] = collections.deque()
        self._pending_msgs = 0
        self._pending_bytes = 0
        self._waiter: asyncio.Future[None] | None = None
        self._closed: JetstreamError | None = None

    @property
    def pending_msgs(self) -> int:
        return self._pending_msgs

    @property
    def pending_bytes(self) -> int:
        return self._pending_bytes

    def deliver(self, msgs: list[NatsMsg], nbytes: int) -> None:
        """Buffer one read's messages (the reader's only per-subscription call)."""
        self.received += len(msgs)
        if (self._pending_msgs + len(msgs) <= self.pending_msgs_max
                and self._pending_bytes + nbytes <= self.pending_bytes_max):
            self._chunks.append((msgs, nbytes))
            self._pending_msgs += len(msgs)
            self._pending_bytes += nbytes
        else:
            self._deliver_partly(msgs)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _deliver_partly(self, msgs: list[NatsMsg]) -> None:
        msgs_room = self.pending_msgs_max - self._pending_msgs
        bytes_room = self.pending_bytes_max - self._pending_bytes
        kept = kept_bytes = 0
        for msg in msgs:
            size = len(msg[3])
            if kept >= msgs_room or kept_bytes + size > bytes_room:
                break
            kept += 1
            kept_bytes += size
        if kept:
            self._chunks.append((msgs[:kept], kept_bytes))
            self._pending_msgs += kept
            self._pending_bytes += kept_bytes
        self.dropped += len(msgs) - kept
        self._conn.note_drop(self, len(msgs) - kept)

    def take_batch(self, max_msgs: int = BATCH_MSGS_MAX,
                   max_bytes: int = BATCH_BYTES_MAX) -> list[NatsMsg]:
        """What is buffered, up to `max_msgs` messages and `max_bytes` payload bytes (but at
        least one message when any is buffered), without waiting; [] when empty."""
        chunks = self._chunks
        if not chunks:
            return []
        if max_msgs < 1 or max_bytes < 1:
            raise ValueError("max_msgs and max_bytes must be >= 1")
        if self._pending_msgs <= max_msgs and self._pending_bytes <= max_bytes:
            if len(chunks) == 1:
                out = chunks[0][0]
            else:
                out = []
                for msgs, _ in chunks:
                    out.extend(msgs)
            chunks.clear()
            self._pending_msgs = self._pending_bytes = 0
            return out
        out = []
        taken_bytes = 0
        while chunks:
            msgs, nbytes = chunks[0]
            if len(out) + len(msgs) <= max_msgs and taken_bytes + nbytes <= max_bytes:
                out.extend(msgs)
                taken_bytes += nbytes
                chunks.popleft()
                continue
            # This chunk straddles a limit: take its head (at least one message overall).
            count = split_bytes = 0
            for msg in msgs[:max_msgs - len(out)]:
                size = len(msg[3])
                if taken_bytes + split_bytes + size > max_bytes and (out or count):
                    break
                count += 1
                split_bytes += size
            out.extend(msgs[:count])
            taken_bytes += split_bytes
            if count == len(msgs):
                chunks.popleft()
            elif count:
                chunks[0] = (msgs[count:], nbytes - split_bytes)
            break
        self._pending_msgs -= len(out)
        self._pending_bytes -= taken_bytes
        return out

    async def next_batch(self, max_msgs: int = BATCH_MSGS_MAX, max_bytes: int = BATCH_BYTES_MAX,
                         timeout_s: float | None = None) -> list[NatsMsg]:
        """Wait for at least one message, then return what is buffered up to the limits
        (see `take_batch`). With `timeout_s`, returns [] if nothing came in time. After the
        subscription or connection closed, returns what is left, then raises
        `NatsConnectionClosed`. One caller at a time."""
        if max_msgs < 1 or max_bytes < 1:
            raise ValueError("max_msgs and max_bytes must be >= 1")
        if not self._chunks:
            await self._wait(timeout_s)
            if not self._chunks:
                if self._closed is not None:
                    raise self._closed
                return []
        return self.take_batch(max_msgs, max_bytes)

    async def _wait(self, timeout_s: float | None) -> None:
        """Until a message is buffered, the subscription closes or `timeout_s` passes. A
        wake-up can find nothing (a read whose messages were all dropped): wait again."""
        if self._waiter is not None:
            raise RuntimeError(f"next_batch of sid {self.sid} is already waiting")
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        while not self._chunks and self._closed is None:
            waiter = self._waiter = loop.create_future()
            timer = None if deadline is None else loop.call_at(deadline, _wake, waiter)
            try:
                await waiter
            finally:
                self._waiter = None
                if timer is not None:
                    timer.cancel()
            if deadline is not None and loop.time() >= deadline:
                return

    def unsubscribe(self) -> None:
        """Stop receiving (UNSUB); what is buffered can still be taken."""
        self._conn.unsubscribe(self)

    def close(self, error: JetstreamError) -> None:
        """No more messages will come: `next_batch` returns what is left, then raises
        `error`."""
        if self._closed is None:
            self._closed = error
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
