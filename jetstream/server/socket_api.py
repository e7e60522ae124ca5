"""The broker's socket API: one TCP port, framed requests pipelined by correlation id.

Theory of operation: each connection has one reader task and one writer task. The reader
decodes frames (jetstream.protocol.frames) and runs each request as its own task, at most
`connection_requests_max` at once per connection, so a long-polling Fetch does not hold up
the requests behind it; answers may come back out of order and carry their request's
correlation id. A request with an immediate handler (a GET the key index covers) is
answered by the reader itself, with no task, while fewer than `connection_requests_max`
answers wait for the writer; one that must wait goes to a task like any other. With the C
part of jetstream.server.bulk_gets built, the GET frames at the front of the buffer are
taken together and answered in one answer, and those it leaves go the way above. The writer
sends answers in the order they are ready; a Fetch answer is its prefix and header followed
by record batches sent straight from the segment file with `loop.sendfile` (zero copy on the
default event loop); slices of at most 16 KiB are copied into one write instead (a fetch
session answers many partitions with a few batches each).

With `tls_cert` set the port speaks TLS only (a plain-text client fails the handshake); a
handshake not finished within `tls_handshake_timeout_ms`, refused credentials
(AUTHENTICATE answered UNAUTHENTICATED), a HELLO not received within
HELLO_TIMEOUT_S, and a request frame begun but not finished within `request_timeout_ms`
(a stalled or deliberately slow sender) close the connection. Past `connections_max` open
connections a new one is answered `TOO_MANY_CONNECTIONS` and closed.

The first frame must be HELLO with a version this broker speaks. A malformed frame gets an
error frame and the connection is closed (the byte stream cannot be resynchronised); a bad
request inside a well-formed frame gets an error frame and the connection carries on. No
input can raise out of a connection handler: every failure is answered or logged.

The socket API knows nothing of the broker: it is given its settings, its counters and a
RequestHandler (jetstream.server.api: the broker's dispatch table) that answers each request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from dataclasses import dataclass, field

from jetstream.errors import JetstreamError, ProtocolError, TooManyConnections, Unauthenticated
from jetstream.protocol import frames
from jetstream.protocol import messages as m
from jetstream.security.auth import certificate_principal
from jetstream.security.tls import server_ssl
from jetstream.server.api import RequestHandler, Result
from jetstream.server.bulk_gets import BulkGets, GetCall, MayNow, as_frame
from jetstream.server.config import BrokerConfig
from jetstream.server.gatekeeper import ANONYMOUS, Gatekeeper
from jetstream.server.metrics import BrokerMetrics
from jetstream.stream.file_slice import FileSlice
from jetstream.tasks import cancel_and_wait

log = logging.getLogger(__name__)

READ_CHUNK_BYTES = 256 * 1024
#: Slices of at most this many bytes are copied, with their small neighbours, into one
#: write instead of each taking a sendfile (an event-loop round and two epoll changes a
#: call): a fetch session's answer carries a small slice for each of many partitions.
COPY_PIECE_BYTES_MAX = 16 * 1024
HELLO_TIMEOUT_S = 10.0
#: What a TLS answer reads from a segment file and encrypts at once.
TLS_CHUNK_BYTES = 256 * 1024
#: An answer this small is read on the event loop (no thread hop).
TLS_INLINE_BYTES = 64 * 1024


@dataclass(slots=True)
class Answer:
    data: bytes
    pieces: list[FileSlice] = field(default_factory=list)
    close_after: bool = False

    def close(self) -> None:
        for piece in self.pieces:
            piece.close()


class _Nothing:
    """Nothing taken from the answer queue (None there means: stop)."""


_NOTHING = _Nothing()
#: Most answers joined into one write.
WRITE_ANSWERS_MAX = 256


class SocketApi:
    def __init__(self, config: BrokerConfig, metrics: BrokerMetrics,
                 handler: RequestHandler, gate: Gatekeeper | None = None,
                 bulk_gets: BulkGets | None = None) -> None:
        self._config = config
        self._metrics = metrics
        self._handler = handler
        self._gate = gate
        self._bulk_gets = bulk_gets
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self.port = 0

    async def start(self) -> None:
        context = server_ssl(self._config.socket_tls)
        handshake_s = self._config.tls_handshake_timeout_ms / 1000 if context else None
        self._server = await asyncio.start_server(
            self._on_connection, self._config.host, self._config.port,
            limit=READ_CHUNK_BYTES, reuse_address=True, ssl=context,
            ssl_handshake_timeout=handshake_s)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        await cancel_and_wait(*self._connections)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    async def _on_connection(self, reader: asyncio.StreamReader,
                             writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        metrics = self._metrics
        if len(self._connections) >= self._config.connections_max:
            metrics.connections_refused_total += 1
            writer.write(m.encode_error(0, frames.Op.HELLO, TooManyConnections(
                f"too many connections (limit {self._config.connections_max})",
                connections_max=self._config.connections_max)))
            with contextlib.suppress(Exception):
                await writer.drain()
            writer.close()
            return
        self._connections.add(task)
        metrics.connections_total += 1
        metrics.connections_open += 1
        try:
            await Connection(self._config, self._metrics, self._handler, reader, writer,
                             self._gate, self._bulk_gets).run()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            # `stop()` cancels open connections. End this task normally: Python 3.11's
            # start_server callback calls task.exception() on it, which would raise and log.
            pass
        except Exception:
            log.exception("connection handler failed")
        finally:
            metrics.connections_open -= 1
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await writer.wait_closed()


class Connection:
    def __init__(self, config: BrokerConfig, metrics: BrokerMetrics, handler: RequestHandler,
                 reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 gate: Gatekeeper | None = None, bulk_gets: BulkGets | None = None) -> None:
        self._gate = gate
        #: Who this connection acts for: None until it authenticates when authentication
        #: is on (jetstream.server.gatekeeper).
        self._principal: str | None = None if gate and gate.authentication else ANONYMOUS
        self._config = config
        self._metrics = metrics
        self._handler = handler
        self._reader = reader
        self._writer = writer
        self._decoder = frames.FrameDecoder(frame_bytes_max=self._config.request_bytes_max)
        self._answers: asyncio.Queue[Answer | None] = asyncio.Queue()
        self._slots = asyncio.Semaphore(self._config.connection_requests_max)
        self._requests: set[asyncio.Task[None]] = set()
        #: Whether the writer is sending an answer (not waiting for the next).
        self._writing = True
        #: The ops the reader answers itself when their handler needs no wait.
        self._immediate_ops = frozenset(kind.op for kind in handler.immediate_kinds)
        #: GETs answered in bulk (jetstream.server.bulk_gets) when GET is answered at once.
        self._bulk = bulk_gets if frames.Op.GET in self._immediate_ops else None
        self._may_now: MayNow | None = None
        if gate is not None and (gate.authentication or gate.authorization):
            self._may_now = lambda request: gate.may_now(self._principal, request)

    async def run(self) -> None:
        writer_task = asyncio.create_task(self._write_loop())
        try:
            if await asyncio.wait_for(self._hello(), HELLO_TIMEOUT_S):
                await self._read_loop()
        except TimeoutError:
            pass
        finally:
            for task in list(self._requests):
                task.cancel()
            await self._answers.put(None)
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await writer_task
            while not self._answers.empty():  # answers the writer never sent
                answer = self._answers.get_nowait()
                if answer is not None:
                    answer.close()

    async def _next_frame(self, bulk: BulkGets | None = None
                          ) -> frames.Frame | list[GetCall] | None:
        """The next whole frame, or with `bulk` the GETs at the front of the buffer when
        there is room for their answer; None at the end of the stream, or when a begun
        frame's next bytes do not come within `request_timeout_ms` (the connection is
        closed)."""
        decoder = self._decoder
        while True:
            # A look at the front frame's op first: other requests (fetches, a follower's
            # replica fetches) pay one check, not a call into the bulk path.
            if bulk is not None and decoder.front_is(frames.Kind.REQUEST, frames.Op.GET) and \
                    self._answers.qsize() < self._config.connection_requests_max:
                calls = bulk.take(decoder)
                if calls:
                    return calls
            frame = decoder.next_frame()
            if frame is not None:
                return frame
            if decoder.buffered_bytes:
                try:
                    data = await asyncio.wait_for(self._reader.read(READ_CHUNK_BYTES),
                                                  self._config.request_timeout_ms / 1000)
                except TimeoutError:
                    self._metrics.stalled_requests_total += 1
                    log.warning("closing a connection whose request frame stalled for %d ms",
                                self._config.request_timeout_ms)
                    return None
            else:
                data = await self._reader.read(READ_CHUNK_BYTES)
            if not data:
                return None
            decoder.feed(data)

    async def _hello(self) -> bool:
        frame: frames.Frame | None = None
        try:
            taken = await self._next_frame()
            if taken is None:
                return False
            assert not isinstance(taken, list)  # taken without `bulk`
            frame = taken
            if frame.kind != frames.Kind.REQUEST or frame.op != frames.Op.HELLO:
                raise ProtocolError("the first frame must be a HELLO request", field="op")
            frames.parse_hello_request(frame.header)
        except JetstreamError as exc:
            cid = frame.correlation_id if frame is not None else 0
            await self._answers.put(Answer(m.encode_error(cid, frames.Op.HELLO, exc),
                                           close_after=True))
            return False
        if self._principal is None:  # a client certificate the TLS handshake verified
            self._principal = certificate_principal(self._writer.get_extra_info("peercert"))
        reply = frames.hello_response(self._config.broker_id, self._config.request_bytes_max)
        await self._answers.put(Answer(frames.encode_frame(
            frame.correlation_id, frames.Kind.RESPONSE, frames.Op.HELLO, reply)))
        return True

    async def _read_loop(self) -> None:
        while True:
            try:
                taken = await self._next_frame(self._bulk)
            except JetstreamError as exc:  # FrameError: the stream is lost; say why, close
                await self._answers.put(Answer(m.encode_error(0, 0, exc), close_after=True))
                return
            if taken is None:
                return
            if isinstance(taken, list):
                await self._serve_gets(taken)
            else:
                await self._dispatch(taken)

    def _send_now(self, data: bytes) -> bool:
        """Write `data` (whole frames) at once, skipping the writer's queue: when the writer
        waits for an answer, none is queued, and the transport holds nothing unsent (so
        what a client does not read piles up in the queue, bounded, never here). False when
        it must be queued."""
        if self._writing or not self._answers.empty() or \
                self._writer.transport.get_write_buffer_size():
            return False
        self._writer.write(data)
        return True

    async def _dispatch(self, frame: frames.Frame) -> None:
        """Answer `frame` at once when its immediate handler can, else in a task."""
        request: m.Request | None = None
        if frame.op in self._immediate_ops and \
                self._answers.qsize() < self._config.connection_requests_max:
            request = self._serve_now(frame)
            if request is None:  # answered
                return
        await self._slots.acquire()
        task = asyncio.create_task(self._serve(frame, request))
        self._requests.add(task)
        task.add_done_callback(self._requests.discard)

    async def _serve_gets(self, calls: list[GetCall]) -> None:
        """Answer GETs taken in bulk: those the bulk path answers in one answer, the rest
        as frames of their own."""
        assert self._bulk is not None
        data, rest = self._bulk.answer(calls, self._may_now)
        self._metrics.requests_total += len(calls) - len(rest)
        if data and not self._send_now(data):
            self._answers.put_nowait(Answer(data))
        for call in rest:
            await self._dispatch(as_frame(call))

    def _serve_now(self, frame: frames.Frame) -> m.Request | None:
        """Answer `frame` here when its immediate handler needs no wait: None once its
        answer is queued; the decoded request when it must wait (for `_serve`)."""
        try:
            request = m.decode_request(frame)
            result = self._answer_now(request)
            if result is None:
                return request
            answer = self._encode(frame, result)
        except Exception as exc:
            answer = self._refusal(frame, exc)
        self._metrics.requests_total += 1
        self._answers.put_nowait(answer)
        return None

    async def _serve(self, frame: frames.Frame, request: m.Request | None = None) -> None:
        """Answer `frame` (`request`: already decoded from it)."""
        self._metrics.requests_total += 1
        try:
            if request is None:
                request = m.decode_request(frame)
            # Encoding is inside the try: an answer too large for a frame header (Metadata of
            # hundreds of streams) must become an error frame, not a request left unanswered.
            answer = self._encode(frame, await self._answer(request))
        except Exception as exc:
            answer = self._refusal(frame, exc)
        finally:
            self._slots.release()
        await self._answers.put(answer)

    def _refusal(self, frame: frames.Frame, exc: Exception) -> Answer:
        """The error frame answering `frame` for `exc` (counted; unexpected ones logged)."""
        self._metrics.request_errors_total += 1
        if isinstance(exc, JetstreamError):
            # Refused credentials close the connection (each guess costs a new one).
            return Answer(m.encode_error(frame.correlation_id, frame.op, exc),
                          close_after=frame.op == frames.Op.AUTHENTICATE
                          and isinstance(exc, Unauthenticated))
        log.error("request %s failed", frame.op, exc_info=exc)
        return Answer(m.encode_error(frame.correlation_id, frame.op,
                                     JetstreamError(f"internal error: {exc}")))

    async def _answer(self, request: m.Request) -> Result:
        """The handler's answer, once the gatekeeper let the request through."""
        gate = self._gate
        if gate is None:
            return await self._handler.handle(request)
        if isinstance(request, m.AuthenticateRequest):
            self._principal = await gate.authenticate(request.credentials,
                                                      _peer(self._writer))
            return m.AuthenticateResponse(self._principal)
        principal = self._admitted(gate, request)
        with gate.admit(principal):
            result = await self._handler.handle(request)
        return result if isinstance(result, tuple) else gate.filter(principal, result)

    def _answer_now(self, request: m.Request) -> Result | None:
        """The immediate handler's answer (None: it must wait), once the gatekeeper let the
        request through."""
        gate = self._gate
        if gate is None:
            return self._handler.handle_now(request)
        principal = self._admitted(gate, request)
        with gate.admit(principal):
            result = self._handler.handle_now(request)
        if result is None or isinstance(result, tuple):
            return result
        return gate.filter(principal, result)

    def _admitted(self, gate: Gatekeeper, request: m.Request) -> str:
        """Who `request` acts for, once the gatekeeper found it may be sent."""
        principal = self._principal
        if principal is None:
            raise Unauthenticated("authenticate first (AUTHENTICATE, or a client "
                                  "certificate the broker trusts)")
        gate.check(principal, request)
        return principal

    @staticmethod
    def _encode(frame: frames.Frame, result: Result) -> Answer:
        if isinstance(result, tuple):  # a response and the slices its payload is sent from
            response, sent = result
            pieces = sent if isinstance(sent, list) else [sent]
            try:
                data = m.encode_response(frame.correlation_id, frames.parse_op(frame.op), response,
                                         sum(piece.length for piece in pieces))
            except BaseException:
                for piece in pieces:
                    piece.close()
                raise
            for piece in pieces:
                if not piece.length:
                    piece.close()
            return Answer(data, [piece for piece in pieces if piece.length])
        return Answer(m.encode_response(frame.correlation_id, frames.parse_op(frame.op),
                                       result))

    @staticmethod
    async def _send_pieces(loop: asyncio.AbstractEventLoop, writer: asyncio.StreamWriter,
                           head: bytes, pieces: list[FileSlice]) -> bool:
        """Send `head` (the frame's prefix), then the slices in order: each larger one with
        sendfile, runs of small ones copied into one write with what precedes them; False
        when one came out short (its file shrank)."""
        copied: list[bytes] = [head]
        for piece in pieces:
            if piece.length <= COPY_PIECE_BYTES_MAX or piece.data is not None:
                data = piece.read()  # from the page cache: what was just appended or read
                if len(data) != piece.length:
                    return False
                copied.append(data)
                continue
            if copied:
                writer.writelines(copied)
                copied = []
                await writer.drain()
            # Wraps an open descriptor for sendfile: no file is opened, nothing blocks.
            with open(piece.fd, "rb", buffering=0, closefd=False) as f:  # noqa: ASYNC230
                sent = await loop.sendfile(writer.transport, f, piece.position, piece.length)
            if sent != piece.length:
                return False
        if copied:
            writer.writelines(copied)
            await writer.drain()
        return True

    async def _write_loop(self) -> None:
        loop = asyncio.get_running_loop()
        writer = self._writer
        tls = writer.get_extra_info("sslcontext") is not None
        answers = self._answers
        taken: Answer | _Nothing | None = _NOTHING  # taken from the queue, not yet sent
        answer: Answer | _Nothing | None
        try:
            while True:
                if taken is _NOTHING:
                    self._writing = False
                    answer = await answers.get()
                    self._writing = True
                else:
                    answer = taken
                taken = _NOTHING
                if answer is None:
                    return
                assert isinstance(answer, Answer)
                try:
                    if answer.pieces:
                        if tls:
                            sent = await _send_tls(loop, writer, answer.data, answer.pieces)
                        else:
                            sent = await self._send_pieces(loop, writer, answer.data,
                                                           answer.pieces)
                        if not sent:
                            # A segment shrank under us (truncation): the frame is broken.
                            writer.close()
                            return
                    elif answer.close_after or answers.empty():
                        writer.write(answer.data)
                    else:  # answers waiting (pipelined requests): one write, one send, for all
                        chunks = [answer.data]
                        while not answers.empty() and len(chunks) < WRITE_ANSWERS_MAX:
                            taken = answers.get_nowait()
                            if taken is None or taken.pieces or taken.close_after:
                                break
                            chunks.append(taken.data)  # nothing to close: no pieces
                            taken = _NOTHING
                        writer.write(b"".join(chunks))
                    if not answer.pieces and answers.empty():
                        await writer.drain()
                except (ConnectionError, OSError):
                    return
                finally:
                    answer.close()
                if answer.close_after:
                    with contextlib.suppress(Exception):
                        await writer.drain()
                    writer.close()
                    return
        finally:
            if isinstance(taken, Answer):  # taken from the queue, never to be sent
                taken.close()


