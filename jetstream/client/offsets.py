"""Committed offsets and consumer-group administration: the client side of `__offsets`.

Theory of operation: every request about a group goes to its coordinator, the leader of the
group's `__offsets` partition. The client asks any broker where that is (FIND_COORDINATOR,
which also creates `__offsets` on first use), remembers the answer per group, and after
NOT_COORDINATOR or a lost connection forgets it, backs off and asks again, a bounded number
of times (a coordinator moves with its partition's leadership, usually within them).

`commit_offset`/`fetch_offset` are for consumers that manage their partitions themselves
(a Spark job, a batch reader): they commit without a member id, which the coordinator
allows while the group has no members. Consumer-group members commit through their
GroupSubscription (group_subscription.py). `list_groups` asks every broker for the groups it
coordinates; `describe_group` asks the coordinator and adds each partition's high watermark
and the group's lag; `reset_offsets` resolves `earliest`, `latest` or a time at the
partitions' leaders and sets the offsets (the group must have no members).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from jetstream.client.connection import BrokerConnection
from jetstream.client.reading import offset_at
from jetstream.client.routing import RETRY_BACKOFF_MAX_S, RETRY_BACKOFF_S, Router
from jetstream.errors import BrokerUnavailable, JetstreamError, NotCoordinator
from jetstream.protocol import messages as m
from jetstream.protocol.wire_errors import error_from_header

_R = TypeVar("_R", bound=m.Response)

#: Attempts of a coordinator request after NOT_COORDINATOR or a lost connection.
COORDINATOR_ATTEMPTS_MAX = 10


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    """A group's committed position in one partition: `offset` is the next one it reads."""

    stream: str
    partition: int
    offset: int
    metadata: str = ""
    commit_time_ms: int = 0


@dataclass(frozen=True, slots=True)
class GroupListing:
    group: str
    state: str
    members: int
    coordinator: int


