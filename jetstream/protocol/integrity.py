"""Messages about the integrity of stored data: a replica's checked copy of a range of
offsets (what repairs a damaged copy elsewhere), and a scrub on demand.

Theory of operation: a replica whose copy of some offsets is damaged (a leader serving a
read, a follower healing) asks another replica of the partition, leader or follower, for
its own copy of exactly those offsets: REPLICA_RANGE answers whole batches from the one
holding `first_offset`, none starting at or past `end_offset`, at most about `max_bytes`
(at least one batch), each checked against its CRC before it is sent; a replica whose own
copy is damaged there answers CORRUPT_RECORD instead. The batches ride in the payload, as a
Fetch's do. SCRUB asks a broker to check every byte of its replicas of a stream (or of one
partition) now, repair what it can, and answer what it found.

    op             request header                        response header
    REPLICA_RANGE  stream, partition, first_offset,      stream, partition, broker_id,
                   end_offset, max_bytes                 next_offset (+ payload)
    SCRUB          stream, partition=-1 (every one)      broker_id, partitions: [{stream,
                                                         partition, role, checked_bytes,
                                                         damage: [...], repaired, lost: [...]}]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from jetstream.protocol.base import Request, Response
from jetstream.protocol.fields import (
    BROKER_ID_MAX,
    FETCH_BYTES_MAX,
    OFFSET_MAX,
    PARTITION_MAX,
    as_list,
    as_map,
    bad,
    check_int,
    check_stream,
)
from jetstream.protocol.frames import Op

#: Most partitions one SCRUB answer describes.
SCRUB_PARTITIONS_MAX = 100_000


@dataclass(frozen=True, slots=True)
class ReplicaRangeResponse(Response):
    """The payload holds the batches; `next_offset` follows the last of them."""

    stream: str
    partition: int
    broker_id: int
    next_offset: int

    def __post_init__(self) -> None:
        check_stream(self.stream)
        check_int("partition", self.partition, 0, PARTITION_MAX)
        check_int("broker_id", self.broker_id, 0, BROKER_ID_MAX)
        check_int("next_offset", self.next_offset, 0, OFFSET_MAX)


@dataclass(frozen=True, slots=True)
class ReplicaRangeRequest(Request):
    """This broker's checked copy of offsets [first_offset, end_offset) of its replica."""

    op: ClassVar[Op] = Op.REPLICA_RANGE
    response_type: ClassVar[type[Response]] = ReplicaRangeResponse
    stream: str
    partition: int
    first_offset: int
    end_offset: int
    max_bytes: int

    def __post_init__(self) -> None:
        check_stream(self.stream)
        check_int("partition", self.partition, 0, PARTITION_MAX)
        check_int("first_offset", self.first_offset, 0, OFFSET_MAX)
        check_int("end_offset", self.end_offset, 0, OFFSET_MAX)
        check_int("max_bytes", self.max_bytes, 1, FETCH_BYTES_MAX)
        if self.end_offset <= self.first_offset:
            raise bad("end_offset", f"must be past first_offset {self.first_offset}")


@dataclass(frozen=True, slots=True)
class ScrubResponse(Response):
    """One entry per replica of the stream on the broker (see the module docstring)."""

    broker_id: int
    partitions: list[dict[str, Any]]

    def __post_init__(self) -> None:
        check_int("broker_id", self.broker_id, 0, BROKER_ID_MAX)
        entries = as_list("partitions", self.partitions)
        if len(entries) > SCRUB_PARTITIONS_MAX:
            raise bad("partitions", f"more than {SCRUB_PARTITIONS_MAX}")
        for i, entry in enumerate(entries):
            as_map(f"partitions[{i}]", entry)


@dataclass(frozen=True, slots=True)
class ScrubRequest(Request):
    """Check this broker's replicas of `stream` (one `partition`, or -1: every one) now."""

    op: ClassVar[Op] = Op.SCRUB
    response_type: ClassVar[type[Response]] = ScrubResponse
    stream: str
    partition: int = -1

    def __post_init__(self) -> None:
        check_stream(self.stream)
        check_int("partition", self.partition, -1, PARTITION_MAX)


#: The requests of this module, for the codec's registry.
REQUESTS: tuple[type[Request], ...] = (ReplicaRangeRequest, ScrubRequest)
