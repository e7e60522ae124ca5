"""A minimal, fast NATS client connection for the broker's hot path: subscribe, take messages
in batches, publish acks in batches. The IO shell around the pure `nats_wire` codec.

Theory of operation
- One TCP connection, one reader path: `IngestConnection` is the `asyncio.Protocol` of its
  socket. `data_received` feeds each read to a `NatsParser`, hands each subscription the
  list of messages that read held for it (`IngestSubscription.deliver`, one call per
  subscription per read; the buffering and slow-consumer rule are in
  jetstream.server.nats_subscription) and answers the server's PINGs. Nothing per message is
  scheduled, awaited or called through Python: no Msg objects, no asyncio.Queue, no tasks.
- Writes of one loop turn go out together: `publish_many` encodes a whole batch of PUBs as
  one bytes and queues it; at the end of the turn (or once `coalesce_bytes_max` is queued)
  everything queued is written to the transport at once, so a leader acking the partitions
  of one replica fetch makes one send, not one per partition. The transport buffers what
  the socket does not take; above its high-water mark `drain()` waits until it is below
  the low-water mark again (`pause_writing`/`resume_writing`).
- Handshake: TCP connect, wait for INFO, upgrade to TLS when the server requires it or the
  URL is tls:// (`loop.start_tls` over the same socket: NATS sends INFO in clear, then
  both sides speak TLS), send CONNECT + PING, wait for PONG (an -ERR, e.g. an authorization
  violation, fails the attempt), all within `connect_timeout_s`. A server asking for TLS of
  a connection given no TLS context is refused with `NatsUnsupported` (the broker then uses
  nats-py). Credentials come from the URL, else from `auth`.
- Liveness: a PING every `ping_interval_s`; more than `pings_outstanding_max` unanswered
  PINGs mean a dead peer and the socket is aborted. `flush()` is a PING whose PONG proves the
  server processed everything written before it (our writes are never reordered);
  `confirm()` is one such PING shared by every caller of a loop turn.
- Reconnect: when the socket is lost (not by `close()`), one task dials again
  (jetstream.server.nats_dial: which server, how long to wait) and, on success, re-sends
  every SUB (same sids) before anything else, then what `publish_many` buffered meanwhile
  (bounded by `reconnect_buffer_bytes_max`; past it `publish_many` raises
  `NatsNotConnected`). Messages published to our subjects during the gap are lost, as with
  nats-py; subscriptions keep their buffers.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import ssl
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from jetstream.errors import JetstreamError
from jetstream.server.nats_dial import Dialer, NatsAuth, ServerAddress, parse_url
from jetstream.server.nats_errors import (
    NatsConnectFailed,
    NatsConnectionClosed,
    NatsNotConnected,
    NatsPayloadTooLarge,
    NatsUnsupported,
)
from jetstream.server.nats_subscription import (
    PENDING_BYTES_MAX,
    PENDING_MSGS_MAX,
    IngestSubscription,
)
from jetstream.server.nats_wire import (
    DEFAULT_MAX_PAYLOAD,
    PING,
    PONG,
    ConnectOptions,
    Err,
    Event,
    Info,
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

VERSION: Final = "0.1.0"
DROP_LOG_INTERVAL_S: Final = 5.0


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
    coalesce_bytes_max: int = 64 * 1024  # queued past this, a write goes out at once
    close_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        if not (self.connect_timeout_s > 0 and self.reconnect_wait_s > 0
                and self.reconnect_wait_max_s >= self.reconnect_wait_s
                and self.ping_interval_s > 0 and self.pings_outstanding_max >= 1
                and 0 <= self.write_buffer_low_bytes <= self.write_buffer_high_bytes
                and self.reconnect_buffer_bytes_max >= 0 and self.coalesce_bytes_max >= 0
                and self.close_timeout_s > 0):
            raise ValueError(f"invalid IngestConfig {self}")
        if self.reconnect_attempts_max is not None and self.reconnect_attempts_max < 0:
            raise ValueError("reconnect_attempts_max must be >= 0 or None")


class IngestConnection(asyncio.Protocol):
    """A NATS connection for subscribe-and-ack ingest; create it with `connect()`."""

    def __init__(self, servers: Sequence[ServerAddress], *, name: str | None = None,
                 config: IngestConfig | None = None, tls: ssl.SSLContext | None = None,
                 auth: NatsAuth | None = None) -> None:
        self.name = name
        self.config = config or IngestConfig()
        self._tls = tls
        if auth is not None:
            servers = [server.with_auth(auth) for server in servers]
        self._dialer = Dialer(servers, self._connect_to, wait_s=self.config.reconnect_wait_s,
                              wait_max_s=self.config.reconnect_wait_max_s,
                              attempts_max=self.config.reconnect_attempts_max)
        #: Successful reconnects since `connect()`.
        self.reconnects = 0
        #: PINGs of the server answered with a PONG.
        self.pings_answered = 0
        #: PINGs `confirm` wrote (each confirms every subscription made before it).
        self.confirm_pings = 0
        self.server_info: dict[str, Any] = {}
        self.last_error: str | None = None
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
        #: The PING the `confirm` calls of this loop turn wait for, until it is written.
        self._confirming: asyncio.Future[None] | None = None
        self._ping_handle: asyncio.TimerHandle | None = None
        self._write_paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        self._offline: list[bytes] = []  # publishes while reconnecting
        self._out: list[bytes] = []  # written this loop turn, for the transport at its end
        self._out_bytes = 0
        self._out_handle: asyncio.Handle | None = None
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
    def servers(self) -> list[ServerAddress]:
        return self._dialer.servers

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
            self._write(data)
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

    async def confirm(self, timeout_s: float = 5.0) -> None:
        """`flush`, shared by the callers of one loop turn: the first schedules a PING for the
        end of the turn and each caller until then waits for its PONG, so hundreds of leaders
        starting together confirm their SUBs with a few round trips rather than one each."""
        self._check_open()
        if not self._connected:
            raise NatsNotConnected("not connected: cannot confirm while reconnecting")
        waiter = self._confirming
        if waiter is None:
            loop = asyncio.get_running_loop()
            waiter = self._confirming = loop.create_future()
            waiter.add_done_callback(_consume)
            loop.call_soon(self._ping_for, waiter)
        async with asyncio.timeout(timeout_s):
            await asyncio.shield(waiter)  # one caller's timeout leaves the others waiting

    def _ping_for(self, waiter: asyncio.Future[None]) -> None:
        self._confirming = None
        if waiter.done():
            return
        if not self._connected:
            waiter.set_exception(NatsNotConnected("not connected: the subscription waits "
                                                  "for the reconnect"))
            return
        self._pongs.append(waiter)
        self._write(PING)
        self.confirm_pings += 1

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
                if self.server_info.get("tls_required") or server.tls:
                    await self._start_tls(server)
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

    async def _start_tls(self, server: ServerAddress) -> None:
        """Carry on over TLS on the same socket (the rest of the handshake included)."""
        tls = self._tls
        if tls is None and server.tls:
            tls = ssl.create_default_context()
        if tls is None:
            raise NatsUnsupported(f"{server} requires TLS and this connection was given no "
                                  "TLS context", server=str(server))
        transport = self._transport
        assert transport is not None
        upgraded = await asyncio.get_running_loop().start_tls(
            transport, self, tls, server_hostname=server.host,
            ssl_handshake_timeout=self.config.connect_timeout_s)
        if upgraded is None:
            raise NatsConnectFailed(f"{server}: the connection closed during the TLS handshake")
        self._transport = upgraded
        upgraded.set_write_buffer_limits(high=self.config.write_buffer_high_bytes,
                                         low=self.config.write_buffer_low_bytes)

    async def _reconnect(self) -> None:
        try:
            found = await self._dialer.redial(lambda: self._closing)
        except NatsConnectionClosed as exc:  # gave up after reconnect_attempts_max
            self._shut(exc)
            return
        except Exception as exc:  # a bug: do not leave subscribers waiting forever
            log.exception("NATS reconnect failed")
            self._shut(NatsConnectionClosed(f"reconnecting failed: {exc}"))
            return
        if found is not None:
            server, attempts = found
            self.reconnects += 1
            log.info("reconnected to %s after %d attempts", server, attempts)

    async def _drop_transport(self, *, graceful: bool) -> None:
        """Close (graceful) or abort the socket and wait until asyncio reports it lost, so
        that its callbacks never mix with the next socket's."""
        transport, lost = self._transport, self._lost
        if transport is None or lost is None:
            return
        if graceful:
            self._flush_out()
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
            sub.close(error)
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
                sub.deliver(msgs, nbytes)
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
        self._drop_out()  # meant for this socket: the next one starts with its handshake
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
        """Queue `data` for the transport, written at the end of this loop turn (at once
        past `coalesce_bytes_max`), after everything queued before it."""
        if self._transport is None or not data:
            return
        self._out.append(data)
        self._out_bytes += len(data)
        if self._out_bytes >= self.config.coalesce_bytes_max:
            self._flush_out()
        elif self._out_handle is None:
            self._out_handle = asyncio.get_running_loop().call_soon(self._flush_out)

    def _flush_out(self) -> None:
        out = self._out
        self._drop_out()
        if self._transport is not None and out:
            self._transport.write(out[0] if len(out) == 1 else b"".join(out))

    def _drop_out(self) -> None:
        if self._out_handle is not None:
            self._out_handle.cancel()
            self._out_handle = None
        self._out = []
        self._out_bytes = 0

    def unsubscribe(self, sub: IngestSubscription) -> None:
        """UNSUB `sub` (the subscription's `unsubscribe` calls this) and close it."""
        if self._subs.pop(sub.sid, None) is not None and self._connected:
            self._write(unsub_command(sub.sid))
        sub.close(NatsConnectionClosed(f"subscription {sub.sid} on {sub.subject!r} ended"))

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

    def note_drop(self, sub: IngestSubscription, count: int) -> None:
        """Log slow-consumer drops, at most once per DROP_LOG_INTERVAL_S per connection."""
        now = time.monotonic()
        if now - self._drop_logged_at >= DROP_LOG_INTERVAL_S:
            self._drop_logged_at = now
            log.warning("slow consumer: sid %s on %r dropped %d messages (%d in total)",
                        sub.sid, sub.subject, count, sub.dropped)


def _consume(waiter: asyncio.Future[None]) -> None:
    """Retrieve a shared waiter's outcome: its callers may all have timed out."""
    if not waiter.cancelled():
        waiter.exception()


async def connect(urls: str | Sequence[str], *, name: str | None = None,
                  config: IngestConfig | None = None, tls: ssl.SSLContext | None = None,
                  auth: NatsAuth | None = None) -> IngestConnection:
    """Connect to the first server of `urls` that accepts (comma-separated in one string, or
    a list). Raises `NatsUnsupported` for a server that requires TLS when no `tls` context
    is given, and `NatsConnectFailed` when no server accepts."""
    if isinstance(urls, str):
        urls = [url.strip() for url in urls.split(",") if url.strip()]
    conn = IngestConnection([parse_url(url) for url in urls], name=name, config=config,
                            tls=tls, auth=auth)
    await conn._dialer.dial_first()
    return conn
