"""The socket API's mirror copy: whole record batches of a source partition, appended as
they are to the same partition of a mirror stream (jetstream.server.mirror_api).

    op             request header                                  response header
    MIRROR_APPEND  stream, partition, source, owner, epoch,        log_end_offset,
                   ack_policy; payload: whole record batches        appended_records

The payload holds whole batches as the source stores them (jetstream.stream.format), which
keep their offsets: the first batch's base offset is where the copy claims to start. `source`
must be the stream's `mirror` setting; `owner` and `epoch` fence an older copier (the
datastream and its task's assignment epoch). `ack_policy` "" takes the stream's.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar, Self

from jetstream.protocol.base import Request, Response
from jetstream.protocol.fields import (
    EPOCH_MAX,
    OFFSET_MAX,
    PARTITION_MAX,
    bad,
    check_int,
    check_str,
    check_stream,
)
from jetstream.protocol.frames import Op

SOURCE_CHARS_MAX = 512
OWNER_CHARS_MAX = 256
ACK_POLICIES = ("", "none", "leader", "all")


@dataclass(frozen=True, slots=True)
class MirrorAppendResponse(Response):
    #: The partition's log end offset after the copy (where the next copy starts).
    log_end_offset: int
    #: Records appended (0: the partition held every batch already: a retry).
    appended_records: int

    def __post_init__(self) -> None:
        check_int("log_end_offset", self.log_end_offset, 0, OFFSET_MAX)
        check_int("appended_records", self.appended_records, 0, OFFSET_MAX)


@dataclass(frozen=True, slots=True)
class MirrorAppendRequest(Request):
    op: ClassVar[Op] = Op.MIRROR_APPEND
    response_type: ClassVar[type[Response]] = MirrorAppendResponse
    stream: str
    partition: int
    source: str
    owner: str
    epoch: int
    ack_policy: str = ""
    #: The batches: the frame's payload, never in the header.
    data: bytes = field(default=b"", repr=False)

    def __post_init__(self) -> None:
        check_stream(self.stream)
        check_int("partition", self.partition, 0, PARTITION_MAX)
        check_str("source", self.source, SOURCE_CHARS_MAX)
        check_str("owner", self.owner, OWNER_CHARS_MAX)
        check_int("epoch", self.epoch, 0, EPOCH_MAX)
        if self.ack_policy not in ACK_POLICIES:
            raise bad("ack_policy", f"must be one of {list(ACK_POLICIES)}")
        if not isinstance(self.data, bytes | bytearray | memoryview):
            raise bad("data", "must be bytes")

    def to_header(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "data"}

    def with_payload(self, payload: bytes) -> Self:
        return replace(self, data=payload)


REQUESTS: tuple[type[Request], ...] = (MirrorAppendRequest,)