def _peer(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
    return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else "socket API"


async def _send_tls(loop: asyncio.AbstractEventLoop, writer: asyncio.StreamWriter,
                    head: bytes, pieces: list[FileSlice]) -> bool:
    """An answer and the slices it carries, over TLS, which has no zero-copy path: each
    slice is read with `pread` (never moving a descriptor's shared position, which
    concurrent answers from one segment rely on). A small answer (a follower's fetch of the
    newest records, in the page cache) is read on the loop and written as one piece, one TLS
    record where it fits; a larger one is read in a thread TLS_CHUNK_BYTES at a time and
    written as it comes, waiting for room. False when a slice came out short."""
    if sum(piece.length for piece in pieces) <= TLS_INLINE_BYTES:
        parts = [head]
        for piece in pieces:
            data = piece.read()
            if len(data) != piece.length:
                return False
            parts.append(data)
        writer.write(b"".join(parts))
        await writer.drain()
        return True
    writer.write(head)
    for piece in pieces:
        if piece.data is not None:
            if len(piece.data) != piece.length:
                return False
            writer.write(piece.data)
            await writer.drain()
            continue
        position, end = piece.position, piece.position + piece.length
        while position < end:
            data = await loop.run_in_executor(None, os.pread, piece.fd,
                                              min(TLS_CHUNK_BYTES, end - position), position)
            if not data:
                return False
            writer.write(data)
            await writer.drain()
            position += len(data)
    return True
