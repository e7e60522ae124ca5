"""Typed requests and responses of the socket API, and its error frames.

Theory of operation: a frame's msgpack header carries the fields of one request or response
(frames.py); this module gives each a frozen dataclass. `to_header()` is the header,
`from_header(header)` takes the fields it knows (unknown ones are ignored, so a newer peer can
add fields), and construction checks every type and range strictly: a missing field, a wrong
type (a bool is not an int), a negative offset or a max_bytes out of range raises
ProtocolError (BAD_REQUEST) naming the field. The same checks run when a value is built
locally, so whatever is sent is valid. The records of a Fetch response ride in the frame's
payload, never in the header.

An error travels as a frame of kind ERROR whose header is the error's `to_dict()`: code,
message and the error's data fields. `error_from_header` turns it back into the class that
owns the code (a registry built by walking the JetstreamError tree), built from the same
fields, or into RemoteError when the code is unknown here.

    op                    request header                        response header
    FETCH                 stream, partition, offset, max_bytes, stream, partition,
                          max_wait_ms, leader_epoch=-1,         high_watermark,
                          replica_id=-1, isolation="committed", log_start_offset,
                          read_replica=false                    log_end_offset, next_offset,
                                                                leader_epoch (+ payload)
    METADATA              streams: [str] | nil (nil: all)       brokers: [{id, host, port}],
                                                                streams: [stream],
                                                                metadata_leader=-1
    CREATE_STREAM         config: map                           {}
    DELETE_STREAM         name                                  {}
    LIST_STREAMS          {}                                    streams: [stream]
    OFFSET_FOR_TIMESTAMP  stream, partition, timestamp_ms       offset (-1: none)
    END_OFFSET_FOR_EPOCH  stream, partition, leader_epoch,      leader_epoch, end_offset
                          current_leader_epoch=-1               (-1, -1: unknown epoch)
    COMMIT_OFFSET         group, stream, partition, offset,     {}
                          metadata=""
    FETCH_OFFSET          group, stream, partition              offset (-1: none), metadata
    REPORT_LEADER_FAILURE stream, partition, leader_epoch,      {}
                          reporter
    stream = {name, subject, partitions: [{partition, leader (-1: none), leader_epoch,
              replicas: [int], isr: [int]}], ...any other keys, passed through}
    (the partition leader's broker adds high_watermark, log_start_offset, log_end_offset and
    replica_end_offsets: {"<broker id>": LEO | nil}, each replica's LEO as it knows it)
"""

from __future__ import annotations

import inspect
from collections import deque
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields
from typing import Any, ClassVar, Literal, Self

from jetstream.errors import JetstreamError, ProtocolError, RemoteError
from jetstream.protocol import names
from jetstream.protocol.frames import (
    I32_MAX,
    RESPONSE_HEADER_BYTES_MAX,
    U32_MAX,
    Frame,
    Kind,
    MiB,
    Op,
    encode_frame,
    parse_op,
)

OFFSET_MAX = 2**63 - 1
PARTITION_MAX = I32_MAX
BROKER_ID_MAX = I32_MAX
#: Leader epochs are stored as u32 in record batches.
EPOCH_MAX = U32_MAX
FETCH_BYTES_MAX = 64 * MiB
FETCH_WAIT_MS_MAX = 60_000
#: Longest metadata string stored with a committed offset (Kafka's default too).
OFFSET_METADATA_CHARS_MAX = 4096
HOST_CHARS_MAX = 255
PORT_MAX = 65535
#: Most streams named in one MetadataRequest.
METADATA_STREAMS_MAX = 10_000
ERROR_CODE_CHARS_MAX = 64
#: timestamp_ms sentinels of OffsetForTimestamp (Kafka's): the log start and the log end.
EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1

Isolation = Literal["committed", "uncommitted"]
_ISOLATIONS = ("committed", "uncommitted")


# -- field checks ------------------------------------------------------------------------------


def _bad(name: str, why: str) -> ProtocolError:
    return ProtocolError(f"{name} {why}", field=name)


