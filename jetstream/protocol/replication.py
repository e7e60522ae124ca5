"""Messages between brokers about replication: where an epoch ended, and a lost leader.

Theory of operation: a replica that restarts, or follows a new leader, asks the leader where
the last epoch it holds ended (KIP-101's OffsetsForLeaderEpoch) and truncates its log there
before fetching, so a suffix the old leader wrote but never committed cannot survive next to
the new leader's history. `current_leader_epoch` (KIP-320) fences a replica that follows in
an older epoch. A follower that gets no answer from its leader reports it to the metadata
leader's broker, whose failover controller counts the reports of the ISR before it moves
leadership. Fetch itself (the replication stream) is a read: reads.py.

    op                    request header                        response header
    END_OFFSET_FOR_EPOCH  stream, partition, leader_epoch,      leader_epoch, end_offset
                          current_leader_epoch=-1               (-1, -1: unknown epoch),
                                                                log_start_offset
    REPORT_LEADER_FAILURE stream, partition, leader_epoch,      {}
                          reporter
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from jetstream.protocol.base import EmptyResponse, Request, Response
from jetstream.protocol.fields import (
    BROKER_ID_MAX,
    EPOCH_MAX,
    OFFSET_MAX,
    PARTITION_MAX,
    check_int,
    check_stream,
)
from jetstream.protocol.frames import Op


@dataclass(frozen=True, slots=True)
class EndOffsetForEpochResponse(Response):
    """The largest epoch <= the requested one and the offset after its last record; the
    current epoch's end is the leader's LEO. -1 and -1 when the leader knows no such epoch.
    `log_start_offset`: the first offset the leader serves, which a truncation step needs
    too (a replica behind it starts over there)."""

    leader_epoch: int
    end_offset: int
    log_start_offset: int

    def __post_init__(self) -> None:
        check_int("leader_epoch", self.leader_epoch, -1, EPOCH_MAX)
        check_int("end_offset", self.end_offset, -1, OFFSET_MAX)
        check_int("log_start_offset", self.log_start_offset, 0, OFFSET_MAX)


@dataclass(frozen=True, slots=True)
class EndOffsetForEpochRequest(Request):
    """KIP-101: a replica that restarts asks the leader where `leader_epoch` ended, and
    truncates its log there. `current_leader_epoch` (KIP-320; -1: unchecked) is the epoch the
    replica follows in: a leader at another epoch answers FENCED_LEADER_EPOCH instead."""

    op: ClassVar[Op] = Op.END_OFFSET_FOR_EPOCH
    response_type: ClassVar[type[Response]] = EndOffsetForEpochResponse
    stream: str
    partition: int
    leader_epoch: int
    current_leader_epoch: int = -1

    def __post_init__(self) -> None:
        check_stream(self.stream)
        check_int("partition", self.partition, 0, PARTITION_MAX)
        check_int("leader_epoch", self.leader_epoch, 0, EPOCH_MAX)
        check_int("current_leader_epoch", self.current_leader_epoch, -1, EPOCH_MAX)


@dataclass(frozen=True, slots=True)
class ReportLeaderFailureRequest(Request):
    """Broker `reporter`, a follower, gets no answer from the leader of `stream/partition` at
    `leader_epoch`; sent to the metadata leader's broker, whose failover controller counts
    it. Answered with an empty response (ignored by a broker that does not lead)."""

    op: ClassVar[Op] = Op.REPORT_LEADER_FAILURE
    response_type: ClassVar[type[Response]] = EmptyResponse
    stream: str
    partition: int
    leader_epoch: int
    reporter: int

    def __post_init__(self) -> None:
        check_stream(self.stream)
        check_int("partition", self.partition, 0, PARTITION_MAX)
        check_int("leader_epoch", self.leader_epoch, 0, EPOCH_MAX)
        check_int("reporter", self.reporter, 0, BROKER_ID_MAX)


#: The requests of this module, for the codec's registry.
REQUESTS: tuple[type[Request], ...] = (EndOffsetForEpochRequest, ReportLeaderFailureRequest)
