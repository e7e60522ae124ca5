"""Messages of a consumer group's committed offsets: commit and fetch.

Theory of operation: a group stores, per partition it reads, the next offset it will read
(Kafka's convention: the committed offset is where reading resumes) and a short metadata
string of its own. A group that has committed nothing for a partition gets -1 back and
chooses where to start itself. The group's membership (join, heartbeat, leave) is another
concern with messages of its own.

    op                    request header                        response header
    COMMIT_OFFSET         group, stream, partition, offset,     {}
                          metadata=""
    FETCH_OFFSET          group, stream, partition              offset (-1: none), metadata
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from jetstream.protocol.base import EmptyResponse, Request, Response
from jetstream.protocol.fields import (
    OFFSET_MAX,
    OFFSET_METADATA_CHARS_MAX,
    PARTITION_MAX,
    check_group,
    check_int,
    check_str,
    check_stream,
)
from jetstream.protocol.frames import Op


@dataclass(frozen=True, slots=True)
class CommitOffsetRequest(Request):
    """Store `offset` (the next offset the group will read) for the group."""

    op: ClassVar[Op] = Op.COMMIT_OFFSET
    response_type: ClassVar[type[Response]] = EmptyResponse
    group: str
    stream: str
    partition: int
    offset: int
    metadata: str = ""

    def __post_init__(self) -> None:
        check_group(self.group)
        check_stream(self.stream)
        check_int("partition", self.partition, 0, PARTITION_MAX)
        check_int("offset", self.offset, 0, OFFSET_MAX)
        check_str("metadata", self.metadata, OFFSET_METADATA_CHARS_MAX)


@dataclass(frozen=True, slots=True)
class FetchOffsetResponse(Response):
    """-1 when the group has committed nothing for the partition."""

    offset: int
    metadata: str = ""

    def __post_init__(self) -> None:
        check_int("offset", self.offset, -1, OFFSET_MAX)
        check_str("metadata", self.metadata, OFFSET_METADATA_CHARS_MAX)


@dataclass(frozen=True, slots=True)
class FetchOffsetRequest(Request):
    op: ClassVar[Op] = Op.FETCH_OFFSET
    response_type: ClassVar[type[Response]] = FetchOffsetResponse
    group: str
    stream: str
    partition: int

    def __post_init__(self) -> None:
        check_group(self.group)
        check_stream(self.stream)
        check_int("partition", self.partition, 0, PARTITION_MAX)


#: The requests of this module, for the codec's registry.
REQUESTS: tuple[type[Request], ...] = (CommitOffsetRequest, FetchOffsetRequest)