def _int(name: str, value: object, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(name, f"must be an integer, got {type(value).__name__}")
    if not low <= value <= high:
        raise _bad(name, f"must be in [{low}, {high}], got {value}")


def _str(name: str, value: object, chars_max: int) -> None:
    if not isinstance(value, str):
        raise _bad(name, f"must be a string, got {type(value).__name__}")
    if len(value) > chars_max:
        raise _bad(name, f"must have at most {chars_max} characters")


def _stream(value: object, name: str = "stream") -> None:
    if not names.is_stream_name(value):
        raise _bad(name, f"must be a stream name ([A-Za-z0-9_-]{{1,64}}), got {value!r}")


def _group(value: object) -> None:
    if not names.is_group_name(value):
        raise _bad("group", f"must be a group name ([A-Za-z0-9_-]{{1,64}}), got {value!r}")


def _map(name: str, value: object) -> dict[str, Any]:
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise _bad(name, "must be a map with string keys")
    return value


def _list(name: str, value: object) -> list[Any]:
    if not isinstance(value, list):
        raise _bad(name, f"must be a list, got {type(value).__name__}")
    return value


def _require(name: str, value: Mapping[str, Any], key: str) -> Any:
    if key not in value:
        raise _bad(name, f"lacks {key!r}")
    return value[key]


def _check_broker(name: str, broker: object) -> None:
    broker = _map(name, broker)
    _int(f"{name}.id", _require(name, broker, "id"), 0, BROKER_ID_MAX)
    host = _require(name, broker, "host")
    _str(f"{name}.host", host, HOST_CHARS_MAX)
    if not host:
        raise _bad(f"{name}.host", "must not be empty")
    _int(f"{name}.port", _require(name, broker, "port"), 1, PORT_MAX)


def _check_stream_description(name: str, stream: object) -> None:
    stream = _map(name, stream)
    _stream(_require(name, stream, "name"), f"{name}.name")
    if not names.is_subject(_require(name, stream, "subject")):
        raise _bad(f"{name}.subject", "must be a NATS subject")
    for i, partition in enumerate(_list(f"{name}.partitions",
                                        _require(name, stream, "partitions"))):
        where = f"{name}.partitions[{i}]"
        partition = _map(where, partition)
        _int(f"{where}.partition", _require(where, partition, "partition"), 0, PARTITION_MAX)
        _int(f"{where}.leader", _require(where, partition, "leader"), -1, BROKER_ID_MAX)
        _int(f"{where}.leader_epoch", _require(where, partition, "leader_epoch"), 0, EPOCH_MAX)
        for key in ("replicas", "isr"):
            for j, replica in enumerate(_list(f"{where}.{key}", _require(where, partition, key))):
                _int(f"{where}.{key}[{j}]", replica, 0, BROKER_ID_MAX)


def _check_streams(name: str, streams: object) -> None:
    for i, stream in enumerate(_list(name, streams)):
        _check_stream_description(f"{name}[{i}]", stream)


# -- messages ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Message:
    """Base of requests and responses: the header is the dataclass's fields."""

    def to_header(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_header(cls, header: Mapping[str, Any]) -> Self:
        """Build from a decoded header, ignoring unknown fields. Raises ProtocolError."""
        if not isinstance(header, Mapping):
            raise ProtocolError(f"{cls.__name__} header must be a map", field="header")
        kwargs: dict[str, Any] = {}
        for f in fields(cls):
            if f.name in header:
                kwargs[f.name] = header[f.name]
            elif f.default is MISSING and f.default_factory is MISSING:
                raise ProtocolError(f"{cls.__name__} lacks field {f.name!r}", field=f.name)
        return cls(**kwargs)


@dataclass(frozen=True, slots=True)
class Request(Message):
    op: ClassVar[Op]


@dataclass(frozen=True, slots=True)
class Response(Message):
    """A response's frame echoes the op of the request it answers."""


@dataclass(frozen=True, slots=True)
class FetchRequest(Request):
    """Read records from `offset`, at most `max_bytes` of them (at least one whole batch is
    sent even when larger, so a consumer always progresses), waiting up to `max_wait_ms` for
    records when there are none. Followers pass their `replica_id`, read `uncommitted` and
    report their LEO as `offset`; `leader_epoch` (-1: unchecked) fences stale leaders.
    A consumer that sets `read_replica` may be answered by an in-sync follower (KIP-392)
    with what is committed as far as that follower knows (the response's HW is the
    follower's); without it a follower answers NOT_LEADER. A broker that predates the field
    ignores it and answers as the leader would."""

    op: ClassVar[Op] = Op.FETCH
    stream: str
    partition: int
    offset: int
    max_bytes: int
    max_wait_ms: int
    leader_epoch: int = -1
    replica_id: int = -1
    isolation: Isolation = "committed"
    read_replica: bool = False

    def __post_init__(self) -> None:
        _stream(self.stream)
        _int("partition", self.partition, 0, PARTITION_MAX)
        _int("offset", self.offset, 0, OFFSET_MAX)
        _int("max_bytes", self.max_bytes, 1, FETCH_BYTES_MAX)
        _int("max_wait_ms", self.max_wait_ms, 0, FETCH_WAIT_MS_MAX)
        _int("leader_epoch", self.leader_epoch, -1, EPOCH_MAX)
        _int("replica_id", self.replica_id, -1, BROKER_ID_MAX)
        if self.isolation not in _ISOLATIONS:
            raise _bad("isolation", f"must be one of {list(_ISOLATIONS)}, got "
                                    f"{self.isolation!r}")
        if not isinstance(self.read_replica, bool):
            raise _bad("read_replica", f"must be a boolean, got "
                                       f"{type(self.read_replica).__name__}")
        if self.read_replica and (self.replica_id >= 0 or self.isolation != "committed"):
            raise _bad("read_replica", "is for consumers: committed reads without replica_id")


@dataclass(frozen=True, slots=True)
class FetchResponse(Response):
    """The frame's payload holds whole record batches from the requested offset (the first
    may start before it); `next_offset` is where the next fetch starts."""

    stream: str
    partition: int
    high_watermark: int
    log_start_offset: int
    log_end_offset: int
    next_offset: int
    leader_epoch: int

    def __post_init__(self) -> None:
        _stream(self.stream)
        _int("partition", self.partition, 0, PARTITION_MAX)
        _int("high_watermark", self.high_watermark, 0, OFFSET_MAX)
        _int("log_start_offset", self.log_start_offset, 0, OFFSET_MAX)
        _int("log_end_offset", self.log_end_offset, 0, OFFSET_MAX)
        _int("next_offset", self.next_offset, 0, OFFSET_MAX)
        _int("leader_epoch", self.leader_epoch, 0, EPOCH_MAX)
        if self.high_watermark > self.log_end_offset:
            raise _bad("high_watermark", f"{self.high_watermark} is past the log end offset "
                                         f"{self.log_end_offset}")


@dataclass(frozen=True, slots=True)
class MetadataRequest(Request):
    """Brokers and the named streams (None: every stream). Unknown names are left out of the
    response."""

    op: ClassVar[Op] = Op.METADATA
    streams: list[str] | None = None

    def __post_init__(self) -> None:
        if self.streams is None:
            return
        if isinstance(self.streams, tuple):
            object.__setattr__(self, "streams", list(self.streams))
        streams = _list("streams", self.streams)
        if len(streams) > METADATA_STREAMS_MAX:
            raise _bad("streams", f"names more than {METADATA_STREAMS_MAX} streams")
        for i, stream in enumerate(streams):
            _stream(stream, f"streams[{i}]")


@dataclass(frozen=True, slots=True)
class MetadataResponse(Response):
    """`metadata_leader`: the broker leading the metadata (Raft), -1 when unknown (during an
    election, or from a broker that predates the field)."""

    brokers: list[dict[str, Any]]
    streams: list[dict[str, Any]]
    metadata_leader: int = -1

    def __post_init__(self) -> None:
        for i, broker in enumerate(_list("brokers", self.brokers)):
            _check_broker(f"brokers[{i}]", broker)
        _check_streams("streams", self.streams)
        _int("metadata_leader", self.metadata_leader, -1, BROKER_ID_MAX)


@dataclass(frozen=True, slots=True)
class CreateStreamRequest(Request):
    """`config` is checked by the stream config module (INVALID_STREAM_CONFIG); here only its
    shape: a map with string keys."""

    op: ClassVar[Op] = Op.CREATE_STREAM
    config: dict[str, Any]

    def __post_init__(self) -> None:
        _map("config", self.config)


@dataclass(frozen=True, slots=True)
class DeleteStreamRequest(Request):
    op: ClassVar[Op] = Op.DELETE_STREAM
    name: str

    def __post_init__(self) -> None:
        _stream(self.name, "name")


@dataclass(frozen=True, slots=True)
class ListStreamsRequest(Request):
    op: ClassVar[Op] = Op.LIST_STREAMS


@dataclass(frozen=True, slots=True)
class ListStreamsResponse(Response):
    streams: list[dict[str, Any]]

    def __post_init__(self) -> None:
        _check_streams("streams", self.streams)


@dataclass(frozen=True, slots=True)
class OffsetForTimestampRequest(Request):
    """The first offset whose record's timestamp is >= `timestamp_ms`; EARLIEST_TIMESTAMP and
    LATEST_TIMESTAMP ask for the log start offset and the high watermark."""

    op: ClassVar[Op] = Op.OFFSET_FOR_TIMESTAMP
    stream: str
    partition: int
    timestamp_ms: int

    def __post_init__(self) -> None:
        _stream(self.stream)
        _int("partition", self.partition, 0, PARTITION_MAX)
        _int("timestamp_ms", self.timestamp_ms, EARLIEST_TIMESTAMP, OFFSET_MAX)


@dataclass(frozen=True, slots=True)
class OffsetForTimestampResponse(Response):
    """-1 when no committed record is that recent."""

    offset: int

    def __post_init__(self) -> None:
        _int("offset", self.offset, -1, OFFSET_MAX)


@dataclass(frozen=True, slots=True)
class EndOffsetForEpochRequest(Request):
    """KIP-101: a replica that restarts asks the leader where `leader_epoch` ended, and
    truncates its log there. `current_leader_epoch` (KIP-320; -1: unchecked) is the epoch the
    replica follows in: a leader at another epoch answers FENCED_LEADER_EPOCH instead."""

    op: ClassVar[Op] = Op.END_OFFSET_FOR_EPOCH
    stream: str
    partition: int
    leader_epoch: int
    current_leader_epoch: int = -1

    def __post_init__(self) -> None:
        _stream(self.stream)
        _int("partition", self.partition, 0, PARTITION_MAX)
        _int("leader_epoch", self.leader_epoch, 0, EPOCH_MAX)
        _int("current_leader_epoch", self.current_leader_epoch, -1, EPOCH_MAX)


@dataclass(frozen=True, slots=True)
class EndOffsetForEpochResponse(Response):
    """The largest epoch <= the requested one and the offset after its last record; the
    current epoch's end is the leader's LEO. -1 and -1 when the leader knows no such epoch."""

    leader_epoch: int
    end_offset: int

    def __post_init__(self) -> None:
        _int("leader_epoch", self.leader_epoch, -1, EPOCH_MAX)
        _int("end_offset", self.end_offset, -1, OFFSET_MAX)


@dataclass(frozen=True, slots=True)
class CommitOffsetRequest(Request):
    """Store `offset` (the next offset the group will read) for the group."""

    op: ClassVar[Op] = Op.COMMIT_OFFSET
    group: str
    stream: str
    partition: int
    offset: int
    metadata: str = ""

    def __post_init__(self) -> None:
        _group(self.group)
        _stream(self.stream)
        _int("partition", self.partition, 0, PARTITION_MAX)
        _int("offset", self.offset, 0, OFFSET_MAX)
        _str("metadata", self.metadata, OFFSET_METADATA_CHARS_MAX)


@dataclass(frozen=True, slots=True)
class FetchOffsetRequest(Request):
    op: ClassVar[Op] = Op.FETCH_OFFSET
    group: str
    stream: str
    partition: int

    def __post_init__(self) -> None:
        _group(self.group)
        _stream(self.stream)
        _int("partition", self.partition, 0, PARTITION_MAX)


@dataclass(frozen=True, slots=True)
class FetchOffsetResponse(Response):
    """-1 when the group has committed nothing for the partition."""

    offset: int
    metadata: str = ""

    def __post_init__(self) -> None:
        _int("offset", self.offset, -1, OFFSET_MAX)
        _str("metadata", self.metadata, OFFSET_METADATA_CHARS_MAX)


@dataclass(frozen=True, slots=True)
class ReportLeaderFailureRequest(Request):
    """Broker `reporter`, a follower, gets no answer from the leader of `stream/partition` at
    `leader_epoch`; sent to the metadata leader's broker, whose failover controller counts
    it. Answered with an empty response (ignored by a broker that does not lead)."""

    op: ClassVar[Op] = Op.REPORT_LEADER_FAILURE
    stream: str
    partition: int
    leader_epoch: int
    reporter: int

    def __post_init__(self) -> None:
        _stream(self.stream)
        _int("partition", self.partition, 0, PARTITION_MAX)
        _int("leader_epoch", self.leader_epoch, 0, EPOCH_MAX)
        _int("reporter", self.reporter, 0, BROKER_ID_MAX)


@dataclass(frozen=True, slots=True)
class EmptyResponse(Response):
    """The answer of CREATE_STREAM, DELETE_STREAM and COMMIT_OFFSET: done."""


REQUEST_TYPES: Mapping[Op, type[Request]] = {
    Op.FETCH: FetchRequest,
    Op.METADATA: MetadataRequest,
    Op.CREATE_STREAM: CreateStreamRequest,
    Op.DELETE_STREAM: DeleteStreamRequest,
    Op.LIST_STREAMS: ListStreamsRequest,
    Op.OFFSET_FOR_TIMESTAMP: OffsetForTimestampRequest,
    Op.END_OFFSET_FOR_EPOCH: EndOffsetForEpochRequest,
    Op.COMMIT_OFFSET: CommitOffsetRequest,
    Op.FETCH_OFFSET: FetchOffsetRequest,
    Op.REPORT_LEADER_FAILURE: ReportLeaderFailureRequest,
}
RESPONSE_TYPES: Mapping[Op, type[Response]] = {
    Op.FETCH: FetchResponse,
    Op.METADATA: MetadataResponse,
    Op.CREATE_STREAM: EmptyResponse,
    Op.DELETE_STREAM: EmptyResponse,
    Op.LIST_STREAMS: ListStreamsResponse,
    Op.OFFSET_FOR_TIMESTAMP: OffsetForTimestampResponse,
    Op.END_OFFSET_FOR_EPOCH: EndOffsetForEpochResponse,
    Op.COMMIT_OFFSET: EmptyResponse,
    Op.FETCH_OFFSET: FetchOffsetResponse,
    Op.REPORT_LEADER_FAILURE: EmptyResponse,
}


# -- frames of messages ------------------------------------------------------------------------


def encode_request(correlation_id: int, request: Request) -> bytes:
    return encode_frame(correlation_id, Kind.REQUEST, request.op, request.to_header())


def encode_response(correlation_id: int, op: Op, response: Response,
                    payload_length: int = 0) -> bytes:
    """The prefix and header of a response; the caller sends `payload_length` bytes after."""
    return encode_frame(correlation_id, Kind.RESPONSE, op, response.to_header(), payload_length,
                        header_bytes_max=RESPONSE_HEADER_BYTES_MAX)


def encode_error(correlation_id: int, op: int, exc: JetstreamError) -> bytes:
    """An error frame answering the request `correlation_id` (whose op may be unknown)."""
    return encode_frame(correlation_id, Kind.ERROR, op, error_header(exc))


def decode_request(frame: Frame) -> Request:
    """The typed request a frame carries. Raises ProtocolError (answer it with an error frame):
    not a request, an unknown op, HELLO (see frames.parse_hello_request) or a bad header."""
    if frame.kind != Kind.REQUEST:
        raise ProtocolError(f"expected a request frame, got {frame.kind.name}", field="kind")
    op = parse_op(frame.op)
    request_type = REQUEST_TYPES.get(op)
    if request_type is None:
        raise ProtocolError(f"op {op.name} has no request type here", field="op")
    return request_type.from_header(frame.header)


def decode_response(frame: Frame) -> Response:
    """The typed response a frame carries; an error frame raises the error it carries."""
    if frame.kind == Kind.ERROR:
        raise error_from_header(frame.header)
    if frame.kind != Kind.RESPONSE:
        raise ProtocolError(f"expected a response frame, got {frame.kind.name}", field="kind")
    response_type = RESPONSE_TYPES.get(parse_op(frame.op))
    if response_type is None:
        raise ProtocolError(f"op {frame.op} has no response type here", field="op")
    return response_type.from_header(frame.header)


# -- errors ------------------------------------------------------------------------------------

# Field names a remote error may not set: they would overwrite attributes of the exception.
_RESERVED_FIELDS = frozenset(dir(RemoteError)) | {"self", "fields", "code", "message"}
_WIRE_SCALARS = (str, int, float, bool, type(None), bytes)


def error_header(exc: JetstreamError) -> dict[str, Any]:
    """The header of an error frame: `exc.to_dict()`, with any field value that msgpack cannot
    carry (not a scalar, list or str-keyed map of them) sent as its str()."""
    return {k: _wire_value(v) for k, v in exc.to_dict().items()}


def _wire_value(value: object) -> object:
    if isinstance(value, _WIRE_SCALARS):
        return value
    if isinstance(value, list | tuple):
        return [_wire_value(v) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: _wire_value(v) for k, v in value.items()}
    return str(value)


def error_registry() -> dict[str, type[JetstreamError]]:
    """Stable code -> the class that declares it. A subclass that inherits its parent's code
    (FrameError) is not listed: the parent stands for it. Walked on each call, so error
    classes defined later are found."""
    registry: dict[str, type[JetstreamError]] = {}
    queue: deque[type[JetstreamError]] = deque([JetstreamError])
    while queue:  # breadth first, so a parent wins over a subclass that repeats its code
        cls = queue.popleft()
        queue.extend(cls.__subclasses__())
        if "code" in vars(cls):
            registry.setdefault(cls.code, cls)
    return registry


def error_from_header(header: Mapping[str, Any]) -> JetstreamError:
    """The error an error frame (or an error ack) carries: an instance of the class that owns
    its code, built from its fields by the class's constructor (or, when the fields do not fit
    it, a sender of another version, carrying them as they are); RemoteError when the code is
    unknown here. Raises ProtocolError when the header has no valid code or message."""
    if not isinstance(header, Mapping):
        raise ProtocolError("error header must be a map", field="error")
    code = header.get("code")
    message = header.get("message", "")
    if not isinstance(code, str) or not 0 < len(code) <= ERROR_CODE_CHARS_MAX:
        raise ProtocolError("error code must be a non-empty string of at most "
                            f"{ERROR_CODE_CHARS_MAX} characters", field="code")
    if not isinstance(message, str):
        raise ProtocolError("error message must be a string", field="message")
    data = {k: v for k, v in header.items()
            if isinstance(k, str) and k.isidentifier() and not k.startswith("_")
            and k not in _RESERVED_FIELDS}
    cls = error_registry().get(code)
    if cls is None:
        exc: JetstreamError = RemoteError(code, message, **data)
    else:
        exc = _rebuild(cls, code, message, data) or _bare(cls, message, data)
    if message and str(exc) != message:
        exc.args = (message,)  # the sender's words, even where a constructor words it anew
    return exc


def _rebuild(cls: type[JetstreamError], code: str, message: str,
             data: dict[str, Any]) -> JetstreamError | None:
    kwargs: dict[str, Any] = {}
    takes_any = False
    try:
        parameters = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return None
    for name, parameter in parameters.items():
        if parameter.kind is parameter.VAR_KEYWORD:
            takes_any = True
        elif parameter.kind is parameter.VAR_POSITIONAL:
            continue
        elif name == "message":
            kwargs[name] = message
        elif name == "code":
            kwargs[name] = code
        elif name in data:
            kwargs[name] = data[name]
        elif parameter.default is parameter.empty:
            return None  # a field the class needs is missing: not the class we know
    if takes_any:
        kwargs.update((k, v) for k, v in data.items() if k not in parameters)
    try:
        return cls(**kwargs)
    except Exception:  # the fields have types the constructor cannot use
        return None


def _bare(cls: type[JetstreamError], message: str, data: dict[str, Any]) -> JetstreamError:
    # Keep the type (callers test it and its `retriable`) even when the constructor refuses
    # the fields: skip it and store them as the base class does.
    exc = cls.__new__(cls)
    JetstreamError.__init__(exc, message, **data)
    return exc
