"""Messages of reads by key from compacted streams (the replicated KV table).

Theory of operation: a compacted partition's replicas keep an index of their committed
records by key (jetstream.compaction.key_index). GET answers a key's newest committed record
from it; KEYS pages over live keys. Both go to the partition's leader, or with `read_replica`
to an in-sync follower, which answers from what it has committed. `min_offset` makes a read
wait (at most `max_wait_ms`) until the index covers that offset: read-your-writes after a
publish ack.

    op     request header                                    response header
    GET    stream, partition, key: bin, min_offset=-1,       found, deleted, offset=-1,
           max_wait_ms=0, read_replica=false                 timestamp_ms=-1, value: bin|nil,
                                                             headers: {str: bin}, covered_offset
    KEYS   stream, partition, prefix: bin, after: bin|nil,   keys: [bin]
           limit, read_replica=false
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from jetstream.protocol.base import Request, Response
from jetstream.protocol.fields import (
    FETCH_WAIT_MS_MAX,
    OFFSET_MAX,
    PARTITION_MAX,
    bad,
    check_bool,
    check_int,
    check_stream,
)
from jetstream.protocol.frames import Op

#: Longest key a request may name, and most keys one KEYS answer holds.
KEY_BYTES_MAX = 64 * 1024
KEYS_LIMIT_MAX = 10_000


def _check_bytes(name: str, value: object, bytes_max: int) -> None:
    if not isinstance(value, bytes) or len(value) > bytes_max:
        raise bad(name, f"must be bytes of at most {bytes_max}")


@dataclass(frozen=True, slots=True)
class GetResponse(Response):
    """`found`: the key has a committed record (`deleted` when it is a tombstone: `value` is
    then None). `covered_offset`: the index holds every committed record below it."""

    found: bool
    deleted: bool = False
    offset: int = -1
    timestamp_ms: int = -1
    value: bytes | None = None
    headers: dict[str, bytes] = field(default_factory=dict)
    covered_offset: int = 0

    def __post_init__(self) -> None:
        check_bool("found", self.found)
        check_bool("deleted", self.deleted)
        check_int("offset", self.offset, -1, OFFSET_MAX)
        check_int("covered_offset", self.covered_offset, 0, OFFSET_MAX)
        if self.value is not None and not isinstance(self.value, bytes):
            raise bad("value", "must be bytes or nil")


@dataclass(frozen=True, slots=True)
class GetRequest(Request):
    op: ClassVar[Op] = Op.GET
    response_type: ClassVar[type[Response]] = GetResponse
    stream: str
    partition: int
    key: bytes
    min_offset: int = -1
    max_wait_ms: int = 0
    read_replica: bool = False

    def __post_init__(self) -> None:
        check_stream(self.stream)
        check_int("partition", self.partition, 0, PARTITION_MAX)
        _check_bytes("key", self.key, KEY_BYTES_MAX)
        check_int("min_offset", self.min_offset, -1, OFFSET_MAX)
        check_int("max_wait_ms", self.max_wait_ms, 0, FETCH_WAIT_MS_MAX)
        check_bool("read_replica", self.read_replica)


@dataclass(frozen=True, slots=True)
class KeysResponse(Response):
    keys: list[bytes]

    def __post_init__(self) -> None:
        if not isinstance(self.keys, list) or len(self.keys) > KEYS_LIMIT_MAX:
            raise bad("keys", f"must be a list of at most {KEYS_LIMIT_MAX} keys")
        for i, key in enumerate(self.keys):
            _check_bytes(f"keys[{i}]", key, KEY_BYTES_MAX)


@dataclass(frozen=True, slots=True)
class KeysRequest(Request):
    op: ClassVar[Op] = Op.KEYS
    response_type: ClassVar[type[Response]] = KeysResponse
    stream: str
    partition: int
    prefix: bytes = b""
    after: bytes | None = None
    limit: int = 1000
    read_replica: bool = False

    def __post_init__(self) -> None:
        check_stream(self.stream)
        check_int("partition", self.partition, 0, PARTITION_MAX)
        _check_bytes("prefix", self.prefix, KEY_BYTES_MAX)
        if self.after is not None:
            _check_bytes("after", self.after, KEY_BYTES_MAX)
        check_int("limit", self.limit, 1, KEYS_LIMIT_MAX)
        check_bool("read_replica", self.read_replica)


#: The requests of this module, for the codec's registry.
REQUESTS: tuple[type[Request], ...] = (GetRequest, KeysRequest)
