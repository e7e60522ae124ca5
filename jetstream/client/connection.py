"""One client connection to one broker's socket API.

Theory of operation: a `BrokerConnection` owns one TCP stream. `open()` connects and sends
HELLO (correlation id 0) with the client id; the broker answers with its id. After that,
requests are pipelined: each gets the next correlation id (1, 2, ... wrapping below 2**32, 0
skipped), a future in `_pending`, and its frame is written at once. One reader task feeds
every received byte to a `frames.FrameDecoder` (bounded by the response frame limit) and
resolves the future whose correlation id a frame echoes; answers may come in any order. A
semaphore bounds the requests in flight (`requests_max`), so a caller that pipelines more
waits for room instead of growing the broker's queue without bound.

`request()` waits for its answer up to a timeout (a Fetch adds its long-poll wait) and
returns the typed response, or raises the JetstreamError an error frame carries. Failures
of the connection itself — refused, reset, closed by the broker, an undecodable byte
stream, no answer in time — are `BrokerUnavailable` (a ConnectionError, retriable): every
request in flight fails with it, and the connection is closed for good; the client opens a
new one. A late answer to a request that timed out is dropped.

TLS: given a `tls` context (an ssl.SSLContext), the connection is TLS from its first byte,
verifying the broker's certificate against the context's CAs and the host name dialled (or
`server_hostname`); a certificate the broker does not accept, or one of the broker's this
side does not, fails `open()` with BrokerUnavailable naming the TLS error.

Authentication: given `credentials`, `open()` sends AUTHENTICATE right after HELLO and
raises the broker's UNAUTHENTICATED when they are refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import ssl
from typing import Any, TypeVar

from jetstream.errors import BrokerUnavailable, FrameError, JetstreamError
from jetstream.protocol import frames
from jetstream.protocol import messages as m
from jetstream.tasks import cancel_and_wait

READ_CHUNK_BYTES = 1024 * 1024
CONNECT_TIMEOUT_S = 5.0
REQUEST_TIMEOUT_S = 30.0
REQUESTS_MAX = 256
#: Correlation ids run from 1 to this, then wrap; 0 is HELLO's.
_CORRELATION_ID_MAX = frames.U32_MAX


def split_address(address: str) -> tuple[str, int]:
    """("host", port) of "host:port". Raises ValueError when it is not one."""
    host, sep, port = address.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        raise ValueError(f"broker address must be host:port, got {address!r}")
    return host.strip("[]"), int(port)


_R = TypeVar("_R", bound=m.Response)

class BrokerConnection:
    """A pipelined connection to one broker. Use `await open()` before requests, `close()`
    after; `closed` tells whether it can still be used."""

    def __init__(
        self,
        address: str,
        *,
        client_id: str,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
        requests_max: int = REQUESTS_MAX,
        response_bytes_max: int = frames.RESPONSE_FRAME_BYTES_MAX,
        tls: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
        credentials: m.Credentials | None = None,
    ) -> None:
        self.address = address
        #: Sent in AUTHENTICATE right after HELLO (brokers with `authentication`).
        self.credentials = credentials
        #: The principal the broker took this connection for (after `open()` with
        #: credentials).
        self.principal: str | None = None
        self.host, self.port = split_address(address)
        self.tls = tls
        self.server_hostname = server_hostname
        self.client_id = client_id
        self.connect_timeout_s = connect_timeout_s
        self.request_timeout_s = request_timeout_s
        #: The broker's id and largest request frame, known after `open()`.
        self.broker_id = -1
        self.max_frame_bytes = frames.REQUEST_FRAME_BYTES_MAX
        self._decoder = frames.FrameDecoder(frame_bytes_max=response_bytes_max,
                                            header_bytes_max=frames.RESPONSE_HEADER_BYTES_MAX)
        self._slots = asyncio.Semaphore(requests_max)
        self._ids = itertools.cycle(range(1, _CORRELATION_ID_MAX + 1))
        self._pending: dict[int, asyncio.Future[frames.Frame]] = {}
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._read_task: asyncio.Task[None] | None = None
        self._failure: BrokerUnavailable | None = None

    def __repr__(self) -> str:
        return f"<BrokerConnection {self.address} broker_id={self.broker_id}>"

    @property
    def closed(self) -> bool:
        return self._failure is not None

    # -- lifecycle ----------------------------------------------------------------------------

    async def open(self) -> frames.HelloReply:
        """Connect and exchange HELLO. Raises BrokerUnavailable when the broker cannot be
        reached or does not answer in time, UnsupportedVersion when it speaks another
        protocol version, and the error it answers HELLO with otherwise."""
        try:
            options: dict[str, Any] = {} if self.tls is None else {
                "ssl": self.tls, "server_hostname": self.server_hostname or self.host,
                "ssl_handshake_timeout": self.connect_timeout_s}
            self._reader, self._writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port, limit=READ_CHUNK_BYTES,
                                        **options),
                self.connect_timeout_s)
        except (OSError, TimeoutError) as exc:
            kind = "TLS handshake failed" if isinstance(exc, ssl.SSLError) else "cannot connect"
            self._failure = BrokerUnavailable(self.address, f"{kind}: {exc or 'timeout'}")
            raise self._failure from None
        self._read_task = asyncio.create_task(self._read_loop(),
                                              name=f"jetstream reader {self.address}")
        try:
            frame = await self._exchange(0, frames.Kind.REQUEST, frames.Op.HELLO,
                                         frames.hello_request(self.client_id),
                                         self.connect_timeout_s)
            if frame.kind == frames.Kind.ERROR:
                raise m.error_from_header(frame.header)
            reply = frames.parse_hello_response(frame.header)
        except BrokerUnavailable as exc:
            await self.close()
            if self.tls is None:
                raise
            # Under TLS 1.3 a broker refuses a client certificate after the client's side of
            # the handshake is done: the refusal shows as the HELLO's connection closing.
            raise BrokerUnavailable(self.address, f"{exc.fields.get('reason', exc)} (before "
                                    "HELLO was answered over TLS: the broker may not trust "
                                    "this side's certificate)") from None
        except BaseException:
            await self.close()
            raise
        self.broker_id = reply.broker_id
        self.max_frame_bytes = reply.max_frame_bytes
        if self.credentials is not None:
            await self._authenticate(self.credentials)
        return reply

    async def _authenticate(self, credentials: m.Credentials) -> None:
        """AUTHENTICATE; the broker's refusal (UNAUTHENTICATED) closes the connection."""
        try:
            answer = await self.request(m.AuthenticateRequest(
                credentials.user, credentials.password, credentials.mechanism),
                timeout_s=self.connect_timeout_s)
        except BaseException:
            await self.close()
            raise
        self.principal = m.expect_response(answer, m.AuthenticateResponse).principal

    async def close(self) -> None:
        """Close the connection: requests in flight fail with BrokerUnavailable. Idempotent."""
        self._fail(BrokerUnavailable(self.address, "connection closed by the client"))
        await cancel_and_wait(self._read_task)
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(Exception):
                await self._writer.wait_closed()

    # -- requests -----------------------------------------------------------------------------

    async def request(self, request: m.Request, *, timeout_s: float | None = None) -> m.Response:
        """Send `request` and return its typed response. Raises the JetstreamError the broker
        answers with, BrokerUnavailable when the connection fails or no answer comes within
        `timeout_s` (default: the connection's request timeout)."""
        frame = await self._call(request, timeout_s)
        return m.decode_response(frame)

    async def fetch(self, request: m.FetchRequest, *,
                    timeout_s: float | None = None) -> tuple[m.FetchResponse, bytes]:
        """Send a Fetch and return its response and the record batches it carries (decode
        them with jetstream.stream.format.decode_batches). The timeout is counted on top of
        the request's long-poll wait. Raises as `request` does."""
        base = self.request_timeout_s if timeout_s is None else timeout_s
        frame = await self._call(request, base + request.max_wait_ms / 1000)
        return m.expect_response(m.decode_response(frame), m.FetchResponse), frame.payload

    async def with_payload(self, request: m.Request, response_type: type[_R], *,
                           timeout_s: float | None = None) -> tuple[_R, bytes]:
        """Send `request`, whose answer carries a payload (REPLICA_RANGE, REPLICA_FETCH):
        the response and the payload. Raises as `request` does."""
        frame = await self._call(request, timeout_s)
        return m.expect_response(m.decode_response(frame), response_type), frame.payload

    async def send_payload(self, request: m.Request, payload: bytes | memoryview,
                           response_type: type[_R],
                           *, timeout_s: float | None = None) -> _R:
        """Send `request` with `payload` (MIRROR_APPEND's batches) and return its response.
        Raises as `request` does."""
        frame = await self._call(request, timeout_s, payload)
        return m.expect_response(m.decode_response(frame), response_type)

    async def _call(self, request: m.Request, timeout_s: float | None,
                    payload: bytes | memoryview = b"") -> frames.Frame:
        timeout = self.request_timeout_s if timeout_s is None else timeout_s
        async with self._slots:
            return await self._exchange(next(self._ids), frames.Kind.REQUEST, request.op,
                                        request.to_header(), timeout, payload)

    async def _exchange(self, correlation_id: int, kind: frames.Kind, op: frames.Op,
                        header: dict[str, Any], timeout_s: float,
                        payload: bytes | memoryview = b"") -> frames.Frame:
        if self._failure is not None:
            raise self._failure
        assert self._writer is not None, "open() the connection first"
        data = frames.encode_frame(correlation_id, kind, op, header, len(payload))
        future: asyncio.Future[frames.Frame] = asyncio.get_running_loop().create_future()
        self._pending[correlation_id] = future
        try:
            try:
                self._writer.write(data)
                if payload:
                    self._writer.write(payload)
                await self._writer.drain()
            except OSError as exc:  # a broken transport
                self._fail(BrokerUnavailable(self.address, f"write failed: {exc}"))
            return await asyncio.wait_for(future, timeout_s)  # _fail has failed it, if so
        except TimeoutError:
            raise BrokerUnavailable(self.address, f"no answer to {op.name} within "
                                                  f"{timeout_s:g} s") from None
        finally:
            if self._pending.get(correlation_id) is future:
                del self._pending[correlation_id]

    # -- reading ------------------------------------------------------------------------------

    async def _read_loop(self) -> None:
        assert self._reader is not None
        reason = "connection closed by the broker"
        try:
            while True:
                data = await self._reader.read(READ_CHUNK_BYTES)
                if not data:
                    break
                self._decoder.feed(data)
                while (frame := self._decoder.next_frame()) is not None:
                    self._dispatch(frame)
        except FrameError as exc:
            reason = f"undecodable answer: {exc}"
        except OSError as exc:
            reason = f"read failed: {exc}"
        finally:
            self._fail(BrokerUnavailable(self.address, reason))
            if self._writer is not None:
                self._writer.close()

    def _dispatch(self, frame: frames.Frame) -> None:
        future = self._pending.pop(frame.correlation_id, None)
        if future is not None:
            if not future.done():
                future.set_result(frame)
        elif frame.kind == frames.Kind.ERROR and frame.correlation_id == 0:
            # A connection-level error (a frame the broker could not parse): it closes next.
            error = _error_text(frame.header)
            self._fail(BrokerUnavailable(self.address, f"the broker closed the connection: "
                                                       f"{error}"))

    def _fail(self, failure: BrokerUnavailable) -> None:
        if self._failure is None:
            self._failure = failure
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(self._failure)


def _error_text(header: dict[str, Any]) -> str:
    try:
        exc: JetstreamError = m.error_from_header(header)
    except JetstreamError as bad:
        return f"unreadable error frame ({bad})"
    return f"[{exc.code}] {exc}"