class GroupOffsets:
    """Offsets and groups: see the module docstring."""

    _router: Router

    def __init__(self) -> None:
        self._coordinators: dict[str, str] = {}

    # -- the coordinator ------------------------------------------------------------------------

    async def coordinator_connection(self, group: str) -> BrokerConnection:
        """A connection to `group`'s coordinator (found and remembered)."""
        address = self._coordinators.get(group)
        if address is None:
            found = await self._router.admin(m.FindCoordinatorRequest(group),
                                             m.FindCoordinatorResponse)
            address = self._coordinators[group] = f"{found.host}:{found.port}"
        return await self._router.connection(address)

    def forget_coordinator(self, group: str) -> None:
        self._coordinators.pop(group, None)

    async def coordinator_request(self, group: str, request: m.Request,
                                  response_type: type[_R], *,
                                  attempts: int = COORDINATOR_ATTEMPTS_MAX,
                                  timeout_s: float | None = None) -> _R:
        """`request` at the group's coordinator, found again (with backoff) after
        NOT_COORDINATOR or a lost connection, `attempts` times in all."""
        delay = RETRY_BACKOFF_S
        for attempt in range(1, attempts + 1):
            try:
                conn = await self.coordinator_connection(group)
                response = await conn.request(request, timeout_s=timeout_s)
                return m.expect_response(response, response_type)
            except (NotCoordinator, BrokerUnavailable):
                self.forget_coordinator(group)
                if attempt == attempts or self._router.closed:
                    raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_BACKOFF_MAX_S)
        raise AssertionError("unreachable")

    # -- offsets --------------------------------------------------------------------------------

    async def commit_offsets(self, group: str, offsets: Mapping[tuple[str, int], int], *,
                             metadata: str = "", member_id: str = "",
                             member_epoch: int = -1) -> dict[tuple[str, int], JetstreamError]:
        """Commit `offsets` ((stream, partition) -> the next offset to read) for `group` in
        one request; answers once they are committed. Returns the partitions that failed,
        with their errors (empty: all committed)."""
        entries = [{"stream": s, "partition": p, "offset": o, "metadata": metadata}
                   for (s, p), o in sorted(offsets.items())]
        request = m.CommitOffsetRequest(group, entries, member_id, member_epoch)
        response = await self.coordinator_request(group, request, m.CommitOffsetResponse)
        return {(f["stream"], f["partition"]): error_from_header(f["error"])
                for f in response.failed}

    async def commit_offset(self, group: str, stream: str, partition: int, offset: int, *,
                            metadata: str = "") -> None:
        """Commit `offset` (the next offset the group reads) of one partition, for a consumer
        that manages its partitions itself. Raises UnknownStream, UnknownPartition,
        OffsetBehindCommitted, UnknownMemberId (the group has members: they commit)."""
        failed = await self.commit_offsets(group, {(stream, partition): offset},
                                           metadata=metadata)
        if failed:
            raise next(iter(failed.values()))

    async def fetch_offsets(self, group: str,
                            partitions: Sequence[tuple[str, int]] | None = None
                            ) -> dict[tuple[str, int], CommittedOffset]:
        """The group's committed offsets of `partitions` (None: all it has); partitions
        with none are left out."""
        wanted = None if partitions is None else [
            {"stream": s, "partition": p} for s, p in partitions]
        response = await self.coordinator_request(group, m.FetchOffsetRequest(group, wanted),
                                                  m.FetchOffsetResponse)
        return {(e["stream"], e["partition"]): CommittedOffset(
                    e["stream"], e["partition"], e["offset"], e.get("metadata", ""),
                    e.get("commit_time_ms", 0))
                for e in response.offsets if e["offset"] >= 0}

    async def fetch_offset(self, group: str, stream: str, partition: int) -> int | None:
        """The group's committed offset of one partition (the next offset it reads), None
        when it has none."""
        found = await self.fetch_offsets(group, [(stream, partition)])
        value = found.get((stream, partition))
        return None if value is None else value.offset

    async def reset_offsets(self, group: str, stream: str, *, to: str,
                            offset: int | None = None, timestamp_ms: int | None = None,
                            partitions: Sequence[int] | None = None) -> dict[int, int]:
        """Move the group's offsets of `stream` (all partitions, or `partitions`) to
        `earliest` (the log start), `latest` (the high watermark), `offset` (clamped into
        the log) or `timestamp` (the first message at or after `timestamp_ms`). Refused with
        GroupNotEmpty while the group has members. Returns partition -> new offset."""
        if to not in m.RESET_TARGETS:
            raise ValueError(f"to must be one of {list(m.RESET_TARGETS)}, got {to!r}")
        info = await self._router.stream(stream)
        chosen = list(range(info.partition_count)) if partitions is None else list(partitions)
        resolved = {p: await self._resolve(stream, p, to, offset, timestamp_ms)
                    for p in chosen}
        entries = [{"stream": stream, "partition": p, "offset": o} for p, o in resolved.items()]
        await self.coordinator_request(group, m.ResetOffsetsRequest(group, entries),
                                       m.EmptyResponse)
        return resolved

    async def _resolve(self, stream: str, partition: int, to: str, offset: int | None,
                       timestamp_ms: int | None) -> int:
        router = self._router
        if to == "earliest":
            return await offset_at(router, stream, partition, m.EARLIEST_TIMESTAMP)
        if to == "latest":
            return await offset_at(router, stream, partition, m.LATEST_TIMESTAMP)
        if to == "timestamp":
            if timestamp_ms is None:
                raise ValueError("to='timestamp' needs timestamp_ms")
            return await offset_at(router, stream, partition, timestamp_ms)
        if offset is None or offset < 0:
            raise ValueError("to='offset' needs offset >= 0")
        start = await offset_at(router, stream, partition, m.EARLIEST_TIMESTAMP)
        end = await offset_at(router, stream, partition, m.LATEST_TIMESTAMP)
        return min(max(offset, start), end)

    async def delete_group(self, group: str) -> int:
        """Delete the group's committed offsets (refused with GroupNotEmpty while it has
        members); the number deleted."""
        response = await self.coordinator_request(group, m.DeleteGroupRequest(group),
                                                  m.DeleteGroupResponse)
        return response.deleted_offsets

    # -- groups ---------------------------------------------------------------------------------

    async def list_groups(self) -> list[GroupListing]:
        """Every group some broker coordinates (members, or committed offsets)."""
        await self._router.refresh_metadata()
        found: dict[str, GroupListing] = {}
        for broker in self._router.metadata.broker_list():
            try:
                conn = await self._router.connection(broker.address)
                response = m.expect_response(await conn.request(m.ListGroupsRequest()),
                                             m.ListGroupsResponse)
            except BrokerUnavailable:
                continue  # its partitions' groups are listed by their new leaders
            for g in response.groups:
                found[g["group"]] = GroupListing(g["group"], g.get("state", ""),
                                                 int(g.get("members", 0)), broker.id)
        return [found[name] for name in sorted(found)]

    async def describe_group(self, group: str) -> dict[str, Any]:
        """The coordinator's description of the group (state, epoch, members with their
        partitions and last heartbeat, committed offsets), each offset with its partition's
        high watermark and the group's lag."""
        response = await self.coordinator_request(group, m.DescribeGroupRequest(group),
                                                  m.DescribeGroupResponse)
        description = dict(response.group)
        for entry in description.get("offsets", []):
            try:
                hw = await offset_at(self._router, entry["stream"], entry["partition"],
                                     m.LATEST_TIMESTAMP)
            except JetstreamError:
                entry["high_watermark"] = entry["lag"] = None
                continue
            entry["high_watermark"] = hw
            entry["lag"] = max(0, hw - entry["offset"])
        return description
