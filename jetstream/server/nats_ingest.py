"""A minimal, fast NATS client connection for the broker's hot path: subscribe, take messages
in batches, publish acks in batches. The IO shell around the pure `nats_wire` codec.

Theory of operation
- One TCP connection, one reader path: `IngestConnection` is the `asyncio.Protocol` of its
  socket. `data_received` feeds each read to a `NatsParser`, hands each subscription the
  list of messages that read held for it (`IngestSubscription._deliver`, one call per
  subscription per read) and answers the server's PINGs. Nothing per message is scheduled,
  awaited or called through Python: no Msg objects, no asyncio.Queue, no tasks.
- A subscription buffers whole lists (chunks) in a deque, with a message and a byte count.
  `next_batch(max_msgs, max_bytes)` waits for the first message, then returns everything
  buffered up to the limits (a chunk is split only when it straddles a limit). When the
  buffer is full (`pending_msgs_max` / `pending_bytes_max`, payload bytes) the rest of a
  read's messages are dropped and counted in `dropped`: nats-py's slow-consumer rule. The
  reader is never paused, so one slow subscription cannot stall the others or the PINGs.
- Writes go straight to the transport: `publish_many` encodes a whole batch of PUBs as one
  bytes and writes it once. The transport buffers what the socket does not take; above its
  high-water mark `drain()` waits until it is below the low-water mark again
  (`pause_writing`/`resume_writing`).
- Handshake: TCP connect, wait for INFO, send CONNECT + PING, wait for PONG (an -ERR, e.g.
  an authorization violation, fails the attempt), all within `connect_timeout_s`. Servers
  asking for TLS are refused with `NatsUnsupported`: the broker falls back to nats-py.
- Liveness: a PING every `ping_interval_s`; more than `pings_outstanding_max` unanswered
  PINGs mean a dead peer and the socket is aborted. `flush()` is a PING whose PONG proves the
  server processed everything written before it (our writes are never reordered).
- Reconnect: when the socket is lost (not by `close()`), one task retries the server list
  round-robin with exponential backoff and jitter, and on success re-sends every SUB (same
  sids) before anything else, then what `publish_many` buffered meanwhile (bounded by
  `reconnect_buffer_bytes_max`; past it `publish_many` raises `NatsNotConnected`). Messages
  published to our subjects during the gap are lost, as with nats-py; subscriptions keep
  their buffers.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import random
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from jetstream.errors import JetstreamError
from jetstream.server.nats_wire import (
    DEFAULT_MAX_PAYLOAD,
    PING,
    PONG,
    ConnectOptions,
    Err,
    Event,
    Info,
    NatsMsg,
    NatsParser,
    NatsProtocolError,
    Ping,
    Pong,
    connect_command,
    pub_commands,
    sub_command,
    unsub_command,
)

log = logging.getLogger(__name__)

DEFAULT_PORT: Final = 4222
VERSION: Final = "0.1.0"
#: nats-py's defaults for a subscription's pending limits.
PENDING_MSGS_MAX: Final = 512 * 1024
PENDING_BYTES_MAX: Final = 128 * 1024 * 1024
BATCH_MSGS_MAX: Final = 16_384
BATCH_BYTES_MAX: Final = 8 * 1024 * 1024
DROP_LOG_INTERVAL_S: Final = 5.0


class NatsUnsupported(JetstreamError):
    """The server or URL needs a NATS feature this connection does not implement (TLS,
    WebSocket, ...). Use nats-py for this server: the broker falls back to it."""

    code = "NATS_UNSUPPORTED"


class NatsConnectFailed(JetstreamError, ConnectionError):
    """No server in the list could be connected to (refused, timed out, or rejected the
    CONNECT, e.g. bad credentials: see `reasons`). Check the URLs and credentials; retry."""

    code = "NATS_CONNECT_FAILED"
    retriable = True


class NatsNotConnected(JetstreamError, ConnectionError):
    """The connection is down and reconnecting, and the operation cannot wait: a `flush`, or
    a `publish_many` whose data does not fit the reconnect buffer. Retry after reconnecting."""

    code = "NATS_NOT_CONNECTED"
    retriable = True


class NatsPayloadTooLarge(JetstreamError):
    """A payload handed to `publish_many` is larger than the server's `max_payload` (the
    server would close the connection). Nothing of the batch was sent; send less."""

    code = "NATS_PAYLOAD_TOO_LARGE"

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"payload of {size} bytes exceeds the server's max_payload of {limit}",
                         size=size, limit=limit)


class NatsConnectionClosed(JetstreamError):
    """The connection was closed (by `close()`, or reconnecting gave up after
    `reconnect_attempts_max`); its subscriptions get no more messages. Open a new one."""

    code = "NATS_CONNECTION_CLOSED"


@dataclass(frozen=True, slots=True)
class ServerAddress:
    """One server of the URL list, with the credentials its URL carries."""

    host: str
    port: int
    user: str | None = None
    password: str | None = None
    auth_token: str | None = None

    def __str__(self) -> str:
        return f"nats://{self.host}:{self.port}"


def parse_url(url: str) -> ServerAddress:
    """`nats://[user:pass@|token@]host[:port]` (or bare `host:port`) as a ServerAddress."""
    if "://" not in url:
        url = "nats://" + url
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "nats":
        raise NatsUnsupported(f"NATS URL scheme {parts.scheme!r} is not supported (only "
                              f"plain nats://; TLS and WebSocket need nats-py): {url}",
                              url=url)
    if not parts.hostname:
        raise NatsConnectFailed(f"NATS URL without a host: {url}", url=url)
    try:
        port = parts.port or DEFAULT_PORT
    except ValueError as exc:
        raise NatsConnectFailed(f"bad port in NATS URL {url}", url=url) from exc
    user = urllib.parse.unquote(parts.username) if parts.username else None
    if user is not None and parts.password is None:
        return ServerAddress(parts.hostname, port, auth_token=user)
    password = urllib.parse.unquote(parts.password) if parts.password is not None else None
    return ServerAddress(parts.hostname, port, user=user, password=password)


@dataclass(frozen=True, slots=True)
class IngestConfig:
    """Limits and timings of one IngestConnection (units last in the names)."""

    connect_timeout_s: float = 5.0
    reconnect_wait_s: float = 0.05  # first backoff; doubles per failed round
    reconnect_wait_max_s: float = 2.0
    reconnect_attempts_max: int | None = None  # None: retry forever (a broker never gives up)
    ping_interval_s: float = 30.0
    pings_outstanding_max: int = 2
    write_buffer_high_bytes: int = 4 * 1024 * 1024
    write_buffer_low_bytes: int = 1024 * 1024
    reconnect_buffer_bytes_max: int = 8 * 1024 * 1024
    close_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        if not (self.connect_timeout_s > 0 and self.reconnect_wait_s > 0
                and self.reconnect_wait_max_s >= self.reconnect_wait_s
                and self.ping_interval_s > 0 and self.pings_outstanding_max >= 1
                and 0 <= self.write_buffer_low_bytes <= self.write_buffer_high_bytes
                and self.reconnect_buffer_bytes_max >= 0 and self.close_timeout_s > 0):
            raise ValueError(f"invalid IngestConfig {self}")
        if self.reconnect_attempts_max is not None and self.reconnect_attempts_max < 0:
            raise ValueError("reconnect_attempts_max must be >= 0 or None")


class IngestSubscription:
    """Messages of one SUB, buffered in chunks up to its pending limits."""

    __slots__ = ("_chunks", "_closed", "_conn", "_pending_bytes", "_pending_msgs", "_waiter",
                 "dropped", "pending_bytes_max", "pending_msgs_max", "queue", "received", "sid",
                 "subject")

    def __init__(self, conn: IngestConnection, sid: str, subject: str, queue: str | None,
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

    def _deliver(self, msgs: list[NatsMsg], nbytes: int) -> None:
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
        self._conn._note_drop(self, len(msgs) - kept)

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
        self._conn._unsubscribe(self)

    def _close(self, error: JetstreamError) -> None:
        if self._closed is None:
            self._closed = error
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class IngestConnection(asyncio.Protocol):
    """A NATS connection for subscribe-and-ack ingest; create it with `connect()`."""

    def __init__(self, servers: Sequence[ServerAddress], *, name: str | None = None,
                 config: IngestConfig | None = None) -> None:
        if not servers:
            raise ValueError("at least one NATS server is needed")
        self.servers = list(servers)
        self.name = name
        self.config = config or IngestConfig()
        #: Successful reconnects since `connect()`.
        self.reconnects = 0
        #: PINGs of the server answered with a PONG.
        self.pings_answered = 0
        self.server_info: dict[str, Any] = {}
        self.last_error: str | None = None
        self._server_index = 0
        self._transport: asyncio.Transport | None = None
        self._parser = NatsParser()
        self._lost: asyncio.Future[None] | None = None
        self._connected = False
        self._closing = False
        self._closed_error: JetstreamError | None = None
        self._stage: Literal["info", "pong"] | None = None
        self._handshake: asyncio.Future[None] | None = None
        self._subs: dict[str, IngestSubscription] = {}
        self._next_sid = 1
        self._pongs: collections.deque[asyncio.Future[None] | None] = collections.deque()
        self._ping_handle: asyncio.TimerHandle | None = None
        self._write_paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        self._offline: list[bytes] = []  # publishes while reconnecting
        self._offline_bytes = 0
        self._reconnect_task: asyncio.Task[None] | None = None
        self._drop_logged_at = -DROP_LOG_INTERVAL_S

    # -- public API ---------------------------------------------------------------------------

    @property
    def is_connected(self) -> bool:
        return self._connected

    @property
    def is_closed(self) -> bool:
        return self._closed_error is not None

    @property
    def max_payload(self) -> int:
        value = self.server_info.get("max_payload")
        return value if isinstance(value, int) and value > 0 else DEFAULT_MAX_PAYLOAD

    def subscribe(self, subject: str, queue: str | None = None, *,
                  pending_msgs_max: int = PENDING_MSGS_MAX,
                  pending_bytes_max: int = PENDING_BYTES_MAX) -> IngestSubscription:
        """Subscribe now (or on reconnect, when down). `await flush()` afterwards to know the
        server has registered it."""
        self._check_open()
        sid = str(self._next_sid)
        command = sub_command(subject, sid, queue)  # validates before anything changes
        self._next_sid += 1
        sub = IngestSubscription(self, sid, subject, queue or None, pending_msgs_max,
                                 pending_bytes_max)
        self._subs[sid] = sub
        if self._connected:
            self._write(command)
        return sub

    def publish_many(self, messages: Sequence[tuple[str, bytes]]) -> None:
        """Publish (subject, payload) pairs in order, as one write. While reconnecting they
        are buffered (up to `reconnect_buffer_bytes_max`, else `NatsNotConnected`). Follow
        with `await drain()` to respect the transport's write buffer limit. Raises
        `InvalidNatsSubject` or `NatsPayloadTooLarge` (nothing is sent) for bad input."""
        if not messages:
            return
        self._check_open()
        data = pub_commands(messages)
        if len(data) > self.max_payload:
            largest = max(len(payload) for _, payload in messages)
            if largest > self.max_payload:
                raise NatsPayloadTooLarge(largest, self.max_payload)
        if self._connected:
            assert self._transport is not None
            self._transport.write(data)
        elif self._offline_bytes + len(data) <= self.config.reconnect_buffer_bytes_max:
            self._offline.append(data)
            self._offline_bytes += len(data)
        else:
            raise NatsNotConnected(
                f"not connected and the reconnect buffer of "
                f"{self.config.reconnect_buffer_bytes_max} bytes is full")

    async def drain(self) -> None:
        """Wait while the transport's write buffer is above its high-water mark (returns at
        once when it is not, or when the connection is down)."""
        if self._write_paused and self._connected:
            waiter = asyncio.get_running_loop().create_future()
            self._drain_waiters.append(waiter)
            await waiter

    async def flush(self, timeout_s: float = 5.0) -> None:
        """PING and wait for its PONG: the server has processed everything written before."""
        self._check_open()
        if not self._connected:
            raise NatsNotConnected("not connected: cannot flush while reconnecting")
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pongs.append(waiter)
        self._write(PING)
        async with asyncio.timeout(timeout_s):
            await waiter

    async def close(self) -> None:
        """Close the socket (after the transport wrote what it buffered) and every
        subscription; stop reconnecting. Safe to call twice."""
        if self._closing:
            return
        self._closing = True
        self._closed_error = NatsConnectionClosed("the NATS connection was closed")
        if self._reconnect_task is not None:
            self._reconnect_task.cancel()
            # wait(), not await: our own cancellation must propagate, the task's must not.
            await asyncio.wait([self._reconnect_task], timeout=self.config.close_timeout_s)
        await self._drop_transport(graceful=True)
        self._shut(self._closed_error)

    async def __aenter__(self) -> IngestConnection:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- connecting ---------------------------------------------------------------------------

    async def _connect_first(self) -> None:
        """One attempt per server, in order; raise if none accepts."""
        reasons: list[str] = []
        for index, server in enumerate(self.servers):
            try:
                await self._connect_to(server)
            except NatsUnsupported:
                raise
            except (OSError, TimeoutError, NatsConnectFailed, NatsProtocolError) as exc:
                reasons.append(f"{server}: {exc or type(exc).__name__}")
                continue
            self._server_index = index
            return
        raise NatsConnectFailed("could not connect to any NATS server: " + "; ".join(reasons),
                                reasons=reasons)

    async def _connect_to(self, server: ServerAddress) -> None:
        """TCP connect and handshake with one server; on success re-send the SUBs."""
        loop = asyncio.get_running_loop()
        self._parser = NatsParser()
        self._pongs.clear()
        try:
            async with asyncio.timeout(self.config.connect_timeout_s):
                self._stage = "info"
                self._handshake = loop.create_future()
                await loop.create_connection(lambda: self, server.host, server.port)
                await self._handshake
                if self.server_info.get("tls_required"):
                    raise NatsUnsupported(f"{server} requires TLS, which this connection does "
                                          "not implement: use nats-py", server=str(server))
                self._stage = "pong"
                self._handshake = loop.create_future()
                options = ConnectOptions(name=self.name, version=VERSION, user=server.user,
                                         password=server.password,
                                         auth_token=server.auth_token)
                self._write(connect_command(options) + PING)
                await self._handshake
                if self._transport is None or self._transport.is_closing():
                    # e.g. garbage right after the PONG, in the same read
                    raise NatsConnectFailed(f"{server} dropped the connection after the "
                                            f"handshake: {self.last_error or 'closed'}")
        except BaseException:
            self._stage = None
            self._handshake = None
            await self._drop_transport(graceful=False)
            raise
        self._stage = None
        self._handshake = None
        resend = [sub_command(sub.subject, sub.sid, sub.queue) for sub in self._subs.values()]
        self._write(b"".join(resend + self._offline))
        self._offline = []
        self._offline_bytes = 0
        self._connected = True
        self._schedule_ping()

    async def _reconnect(self) -> None:
        try:
            await self._reconnect_rounds()
        except Exception as exc:  # a bug: do not leave subscribers waiting forever
            log.exception("NATS reconnect failed")
            self._shut(NatsConnectionClosed(f"reconnecting failed: {exc}"))

    async def _reconnect_rounds(self) -> None:
        wait_s = self.config.reconnect_wait_s
        attempts = 0
        limit = self.config.reconnect_attempts_max
        while not self._closing:
            for _ in range(len(self.servers)):
                if limit is not None and attempts >= limit:
                    self._shut(NatsConnectionClosed(
                        f"gave up reconnecting to NATS after {attempts} attempts"))
                    return
                self._server_index = (self._server_index + 1) % len(self.servers)
                server = self.servers[self._server_index]
                attempts += 1
                try:
                    await self._connect_to(server)
                except (OSError, TimeoutError, JetstreamError) as exc:
                    log.debug("reconnect to %s failed: %s", server, exc)
                    continue
                self.reconnects += 1
                log.info("reconnected to %s after %d attempts", server, attempts)
                return
            await asyncio.sleep(wait_s * (0.5 + random.random()))
            wait_s = min(wait_s * 2, self.config.reconnect_wait_max_s)

    async def _drop_transport(self, *, graceful: bool) -> None:
        """Close (graceful) or abort the socket and wait until asyncio reports it lost, so
        that its callbacks never mix with the next socket's."""
        transport, lost = self._transport, self._lost
        if transport is None or lost is None:
            return
        if graceful:
            transport.close()
        else:
            transport.abort()
        try:
            async with asyncio.timeout(self.config.close_timeout_s):
                await asyncio.shield(lost)
        except TimeoutError:
            transport.abort()

    def _shut(self, error: JetstreamError) -> None:
        """Closed for good: wake everyone that waits."""
        if self._closed_error is None:
            self._closed_error = error
        self._closing = True
        self._connected = False
        self._cancel_ping()
        for sub in self._subs.values():
            sub._close(error)
        self._fail_waiters(error)

    # -- asyncio.Protocol -----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._lost = asyncio.get_running_loop().create_future()
        self._write_paused = False
        transport.set_write_buffer_limits(high=self.config.write_buffer_high_bytes,
                                          low=self.config.write_buffer_low_bytes)

    def data_received(self, data: bytes) -> None:
        parser = self._parser
        error: NatsProtocolError | None = None
        try:
            parser.feed(data)
        except NatsProtocolError as exc:
            error = exc
        subs = self._subs
        for sid, msgs, nbytes in parser.take_messages():
            sub = subs.get(sid)
            if sub is not None:
                sub._deliver(msgs, nbytes)
        events = parser.take_events()
        if events:
            self._on_events(events)
        if error is not None and self._transport is not None:
            log.warning("NATS protocol error from the server, reconnecting: %s", error)
            self.last_error = str(error)
            if self._handshake is not None and not self._handshake.done():
                self._handshake.set_exception(error)
            self._transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        was_connected = self._connected
        self._connected = False
        self._transport = None
        self._cancel_ping()
        if self._lost is not None and not self._lost.done():
            self._lost.set_result(None)
        if self._handshake is not None and not self._handshake.done():
            reason = self.last_error if self._stage == "pong" and self.last_error else exc
            self._handshake.set_exception(NatsConnectFailed(
                f"connection closed during the handshake: {reason or 'by the server'}"))
        self._fail_waiters(NatsNotConnected("the NATS connection was lost"))
        if was_connected and not self._closing:
            log.warning("NATS connection lost (%s); reconnecting", exc or "closed by server")
            self._reconnect_task = asyncio.get_running_loop().create_task(
                self._reconnect(), name="nats ingest reconnect")

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        waiters, self._drain_waiters = self._drain_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    # -- internals ----------------------------------------------------------------------------

    def _on_events(self, events: list[Event]) -> None:
        for event in events:
            if isinstance(event, Ping):
                self._write(PONG)
                self.pings_answered += 1
            elif isinstance(event, Pong):
                if self._stage == "pong":
                    self._resolve_handshake()
                elif self._pongs:
                    waiter = self._pongs.popleft()
                    if waiter is not None and not waiter.done():
                        waiter.set_result(None)
            elif isinstance(event, Info):
                self.server_info = event.info
                if self._stage == "info":
                    self._resolve_handshake()
            elif isinstance(event, Err):
                self.last_error = event.message
                log.warning("NATS server error: %s", event.message)
                if self._handshake is not None and not self._handshake.done():
                    self._handshake.set_exception(NatsConnectFailed(
                        f"the server refused the connection: {event.message}"))

    def _resolve_handshake(self) -> None:
        if self._handshake is not None and not self._handshake.done():
            self._handshake.set_result(None)

    def _write(self, data: bytes) -> None:
        if self._transport is not None and data:
            self._transport.write(data)

    def _unsubscribe(self, sub: IngestSubscription) -> None:
        if self._subs.pop(sub.sid, None) is not None and self._connected:
            self._write(unsub_command(sub.sid))
        sub._close(NatsConnectionClosed(f"subscription {sub.sid} on {sub.subject!r} ended"))

    def _schedule_ping(self) -> None:
        self._cancel_ping()
        loop = asyncio.get_running_loop()
        self._ping_handle = loop.call_later(self.config.ping_interval_s, self._ping_tick)

    def _cancel_ping(self) -> None:
        if self._ping_handle is not None:
            self._ping_handle.cancel()
            self._ping_handle = None

    def _ping_tick(self) -> None:
        self._ping_handle = None
        if not self._connected or self._transport is None:
            return
        if len(self._pongs) >= self.config.pings_outstanding_max:
            log.warning("NATS server did not answer %d PINGs: stale connection, reconnecting",
                        len(self._pongs))
            self._transport.abort()
            return
        self._pongs.append(None)
        self._write(PING)
        self._schedule_ping()

    def _fail_waiters(self, error: JetstreamError) -> None:
        pongs, self._pongs = self._pongs, collections.deque()
        for waiter in pongs:
            if waiter is not None and not waiter.done():
                waiter.set_exception(error)
        drains, self._drain_waiters = self._drain_waiters, []
        for waiter in drains:
            if not waiter.done():
                waiter.set_result(None)  # drain() never raises: writes now go offline
        self._write_paused = False

    def _check_open(self) -> None:
        if self._closed_error is not None:
            raise self._closed_error

    def _note_drop(self, sub: IngestSubscription, count: int) -> None:
        now = time.monotonic()
        if now - self._drop_logged_at >= DROP_LOG_INTERVAL_S:
            self._drop_logged_at = now
            log.warning("slow consumer: sid %s on %r dropped %d messages (%d in total)",
                        sub.sid, sub.subject, count, sub.dropped)


async def connect(urls: str | Sequence[str], *, name: str | None = None,
                  config: IngestConfig | None = None) -> IngestConnection:
    """Connect to the first server of `urls` that accepts (comma-separated in one string, or
    a list). Raises `NatsUnsupported` for tls:// (or a server that requires TLS) and
    `NatsConnectFailed` when no server accepts."""
    if isinstance(urls, str):
        urls = [url.strip() for url in urls.split(",") if url.strip()]
    conn = IngestConnection([parse_url(url) for url in urls], name=name, config=config)
    await conn._connect_first()
    return conn
