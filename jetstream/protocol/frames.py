"""Framing of the broker socket API, declared once.

Theory of operation: clients and followers keep one TCP connection to a broker and pipeline
requests on it. Each request carries a correlation id that its response (or error) echoes, so
a requester can have many requests in flight and match answers as they come. A frame is a
fixed prefix, a small msgpack header (the typed fields of a request or response, see
`messages.py`) and an optional raw payload: the record batches of a Fetch response, which the
broker sends straight from the segment file with sendfile after writing the prefix and the
header. That is why `encode_frame` produces only the prefix and the header and takes the
payload's length: the declared length covers the payload the caller sends itself.

`FrameDecoder` is a buffer without IO (h11's style): feed it bytes as they arrive, take whole
frames out. It checks each length as soon as the bytes that declare it are in, before it keeps
anything of the frame, so a peer can never make it wait for or hold more than
`frame_bytes_max` bytes of one frame. Any fault raises `FrameError`; the byte stream cannot be
resynchronised after one, so the decoder stays failed and the connection must be closed. An
unknown op is not a framing fault: the frame decodes, and the server answers it with a
BAD_REQUEST error frame (`parse_op`) and carries on. That leaves room for new ops.

    Frame (big-endian):
      length          u32  bytes after this field: 10 + header_length + payload length
      correlation_id  u32  chosen by the requester, echoed by the response
      kind            u8   1 request, 2 response, 3 error
      op              u8   Op (the response echoes the request's op)
      header_length   u32  bytes of header
      header          msgpack map with str keys; an error frame's is the error's to_dict()
      payload         the rest of the frame, raw bytes (may be empty)

    HELLO opens every connection:
      request   {"version": 1, "client_id": str}
      response  {"version": 1, "broker_id": int, "max_frame_bytes": int}
      A broker that speaks another version answers with an UNSUPPORTED_VERSION error frame.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import msgpack

from jetstream.errors import FrameError, ProtocolError, UnsupportedVersion

PROTOCOL_VERSION = 1

_T = TypeVar("_T")

LENGTH = struct.Struct(">I")
assert LENGTH.size == 4
# length | correlation_id | kind | op | header_length
PREFIX = struct.Struct(">IIBBI")
assert PREFIX.size == 14
#: Bytes every frame has after its length field: correlation_id .. header_length.
FIXED_BYTES = PREFIX.size - LENGTH.size
assert FIXED_BYTES == 10

U8_MAX = 0xFF
U32_MAX = 0xFFFF_FFFF
I32_MAX = 0x7FFF_FFFF

KiB = 1024
MiB = 1024 * KiB

#: Largest frame (value of its length field) a client accepts: a Fetch response carries up to
#: 64 MiB of records (its max_bytes) plus its header.
RESPONSE_FRAME_BYTES_MAX = 64 * MiB + 64 * KiB
#: Largest frame a broker accepts: requests carry no bulk data.
REQUEST_FRAME_BYTES_MAX = 1 * MiB
#: Largest msgpack header of a request, and of a response: responses describe every stream
#: (METADATA, LIST_STREAMS; ~250 bytes a stream, up to 10,000 streams).
HEADER_BYTES_MAX = 64 * KiB
RESPONSE_HEADER_BYTES_MAX = 8 * MiB
#: Longest client_id in HELLO.
CLIENT_ID_CHARS_MAX = 256
# The decoder drops consumed bytes from its buffer once this many have piled up (and they are
# at least half the buffer), so compaction costs O(1) amortised per byte.
_COMPACT_BYTES = 64 * KiB


class Kind(enum.IntEnum):
    REQUEST = 1
    RESPONSE = 2
    ERROR = 3


class Op(enum.IntEnum):
    """Operations of the socket API. Numbers are never reused; new ops take new numbers."""

    HELLO = 1
    FETCH = 2
    METADATA = 3
    CREATE_STREAM = 4
    DELETE_STREAM = 5
    LIST_STREAMS = 6
    OFFSET_FOR_TIMESTAMP = 7
    END_OFFSET_FOR_EPOCH = 8
    COMMIT_OFFSET = 9
    FETCH_OFFSET = 10
    REPORT_LEADER_FAILURE = 11
    UPDATE_STREAM = 12
    GET = 13
    KEYS = 14
    FIND_COORDINATOR = 15
    GROUP_HEARTBEAT = 16
    LIST_GROUPS = 17
    DESCRIBE_GROUP = 18
    RESET_OFFSETS = 19
    DELETE_GROUP = 20
    LIST_SEGMENTS = 21
    REPLICA_RANGE = 22
    SCRUB = 23
    REPLICA_FETCH = 24
    FRAGMENTS = 25
    REGISTERS = 26
    # Authentication and ACLs (protocol/auth.py): numbered from 40.
    AUTHENTICATE = 40
    ACL_LIST = 41
    ACL_ADD = 42
    ACL_REMOVE = 43
    # Datastreams (protocol/datastreams.py): numbered from 50.
    DATASTREAMS = 50
    # Mirror copies of record batches (protocol/mirror.py): numbered from 60.
    MIRROR_APPEND = 60


_KINDS = frozenset(int(k) for k in Kind)
#: Kind by number: a dict lookup, where `Kind(n)` costs an enum call on every frame.
_KIND_OF = {int(k): k for k in Kind}
_OPS = {int(op): op for op in Op}


def parse_op(op: int) -> Op:
    """The Op numbered `op`. An unknown one raises ProtocolError: answer it with an error frame
    (BAD_REQUEST) and keep the connection."""
    try:
        return _OPS[op]
    except KeyError:
        raise ProtocolError(f"unknown op {op}", field="op") from None


@dataclass(frozen=True, slots=True)
class Frame:
    correlation_id: int
    kind: Kind
    #: An int rather than an Op: unknown ops decode, and `parse_op` rejects them.
    op: int
    header: dict[str, Any]
    payload: bytes = b""


# -- encoding ----------------------------------------------------------------------------------


def encode_frame(
    correlation_id: int,
    kind: Kind | int,
    op: Op | int,
    header: Mapping[str, Any],
    payload_length: int = 0,
    *,
    header_bytes_max: int = HEADER_BYTES_MAX,
) -> bytes:
    """The prefix and header of a frame whose payload, `payload_length` bytes, the caller sends
    right after (with sendfile, say). Raises FrameError when a value does not fit the format
    or the header is larger than `header_bytes_max` (the peer would refuse it)."""
    _check_uint("correlation_id", correlation_id, U32_MAX)
    _check_uint("op", op, U8_MAX)
    _check_uint("payload_length", payload_length, U32_MAX)
    _check_uint("kind", kind, U8_MAX)
    if kind not in _KINDS:
        raise FrameError(f"kind must be one of {sorted(_KINDS)}, got {kind!r}", field="kind")
    if not all(isinstance(k, str) for k in header):
        raise FrameError("header keys must be strings", field="header")
    try:
        header_bytes: bytes = msgpack.packb(dict(header), use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as e:
        raise FrameError(f"header cannot be encoded: {e}", field="header") from None
    if len(header_bytes) > header_bytes_max:
        raise FrameError(f"header of {len(header_bytes)} bytes exceeds {header_bytes_max}",
                         field="header_length")
    length = FIXED_BYTES + len(header_bytes) + payload_length
    if length > U32_MAX:
        raise FrameError(f"frame of {length} bytes does not fit a u32 length", field="length")
    return PREFIX.pack(length, correlation_id, kind, op, len(header_bytes)) + header_bytes


def encode_frame_with_payload(
    correlation_id: int,
    kind: Kind | int,
    op: Op | int,
    header: Mapping[str, Any],
    payload: bytes | bytearray | memoryview = b"",
    *,
    header_bytes_max: int = HEADER_BYTES_MAX,
) -> bytes:
    """A whole frame, payload included."""
    head = encode_frame(correlation_id, kind, op, header, len(payload),
                        header_bytes_max=header_bytes_max)
    return head + bytes(payload) if payload else head


def _check_uint(name: str, value: object, high: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= high:
        raise FrameError(f"{name} must be an integer in [0, {high}], got {value!r}", field=name)


# -- decoding ----------------------------------------------------------------------------------


def _reject_ext(code: int, data: bytes) -> Any:
    raise ValueError(f"msgpack extension type {code} is not allowed")


def decode_header(data: bytes | bytearray | memoryview) -> dict[str, Any]:
    """Decode a msgpack header: one map with str keys, nothing after it, strings valid UTF-8,
    no extension types. Raises FrameError otherwise."""
    try:
        # unpackb bounds every str and bin by len(data), so a small header cannot claim a huge
        # string; arrays and maps get the same bound here (each item takes at least a byte).
        # max_ext_len=0 and the hook refuse every extension type (timestamps included).
        value = msgpack.unpackb(data, raw=False, strict_map_key=True, max_ext_len=0,
                                max_array_len=len(data), max_map_len=len(data),
                                ext_hook=_reject_ext)
    except Exception as e:  # msgpack raises many types (ValueError, StackError, ...)
        raise FrameError(f"header is not valid msgpack: {e}", field="header") from None
    if not isinstance(value, dict):
        raise FrameError(f"header must be a map, got {type(value).__name__}", field="header")
    if not all(isinstance(k, str) for k in value):
        raise FrameError("header keys must be strings", field="header")
    return value


class FrameDecoder:
    """Incremental frame decoder: `feed(data)` then `next_frame()` (or iterate) until None.

    `frame_bytes_max` bounds the length field (clients keep the default; brokers pass
    REQUEST_FRAME_BYTES_MAX), `header_bytes_max` the header (clients pass
    RESPONSE_HEADER_BYTES_MAX). After a FrameError every call raises it again."""

    def __init__(self, frame_bytes_max: int = RESPONSE_FRAME_BYTES_MAX,
                 header_bytes_max: int = HEADER_BYTES_MAX) -> None:
        if not FIXED_BYTES <= frame_bytes_max <= U32_MAX:
            raise ValueError(f"frame_bytes_max must be in [{FIXED_BYTES}, {U32_MAX}]")
        if not 1 <= header_bytes_max <= frame_bytes_max - FIXED_BYTES:
            raise ValueError("header_bytes_max must be in [1, frame_bytes_max - 10]")
        self.frame_bytes_max = frame_bytes_max
        self.header_bytes_max = header_bytes_max
        self._buf = bytearray()
        self._pos = 0  # start of the first frame not yet returned
        # (length, correlation_id, kind, op, header_length) of that frame, once checked.
        self._prefix: tuple[int, int, int, int, int] | None = None
        self._error: FrameError | None = None

    @property
    def buffered_bytes(self) -> int:
        """Bytes received and not yet returned in a frame."""
        return len(self._buf) - self._pos

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Add received bytes. Raises FrameError at once when the next frame's prefix is bad."""
        if self._error is not None:
            raise self._error
        self._buf += data
        self._guarded(self._check_prefix)

    def next_frame(self) -> Frame | None:
        """The next whole frame, or None until more bytes arrive."""
        if self._error is not None:
            raise self._error
        return self._guarded(self._take_frame)

    def front_is(self, kind: int, op: int) -> bool:
        """Whether the first frame not yet returned has its prefix in and is of `kind` and
        `op` (whole or not): a cheap look before handing the buffer to `take_with`."""
        buf, pos = self._buf, self._pos
        return len(buf) - pos >= PREFIX.size and buf[pos + 8] == kind and buf[pos + 9] == op

    def take_with(self, take: Callable[[bytearray, int], int]) -> None:
        """Let `take` consume whole frames from the front of the buffer: it is given the
        buffer and the position of the first frame not yet returned, and returns the
        position after the frames it consumed (a parser in C of one kind of frame, checking
        each as `next_frame` would, and leaving it any frame it does not take)."""
        if self._error is not None:
            raise self._error
        pos = take(self._buf, self._pos)
        if pos != self._pos:
            if not self._pos < pos <= len(self._buf):
                raise ValueError(f"take_with: position {pos} is outside the buffer")
            self._pos = pos
            self._prefix = None  # the checked prefix was of a frame now consumed
            self._compact()

    def __iter__(self) -> Iterator[Frame]:
        while (frame := self.next_frame()) is not None:
            yield frame

    def _guarded(self, step: Callable[[], _T]) -> _T:
        try:
            return step()
        except FrameError as e:
            self._error = e
            raise

    def _check_prefix(self) -> tuple[int, int, int, int, int] | None:
        if self._prefix is not None:
            return self._prefix
        buf, pos = self._buf, self._pos
        available = len(buf) - pos
        if available < LENGTH.size:
            return None
        (length,) = LENGTH.unpack_from(buf, pos)
        if not FIXED_BYTES <= length <= self.frame_bytes_max:
            raise FrameError(f"frame length {length} is outside [{FIXED_BYTES}, "
                             f"{self.frame_bytes_max}]", field="length")
        if available < PREFIX.size:
            return None
        prefix: tuple[int, int, int, int, int] = PREFIX.unpack_from(buf, pos)
        _, _, kind, _, header_length = prefix
        if kind not in _KINDS:
            raise FrameError(f"unknown frame kind {kind}", field="kind")
        if header_length > min(self.header_bytes_max, length - FIXED_BYTES):
            raise FrameError(f"header length {header_length} exceeds the frame or the limit "
                             f"{self.header_bytes_max}", field="header_length")
        self._prefix = prefix
        return prefix

    def _take_frame(self) -> Frame | None:
        prefix = self._check_prefix()
        if prefix is None:
            return None
        length, correlation_id, kind, op, header_length = prefix
        start = self._pos
        end = start + LENGTH.size + length
        if len(self._buf) < end:
            return None
        header_start = start + PREFIX.size
        payload_start = header_start + header_length
        header = decode_header(_copy(self._buf, header_start, payload_start))
        payload = _copy(self._buf, payload_start, end) if payload_start < end else b""
        self._pos = end
        self._prefix = None
        self._compact()
        return Frame(correlation_id, _KIND_OF[kind], op, header, payload)

    def _compact(self) -> None:
        if self._pos == len(self._buf):
            self._buf.clear()
            self._pos = 0
        elif self._pos >= _COMPACT_BYTES and self._pos * 2 >= len(self._buf):
            del self._buf[:self._pos]
            self._pos = 0


