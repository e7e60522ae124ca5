"""Preferred-leader rebalancing (Kafka's automatic preferred replica election), as a pure
function of the metadata.

Theory of operation: a partition's preferred leader is the first broker of its replica
list (placement spreads those first replicas over the brokers). A failover, a broker's
controlled stop or a full disk moves leaderships to other replicas, and nothing moves them
back, so after a broker comes back the others lead more than their share. Every
`leader_imbalance_check_interval_ms` the metadata leader counts, per broker, the partitions
that prefer it and how many of them another broker leads; where that share is above
`leader_imbalance_per_broker_percentage`, each such partition whose preferred broker is
live, not shutting down and in its ISR (so it holds every committed record) gets a
`ChangeLeader` back to it, compare-and-set on the epoch seen, as a failover decision is.
A partition whose leader is not live is left to the failover controller. At most `limit`
changes a round; the caller runs the next round at once while the last one was cut short.

Work per round is one pass over the partitions, at the check interval only. Nothing here
does IO.
"""

from __future__ import annotations

from collections.abc import Collection

from jetstream.raft_meta.fsm import ChangeLeader, MetadataState
from jetstream.raft_meta.model import PartitionState


def preferred_leader_changes(state: MetadataState, live: Collection[int],
                             imbalance_percentage: int, limit: int) -> list[ChangeLeader]:
    """The leader changes that give imbalanced brokers their preferred partitions back, in
    a deterministic order (broker, then stream and partition), at most `limit`."""
    preferring: dict[int, int] = {}
    elsewhere: dict[int, list[PartitionState]] = {}
    for partition in state.partitions.values():
        if not partition.replicas:
            continue
        preferred = partition.replicas[0]
        preferring[preferred] = preferring.get(preferred, 0) + 1
        if partition.leader != preferred:
            elsewhere.setdefault(preferred, []).append(partition)
    changes: list[ChangeLeader] = []
    for broker in sorted(elsewhere):
        moved = elsewhere[broker]
        if broker not in live or broker in state.shutting_down or \
                len(moved) * 100 <= imbalance_percentage * preferring[broker]:
            continue
        for p in sorted(moved, key=lambda p: (p.stream, p.partition)):
            if broker in p.isr and p.leader in live:
                changes.append(ChangeLeader(p.stream, p.partition, p.leader_epoch, broker))
                if len(changes) >= limit:
                    return changes
    return changes
