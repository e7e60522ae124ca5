"""Messages of committed offsets: commit, fetch, reset, and deleting a group's offsets.

Theory of operation: a group stores, per partition it reads, the next offset it will read
(Kafka's convention: the committed offset is where reading resumes) and a short metadata
string of its own. Each request goes to the group's coordinator (FIND_COORDINATOR in
groups.py). A commit names many partitions; a member of the group commits with its id and
epoch (refused when stale), a consumer that manages its partitions itself without (allowed
while the group has no members). Each partition's commit succeeds or fails alone: `failed`
lists the ones that failed, with their errors (the error maps of wire_errors.py). A fetch
answers -1 for a partition with no committed offset. RESET_OFFSETS and DELETE_GROUP change
a group's offsets outside of its commits and are refused while the group has members.

    op              request header                            response header
    COMMIT_OFFSET   group, offsets: [{stream, partition,      failed: [{stream, partition,
                    offset, metadata=""}], member_id="",      error: {code, message, ...}}]
                    member_epoch=-1
    FETCH_OFFSET    group, partitions: [{stream, partition}]  offsets: [{stream, partition,
                    | nil (nil: every committed one)          offset, metadata,
                                                              commit_time_ms, member_epoch}]
    RESET_OFFSETS   group, offsets: [{stream, partition,      {}
                    offset}]
    DELETE_GROUP    group                                     deleted_offsets
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from jetstream.protocol.base import EmptyResponse, Request, Response
from jetstream.protocol.fields import (
    OFFSET_MAX,
    OFFSET_METADATA_CHARS_MAX,
    PARTITION_MAX,
    as_list,
    as_map,
    bad,
    check_group,
    check_int,
    check_str,
    check_stream,
    required,
)
from jetstream.protocol.frames import Op

#: Most partitions one commit or fetch names.
OFFSETS_PER_REQUEST_MAX = 10_000
MEMBER_ID_CHARS_MAX = 64
MEMBER_EPOCH_MAX = 2**62
#: Where a reset may move a group's offsets (the client resolves them to offsets).
RESET_TARGETS = ("earliest", "latest", "offset", "timestamp")


def check_member(member_id: object, member_epoch: object) -> None:
    check_str("member_id", member_id, MEMBER_ID_CHARS_MAX)
    check_int("member_epoch", member_epoch, -1, MEMBER_EPOCH_MAX)


def _check_partition_ref(name: str, entry: object) -> dict[str, Any]:
    entry = as_map(name, entry)
    check_stream(required(name, entry, "stream"), f"{name}.stream")
    check_int(f"{name}.partition", required(name, entry, "partition"), 0, PARTITION_MAX)
    return entry


def _check_entries(name: str, entries: object) -> list[Any]:
    entries = as_list(name, entries)
    if len(entries) > OFFSETS_PER_REQUEST_MAX:
        raise bad(name, f"names more than {OFFSETS_PER_REQUEST_MAX} partitions")
    return entries


def _check_offsets(name: str, entries: object, *, low: int = 0,
                   required_one: bool = True) -> None:
    """A list of {stream, partition, offset, metadata=""} maps; `low` is the least offset."""
    entries = _check_entries(name, entries)
    if required_one and not entries:
        raise bad(name, "must name at least one partition")
    for i, entry in enumerate(entries):
        entry = _check_partition_ref(f"{name}[{i}]", entry)
        check_int(f"{name}[{i}].offset", required(f"{name}[{i}]", entry, "offset"), low,
                  OFFSET_MAX)
        check_str(f"{name}[{i}].metadata", entry.get("metadata", ""),
                  OFFSET_METADATA_CHARS_MAX)


@dataclass(frozen=True, slots=True)
class CommitOffsetResponse(Response):
    failed: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        for i, entry in enumerate(_check_entries("failed", self.failed)):
            entry = _check_partition_ref(f"failed[{i}]", entry)
            error = as_map(f"failed[{i}].error", required(f"failed[{i}]", entry, "error"))
            check_str(f"failed[{i}].error.code", required(f"failed[{i}].error", error, "code"),
                      64)


@dataclass(frozen=True, slots=True)
class CommitOffsetRequest(Request):
    """Store each entry's `offset` (the next offset the group reads) for the group."""

    op: ClassVar[Op] = Op.COMMIT_OFFSET
    response_type: ClassVar[type[Response]] = CommitOffsetResponse
    group: str
    offsets: list[dict[str, Any]]
    member_id: str = ""
    member_epoch: int = -1

    def __post_init__(self) -> None:
        check_group(self.group)
        check_member(self.member_id, self.member_epoch)
        _check_offsets("offsets", self.offsets)


@dataclass(frozen=True, slots=True)
class FetchOffsetResponse(Response):
    """One entry per partition asked for (offset -1: nothing committed), or per committed
    partition of the group when none were named."""

    offsets: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        _check_offsets("offsets", self.offsets, low=-1, required_one=False)


@dataclass(frozen=True, slots=True)
class FetchOffsetRequest(Request):
    op: ClassVar[Op] = Op.FETCH_OFFSET
    response_type: ClassVar[type[Response]] = FetchOffsetResponse
    group: str
    partitions: list[dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        check_group(self.group)
        if self.partitions is not None:
            for i, entry in enumerate(_check_entries("partitions", self.partitions)):
                _check_partition_ref(f"partitions[{i}]", entry)


@dataclass(frozen=True, slots=True)
class ResetOffsetsRequest(Request):
    """Set the group's offsets to these, forwards or backwards (the requester resolved
    `earliest`, `latest` or a time to offsets). Refused while the group has members."""

    op: ClassVar[Op] = Op.RESET_OFFSETS
    response_type: ClassVar[type[Response]] = EmptyResponse
    group: str
    offsets: list[dict[str, Any]]

    def __post_init__(self) -> None:
        check_group(self.group)
        _check_offsets("offsets", self.offsets)


@dataclass(frozen=True, slots=True)
class DeleteGroupResponse(Response):
    deleted_offsets: int = 0

    def __post_init__(self) -> None:
        check_int("deleted_offsets", self.deleted_offsets, 0, OFFSET_MAX)


@dataclass(frozen=True, slots=True)
class GroupRequest(Request):
    """A request that names only a group."""

    group: str

    def __post_init__(self) -> None:
        check_group(self.group)


@dataclass(frozen=True, slots=True)
class DeleteGroupRequest(GroupRequest):
    """Delete the group's committed offsets (tombstones). Refused while it has members."""

    op: ClassVar[Op] = Op.DELETE_GROUP
    response_type: ClassVar[type[Response]] = DeleteGroupResponse


#: The requests of this module, for the codec's registry.
REQUESTS: tuple[type[Request], ...] = (CommitOffsetRequest, FetchOffsetRequest,
                                       ResetOffsetsRequest, DeleteGroupRequest)
