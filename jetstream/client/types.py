"""The values the client hands out: stream and partition descriptions, messages, fetch
results (decoded, or raw), segment listings, and the start positions of a subscription.

Theory of operation: every value is a frozen dataclass built from what a broker sent (the
stream dicts of Metadata and ListStreams, a Fetch response and its decoded records), so a
caller can keep, compare and print them without holding on to the client. Stream
descriptions keep the broker's whole dict in `config`, so keys a newer broker adds are not
lost.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from jetstream.protocol.ack import Ack
from jetstream.protocol.envelope import AckPolicy
from jetstream.stream.format import StoredRecord

__all__ = [
    "Ack",
    "AckPolicy",
    "BrokerInfo",
    "FetchResult",
    "Message",
    "PartitionInfo",
    "PublishMessage",
    "RawFetch",
    "SegmentListing",
    "Start",
    "StreamInfo",
]


class Start(enum.Enum):
    """Where a subscription starts reading a partition."""

    #: The oldest message still in the log (the log start offset).
    EARLIEST = "earliest"
    #: The newest committed message (high watermark - 1), or the high watermark when the
    #: partition is empty: Liftbridge's meaning.
    LATEST = "latest"
    #: Only messages committed after subscribing (the high watermark).
    NEW_ONLY = "new_only"
    #: The offset given as `offset=`.
    OFFSET = "offset"
    #: The first message whose timestamp is at or after `timestamp_ms=`.
    TIMESTAMP = "timestamp"


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    id: int
    host: str
    port: int
    http_port: int = 0
    #: The NATS server(s) the broker uses, comma-separated; "" when it does not say.
    nats_url: str = ""

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BrokerInfo:
        return cls(data["id"], data["host"], data["port"], int(data.get("http_port") or 0),
                   str(data.get("nats_url") or ""))


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    """One partition: who leads it, its replicas, and its offsets when the broker that
    answered leads it (else None): among them each replica's log end offset as the leader
    knows it (None for a follower that has not fetched in this leader epoch)."""

    stream: str
    partition: int
    subject: str
    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    high_watermark: int | None = None
    log_start_offset: int | None = None
    log_end_offset: int | None = None
    replica_end_offsets: Mapping[int, int | None] | None = None

    @classmethod
    def from_dict(cls, stream: str, subject: str, data: Mapping[str, Any]) -> PartitionInfo:
        leos = data.get("replica_end_offsets")
        return cls(stream, data["partition"], data.get("subject", subject), data["leader"],
                   data["leader_epoch"], tuple(data["replicas"]), tuple(data["isr"]),
                   data.get("high_watermark"), data.get("log_start_offset"),
                   data.get("log_end_offset"),
                   None if not isinstance(leos, Mapping)
                   else {int(k): v for k, v in sorted(leos.items(), key=lambda kv: int(kv[0]))})


@dataclass(frozen=True, slots=True)
class StreamInfo:
    """A stream as the broker describes it. `config` is the broker's whole description
    (every config field, partitions excepted)."""

    name: str
    subject: str
    partitions: tuple[PartitionInfo, ...]
    ingest_group: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    replication_factor: int = 1
    ack_policy: str = AckPolicy.ALL.value
    config: Mapping[str, Any] = field(default_factory=dict)

    @property
    def partition_count(self) -> int:
        return len(self.partitions)

    @property
    def mirror(self) -> str | None:
        """The source a mirror stream copies ("<cluster>/<stream>"); None: not a mirror."""
        mirror = self.config.get("mirror")
        return mirror if isinstance(mirror, str) else None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StreamInfo:
        name, subject = data["name"], data["subject"]
        partitions = tuple(sorted((PartitionInfo.from_dict(name, subject, p)
                                   for p in data["partitions"]), key=lambda p: p.partition))
        config = {k: v for k, v in data.items() if k != "partitions"}
        return cls(name, subject, partitions,
                   data.get("ingest_group", data.get("group")), dict(data.get("labels") or {}),
                   int(data.get("replication_factor") or 1),
                   str(data.get("ack_policy") or AckPolicy.ALL.value), config)


class Message(NamedTuple):
    """A committed message of a stream partition. (A named tuple, decoded straight from the
    fetched record batches: a catch-up read builds hundreds of thousands a second.)"""

    stream: str
    partition: int
    offset: int
    timestamp_ms: int
    value: bytes
    key: bytes | None
    headers: Mapping[str, bytes]
    #: The NATS subject the message arrived on ("" for messages appended over HTTP).
    subject: str
    #: The epoch of the leader that appended it.
    leader_epoch: int

    @classmethod
    def from_record(cls, stream: str, partition: int, record: StoredRecord) -> Message:
        return tuple.__new__(cls, (stream, partition, *record))


@dataclass(frozen=True, slots=True)
class FetchResult:
    """What one Fetch returned: messages below the high watermark, the partition's offsets
    as the leader saw them, and where the next fetch starts."""

    messages: list[Message]
    high_watermark: int
    log_start_offset: int
    log_end_offset: int
    next_offset: int


@dataclass(frozen=True, slots=True)
class RawFetch:
    """What one Fetch returned, undecoded: `payload` is whole record batches exactly as the
    broker sent them (jetstream.stream.format; decode them with `decode_batches`). The first
    batch may start below the offset asked for (skip its records below it); none holds a
    record at or past `high_watermark`. The next fetch starts at `next_offset` (the offset
    asked for when `payload` is empty)."""

    high_watermark: int
    log_start_offset: int
    log_end_offset: int
    next_offset: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class SegmentListing:
    """A partition's segment files at its leader, and the leader's offsets of that moment
    (ListSegments). Each segment is `(base_offset, size_bytes)`, oldest first, its file
    `directory / jetstream.stream.segment.log_file_name(base_offset)` on broker
    `broker_id`. Read at most `size_bytes` of a file and no record at or past
    `high_watermark`; the first segment's base may lie below `log_start_offset`. Retention
    may delete and compaction replace a file after the listing: when a file is gone or
    shorter than listed, fetch that range instead (Client.fetch_raw). `stream_version`
    is what `version_file` holds: a file set whose marker differs belongs to another
    stream of the same name."""

    stream: str
    partition: int
    high_watermark: int
    log_start_offset: int
    log_end_offset: int
    leader_epoch: int
    broker_id: int
    directory: str
    version_file: str
    stream_version: str
    segments: tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class PublishMessage:
    """One message of `publish_batch` (a None value with a key: a tombstone)."""

    subject: str
    value: bytes | None
    key: bytes | None = None
    headers: Mapping[str, bytes] | None = None
    partition: int | None = None
