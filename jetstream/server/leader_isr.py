"""A cluster-mode partition leader's dealings with its ISR: what the ISR core (an
isr.LeaderState) is told of followers, whether an `all` publish can be taken, proposing the
core's ISR changes to the metadata until their outcome is known, and checking a follower's
fetch. The leader (jetstream.server.partition) owns the core and carries out its decisions;
these are the steps it takes on the way, kept apart from ingest, commit and reads."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from jetstream.errors import FencedLeaderEpoch, NotEnoughReplicas, NotLeader, OffsetOutOfRange
from jetstream.isr.leader import Decision, LeaderState, ProposeIsr, Unfit
from jetstream.raft_meta.model import PartitionState
from jetstream.server.metrics import PartitionMetrics
from jetstream.stream.log import Log

log = logging.getLogger(__name__)

#: Wait before proposing an ISR change again after its outcome was unknown (a timeout).
PROPOSE_RETRY_MS = 500

Key = tuple[str, int]


def now_ms() -> int:
    return int(time.monotonic() * 1000)


@dataclass(frozen=True, slots=True)
class Replication:
    """What a cluster-mode leader needs from the broker: this broker's id, the ISR settings,
    and how to propose an ISR change (the coroutine returns True when committed, False when
    refused, None when the outcome is unknown)."""

    broker_id: int
    replica_lag_ms_max: int
    propose_isr: Callable[[ProposeIsr], Awaitable[bool | None]]


class SessionWatch(Protocol):
    """The broker's fetch sessions (jetstream.server.fetch_sessions), as a leader sees them:
    told when a partition's records or HW change, and asked where its followers stand."""

    def changed(self, key: Key) -> None: ...

    def standing(self, key: Key) -> list[tuple[int, int, int]]:
        """(replica id, the offset it fetches at, when it last said so) per session that
        holds the partition."""
        ...


def isr_for_all(isr: LeaderState, sessions: SessionWatch | None, key: Key) -> tuple[int, ...]:
    """The committed ISR, less the members a removal in flight drops and the members lagging
    right now (whose removal may be stuck behind another proposal)."""
    pending = isr.pending_isr
    members = pending if pending is not None and len(pending) < len(isr.isr) else isr.isr
    now, lag_max = now_ms(), isr.replica_lag_ms_max
    standing = {}
    if sessions is not None:
        # An idle partition's followers speak through their sessions (see `refresh_standing`).
        standing = {replica: fetched_ms for replica, offset, fetched_ms
                    in sessions.standing(key) if offset >= isr.log_end_offset}
    return tuple(r for r in members if r == isr.leader_id or (
        (seen := max(isr.follower_state(r).last_caught_up_ms or -1, standing.get(r, -1)))
        >= 0 and now - seen <= lag_max))


def refuse_all(isr: LeaderState | None, sessions: SessionWatch | None, key: Key) -> bool:
    """True while an `all` publish must be refused: the ISR is below min_isr, counting a
    removal in flight or due (when the metadata has lost its majority the removal never
    commits, and the publish would wait for a replica that is gone)."""
    if isr is None:
        return False
    if len(isr_for_all(isr, None, key)) >= isr.min_isr:
        return False  # the members the core saw caught up lately settle it, sessions unasked
    return len(isr_for_all(isr, sessions, key)) < isr.min_isr


def not_enough_replicas(isr: LeaderState, sessions: SessionWatch | None,
                        key: Key) -> NotEnoughReplicas:
    return NotEnoughReplicas(isr.min_isr, len(isr_for_all(isr, sessions, key)))


def refresh_standing(isr: LeaderState, sessions: SessionWatch | None, key: Key) -> None:
    """Tell the ISR core where the followers of this partition stand in their fetch
    sessions: a session names a partition only when its offset changes, so followers of an
    idle partition would otherwise seem to have stopped fetching."""
    if sessions is None:
        return
    for replica_id, offset, fetched_ms in sessions.standing(key):
        with contextlib.suppress(ValueError):  # not a follower of this partition
            isr.on_follower_standing(replica_id, offset, fetched_ms)


def count_isr_change(metrics: PartitionMetrics, old: tuple[int, ...],
                     new: tuple[int, ...]) -> None:
    if set(old) - set(new):
        metrics.isr_shrinks += 1
    if set(new) - set(old):
        metrics.isr_expands += 1


async def propose_until_known(name: str, decision: ProposeIsr, isr: LeaderState,
                              replication: Replication, metrics: PartitionMetrics,
                              stopping: Callable[[], bool],
                              apply: Callable[[list[Decision]], Awaitable[None]]) -> None:
    """Propose until the outcome is known. An unknown outcome (a timeout) is settled by
    proposing the same ISR again: the compare-and-set is on the epoch only, so a copy
    applied after the first changes nothing."""
    log.info("%s: proposing ISR %s (%s)", name, decision.isr, decision.reason)
    while not stopping() and isr.pending_isr == decision.isr:
        outcome = await replication.propose_isr(decision)
        if stopping() or isr.pending_isr != decision.isr:
            return  # settled meanwhile (the metadata listener saw it committed)
        if outcome is None:
            await asyncio.sleep(PROPOSE_RETRY_MS / 1000)
        elif outcome:
            # Committed, but the listener may not have run (or saw no change: a copy).
            count_isr_change(metrics, isr.isr, decision.isr)
            await apply(isr.on_isr_committed(decision.isr, decision.expected_epoch))
        else:
            await apply(isr.on_proposal_failed())


def follower_fetch(isr: LeaderState | None, state: PartitionState, log_: Log, stopping: bool,
                   replica_id: int, offset: int, leader_epoch: int,
                   unfit: Unfit) -> list[Decision]:
    """The ISR core's decisions on follower `replica_id` fetching at `offset` in
    `leader_epoch` (it holds every offset below). Raises NotLeader, FencedLeaderEpoch or
    OffsetOutOfRange when it cannot fetch here."""
    if isr is None:
        raise NotLeader(state.stream, state.partition)
    if leader_epoch != state.leader_epoch or stopping:
        raise FencedLeaderEpoch(state.stream, state.partition, leader_epoch,
                                state.leader_epoch)
    if offset > log_.log_end_offset:
        raise OffsetOutOfRange(offset, log_.log_start_offset, log_.log_end_offset)
    try:
        return isr.on_follower_fetch(replica_id, offset, now_ms(), unfit)
    except ValueError as exc:
        raise OffsetOutOfRange(offset, log_.log_start_offset, log_.log_end_offset) from exc
