"""Consumer groups on the client: members (GroupSubscription) and the groups' offsets.

Theory of operation: `subscribe_group` builds a GroupSubscription (group_subscription.py),
which joins the group through the group's coordinator (offsets.py finds it) and reads the
partitions it is given through partition Subscriptions (subscription.py) made here. The
client keeps its members and closes them — commit, leave — when it closes.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

from jetstream.client.group_subscription import (
    Callback,
    GroupSubscription,
    MemberSettings,
    OpenPartition,
)
from jetstream.client.offsets import GroupOffsets

AUTO_COMMIT_INTERVAL_MS = 5_000
SESSION_TIMEOUT_MS = 10_000
HEARTBEAT_INTERVAL_MS = 1_000


class ConsumerGroups(GroupOffsets):
    client_id: str

    def __init__(self, open_partition: OpenPartition) -> None:
        GroupOffsets.__init__(self)
        self._open_partition = open_partition
        self._members: weakref.WeakSet[GroupSubscription] = weakref.WeakSet()

    def subscribe_group(
        self,
        streams: str | Sequence[str] | None,
        group: str,
        *,
        selector: str = "",
        reset: str = "earliest",
        auto_commit: bool = True,
        auto_commit_interval_ms: int = AUTO_COMMIT_INTERVAL_MS,
        session_timeout_ms: int = SESSION_TIMEOUT_MS,
        heartbeat_interval_ms: int = HEARTBEAT_INTERVAL_MS,
        rebalance_timeout_ms: int = 30_000,
        max_bytes: int = 1 << 20,
        max_wait_ms: int = 500,
        on_assign: Callback | None = None,
        on_revoke: Callback | None = None,
    ) -> GroupSubscription:
        """A member of consumer group `group`, reading the partitions the group's
        coordinator gives it of `streams` (a name or several) and/or the streams whose labels
        match `selector`. See Client.subscribe."""
        names = [streams] if isinstance(streams, str) else list(streams or ())
        if not names and not selector:
            raise ValueError("a group subscription names streams or a selector")
        settings = MemberSettings(reset, auto_commit, auto_commit_interval_ms,
                                  session_timeout_ms, heartbeat_interval_ms,
                                  rebalance_timeout_ms, max_bytes, max_wait_ms, self.client_id,
                                  on_assign, on_revoke)
        member = GroupSubscription(self, self._open_partition, group, names, selector,
                                   settings)
        self._members.add(member)
        return member

    async def _close_members(self) -> None:
        for member in list(self._members):
            await member.close()
