"""Messages of the data plane's reads: Fetch, the offset lookup by timestamp, and the listing
of a partition's segment files.

Theory of operation: consumers and followers read a partition with the same Fetch (Kafka's
shape): from an offset, at most max_bytes (but always one whole batch, so a reader always
progresses), long-polling up to max_wait_ms when nothing is there yet. A consumer reads what
is committed (below the high watermark); a follower names itself (`replica_id`), reads
uncommitted records, and its fetch offset is its log end offset, which is how the leader
learns it. The records ride in the response frame's payload as whole record batches straight
from the segment file; the header carries the partition's offsets. OffsetForTimestamp turns
a time (or the EARLIEST/LATEST sentinels) into the offset a reader starts from.
LIST_SEGMENTS is for bulk readers (Spark) that read a partition's segment files themselves:
the leader answers where its log lives and one consistent snapshot of its segments (base
offset and size in bytes, oldest first) with the high watermark of the same moment. A file
is `log_file_name(base)` in `directory`; a reader reads at most `size_bytes` of it and no
record at or past the high watermark (the active segment holds uncommitted records too).
Retention may delete a listed file and compaction may replace it after the answer: a reader
that cannot open one, or finds it shorter than listed, fetches that range instead.

    op                    request header                        response header
    FETCH                 stream, partition, offset, max_bytes, stream, partition,
                          max_wait_ms, leader_epoch=-1,         high_watermark,
                          replica_id=-1, isolation="committed", log_start_offset,
                          read_replica=false, verify=false,     log_end_offset, next_offset,
                          unfit=""                              leader_epoch (+ payload)
    OFFSET_FOR_TIMESTAMP  stream, partition, timestamp_ms       offset (-1: none)
    LIST_SEGMENTS         stream, partition                     stream, partition,
                                                                high_watermark,
                                                                log_start_offset,
                                                                log_end_offset, leader_epoch,
                                                                broker_id, directory: str,
                                                                version_file: str,
                                                                stream_version: str,
                                                                segments: [[base_offset,
                                                                            size_bytes]]
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import ClassVar, Literal

from jetstream.protocol.base import Request, Response
from jetstream.protocol.fields import (
    BROKER_ID_MAX,
    EPOCH_MAX,
    FETCH_BYTES_MAX,
    FETCH_WAIT_MS_MAX,
    OFFSET_MAX,
    PARTITION_MAX,
    as_list,
    bad,
    check_bool,
    check_int,
    check_str,
    check_stream,
)
from jetstream.protocol.frames import RESPONSE_HEADER_BYTES_MAX, Op

#: timestamp_ms sentinels of OffsetForTimestamp (Kafka's): the log start and the log end.
EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1

Isolation = Literal["committed", "uncommitted"]
_ISOLATIONS = ("committed", "uncommitted")
_UNFIT = ("", "corrupt", "disk_full")

#: Most segments one ListSegments answer lists: at 64 MiB a segment, 6 PiB of partition.
SEGMENTS_MAX = 100_000
#: Longest path a ListSegments answer names (Linux's PATH_MAX), and longest stream version.
PATH_CHARS_MAX = 4096
STREAM_VERSION_CHARS_MAX = 64
# A segment entry in msgpack is at most a fixarray byte and two uint64s (9 bytes each); a
# path at most 4 bytes a character. The largest answer must fit a response header.
_SEGMENT_ENTRY_BYTES_MAX = 1 + 9 + 9
assert (SEGMENTS_MAX * _SEGMENT_ENTRY_BYTES_MAX + 2 * 4 * PATH_CHARS_MAX + 64 * 1024
        <= RESPONSE_HEADER_BYTES_MAX)


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
    #: Check every byte sent against its CRC, even bytes the broker counts as checked: a
    #: reader asks for it after it met a CRC mismatch (damage since they were checked).
    verify: bool = False
    #: A replica that must not be in the ISR now says why ("corrupt": its copy has damage
    #: not yet healed; "disk_full": it cannot take appends); "" when it may be.
    unfit: str = ""

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
        check_bool("verify", self.verify)
        if self.unfit not in _UNFIT or (self.unfit and self.replica_id < 0):
            raise bad("unfit", f"is a replica's, one of {list(_UNFIT)}, got {self.unfit!r}")


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


def _check_path(name: str, value: object) -> None:
    check_str(name, value, PATH_CHARS_MAX)
    assert isinstance(value, str)
    if not PurePosixPath(value).is_absolute():
        raise bad(name, f"must be an absolute path, got {value!r}")


@dataclass(frozen=True, slots=True)
class ListSegmentsResponse(Response):
    """One snapshot of the leader's log: its segments as `[base_offset, size_bytes]`, oldest
    first, with the offsets and high watermark of the same moment. The first segment holds
    the log start offset (its base may lie below it); the last is the active segment, where
    appends go. `directory` and `version_file` are absolute paths on the answering broker;
    `stream_version` is the version file's contents (the partition's created_version), by
    which a reader tells the files of this stream from those of an earlier one of the same
    name."""

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
    segments: list[list[int]]

    def __post_init__(self) -> None:
        check_stream(self.stream)
        check_int("partition", self.partition, 0, PARTITION_MAX)
        check_int("high_watermark", self.high_watermark, 0, OFFSET_MAX)
        check_int("log_start_offset", self.log_start_offset, 0, OFFSET_MAX)
        check_int("log_end_offset", self.log_end_offset, 0, OFFSET_MAX)
        check_int("leader_epoch", self.leader_epoch, 0, EPOCH_MAX)
        check_int("broker_id", self.broker_id, 0, BROKER_ID_MAX)
        if not self.log_start_offset <= self.high_watermark <= self.log_end_offset:
            raise bad("high_watermark", f"{self.high_watermark} is outside [log_start_offset "
                                        f"{self.log_start_offset}, log_end_offset "
                                        f"{self.log_end_offset}]")
        _check_path("directory", self.directory)
        _check_path("version_file", self.version_file)
        check_str("stream_version", self.stream_version, STREAM_VERSION_CHARS_MAX)
        if not self.stream_version:
            raise bad("stream_version", "must not be empty")
        if isinstance(self.segments, list | tuple):  # the wire's shape: lists of lists
            object.__setattr__(self, "segments", [
                list(entry) if isinstance(entry, tuple) else entry for entry in self.segments])
        self._check_segments(as_list("segments", self.segments))

    def _check_segments(self, segments: list[object]) -> None:
        if not 1 <= len(segments) <= SEGMENTS_MAX:
            raise bad("segments", f"must list 1 to {SEGMENTS_MAX} segments, got "
                                  f"{len(segments)}")
        previous = -1
        for i, entry in enumerate(segments):
            if not isinstance(entry, list) or len(entry) != 2:
                raise bad(f"segments[{i}]", "must be [base_offset, size_bytes]")
            base, size = entry
            check_int(f"segments[{i}].base_offset", base, 0, OFFSET_MAX)
            check_int(f"segments[{i}].size_bytes", size, 0, OFFSET_MAX)
            if i == 0 and base > self.log_start_offset:
                raise bad("segments[0].base_offset", f"{base} is past the log start offset "
                                                     f"{self.log_start_offset}")
            if base <= previous:
                raise bad(f"segments[{i}].base_offset", f"{base} does not follow {previous}")
            if base > self.log_end_offset:
                raise bad(f"segments[{i}].base_offset", f"{base} is past the log end offset "
                                                        f"{self.log_end_offset}")
            previous = base


@dataclass(frozen=True, slots=True)
class ListSegmentsRequest(Request):
    """The partition's segment files at its leader (NOT_LEADER elsewhere): see
    ListSegmentsResponse."""

    op: ClassVar[Op] = Op.LIST_SEGMENTS
    response_type: ClassVar[type[Response]] = ListSegmentsResponse
    stream: str
    partition: int

    def __post_init__(self) -> None:
        check_stream(self.stream)
        check_int("partition", self.partition, 0, PARTITION_MAX)


#: The requests of this module, for the codec's registry.
REQUESTS: tuple[type[Request], ...] = (FetchRequest, OffsetForTimestampRequest,
                                       ListSegmentsRequest)
