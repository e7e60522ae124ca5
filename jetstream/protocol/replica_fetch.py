"""REPLICA_FETCH: one fetch session per follower broker and leader broker, carrying every
partition they share (Kafka's replica fetcher with KIP-227 incremental fetch sessions).

Theory of operation: a follower broker opens a session at a leader broker (`session_id` 0)
and names the partitions it follows there, each with the offset it fetches from (it holds
every offset below), the leader epoch it follows in, why it must stay out of the ISR (unfit)
and whether the leader should check every byte it sends (verify). The leader keeps them in
the session; later requests name only the partitions whose entry changed (a new offset after
an append, a new unfit) and those to forget, at most REPLICA_FETCH_CHANGES_MAX per request
(a session of more partitions is built over a few requests). Each request carries
`session_epoch`, one more than the last; a leader that lost the session, or sees another
epoch, refuses the whole request (FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH)
and the follower opens a new session naming all its partitions again.

The leader answers the partitions that have something to say: records at or past their
offset, a high watermark the follower has not been told, or an error (the partition is no
longer led here, or at another epoch: the follower truncates again and names it anew). A
partition with an error is dropped from the session. When none has anything, the request
long-polls up to `max_wait_ms` for any of them, so an idle pair exchanges one request per
wait, whatever the number of partitions. The records of the answered partitions ride in the
payload, one after another in the order of `partitions`, each `length` bytes.

    op             request header                            response header
    REPLICA_FETCH  replica_id, session_id, session_epoch,    session_id, partitions:
                   max_wait_ms, max_bytes,                   [[stream, partition, error,
                   partition_bytes_max, partitions:           high_watermark,
                   [[stream, partition, offset,               log_start_offset,
                   leader_epoch, unfit, verify]],             log_end_offset, next_offset,
                   forgotten: [[stream, partition]],          leader_epoch, length]] (+ payload)
                   wake=False

A request with `wake` changes nothing: a request of the same session waiting at the leader
returns at once (a partition joined at the follower, and waiting out the long poll would
hold up its first records), and the wake itself is answered at once with no partitions.

`error` is None or an error's header (jetstream.protocol.wire_errors).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from jetstream.errors import JetstreamError, ProtocolError
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
    check_stream,
)
from jetstream.protocol.frames import U32_MAX, Op
from jetstream.protocol.names import is_stream_name
from jetstream.protocol.wire_errors import error_from_header, error_header

#: Most partition entries (changed and forgotten together) one request names: a request
#: header stays well under its 64 KiB limit with stream names of 64 characters.
REPLICA_FETCH_CHANGES_MAX = 500
#: Most partitions one answer describes (the rest are answered by the next request).
REPLICA_FETCH_ANSWERS_MAX = 5_000
#: Unfit reasons on the wire (jetstream.isr.leader.UNFIT_REASONS).
_UNFIT_CHARS_MAX = 16


@dataclass(frozen=True, slots=True)
class SessionPartition:
    """A partition as a follower names it in its session."""

    stream: str
    partition: int
    offset: int
    leader_epoch: int
    unfit: str = ""
    verify: bool = False

    def __post_init__(self) -> None:
        # A well-formed entry passes in one expression (a session carries many); the checks
        # below name what is wrong with another.
        if type(self.partition) is int and type(self.offset) is int and \
                type(self.leader_epoch) is int and type(self.unfit) is str and \
                type(self.verify) is bool and 0 <= self.partition <= PARTITION_MAX and \
                0 <= self.offset <= OFFSET_MAX and 0 <= self.leader_epoch <= EPOCH_MAX and \
                len(self.unfit) <= _UNFIT_CHARS_MAX and is_stream_name(self.stream):
            return
        check_stream(self.stream)
        check_int("partition", self.partition, 0, PARTITION_MAX)
        check_int("offset", self.offset, 0, OFFSET_MAX)
        check_int("leader_epoch", self.leader_epoch, 0, EPOCH_MAX)
        if not isinstance(self.unfit, str) or len(self.unfit) > _UNFIT_CHARS_MAX:
            raise bad("unfit", "must be a short string")
        check_bool("verify", self.verify)

    @property
    def key(self) -> tuple[str, int]:
        return (self.stream, self.partition)

    def to_wire(self) -> list[Any]:
        return self.wire_of(self.stream, self.partition, self.offset, self.leader_epoch,
                            self.unfit, self.verify)

    @staticmethod
    def wire_of(stream: str, partition: int, offset: int, leader_epoch: int, unfit: str,
                verify: bool) -> list[Any]:
        """The wire form, from a follower's own figures (not checked again: the leader
        checks what it decodes)."""
        return [stream, partition, offset, leader_epoch, unfit, verify]

    @classmethod
    def from_wire(cls, value: object) -> SessionPartition:
        entry = as_list("partitions[]", value)
        if len(entry) != 6:
            raise bad("partitions[]", "must be [stream, partition, offset, leader_epoch, "
                                      "unfit, verify]")
        return cls(*entry)


@dataclass(frozen=True, slots=True)
class PartitionAnswer:
    """What the leader says of one partition of the session: an error, or its offsets and
    `length` bytes of record batches in the payload (possibly none: a new HW)."""

    stream: str
    partition: int
    error: JetstreamError | None
    high_watermark: int = 0
    log_start_offset: int = 0
    log_end_offset: int = 0
    next_offset: int = 0
    leader_epoch: int = 0
    length: int = 0

    def __post_init__(self) -> None:
        # As SessionPartition's: the usual answer in one expression, then the named checks.
        if type(self.partition) is int and type(self.high_watermark) is int and \
                type(self.log_start_offset) is int and type(self.log_end_offset) is int and \
                type(self.next_offset) is int and type(self.leader_epoch) is int and \
                type(self.length) is int and 0 <= self.partition <= PARTITION_MAX and \
                0 <= self.high_watermark <= OFFSET_MAX and \
                0 <= self.log_start_offset <= OFFSET_MAX and \
                0 <= self.log_end_offset <= OFFSET_MAX and \
                0 <= self.next_offset <= OFFSET_MAX and \
                0 <= self.leader_epoch <= EPOCH_MAX and 0 <= self.length <= U32_MAX and \
                is_stream_name(self.stream):
            return
        check_stream(self.stream)
        check_int("partition", self.partition, 0, PARTITION_MAX)
        for name in ("high_watermark", "log_start_offset", "log_end_offset", "next_offset"):
            check_int(name, getattr(self, name), 0, OFFSET_MAX)
        check_int("leader_epoch", self.leader_epoch, 0, EPOCH_MAX)
        check_int("length", self.length, 0, U32_MAX)

    @property
    def key(self) -> tuple[str, int]:
        return (self.stream, self.partition)

    def to_wire(self) -> list[Any]:
        wire = self.wire_of(self.stream, self.partition, self.high_watermark,
                            self.log_start_offset, self.log_end_offset, self.next_offset,
                            self.leader_epoch, self.length)
        if self.error is not None:
            wire[2] = error_header(self.error)
        return wire

    @staticmethod
    def wire_of(stream: str, partition: int, high_watermark: int, log_start_offset: int,
                log_end_offset: int, next_offset: int, leader_epoch: int,
                length: int) -> list[Any]:
        """The wire form of an answer with no error, from a leader's own figures (not
        checked again: a follower checks what it decodes)."""
        return [stream, partition, None, high_watermark, log_start_offset, log_end_offset,
                next_offset, leader_epoch, length]

    @classmethod
    def from_wire(cls, value: object) -> PartitionAnswer:
        entry = as_list("partitions[]", value)
        if len(entry) != 9:
            raise bad("partitions[]", "must have 9 fields")
        stream, partition, error, *rest = entry
        if error is not None and not isinstance(error, dict):
            raise bad("partitions[].error", "must be an error header or nil")
        return cls(stream, partition, None if error is None else error_from_header(error),
                   *rest)


@dataclass(frozen=True, slots=True)
class ReplicaFetchResponse(Response):
    """The answered partitions (wire form: see PartitionAnswer); their records ride in the
    payload in this order."""

    session_id: int
    partitions: list[list[Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        check_int("session_id", self.session_id, 1, U32_MAX)
        entries = as_list("partitions", self.partitions)
        if len(entries) > REPLICA_FETCH_ANSWERS_MAX:
            raise bad("partitions", f"more than {REPLICA_FETCH_ANSWERS_MAX}")

    def answers(self) -> list[PartitionAnswer]:
        return [PartitionAnswer.from_wire(entry) for entry in self.partitions]


@dataclass(frozen=True, slots=True)
class ReplicaFetchRequest(Request):
    """Broker `replica_id` fetches every partition of its session (see the module docstring).
    `partitions` are SessionPartition.to_wire() entries: added or changed."""

    op: ClassVar[Op] = Op.REPLICA_FETCH
    response_type: ClassVar[type[Response]] = ReplicaFetchResponse
    replica_id: int
    session_id: int
    session_epoch: int
    max_wait_ms: int
    max_bytes: int
    partition_bytes_max: int
    partitions: list[list[Any]] = field(default_factory=list)
    forgotten: list[list[Any]] = field(default_factory=list)
    #: Only wake this session's request that waits at the leader (it returns at once, so
    #: that the next request names a partition that just joined); answered empty.
    wake: bool = False

    def __post_init__(self) -> None:
        check_bool("wake", self.wake)
        check_int("replica_id", self.replica_id, 0, BROKER_ID_MAX)
        check_int("session_id", self.session_id, 0, U32_MAX)
        check_int("session_epoch", self.session_epoch, 0, U32_MAX)
        if (self.session_id == 0) != (self.session_epoch == 0):
            raise bad("session_epoch", "must be 0 exactly when opening a session")
        check_int("max_wait_ms", self.max_wait_ms, 0, FETCH_WAIT_MS_MAX)
        check_int("max_bytes", self.max_bytes, 1, FETCH_BYTES_MAX)
        check_int("partition_bytes_max", self.partition_bytes_max, 1, FETCH_BYTES_MAX)
        changed = as_list("partitions", self.partitions)
        forgotten = as_list("forgotten", self.forgotten)
        if len(changed) + len(forgotten) > REPLICA_FETCH_CHANGES_MAX:
            raise bad("partitions", f"more than {REPLICA_FETCH_CHANGES_MAX} entries with "
                                    "forgotten")
        for entry in forgotten:
            pair = as_list("forgotten[]", entry)
            if len(pair) != 2:
                raise bad("forgotten[]", "must be [stream, partition]")
            check_stream(pair[0])
            check_int("partition", pair[1], 0, PARTITION_MAX)

    def changed(self) -> list[SessionPartition]:
        return [SessionPartition.from_wire(entry) for entry in self.partitions]

    def forgotten_keys(self) -> list[tuple[str, int]]:
        return [(str(stream), int(partition)) for stream, partition in self.forgotten]


def decode_answers(response: ReplicaFetchResponse, payload: bytes
                   ) -> list[tuple[PartitionAnswer, bytes]]:
    """Each answered partition with its records, cut from the payload. Raises ProtocolError
    when the lengths do not add up to the payload."""
    out: list[tuple[PartitionAnswer, bytes]] = []
    view = memoryview(payload)
    position = 0
    for answer in response.answers():
        end = position + answer.length
        if end > len(payload):
            raise ProtocolError("REPLICA_FETCH answer lengths exceed its payload",
                                field="partitions")
        out.append((answer, bytes(view[position:end])))
        position = end
    if position != len(payload):
        raise ProtocolError("REPLICA_FETCH payload longer than its answers",
                            field="partitions")
    return out


#: The requests of this module, for the codec's registry.
REQUESTS: tuple[type[Request], ...] = (ReplicaFetchRequest,)
