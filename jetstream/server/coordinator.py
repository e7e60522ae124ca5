"""The consumer-group coordinators of this broker: one per `__offsets` partition it leads.

Theory of operation
- A group's coordinator is the leader of its `__offsets` partition
  (jetstream.server.offsets_stream); it moves with that leadership. When this broker becomes
  the leader of such a partition it loads the partition's groups: it waits until the key
  index (jetstream.server.kv) covers everything the log held when leadership came (records
  a former leader wrote are committed by then), then reads every live `g/` (group) and `o/`
  (offset) record from it. A group's members, epochs and holdings are restored from its
  stored record (jetstream.offsets.group.Group.restore), each member with a whole session to
  come back; offsets are kept in memory from then on, and every change is written first.
  Requests that arrive while loading wait for it (bounded), then get NOT_COORDINATOR.
- Writes: a group's requests are serialised by its lock. Joins, grants, epoch changes and
  departures are stored (a `g/<group>` record, a tombstone once the group is empty) before the
  answer goes out; commits are `o/<group>/<stream>/<partition>` records. Both are appended to
  the partition with ack `all`: an answer means the write is committed (on every in-sync
  replica). A commit of the offset already committed writes nothing (idempotent); one behind
  it is refused (OFFSET_BEHIND_COMMITTED); RESET_OFFSETS moves offsets either way while the
  group has no members.
- Heartbeats are long polls: one with nothing new for its member waits (up to its
  `max_wait_ms`) until the group changes (`Group.version`), then is answered again — so a
  revocation or a grant reaches the member at once, and a rebalance takes round trips, not
  heartbeat intervals.
- A background loop expires members whose session ended, drops the groups of partitions
  this broker no longer leads (waking their heartbeats, which then get NOT_COORDINATOR),
  passes new partition counts to the groups when the metadata changes, tombstones offsets of
  deleted streams (and of a stream deleted and created again: each offset records the
  stream's version), and every `offsets_retention_check_ms` deletes the offsets of groups
  that have had no members and no commit for `offsets_retention_ms`.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Iterable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

from jetstream.compaction.key_index import KEYS_LIMIT_MAX, KeyIndex
from jetstream.errors import (
    CorruptRecord,
    GroupNotEmpty,
    JetstreamError,
    NotCoordinator,
    NotLeader,
    OffsetBehindCommitted,
    TooManyGroups,
    UnknownPartition,
    UnknownStream,
)
from jetstream.offsets import records as rec
from jetstream.offsets.group import JOIN_EPOCH, LEAVE_EPOCH, Assignment, Group, Heartbeat
from jetstream.offsets.records import CommittedOffset, StoredGroup, StreamPartition
from jetstream.protocol import messages as m
from jetstream.protocol.envelope import AckPolicy
from jetstream.protocol.names import parse_selector
from jetstream.raft_meta.changes import Touched
from jetstream.raft_meta.local import LocalMetadata
from jetstream.raft_meta.raft import RaftMetadata
from jetstream.server.config import BrokerConfig
from jetstream.server.kv import KeyValue
from jetstream.server.offsets_stream import OffsetsStream
from jetstream.server.partition import PartitionLeader
from jetstream.server.roles import Roles
from jetstream.stream.format import Record
from jetstream.tasks import cancel_and_wait, wait_event

log = logging.getLogger(__name__)

#: How long a request waits for its partition's groups to load, and one load attempt for
#: the key index to cover the log.
LOAD_WAIT_S = 5.0
LOAD_INDEX_WAIT_MS = 5_000
LOAD_RETRY_S = 0.1


def now_ms() -> int:
    return int(time.monotonic() * 1000)


def wall_ms() -> int:
    return int(time.time() * 1000)


@dataclass(slots=True)
class GroupEntry:
    group: Group
    offsets: dict[StreamPartition, CommittedOffset] = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    commits: int = 0
    rebalances: int = 0

    def notify(self) -> None:
        """Wake the heartbeats waiting for a change of this group."""
        self.changed.set()
        self.changed = asyncio.Event()


@dataclass(slots=True)
class PartitionGroups:
    """The groups of one `__offsets` partition, while `leader` leads it here."""

    partition: int
    leader: PartitionLeader
    groups: dict[str, GroupEntry] = field(default_factory=dict)
    loaded: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None


class Coordinators:
    def __init__(self, config: BrokerConfig, metadata: LocalMetadata | RaftMetadata,
                 roles: Roles, kv: KeyValue, offsets: OffsetsStream, executor: Executor) -> None:
        self._config = config
        self._metadata = metadata
        self._roles = roles
        self._kv = kv
        self._offsets = offsets
        self._executor = executor
        self._partitions: dict[int, PartitionGroups] = {}
        self._task: asyncio.Task[None] | None = None
        #: Stream -> partition count (None: to build from the metadata).
        self._topology_map: dict[str, int] | None = None
        self._metadata_changed = True
        self._next_retention_ms = 0

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="coordinators")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
        for pg in list(self._partitions.values()):
            await self._drop(pg)

    def on_metadata_change(self, change: Touched) -> None:
        """Streams were created or deleted (`change`): partition counts and stream versions
        changed. Leader and ISR changes do not concern the groups: the broker does not pass
        them on."""
        topology, streams = self._topology_map, self._metadata.state.streams
        if change.everything:
            self._topology_map = None
        elif topology is not None:
            for name in {stream for stream, _ in change.keys}:
                config = streams.get(name)
                if config is None or rec.is_internal(name):
                    topology.pop(name, None)
                else:
                    topology[name] = config.partitions
        self._metadata_changed = True

    # -- partitions and groups ------------------------------------------------------------------

    async def _partition(self, group: str) -> PartitionGroups:
        """The loaded groups of `group`'s partition; raises NotCoordinator."""
        p = self._offsets.partition_of(group)
        pg = self._held(p)
        if pg is None:
            raise NotCoordinator(group, f"this broker does not lead __offsets/{p}")
        if not pg.loaded.is_set():
            await wait_event(pg.loaded, LOAD_WAIT_S)
            if not pg.loaded.is_set():
                raise NotCoordinator(group, "loading the group")
        if self._partitions.get(p) is not pg:
            raise NotCoordinator(group, "leadership moved")
        return pg

    def _held(self, p: int) -> PartitionGroups | None:
        """This broker's groups of partition p (starting to load them when it just became the
        leader), or None when it does not lead it."""
        leader = self._roles.leaders.get((rec.OFFSETS_STREAM, p))
        pg = self._partitions.get(p)
        if leader is None:
            return None
        if pg is None or pg.leader is not leader:
            pg = PartitionGroups(p, leader)
            self._partitions[p] = pg
            pg.task = asyncio.get_running_loop().create_task(self._load(pg),
                                                             name=f"load __offsets/{p}")
        return pg

    async def _drop(self, pg: PartitionGroups) -> None:
        if self._partitions.get(pg.partition) is pg:
            del self._partitions[pg.partition]
        if pg.task is not None and pg.task is not asyncio.current_task():
            await cancel_and_wait(pg.task)
        for entry in pg.groups.values():
            entry.notify()

    async def _load(self, pg: PartitionGroups) -> None:
        end = pg.leader.log.log_end_offset
        while True:
            try:
                groups, offsets = await self._kv.read_covering(
                    rec.OFFSETS_STREAM, pg.partition, end, LOAD_INDEX_WAIT_MS, _scan)
                break
            except JetstreamError as exc:
                log.info("__offsets/%d: waiting to load groups: %s", pg.partition, exc)
            except Exception:  # an unreadable index: it is rebuilt from the log; try again
                log.exception("__offsets/%d: loading groups failed", pg.partition)
            await asyncio.sleep(LOAD_RETRY_S)
        now, topology = now_ms(), self._topology()
        for name, stored in groups.items():
            pg.groups[name] = GroupEntry(Group.restore(
                name, stored, now, topology, members_max=self._config.group_members_max))
        for (name, sp), value in offsets:
            entry = pg.groups.get(name)
            if entry is None:
                entry = pg.groups[name] = GroupEntry(
                    Group(name, members_max=self._config.group_members_max))
            entry.offsets[sp] = value
        pg.loaded.set()
        log.info("__offsets/%d: coordinating %d group(s)", pg.partition, len(pg.groups))

    def _entry(self, pg: PartitionGroups, group: str, *, create: bool) -> GroupEntry | None:
        entry = pg.groups.get(group)
        if entry is None and create:
            if sum(len(p.groups) for p in self._partitions.values()) >= self._config.groups_max:
                raise TooManyGroups(group, self._config.groups_max)
            entry = pg.groups[group] = GroupEntry(
                Group(group, members_max=self._config.group_members_max))
        return entry

    async def _append(self, pg: PartitionGroups, group: str, records: list[Record]) -> None:
        """Append to the group's partition and wait until committed; NotCoordinator when
        this broker lost the partition's leadership."""
        try:
            await pg.leader.append_direct(records, AckPolicy.ALL)
        except NotLeader:
            await self._drop(pg)
            raise NotCoordinator(group, "leadership moved") from None

    async def _persist(self, pg: PartitionGroups, name: str, entry: GroupEntry) -> None:
        group = entry.group
        if not group.dirty:
            return
        value = rec.encode_group(group.stored()) if group.members else None
        await self._append(pg, name, [Record(value, rec.group_key(name))])
        group.dirty = False

    # -- the view of the metadata ---------------------------------------------------------------

    def _topology(self) -> dict[str, int]:
        """Stream -> partition count, for the assignor (built once, then kept up to date
        stream by stream by `on_metadata_change`)."""
        if self._topology_map is None:
            self._topology_map = {name: c.partitions for name, c in
                                  self._metadata.state.streams.items()
                                  if not rec.is_internal(name)}
        return self._topology_map

    def _stream_version(self, sp: StreamPartition) -> int:
        """The version of the stream `sp` belongs to; raises UnknownStream/UnknownPartition."""
        version = self._version_or_none(sp)
        if version is None or rec.is_internal(sp.stream):
            if sp.stream in self._metadata.state.streams and not rec.is_internal(sp.stream):
                raise UnknownPartition(sp.stream, sp.partition)
            raise UnknownStream(sp.stream)
        return version

    def _version_or_none(self, sp: StreamPartition) -> int | None:
        held = self._metadata.state.partitions.get((sp.stream, sp.partition))
        return None if held is None else held.created_version

    def _subscription(self, request: m.GroupHeartbeatRequest) -> tuple[str, ...]:
        streams = set(request.streams)
        if request.selector:
            selector = parse_selector(request.selector)
            streams.update(name for name, c in self._metadata.state.streams.items()
                           if not rec.is_internal(name) and selector(c.labels))
        return tuple(sorted(streams))

    # -- heartbeats -----------------------------------------------------------------------------

    async def heartbeat(self, request: m.GroupHeartbeatRequest) -> m.GroupHeartbeatResponse:
        pg = await self._partition(request.group)
        entry = self._entry(pg, request.group, create=request.member_epoch == JOIN_EPOCH)
        session = min(max(request.session_timeout_ms, self._config.group_session_timeout_ms_min),
                      self._config.group_session_timeout_ms_max)
        interval = max(1, min(self._config.group_heartbeat_interval_ms, session // 3))
        owned = frozenset(StreamPartition(s, p) for s, p in request.owned)
        beat = Heartbeat(request.member_id, request.member_epoch, self._subscription(request),
                         owned, session, request.client_id)
        if entry is None:  # an unknown group: only a join creates one
            entry = GroupEntry(Group(request.group))
        wait_until = time.monotonic() + min(request.max_wait_ms, session // 2) / 1000
        while True:
            answer = await self._beat(pg, request.group, entry, beat)
            changed = entry.changed
            new = (beat.member_epoch in (JOIN_EPOCH, LEAVE_EPOCH)
                   or answer.member_epoch != beat.member_epoch or answer.partitions != owned)
            remaining = wait_until - time.monotonic()
            if new or remaining <= 0:
                return m.GroupHeartbeatResponse(
                    answer.member_id, answer.member_epoch,
                    [[sp.stream, sp.partition] for sp in sorted(answer.partitions)],
                    interval, session)
            await wait_event(changed, remaining)
            if self._partitions.get(pg.partition) is not pg:
                raise NotCoordinator(request.group, "leadership moved")

    async def _beat(self, pg: PartitionGroups, name: str, entry: GroupEntry,
                    beat: Heartbeat) -> Assignment:
        async with entry.lock:
            group = entry.group
            version, target = group.version, group.target
            answer = group.heartbeat(beat, now_ms(), self._topology(), uuid.uuid4().hex)
            if group.target != target:
                entry.rebalances += 1
            await self._persist(pg, name, entry)
            if group.version != version:
                entry.notify()
            return answer

    # -- offsets --------------------------------------------------------------------------------

    async def commit(self, request: m.CommitOffsetRequest) -> m.CommitOffsetResponse:
        pg = await self._partition(request.group)
        entry = self._entry(pg, request.group, create=True)
        assert entry is not None
        failed: list[dict[str, Any]] = []
        async with entry.lock:
            now, pending = wall_ms(), {}
            for item in request.offsets:
                sp = StreamPartition(item["stream"], item["partition"])
                try:
                    value = self._checked_commit(request, entry, sp, item, now)
                except JetstreamError as exc:
                    failed.append({"stream": sp.stream, "partition": sp.partition,
                                   "error": m.error_header(exc)})
                    continue
                if value is not None:
                    pending[sp] = value
            if pending:
                await self._append(pg, request.group, [
                    Record(rec.encode_offset(v), rec.offset_key(request.group, sp))
                    for sp, v in pending.items()])
                entry.offsets.update(pending)
                entry.commits += len(pending)
        return m.CommitOffsetResponse(failed)

    def _checked_commit(self, request: m.CommitOffsetRequest, entry: GroupEntry,
                        sp: StreamPartition, item: Mapping[str, Any],
                        now: int) -> CommittedOffset | None:
        """The record to write for one partition of a commit, None when it is already
        committed; raises what refuses it."""
        version = self._stream_version(sp)
        entry.group.check_commit(request.member_id, request.member_epoch, sp)
        offset, metadata = item["offset"], item.get("metadata", "")
        current = entry.offsets.get(sp)
        if current is not None and current.stream_version == version:
            if offset < current.offset:
                raise OffsetBehindCommitted(request.group, sp.stream, sp.partition, offset,
                                            current.offset)
            if offset == current.offset and metadata == current.metadata:
                return None
        return CommittedOffset(offset, metadata, now, request.member_epoch, version)

    async def fetch(self, request: m.FetchOffsetRequest) -> m.FetchOffsetResponse:
        pg = await self._partition(request.group)
        entry = pg.groups.get(request.group)
        offsets = entry.offsets if entry is not None else {}
        if request.partitions is None:
            wanted: Iterable[StreamPartition] = sorted(offsets)
        else:
            wanted = [StreamPartition(p["stream"], p["partition"]) for p in request.partitions]
        out = []
        for sp in wanted:
            value = offsets.get(sp)
            if value is None or value.stream_version != self._version_or_none(sp):
                out.append({"stream": sp.stream, "partition": sp.partition, "offset": -1,
                            "metadata": ""})
                continue
            out.append({"stream": sp.stream, "partition": sp.partition, "offset": value.offset,
                        "metadata": value.metadata, "commit_time_ms": value.commit_time_ms,
                        "member_epoch": value.member_epoch})
        return m.FetchOffsetResponse(out)

    async def reset(self, request: m.ResetOffsetsRequest) -> m.EmptyResponse:
        pg = await self._partition(request.group)
        entry = self._entry(pg, request.group, create=True)
        assert entry is not None
        async with entry.lock:
            if entry.group.members:
                raise GroupNotEmpty(request.group, len(entry.group.members))
            now, pending = wall_ms(), {}
            for item in request.offsets:
                sp = StreamPartition(item["stream"], item["partition"])
                pending[sp] = CommittedOffset(item["offset"], "reset", now, -1,
                                              self._stream_version(sp))
            await self._append(pg, request.group, [
                Record(rec.encode_offset(v), rec.offset_key(request.group, sp))
                for sp, v in pending.items()])
            entry.offsets.update(pending)
        return m.EmptyResponse()

    async def delete_group(self, request: m.DeleteGroupRequest) -> m.DeleteGroupResponse:
        pg = await self._partition(request.group)
        entry = pg.groups.get(request.group)
        if entry is None:
            return m.DeleteGroupResponse(0)
        async with entry.lock:
            if entry.group.members:
                raise GroupNotEmpty(request.group, len(entry.group.members))
            count = len(entry.offsets)
            await self._tombstone(pg, request.group, entry, list(entry.offsets))
            pg.groups.pop(request.group, None)
        return m.DeleteGroupResponse(count)

    async def _tombstone(self, pg: PartitionGroups, name: str, entry: GroupEntry,
                         partitions: list[StreamPartition]) -> None:
        if partitions:
            await self._append(pg, name, [Record(None, rec.offset_key(name, sp))
                                          for sp in partitions])
        for sp in partitions:
            entry.offsets.pop(sp, None)

    # -- views ----------------------------------------------------------------------------------

    async def list_groups(self, request: m.ListGroupsRequest) -> m.ListGroupsResponse:
        out = []
        for p, pg in sorted(self._partitions.items()):
            if not pg.loaded.is_set() or self._roles.leaders.get(
                    (rec.OFFSETS_STREAM, p)) is not pg.leader:
                continue
            for name, entry in sorted(pg.groups.items()):
                out.append({"group": name, "state": entry.group.state.value,
                            "members": len(entry.group.members), "partition": p,
                            "offsets": len(entry.offsets)})
        return m.ListGroupsResponse(out)

    async def describe(self, request: m.DescribeGroupRequest) -> m.DescribeGroupResponse:
        pg = await self._partition(request.group)
        entry = pg.groups.get(request.group) or GroupEntry(Group(request.group))
        description = entry.group.describe(now_ms())
        description["offsets"] = [
            {"stream": sp.stream, "partition": sp.partition, "offset": v.offset,
             "metadata": v.metadata, "commit_time_ms": v.commit_time_ms,
             "member_epoch": v.member_epoch}
            for sp, v in sorted(entry.offsets.items())
            if v.stream_version == self._version_or_none(sp)]
        description["coordinator"] = {"broker_id": self._config.broker_id,
                                      "partition": pg.partition}
        return m.DescribeGroupResponse(description)

    def _entries(self) -> list[tuple[str, GroupEntry]]:
        return sorted((name, entry) for pg in self._partitions.values()
                      if pg.loaded.is_set() for name, entry in pg.groups.items())

    def partitions(self) -> list[tuple[str, int]]:
        """The partitions the groups coordinated here have committed offsets of."""
        return sorted({(sp.stream, sp.partition) for _name, entry in self._entries()
                       for sp in entry.offsets})

    def render_metrics(self, high_watermarks: Mapping[tuple[str, int], int]) -> list[str]:
        """Prometheus lines of the groups coordinated here: members, commits, rebalances,
        and per partition the committed offset and the lag behind `high_watermarks`."""
        entries = self._entries()
        lines = []
        for name, kind, text, value in (
                ("members", "gauge", "Members of the consumer group.",
                 lambda e: len(e.group.members)),
                ("commits_total", "counter", "Offsets committed by the group.",
                 lambda e: e.commits),
                ("rebalances_total", "counter", "Changes of the group's target assignment.",
                 lambda e: e.rebalances)):
            lines += [f"# HELP jetstream_group_{name} {text}",
                      f"# TYPE jetstream_group_{name} {kind}"]
            lines += [f'jetstream_group_{name}{{group="{g}"}} {value(e)}' for g, e in entries]
        offsets = [(f'group="{group}",stream="{sp.stream}",partition="{sp.partition}"',
                    value.offset, high_watermarks.get((sp.stream, sp.partition)))
                   for group, entry in entries for sp, value in sorted(entry.offsets.items())]
        lines += ["# HELP jetstream_group_committed_offset The group's committed offset.",
                  "# TYPE jetstream_group_committed_offset gauge"]
        lines += [f"jetstream_group_committed_offset{{{labels}}} {offset}"
                  for labels, offset, _hw in offsets]
        lines += ["# HELP jetstream_group_lag The high watermark less the committed offset.",
                  "# TYPE jetstream_group_lag gauge"]
        lines += [f"jetstream_group_lag{{{labels}}} {max(0, hw - offset)}"
                  for labels, offset, hw in offsets if hw is not None]
        return lines

    # -- the background loop --------------------------------------------------------------------

    async def _loop(self) -> None:
        while True:
            try:
                await self._tick()
            except Exception:  # one bad round must not end expiry for good
                log.exception("coordinator round failed")
            await asyncio.sleep(self._config.group_expiry_check_ms / 1000)

    async def _tick(self) -> None:
        for p, pg in list(self._partitions.items()):
            if self._roles.leaders.get((rec.OFFSETS_STREAM, p)) is not pg.leader:
                await self._drop(pg)
        offsets = self._offsets.existing
        for p in range(offsets.partitions if offsets is not None else 0):
            self._held(p)  # this broker's partitions of __offsets, not every leader's
        metadata_changed, self._metadata_changed = self._metadata_changed, False
        retention_due = now_ms() >= self._next_retention_ms
        if retention_due:
            self._next_retention_ms = now_ms() + self._config.offsets_retention_check_ms
        for pg in list(self._partitions.values()):
            if not pg.loaded.is_set():
                continue
            for name, entry in list(pg.groups.items()):
                try:
                    await self._maintain(pg, name, entry, metadata_changed, retention_due)
                except NotCoordinator:
                    break

    async def _maintain(self, pg: PartitionGroups, name: str, entry: GroupEntry,
                        metadata_changed: bool, retention_due: bool) -> None:
        group, now = entry.group, now_ms()
        expiring = any(member.deadline_ms < now for member in group.members.values())
        if not (expiring or metadata_changed or retention_due):
            return
        async with entry.lock:
            version = group.version
            if expiring:
                for member_id in group.expire(now):
                    log.info("group %s: member %s expired", name, member_id)
            if metadata_changed:
                group.refresh_topology(self._topology())
                void = [sp for sp, v in entry.offsets.items()
                        if self._version_or_none(sp) != v.stream_version]
                await self._tombstone(pg, name, entry, void)
            if retention_due and not group.members and entry.offsets:
                newest = max(v.commit_time_ms for v in entry.offsets.values())
                if wall_ms() - newest > self._config.offsets_retention_ms:
                    log.info("group %s: offsets expired (no members, no commit since %d)",
                             name, newest)
                    await self._tombstone(pg, name, entry, list(entry.offsets))
            await self._persist(pg, name, entry)
            if group.version != version:
                entry.rebalances += 1
                entry.notify()
            if not group.members and not entry.offsets and not group.dirty:
                pg.groups.pop(name, None)


def _scan(index: KeyIndex) -> tuple[dict[str, StoredGroup],
                                    list[tuple[tuple[str, StreamPartition], CommittedOffset]]]:
    """Every live group and offset record of a partition's key index (a worker thread)."""
    groups: dict[str, StoredGroup] = {}
    offsets: list[tuple[tuple[str, StreamPartition], CommittedOffset]] = []
    after: bytes | None = None
    while True:
        page = index.items(b"", after, KEYS_LIMIT_MAX)
        for key, entry in page:
            if entry.value is None:
                continue
            try:
                name = rec.parse_group_key(key)
                if name is not None:
                    groups[name] = rec.decode_group(entry.value)
                    continue
                found = rec.parse_offset_key(key)
                if found is not None:
                    offsets.append((found, rec.decode_offset(entry.value)))
            except CorruptRecord as exc:
                log.error("__offsets: skipping record %r: %s", key, exc)
        if len(page) < KEYS_LIMIT_MAX:
            return groups, offsets
        after = page[-1][0]
