"""Messages of consumer groups: finding the coordinator, the member heartbeat, listing and
describing groups.

Theory of operation: a group's coordinator is the leader of its `__offsets` partition;
FIND_COORDINATOR (to any broker) names it, creating `__offsets` on first use. A member talks
to the coordinator with one operation, GROUP_HEARTBEAT (KIP-848's shape): epoch 0 joins,
-1 leaves, anything else keeps the session alive and reports the partitions the member is
consuming (`owned`). The answer carries the member's id and epoch and the partitions it may
consume now. A heartbeat with nothing new to answer is held up to `max_wait_ms` and answered
as soon as the member's assignment changes, so a rebalance reaches members at once. A member
subscribes to `streams`, or to every stream whose labels match `selector`.

    op                request header                          response header
    FIND_COORDINATOR  group                                   partition, broker_id, host, port
    GROUP_HEARTBEAT   group, member_id, member_epoch,         member_id, member_epoch,
                      streams: [str], selector="",            assignment: [[stream, partition]],
                      owned: [[stream, partition]],           heartbeat_interval_ms,
                      session_timeout_ms, max_wait_ms=0,      session_timeout_ms
                      client_id=""
    LIST_GROUPS       {}                                      groups: [{group, state, members,
                                                              partition}]
    DESCRIBE_GROUP    group                                   group: {state, group_epoch,
                                                              members: [...], offsets: [...]}
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from jetstream.protocol import names
from jetstream.protocol.base import Request, Response
from jetstream.protocol.fields import (
    BROKER_ID_MAX,
    FETCH_WAIT_MS_MAX,
    HOST_CHARS_MAX,
    PARTITION_MAX,
    PORT_MAX,
    as_list,
    as_map,
    bad,
    check_group,
    check_int,
    check_str,
    check_stream,
)
from jetstream.protocol.frames import Op
from jetstream.protocol.offsets import GroupRequest, check_member

#: Most streams one member subscribes to by name, and most partitions it reports.
SUBSCRIBED_STREAMS_MAX = 1000
OWNED_PARTITIONS_MAX = 65_536
SESSION_TIMEOUT_MS_MAX = 30 * 60 * 1000
CLIENT_ID_CHARS_MAX = 256


def check_partition_pairs(name: str, value: object, count_max: int) -> None:
    pairs = as_list(name, value)
    if len(pairs) > count_max:
        raise bad(name, f"names more than {count_max} partitions")
    for i, pair in enumerate(pairs):
        if not isinstance(pair, list | tuple) or len(pair) != 2:
            raise bad(f"{name}[{i}]", "must be [stream, partition]")
        check_stream(pair[0], f"{name}[{i}].stream")
        check_int(f"{name}[{i}].partition", pair[1], 0, PARTITION_MAX)


@dataclass(frozen=True, slots=True)
class FindCoordinatorResponse(Response):
    partition: int
    broker_id: int
    host: str
    port: int

    def __post_init__(self) -> None:
        check_int("partition", self.partition, 0, PARTITION_MAX)
        check_int("broker_id", self.broker_id, 0, BROKER_ID_MAX)
        check_str("host", self.host, HOST_CHARS_MAX)
        check_int("port", self.port, 1, PORT_MAX)


@dataclass(frozen=True, slots=True)
class FindCoordinatorRequest(GroupRequest):
    op: ClassVar[Op] = Op.FIND_COORDINATOR
    response_type: ClassVar[type[Response]] = FindCoordinatorResponse


@dataclass(frozen=True, slots=True)
class GroupHeartbeatResponse(Response):
    member_id: str
    member_epoch: int
    assignment: list[list[Any]] = field(default_factory=list)
    heartbeat_interval_ms: int = 1000
    session_timeout_ms: int = 10_000

    def __post_init__(self) -> None:
        check_member(self.member_id, self.member_epoch)
        check_partition_pairs("assignment", self.assignment, OWNED_PARTITIONS_MAX)
        check_int("heartbeat_interval_ms", self.heartbeat_interval_ms, 1,
                  SESSION_TIMEOUT_MS_MAX)
        check_int("session_timeout_ms", self.session_timeout_ms, 1, SESSION_TIMEOUT_MS_MAX)


@dataclass(frozen=True, slots=True)
class GroupHeartbeatRequest(Request):
    op: ClassVar[Op] = Op.GROUP_HEARTBEAT
    response_type: ClassVar[type[Response]] = GroupHeartbeatResponse
    group: str
    member_id: str
    member_epoch: int
    streams: list[str] = field(default_factory=list)
    selector: str = ""
    owned: list[list[Any]] = field(default_factory=list)
    session_timeout_ms: int = 10_000
    max_wait_ms: int = 0
    client_id: str = ""

    def __post_init__(self) -> None:
        check_group(self.group)
        check_member(self.member_id, self.member_epoch)
        streams = as_list("streams", self.streams)
        if len(streams) > SUBSCRIBED_STREAMS_MAX:
            raise bad("streams", f"names more than {SUBSCRIBED_STREAMS_MAX} streams")
        for i, stream in enumerate(streams):
            check_stream(stream, f"streams[{i}]")
        check_str("selector", self.selector, names.SELECTOR_CHARS_MAX)
        check_partition_pairs("owned", self.owned, OWNED_PARTITIONS_MAX)
        check_int("session_timeout_ms", self.session_timeout_ms, 1, SESSION_TIMEOUT_MS_MAX)
        check_int("max_wait_ms", self.max_wait_ms, 0, FETCH_WAIT_MS_MAX)
        check_str("client_id", self.client_id, CLIENT_ID_CHARS_MAX)


@dataclass(frozen=True, slots=True)
class ListGroupsResponse(Response):
    """The groups this broker coordinates, and those with offsets in its partitions."""

    groups: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        for i, entry in enumerate(as_list("groups", self.groups)):
            check_group(as_map(f"groups[{i}]", entry).get("group"))


@dataclass(frozen=True, slots=True)
class ListGroupsRequest(Request):
    op: ClassVar[Op] = Op.LIST_GROUPS
    response_type: ClassVar[type[Response]] = ListGroupsResponse


@dataclass(frozen=True, slots=True)
class DescribeGroupResponse(Response):
    group: dict[str, Any]

    def __post_init__(self) -> None:
        check_group(as_map("group", self.group).get("group"))


@dataclass(frozen=True, slots=True)
class DescribeGroupRequest(GroupRequest):
    op: ClassVar[Op] = Op.DESCRIBE_GROUP
    response_type: ClassVar[type[Response]] = DescribeGroupResponse


#: The requests of this module, for the codec's registry.
REQUESTS: tuple[type[Request], ...] = (FindCoordinatorRequest, GroupHeartbeatRequest,
                                       ListGroupsRequest, DescribeGroupRequest)