#: Spans up to this size are copied by slicing (two copies, but no view to set up and
#: release: cheaper for a request's header); larger ones through a view (one copy).
_SLICE_COPY_BYTES_MAX = 64 * KiB


def _copy(buf: bytearray, start: int, end: int) -> bytes:
    if end - start <= _SLICE_COPY_BYTES_MAX:
        return bytes(buf[start:end])
    # One copy, and the views are released at once so the bytearray can grow again.
    with memoryview(buf) as view, view[start:end] as part:
        return part.tobytes()


# -- HELLO -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Hello:
    client_id: str
    version: int = PROTOCOL_VERSION


@dataclass(frozen=True, slots=True)
class HelloReply:
    broker_id: int
    max_frame_bytes: int
    version: int = PROTOCOL_VERSION


def hello_request(client_id: str) -> dict[str, Any]:
    """The header of the HELLO request."""
    _check_client_id(client_id)
    return {"version": PROTOCOL_VERSION, "client_id": client_id}


def parse_hello_request(header: Mapping[str, Any]) -> Hello:
    """Check a HELLO request (broker side). Raises UnsupportedVersion or ProtocolError."""
    _check_version(header)
    client_id = _field(header, "client_id", str)
    _check_client_id(client_id)
    return Hello(client_id)


def hello_response(broker_id: int, max_frame_bytes: int) -> dict[str, Any]:
    """The header of the HELLO response: `max_frame_bytes` is the largest request frame the
    broker accepts."""
    _check_int("broker_id", broker_id, 0, I32_MAX)
    _check_int("max_frame_bytes", max_frame_bytes, FIXED_BYTES, U32_MAX)
    return {"version": PROTOCOL_VERSION, "broker_id": broker_id,
            "max_frame_bytes": max_frame_bytes}


