"""A consumer group as its coordinator sees it: members, epochs, and who may consume what.

Theory of operation (pure: no IO, no clock; `now_ms` is passed in), in KIP-848's shape:
- A member joins with epoch 0 (JOIN_EPOCH) and gets an id; it heartbeats, reporting the
  partitions it is consuming (`owned`), and leaves with epoch -1 (LEAVE_EPOCH). A member
  with no heartbeat for `session_timeout_ms` is expired (`expire`).
- A change of membership, of a member's subscription or of its streams' partition counts
  recomputes the target assignment (jetstream.offsets.assignor, sticky).
- Revoke before assign: a partition of a member's target is granted to it only while no
  other member holds it. A member holds a partition from its grant until one of its own
  heartbeats no longer reports it, or its session ends. So no partition is ever held by two
  members, and a member consumes only what it holds (the property the tests check).
- Epochs: one counter per group (`epoch`). A member's epoch takes the counter's next value
  whenever what it may consume changes. A heartbeat must carry the member's epoch, or its
  previous one when it reports nothing new (the answer that moved it on was lost); any other
  epoch is fenced (FENCED_MEMBER: drop everything, join again). A commit must come from a
  member that holds the partition, with its epoch or its previous one (commits in flight
  while the epoch moves); an older epoch is STALE_MEMBER_EPOCH. A commit without a member is
  allowed only while the group has none (a consumer that manages its partitions itself).
- `dirty`: joins, grants, epoch changes, leaves and expiries must be stored (`stored()`, a
  `g/<group>` record in `__offsets`) before an answer goes out, so a coordinator that takes
  over (`restore`) knows who holds what and which epochs are current. Releases need not be
  stored first: an outdated record only overstates what members hold, which is safe.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from jetstream.errors import (
    FencedMember,
    GroupFull,
    PartitionNotAssigned,
    StaleMemberEpoch,
    UnknownMemberId,
)
from jetstream.offsets.assignor import assign
from jetstream.offsets.records import StoredGroup, StoredMember, StreamPartition

JOIN_EPOCH = 0
LEAVE_EPOCH = -1
MEMBERS_MAX_DEFAULT = 1000
_NOTHING: frozenset[StreamPartition] = frozenset()


class GroupState(enum.StrEnum):
    EMPTY = "empty"  # no members (its committed offsets may remain)
    RECONCILING = "reconciling"  # some member does not hold its target yet
    STABLE = "stable"  # every member holds exactly its target


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """What a member says in a heartbeat (a join with JOIN_EPOCH, a leave with LEAVE_EPOCH)."""

    member_id: str
    member_epoch: int
    streams: tuple[str, ...] = ()
    owned: frozenset[StreamPartition] = _NOTHING
    session_timeout_ms: int = 10_000
    client_id: str = ""


@dataclass(frozen=True, slots=True)
class Assignment:
    """The coordinator's answer: the member's id and epoch, and what it may consume now."""

    member_id: str
    member_epoch: int
    partitions: frozenset[StreamPartition]


@dataclass(slots=True)
class Member:
    member_id: str
    client_id: str
    streams: tuple[str, ...]
    session_timeout_ms: int
    deadline_ms: int
    last_heartbeat_ms: int
    epoch: int = JOIN_EPOCH
    previous_epoch: int = JOIN_EPOCH
    #: Granted and not yet released: what it may be consuming.
    owned: frozenset[StreamPartition] = _NOTHING
    #: What its last answer said it may consume (owned, less what is being revoked).
    assigned: frozenset[StreamPartition] = _NOTHING


class Group:
    def __init__(self, name: str, *, members_max: int = MEMBERS_MAX_DEFAULT) -> None:
        self.name = name
        self.epoch = 0
        self.members: dict[str, Member] = {}
        self.target: dict[str, frozenset[StreamPartition]] = {}
        self.dirty = False
        #: Bumped by every change a waiting member could care about (members, holdings,
        #: epochs, the target): a coordinator wakes held heartbeats when it moves.
        self.version = 0
        self._members_max = members_max
        self._holder: dict[StreamPartition, str] = {}
        self._topology: Mapping[str, int] = {}
        self._counts: dict[str, int] = {}

    # -- persistence ---------------------------------------------------------------------------

    def stored(self) -> StoredGroup:
        return StoredGroup(self.epoch, tuple(
            StoredMember(m.member_id, m.client_id, m.epoch, m.previous_epoch,
                         m.session_timeout_ms, m.streams, m.owned)
            for m in self.members.values()))

    @classmethod
    def restore(cls, name: str, stored: StoredGroup, now_ms: int, topology: Mapping[str, int],
                *, members_max: int = MEMBERS_MAX_DEFAULT) -> Group:
        """The group a former coordinator stored. Every member gets a whole session from
        `now_ms` to reach this coordinator."""
        group = cls(name, members_max=members_max)
        group.epoch = max([stored.epoch, *(m.epoch for m in stored.members)])
        for s in stored.members:
            owned = frozenset(sp for sp in s.owned if sp not in group._holder)
            group.members[s.member_id] = Member(
                s.member_id, s.client_id, s.streams, s.session_timeout_ms,
                now_ms + s.session_timeout_ms, now_ms, s.epoch, s.previous_epoch, owned, owned)
            for sp in owned:
                group._holder[sp] = s.member_id
        group._sync_topology(topology)
        group._retarget()
        return group

    # -- members -------------------------------------------------------------------------------

    def heartbeat(self, beat: Heartbeat, now_ms: int, topology: Mapping[str, int],
                  new_member_id: str) -> Assignment:
        """Answer a member's heartbeat (join, leave, or keep-alive). `topology`: stream ->
        partition count (0 or absent: no such stream). `new_member_id` names a joining
        member that brings no id. Raises UnknownMemberId, FencedMember, GroupFull."""
        if beat.member_epoch == LEAVE_EPOCH:
            if beat.member_id in self.members:
                self.remove(beat.member_id)
            return Assignment(beat.member_id, LEAVE_EPOCH, _NOTHING)
        changed = self._sync_topology(topology)
        if beat.member_epoch == JOIN_EPOCH:
            member = self._join(beat, now_ms, new_member_id)
            changed = True
        else:
            member = self._known(beat)
            self._release(member, member.owned - beat.owned)
            if beat.streams != member.streams:
                member.streams = beat.streams
                changed = True
        if member.session_timeout_ms != beat.session_timeout_ms:
            member.session_timeout_ms = beat.session_timeout_ms
            self.dirty = True
        member.deadline_ms = now_ms + member.session_timeout_ms
        member.last_heartbeat_ms = now_ms
        if changed:
            self._retarget()
        return self._reconcile(member)

    def _join(self, beat: Heartbeat, now_ms: int, new_member_id: str) -> Member:
        if beat.member_id in self.members:  # a member starting over holds nothing any more
            self.remove(beat.member_id)
        if len(self.members) >= self._members_max:
            raise GroupFull(self.name, self._members_max)
        member_id = beat.member_id or new_member_id
        member = Member(member_id, beat.client_id, beat.streams, beat.session_timeout_ms,
                        now_ms + beat.session_timeout_ms, now_ms)
        self.members[member_id] = member
        self.dirty = True
        self.version += 1
        return member

    def _known(self, beat: Heartbeat) -> Member:
        member = self.members.get(beat.member_id)
        if member is None:
            raise UnknownMemberId(self.name, beat.member_id)
        lost_answer = beat.member_epoch == member.previous_epoch and beat.owned <= member.owned
        if beat.member_epoch != member.epoch and not lost_answer:
            raise FencedMember(self.name, beat.member_id, beat.member_epoch, member.epoch)
        return member

    def remove(self, member_id: str) -> None:
        """A member left or was expired: what it held is free."""
        member = self.members.pop(member_id)
        self._release(member, member.owned)
        self.target.pop(member_id, None)
        self.dirty = True
        self.version += 1
        self._retarget()

    def expire(self, now_ms: int) -> list[str]:
        """Remove the members whose session ended before `now_ms`; their ids."""
        expired = [m.member_id for m in self.members.values() if m.deadline_ms < now_ms]
        for member_id in expired:
            self.remove(member_id)
        return expired

    def refresh_topology(self, topology: Mapping[str, int]) -> bool:
        """Take new partition counts (streams created, deleted or changed); True when the
        target moved, so members must hear of it."""
        if self._sync_topology(topology):
            self._retarget()
            return True
        return False

    # -- commits -------------------------------------------------------------------------------

    def check_commit(self, member_id: str, member_epoch: int, sp: StreamPartition) -> None:
        """Raise unless the member may commit an offset of `sp` now (see the module doc)."""
        if not member_id:
            if self.members:
                raise UnknownMemberId(self.name, "")
            return
        member = self.members.get(member_id)
        if member is None:
            raise UnknownMemberId(self.name, member_id)
        if member_epoch not in (member.epoch, member.previous_epoch):
            if member_epoch < member.epoch:
                raise StaleMemberEpoch(self.name, member_id, member_epoch, member.epoch)
            raise FencedMember(self.name, member_id, member_epoch, member.epoch)
        if sp not in member.owned:
            raise PartitionNotAssigned(self.name, member_id, sp.stream, sp.partition)

    # -- views ---------------------------------------------------------------------------------

    @property
    def state(self) -> GroupState:
        if not self.members:
            return GroupState.EMPTY
        for member in self.members.values():
            target = self.target.get(member.member_id, _NOTHING)
            if member.owned != target or member.assigned != target:
                return GroupState.RECONCILING
        return GroupState.STABLE

    def holder(self, sp: StreamPartition) -> str | None:
        return self._holder.get(sp)

    def describe(self, now_ms: int) -> dict[str, Any]:
        members = [{
            "member_id": m.member_id, "client_id": m.client_id, "member_epoch": m.epoch,
            "streams": list(m.streams), "assigned": _names(m.assigned),
            "revoking": _names(m.owned - m.assigned),
            "target": _names(self.target.get(m.member_id, _NOTHING)),
            "last_heartbeat_ms_ago": max(0, now_ms - m.last_heartbeat_ms),
            "session_timeout_ms": m.session_timeout_ms,
        } for m in sorted(self.members.values(), key=lambda m: m.member_id)]
        return {"group": self.name, "state": self.state.value, "group_epoch": self.epoch,
                "members": members}

    # -- internals -----------------------------------------------------------------------------

    def _eligible(self, member: Member) -> frozenset[StreamPartition]:
        return frozenset(StreamPartition(stream, p) for stream in member.streams
                         for p in range(self._topology.get(stream, 0)))

    def _subscribed_counts(self) -> dict[str, int]:
        """The partition count of every stream some member subscribes to."""
        return {s: self._topology.get(s, 0) for m in self.members.values() for s in m.streams}

    def _sync_topology(self, topology: Mapping[str, int]) -> bool:
        self._topology = topology
        counts = self._subscribed_counts()
        if counts == self._counts:
            return False
        self._counts = counts
        return True

    def _retarget(self) -> None:
        self._counts = self._subscribed_counts()
        self.target = assign({m.member_id: self._eligible(m) for m in self.members.values()},
                             {m.member_id: m.owned for m in self.members.values()})
        self.epoch += 1
        self.version += 1

    def _release(self, member: Member, partitions: frozenset[StreamPartition]) -> None:
        if not partitions:
            return
        for sp in partitions:
            if self._holder.get(sp) == member.member_id:
                del self._holder[sp]
        member.owned -= partitions
        member.assigned -= partitions
        self.version += 1

    def _reconcile(self, member: Member) -> Assignment:
        target = self.target.get(member.member_id, _NOTHING)
        grants = frozenset(sp for sp in target - member.owned if sp not in self._holder)
        if grants:
            for sp in grants:
                self._holder[sp] = member.member_id
            member.owned |= grants
            self.dirty = True
            self.version += 1
        assignment = member.owned & target
        if assignment != member.assigned or member.epoch == JOIN_EPOCH:
            self.epoch += 1
            member.previous_epoch, member.epoch = member.epoch, self.epoch
            member.assigned = assignment
            self.dirty = True
            self.version += 1
        return Assignment(member.member_id, member.epoch, assignment)


def _names(partitions: frozenset[StreamPartition]) -> list[str]:
    return [str(sp) for sp in sorted(partitions)]
