"""Consumer groups and committed offsets."""

from __future__ import annotations

from jetstream.errors.base import JetstreamError


class ProtectedStream(JetstreamError):
    """Streams whose names start with "__" (such as `__offsets`, the committed offsets) are
    the system's own: they cannot be created, deleted, changed or published to by users."""

    code = "STREAM_PROTECTED"

    def __init__(self, stream: str, action: str) -> None:
        super().__init__(f"cannot {action} {stream!r}: streams named __* are internal",
                         stream=stream, action=action)


class NotCoordinator(JetstreamError):
    """This broker is not the group's coordinator (the leader of its `__offsets` partition)
    or is still loading the group after becoming it. Find the coordinator again and retry."""

    code = "NOT_COORDINATOR"
    retriable = True

    def __init__(self, group: str, reason: str = "") -> None:
        super().__init__(f"not the coordinator of group {group!r}"
                         + (f" ({reason})" if reason else ""), group=group, reason=reason)


class UnknownMemberId(JetstreamError):
    """The group has no member with this id (its session expired, it left, or it never
    joined). Drop the partitions it held and join again (member epoch 0)."""

    code = "UNKNOWN_MEMBER_ID"

    def __init__(self, group: str, member_id: str) -> None:
        super().__init__(f"group {group!r} has no member {member_id!r}", group=group,
                         member_id=member_id)


class FencedMember(JetstreamError):
    """The member's epoch is not the coordinator's: another incarnation of it took over, or
    it missed an assignment. Drop the partitions it held and join again (epoch 0)."""

    code = "FENCED_MEMBER"

    def __init__(self, group: str, member_id: str, epoch: int, current: int) -> None:
        super().__init__(f"member {member_id!r} of group {group!r} is fenced: epoch {epoch}, "
                         f"the coordinator's is {current}", group=group, member_id=member_id,
                         epoch=epoch, current_epoch=current)


class StaleMemberEpoch(JetstreamError):
    """A commit carried a member epoch older than the member's current one: its assignment
    changed meanwhile. Take the newest heartbeat answer's epoch and commit again what the
    member still holds."""

    code = "STALE_MEMBER_EPOCH"
    retriable = True

    def __init__(self, group: str, member_id: str, epoch: int, current: int) -> None:
        super().__init__(f"member {member_id!r} of group {group!r} committed with epoch "
                         f"{epoch}; its epoch is {current}", group=group, member_id=member_id,
                         epoch=epoch, current_epoch=current)


class PartitionNotAssigned(JetstreamError):
    """A member committed an offset of a partition it does not hold (it was revoked and
    given to another member, or never given to it). The commit is refused: the new holder's
    progress must not be overwritten."""

    code = "PARTITION_NOT_ASSIGNED"

    def __init__(self, group: str, member_id: str, stream: str, partition: int) -> None:
        super().__init__(f"member {member_id!r} of group {group!r} does not hold "
                         f"{stream}/{partition}", group=group, member_id=member_id,
                         stream=stream, partition=partition)


class OffsetBehindCommitted(JetstreamError):
    """A commit would move a committed offset backwards. Commits only move forwards (a
    retried commit of the same offset is fine); to go back, reset the group's offsets
    (`jetstream offsets reset`) while it has no members."""

    code = "OFFSET_BEHIND_COMMITTED"

    def __init__(self, group: str, stream: str, partition: int, offset: int,
                 committed: int) -> None:
        super().__init__(f"group {group!r}: {stream}/{partition} offset {offset} is behind the "
                         f"committed {committed}", group=group, stream=stream,
                         partition=partition, offset=offset, committed=committed)


class GroupNotEmpty(JetstreamError):
    """Resetting or deleting a group's offsets needs the group to have no members (as in
    Kafka): stop its consumers first."""

    code = "GROUP_NOT_EMPTY"

    def __init__(self, group: str, members: int) -> None:
        super().__init__(f"group {group!r} has {members} member(s)", group=group,
                         members=members)


class GroupFull(JetstreamError):
    """The group has as many members as a group may have (`group_members_max`)."""

    code = "GROUP_FULL"

    def __init__(self, group: str, members_max: int) -> None:
        super().__init__(f"group {group!r} already has {members_max} members", group=group,
                         members_max=members_max)


class TooManyGroups(JetstreamError):
    """This broker coordinates as many consumer groups as it may (`groups_max`); groups
    that already exist carry on. Delete unused groups' offsets, or raise the limit."""

    code = "TOO_MANY_GROUPS"

    def __init__(self, group: str, groups_max: int) -> None:
        super().__init__(f"cannot take group {group!r}: this broker coordinates {groups_max} "
                         "groups already", group=group, groups_max=groups_max)


class NoCommittedOffset(JetstreamError):
    """The group has no committed offset for a partition and its reset policy is `error`.
    Commit or reset an offset for it, or subscribe with reset `earliest` or `latest`."""

    code = "NO_COMMITTED_OFFSET"

    def __init__(self, group: str, stream: str, partition: int) -> None:
        super().__init__(f"group {group!r} has no committed offset for {stream}/{partition}",
                         group=group, stream=stream, partition=partition)