def parse_hello_response(header: Mapping[str, Any]) -> HelloReply:
    """Check a HELLO response (client side). Raises UnsupportedVersion or ProtocolError."""
    _check_version(header)
    broker_id = _field(header, "broker_id", int)
    max_frame_bytes = _field(header, "max_frame_bytes", int)
    _check_int("broker_id", broker_id, 0, I32_MAX)
    _check_int("max_frame_bytes", max_frame_bytes, FIXED_BYTES, U32_MAX)
    return HelloReply(broker_id, max_frame_bytes)


def _check_version(header: Mapping[str, Any]) -> None:
    version = _field(header, "version", int)
    if version != PROTOCOL_VERSION:
        raise UnsupportedVersion(version, PROTOCOL_VERSION)


def _field(header: Mapping[str, Any], name: str, kind: type[Any]) -> Any:
    if name not in header:
        raise ProtocolError(f"missing field {name!r}", field=name)
    value = header[name]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ProtocolError(f"{name} must be {kind.__name__}, got {type(value).__name__}",
                            field=name)
    return value


def _check_int(name: str, value: int, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ProtocolError(f"{name} must be an integer in [{low}, {high}], got {value!r}",
                            field=name)


def _check_client_id(client_id: str) -> None:
    if not isinstance(client_id, str) or len(client_id) > CLIENT_ID_CHARS_MAX:
        raise ProtocolError(f"client_id must be a string of at most {CLIENT_ID_CHARS_MAX} "
                            "characters", field="client_id")
