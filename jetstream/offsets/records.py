"""The records of the internal `__offsets` stream: committed offsets and consumer groups.

Theory of operation: consumer positions are data like any other. They live in a compacted,
replicated stream, `__offsets`, whose partition `coordinator_partition(group)` holds all of
one group's records; the leader of that partition is the group's coordinator. Two kinds of
record share it, told apart by their keys (readable, and ordered so that one group's records
are one key range):

    key                                    value (msgpack map)
    o/<group>/<stream>/<partition>         a committed offset: offset, metadata, commit time,
                                           member epoch, the stream's version
    g/<group>                              the group: its epoch and its members (epoch,
                                           session timeout, the partitions each may consume)

Group and stream names are `[A-Za-z0-9_-]`, so "/" cannot occur inside them. A null value is
a tombstone, as in any compacted stream: an expired or deleted offset, an empty group. The
committed offset is where reading resumes (Kafka's convention: the next offset to read).
`stream_version` is the stream's creation version when the offset was committed: the offset
of a stream deleted and created again under the same name is void.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any, NamedTuple

import msgpack

from jetstream.errors import CorruptRecord

#: The internal stream of committed offsets and consumer groups.
OFFSETS_STREAM = "__offsets"
#: Streams whose names start with this are the system's own: users cannot create, delete,
#: update or publish to them.
INTERNAL_PREFIX = "__"
OFFSETS_PARTITIONS_DEFAULT = 16
OFFSET_PREFIX = b"o/"
GROUP_PREFIX = b"g/"
_FORMAT = 1


class StreamPartition(NamedTuple):
    """One partition of one stream (Kafka's TopicPartition)."""

    stream: str
    partition: int

    def __str__(self) -> str:
        return f"{self.stream}/{self.partition}"


def is_internal(stream: str) -> bool:
    return stream.startswith(INTERNAL_PREFIX)


def coordinator_partition(group: str, partitions: int) -> int:
    """The `__offsets` partition that holds `group`'s records; its leader coordinates it."""
    return zlib.crc32(group.encode()) % partitions


def offset_key(group: str, sp: StreamPartition) -> bytes:
    return f"o/{group}/{sp.stream}/{sp.partition}".encode()


def group_offsets_prefix(group: str) -> bytes:
    return f"o/{group}/".encode()


def group_key(group: str) -> bytes:
    return f"g/{group}".encode()


def parse_offset_key(key: bytes) -> tuple[str, StreamPartition] | None:
    """(group, partition) of an offset key; None for any other key."""
    if not key.startswith(OFFSET_PREFIX):
        return None
    parts = key[len(OFFSET_PREFIX):].decode(errors="replace").split("/")
    if len(parts) != 3 or not parts[2].isdigit():
        return None
    return parts[0], StreamPartition(parts[1], int(parts[2]))


def parse_group_key(key: bytes) -> str | None:
    if not key.startswith(GROUP_PREFIX):
        return None
    return key[len(GROUP_PREFIX):].decode(errors="replace")


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    """A group's position in one partition: `offset` is the next offset it reads."""

    offset: int
    metadata: str = ""
    commit_time_ms: int = 0
    member_epoch: int = -1
    stream_version: int = 0


def encode_offset(value: CommittedOffset) -> bytes:
    return msgpack.packb({"v": _FORMAT, "offset": value.offset, "metadata": value.metadata,
                          "time": value.commit_time_ms, "epoch": value.member_epoch,
                          "stream_version": value.stream_version})


def decode_offset(data: bytes) -> CommittedOffset:
    """Raises CorruptRecord when `data` is not an offset record."""
    fields = _unpack(data, "offset")
    try:
        return CommittedOffset(int(fields["offset"]), str(fields.get("metadata", "")),
                               int(fields.get("time", 0)), int(fields.get("epoch", -1)),
                               int(fields.get("stream_version", 0)))
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptRecord(f"__offsets: bad offset record: {exc}") from None


@dataclass(frozen=True, slots=True)
class StoredMember:
    """What survives a coordinator's failover of one member: who it is, its epoch, how long
    its session lasts, what it subscribes to, and the partitions it may be consuming."""

    member_id: str
    client_id: str
    epoch: int
    previous_epoch: int
    session_timeout_ms: int
    streams: tuple[str, ...]
    owned: frozenset[StreamPartition]


@dataclass(frozen=True, slots=True)
class StoredGroup:
    epoch: int
    members: tuple[StoredMember, ...]


def encode_group(group: StoredGroup) -> bytes:
    members = [{"id": m.member_id, "client": m.client_id, "epoch": m.epoch,
                "previous_epoch": m.previous_epoch, "session_ms": m.session_timeout_ms,
                "streams": list(m.streams),
                "owned": sorted([sp.stream, sp.partition] for sp in m.owned)}
               for m in group.members]
    return msgpack.packb({"v": _FORMAT, "epoch": group.epoch, "members": members})


def decode_group(data: bytes) -> StoredGroup:
    """Raises CorruptRecord when `data` is not a group record."""
    fields = _unpack(data, "group")
    try:
        members = tuple(
            StoredMember(str(m["id"]), str(m.get("client", "")), int(m["epoch"]),
                         int(m.get("previous_epoch", m["epoch"])), int(m["session_ms"]),
                         tuple(str(s) for s in m.get("streams", ())),
                         frozenset(StreamPartition(str(s), int(p)) for s, p in m["owned"]))
            for m in fields["members"])
        return StoredGroup(int(fields["epoch"]), members)
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptRecord(f"__offsets: bad group record: {exc}") from None


def _unpack(data: bytes, kind: str) -> dict[str, Any]:
    try:
        fields = msgpack.unpackb(data)
    except Exception as exc:  # msgpack raises several unrelated types on bad input
        raise CorruptRecord(f"__offsets: undecodable {kind} record: {exc}") from None
    if not isinstance(fields, dict) or fields.get("v") != _FORMAT:
        raise CorruptRecord(f"__offsets: {kind} record of an unknown format")
    return fields
