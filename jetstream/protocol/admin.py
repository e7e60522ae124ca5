"""Messages of cluster metadata and stream administration.

Theory of operation: any broker answers these (a broker that does not lead the metadata
forwards changes to the one that does), so a client sends them wherever it is connected.
Metadata and ListStreams describe streams as maps: the fields checked here are the ones a
reader routes by (name, subject, and each partition's leader, epoch, replicas and ISR); any
other key of a stream's description (its config, its labels, keys a newer broker adds) is
passed through as it is. A stream's config is checked by the stream config module when it
is created, not here: here only its shape.

    op                    request header                        response header
    METADATA              streams: [str] | nil (nil: all)       brokers: [{id, host, port}],
                                                                streams: [stream],
                                                                metadata_leader=-1
    CREATE_STREAM         config: map                           {}
    DELETE_STREAM         name                                  {}
    UPDATE_STREAM         name, changes: map                    config: map (the new one)
    LIST_STREAMS          internal=false                        streams: [stream]
    stream = {name, subject, partitions: [{partition, leader (-1: none), leader_epoch,
              replicas: [int], isr: [int]}], ...any other keys, passed through}
    (the partition leader's broker adds high_watermark, log_start_offset, log_end_offset and
    replica_end_offsets: {"<broker id>": LEO | nil}, each replica's LEO as it knows it)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from jetstream.protocol import names
from jetstream.protocol.base import EmptyResponse, Request, Response
from jetstream.protocol.fields import (
    BROKER_ID_MAX,
    EPOCH_MAX,
    HOST_CHARS_MAX,
    METADATA_STREAMS_MAX,
    PARTITION_MAX,
    PORT_MAX,
    as_list,
    as_map,
    bad,
    check_bool,
    check_int,
    check_str,
    check_stream,
    required,
)
from jetstream.protocol.frames import Op


def _check_broker(name: str, broker: object) -> None:
    broker = as_map(name, broker)
    check_int(f"{name}.id", required(name, broker, "id"), 0, BROKER_ID_MAX)
    host = required(name, broker, "host")
    check_str(f"{name}.host", host, HOST_CHARS_MAX)
    if not host:
        raise bad(f"{name}.host", "must not be empty")
    check_int(f"{name}.port", required(name, broker, "port"), 1, PORT_MAX)


def _check_stream_description(name: str, stream: object) -> None:
    stream = as_map(name, stream)
    check_stream(required(name, stream, "name"), f"{name}.name")
    if not names.is_subject(required(name, stream, "subject")):
        raise bad(f"{name}.subject", "must be a NATS subject")
    for i, partition in enumerate(as_list(f"{name}.partitions",
                                          required(name, stream, "partitions"))):
        where = f"{name}.partitions[{i}]"
        partition = as_map(where, partition)
        check_int(f"{where}.partition", required(where, partition, "partition"), 0,
                  PARTITION_MAX)
        check_int(f"{where}.leader", required(where, partition, "leader"), -1, BROKER_ID_MAX)
        check_int(f"{where}.leader_epoch", required(where, partition, "leader_epoch"), 0,
                  EPOCH_MAX)
        for key in ("replicas", "isr"):
            for j, replica in enumerate(as_list(f"{where}.{key}",
                                                required(where, partition, key))):
                check_int(f"{where}.{key}[{j}]", replica, 0, BROKER_ID_MAX)


def _check_streams(name: str, streams: object) -> None:
    for i, stream in enumerate(as_list(name, streams)):
        _check_stream_description(f"{name}[{i}]", stream)


@dataclass(frozen=True, slots=True)
class MetadataResponse(Response):
    """`metadata_leader`: the broker leading the metadata (Raft), -1 when unknown (during an
    election, or from a broker that predates the field)."""

    brokers: list[dict[str, Any]]
    streams: list[dict[str, Any]]
    metadata_leader: int = -1

    def __post_init__(self) -> None:
        for i, broker in enumerate(as_list("brokers", self.brokers)):
            _check_broker(f"brokers[{i}]", broker)
        _check_streams("streams", self.streams)
        check_int("metadata_leader", self.metadata_leader, -1, BROKER_ID_MAX)


@dataclass(frozen=True, slots=True)
class MetadataRequest(Request):
    """Brokers and the named streams (None: every stream). Unknown names are left out of the
    response."""

    op: ClassVar[Op] = Op.METADATA
    response_type: ClassVar[type[Response]] = MetadataResponse
    streams: list[str] | None = None

    def __post_init__(self) -> None:
        if self.streams is None:
            return
        if isinstance(self.streams, tuple):
            object.__setattr__(self, "streams", list(self.streams))
        streams = as_list("streams", self.streams)
        if len(streams) > METADATA_STREAMS_MAX:
            raise bad("streams", f"names more than {METADATA_STREAMS_MAX} streams")
        for i, stream in enumerate(streams):
            check_stream(stream, f"streams[{i}]")


@dataclass(frozen=True, slots=True)
class CreateStreamRequest(Request):
    """`config` is checked by the stream config module (INVALID_STREAM_CONFIG); here only its
    shape: a map with string keys."""

    op: ClassVar[Op] = Op.CREATE_STREAM
    response_type: ClassVar[type[Response]] = EmptyResponse
    config: dict[str, Any]

    def __post_init__(self) -> None:
        as_map("config", self.config)


@dataclass(frozen=True, slots=True)
class DeleteStreamRequest(Request):
    op: ClassVar[Op] = Op.DELETE_STREAM
    response_type: ClassVar[type[Response]] = EmptyResponse
    name: str

    def __post_init__(self) -> None:
        check_stream(self.name, "name")


@dataclass(frozen=True, slots=True)
class UpdateStreamResponse(Response):
    config: dict[str, Any]

    def __post_init__(self) -> None:
        as_map("config", self.config)


@dataclass(frozen=True, slots=True)
class UpdateStreamRequest(Request):
    """Change settings of a stream; `changes` is checked by the stream config module
    (INVALID_STREAM_CONFIG names a setting that is unknown, fixed or out of range)."""

    op: ClassVar[Op] = Op.UPDATE_STREAM
    response_type: ClassVar[type[Response]] = UpdateStreamResponse
    name: str
    changes: dict[str, Any]

    def __post_init__(self) -> None:
        check_stream(self.name, "name")
        as_map("changes", self.changes)


@dataclass(frozen=True, slots=True)
class ListStreamsResponse(Response):
    streams: list[dict[str, Any]]

    def __post_init__(self) -> None:
        _check_streams("streams", self.streams)


@dataclass(frozen=True, slots=True)
class ListStreamsRequest(Request):
    """Every stream; the internal ones (named `__*`, such as `__offsets`) only with
    `internal`."""

    op: ClassVar[Op] = Op.LIST_STREAMS
    response_type: ClassVar[type[Response]] = ListStreamsResponse
    internal: bool = False

    def __post_init__(self) -> None:
        check_bool("internal", self.internal)


#: The requests of this module, for the codec's registry.
REQUESTS: tuple[type[Request], ...] = (
    MetadataRequest, CreateStreamRequest, DeleteStreamRequest, ListStreamsRequest,
    UpdateStreamRequest)
