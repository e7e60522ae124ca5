"""What replication does about a full data disk: a follower leaves the ISR and comes back, a
leader hands its partitions to an in-sync follower that has room.

Theory of operation (pure: the broker's DiskMonitor says whether the disk is above its high
watermark, and the async shells in jetstream.server carry the decisions out):
- A follower (`FollowerDisk`) is unfit ("disk_full", jetstream.isr.leader.Unfit) while its
  disk is above the watermark or its last append found no room. It keeps fetching, so the
  leader hears this at once and takes it out of the ISR (and the HW stops waiting for it),
  but it appends nothing while the disk is above the watermark: the room left there is for
  recovery, checkpoints and the metadata. It is fit again once an append succeeded with the
  disk below the watermark, or, when a fetch brought nothing to append, once the disk is
  below it; the leader then adds it back when it has caught up (its usual expansion rule).
  While it is full, its fetch session names its partitions again only as the disk changes
  or after a failed append (jetstream.server.replica_fetcher): what it would get it could
  not keep.
- A leader on a full disk (`FullDiskHandOver`) moves each partition it leads to the first
  in-sync follower, in replica order, that has not said it is unfit (`successors`), so
  that publishing goes on there. At most once per leader epoch, and only when there is
  such a follower: otherwise it stays leader and refuses appends (DISK_FULL). It does not
  come back while its disk is full: as a follower it says so and stays out of the ISR, and
  only ISR members can lead.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from jetstream.isr.leader import Unfit

PartitionKey = tuple[str, int]


class FollowerDisk:
    """One follower's standing on a disk that may be full (see the module docstring)."""

    def __init__(self) -> None:
        self._append_failed = False

    def unfit(self, disk_full: bool) -> Unfit:
        """What the next fetch tells the leader; `disk_full`: the disk is above its
        high watermark now."""
        return "disk_full" if disk_full or self._append_failed else ""

    @staticmethod
    def may_append(disk_full: bool) -> bool:
        """Whether to append what a fetch brought."""
        return not disk_full

    def after_fetch(self, disk_full: bool, appended: bool | None) -> None:
        """A fetch round ended: `appended` says whether the append of what it brought
        succeeded, None when nothing was appended (nothing came, or the disk was full)."""
        if appended is not None:
            self._append_failed = not appended
        elif not disk_full:
            self._append_failed = False


def successors(replicas: Iterable[int], isr: Iterable[int], me: int,
               unfit: Iterable[int] = ()) -> list[int]:
    """The in-sync replicas other than `me`, in replica order, less those that said they are
    unfit: the brokers `me` may hand its leadership to."""
    in_sync, out = set(isr), set(unfit)
    return [r for r in replicas if r != me and r in in_sync and r not in out]


@dataclass(frozen=True, slots=True)
class LedPartition:
    """A partition this broker leads, as its leader sees it: the committed ISR, and the
    followers whose last fetch said they are unfit."""

    stream: str
    partition: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    unfit: frozenset[int] = frozenset()


@dataclass(frozen=True, slots=True)
class HandOver:
    """Propose `leader` as the partition's leader (a compare-and-set on `leader_epoch`)."""

    stream: str
    partition: int
    leader_epoch: int
    leader: int


class FullDiskHandOver:
    """Which partitions a broker on a full disk hands over, and to whom (see the module
    docstring)."""

    def __init__(self, broker_id: int) -> None:
        self.broker_id = broker_id
        #: The leader epoch a hand-over was decided at, per partition.
        self._decided: dict[PartitionKey, int] = {}

    def decide(self, disk_full: bool, led: Iterable[LedPartition]) -> list[HandOver]:
        """The hand-overs to propose now, given whether the disk is above its high watermark
        and the partitions this broker leads."""
        led = list(led)
        # Partitions no longer led here are forgotten: leading one again is a new epoch.
        current = {(p.stream, p.partition) for p in led}
        self._decided = {k: e for k, e in self._decided.items() if k in current}
        if not disk_full:
            return []
        decisions: list[HandOver] = []
        for p in led:
            key = (p.stream, p.partition)
            if self._decided.get(key, -1) >= p.leader_epoch:
                continue
            to = successors(p.replicas, p.isr, self.broker_id, p.unfit)
            if to:
                self._decided[key] = p.leader_epoch
                decisions.append(HandOver(p.stream, p.partition, p.leader_epoch, to[0]))
        return decisions
