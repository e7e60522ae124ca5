"""Messages of the data plane's reads: Fetch, and the offset lookup by timestamp.

Theory of operation: consumers and followers read a partition with the same Fetch (Kafka's
shape): from an offset, at most max_bytes (but always one whole batch, so a reader always
progresses), long-polling up to max_wait_ms when nothing is there yet. A consumer reads what
is committed (below the high watermark); a follower names itself (`replica_id`), reads
uncommitted records, and its fetch offset is its log end offset, which is how the leader
learns it. The records ride in the response frame's payload as whole record batches straight
from the segment file; the header carries the partition's offsets. OffsetForTimestamp turns
a time (or the EARLIEST/LATEST sentinels) into the offset a reader starts from.

    op                    request header                        response header
    FETCH                 stream, partition, offset, max_bytes, stream, partition,
                          max_wait_ms, leader_epoch=-1,         high_watermark,
                          replica_id=-1, isolation="committed", log_start_offset,
                          read_replica=false                    log_end_offset, next_offset,
                                                                leader_epoch (+ payload)
    OFFSET_FOR_TIMESTAMP  stream, partition, timestamp_ms       offset (-1: none)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from jetstream.protocol.base import Request, Response
from jetstream.protocol.fields import (
    BROKER_ID_MAX,
    EPOCH_MAX,
    FETCH_BYTES_MAX,
    FETCH_WAIT_MS_MAX,
    OFFSET_MAX,
    PARTITION_MAX,
    bad,
    check_bool,
    check_int,
    check_stream,
)
from jetstream.protocol.frames import Op

#: timestamp_ms sentinels of OffsetForTimestamp (Kafka's): the log start and the log end.
EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1

Isolation = Literal["committed", "uncommitted"]
_ISOLATIONS = ("committed", "uncommitted")


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
        check_stream(self.stream)
        check_int("partition", self.partition, 0, PARTITION_MAX)
        check_int("high_watermark", self.high_watermark, 0, OFFSET_MAX)
        check_int("log_start_offset", self.log_start_offset, 0, OFFSET_MAX)
        check_int("log_end_offset", self.log_end_offset, 0, OFFSET_MAX)
        check_int("next_offset", self.next_offset, 0, OFFSET_MAX)
        check_int("leader_epoch", self.leader_epoch, 0, EPOCH_MAX)
        if self.high_watermark > self.log_end_offset:
            raise bad("high_watermark", f"{self.high_watermark} is past the log end offset "
                                        f"{self.log_end_offset}")


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
    response_type: ClassVar[type[Response]] = FetchResponse
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
        check_stream(self.stream)
        check_int("partition", self.partition, 0, PARTITION_MAX)
        check_int("offset", self.offset, 0, OFFSET_MAX)
        check_int("max_bytes", self.max_bytes, 1, FETCH_BYTES_MAX)
        check_int("max_wait_ms", self.max_wait_ms, 0, FETCH_WAIT_MS_MAX)
        check_int("leader_epoch", self.leader_epoch, -1, EPOCH_MAX)
        check_int("replica_id", self.replica_id, -1, BROKER_ID_MAX)
        if self.isolation not in _ISOLATIONS:
            raise bad("isolation", f"must be one of {list(_ISOLATIONS)}, got "
                                   f"{self.isolation!r}")
        check_bool("read_replica", self.read_replica)
        if self.read_replica and (self.replica_id >= 0 or self.isolation != "committed"):
            raise bad("read_replica", "is for consumers: committed reads without replica_id")


@dataclass(frozen=True, slots=True)
class OffsetForTimestampResponse(Response):
    """-1 when no committed record is that recent."""

    offset: int

    def __post_init__(self) -> None:
        check_int("offset", self.offset, -1, OFFSET_MAX)


@dataclass(frozen=True, slots=True)
class OffsetForTimestampRequest(Request):
    """The first offset whose record's timestamp is >= `timestamp_ms`; EARLIEST_TIMESTAMP and
    LATEST_TIMESTAMP ask for the log start offset and the high watermark."""

    op: ClassVar[Op] = Op.OFFSET_FOR_TIMESTAMP
    response_type: ClassVar[type[Response]] = OffsetForTimestampResponse
    stream: str
    partition: int
    timestamp_ms: int

    def __post_init__(self) -> None:
        check_stream(self.stream)
        check_int("partition", self.partition, 0, PARTITION_MAX)
        check_int("timestamp_ms", self.timestamp_ms, EARLIEST_TIMESTAMP, OFFSET_MAX)


#: The requests of this module, for the codec's registry.
REQUESTS: tuple[type[Request], ...] = (FetchRequest, OffsetForTimestampRequest)
