"""Preferred-leader rebalancing (jetstream.raft_meta.rebalance): which leaderships go back to
their first replica, when, and never to a replica that may lack committed records."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from jetstream.raft_meta.fsm import (
    ChangeIsr,
    ChangeLeader,
    CreateStream,
    MetadataState,
    RegisterBroker,
)
from jetstream.raft_meta.model import BrokerInfo, StreamConfig
from jetstream.raft_meta.rebalance import preferred_leader_changes

ALL = (0, 1, 2)


def cluster(partitions: int = 12) -> MetadataState:
    state = MetadataState()
    for i in ALL:
        state.apply(RegisterBroker(BrokerInfo(i, "127.0.0.1", 7000 + i)))
    state.apply(CreateStream(StreamConfig("s", "s", partitions=partitions,
                                          replication_factor=3, min_isr=2)))
    return state


def fail_over(state: MetadataState, broker: int) -> None:
    """What a failover of `broker` leaves: its partitions led by their next replica, and
    it out of their ISRs."""
    for p in list(state.partitions.values()):
        if p.leader == broker:
            successor = next(r for r in p.replicas if r != broker)
            state.apply(ChangeLeader(p.stream, p.partition, p.leader_epoch, successor))
        p = state.partition(p.stream, p.partition)
        if broker in p.isr:
            state.apply(ChangeIsr(p.stream, p.partition, p.leader_epoch,
                                  tuple(b for b in p.isr if b != broker)))


def rejoin(state: MetadataState, broker: int) -> None:
    """`broker` caught up: back in every ISR."""
    for p in list(state.partitions.values()):
        state.apply(ChangeIsr(p.stream, p.partition, p.leader_epoch,
                              tuple(sorted({*p.isr, broker}))))


def test_a_balanced_cluster_moves_nothing() -> None:
    state = cluster()
    assert all(p.leader == p.replicas[0] for p in state.partitions.values())
    assert preferred_leader_changes(state, ALL, 10, 100) == []


def test_leaderships_go_back_once_their_broker_is_live_and_in_sync() -> None:
    state = cluster()
    preferred_by_1 = sorted(k for k, p in state.partitions.items() if p.replicas[0] == 1)
    fail_over(state, 1)
    assert preferred_leader_changes(state, (0, 2), 10, 100) == []  # broker 1 is gone
    assert preferred_leader_changes(state, ALL, 10, 100) == []  # back, not in sync yet
    rejoin(state, 1)
    changes = preferred_leader_changes(state, ALL, 10, 100)
    assert [(c.stream, c.partition) for c in changes] == preferred_by_1
    for change in changes:
        p = state.partition(change.stream, change.partition)
        assert change == ChangeLeader(p.stream, p.partition, p.leader_epoch, 1)
        state.apply(change)
    assert all(p.leader == p.replicas[0] for p in state.partitions.values())
    assert preferred_leader_changes(state, ALL, 10, 100) == []


def test_an_imbalance_at_or_below_the_percentage_is_left_alone() -> None:
    state = cluster(partitions=30)  # ten partitions prefer each broker
    mine = sorted(k for k, p in state.partitions.items() if p.replicas[0] == 0)
    assert len(mine) == 10
    for key in mine[:2]:
        p = state.partitions[key]
        state.apply(ChangeLeader(p.stream, p.partition, p.leader_epoch, p.replicas[1]))
        p = state.partitions[key]
        state.apply(ChangeIsr(p.stream, p.partition, p.leader_epoch, ALL))
    assert len(preferred_leader_changes(state, ALL, 20, 100)) == 0  # 2 of 10: 20 %
    assert [(c.stream, c.partition) for c in preferred_leader_changes(state, ALL, 10, 100)] \
        == mine[:2]


def test_a_partition_whose_leader_is_gone_is_left_to_failover() -> None:
    state = cluster()
    fail_over(state, 1)
    rejoin(state, 1)
    moved = [p for p in state.partitions.values() if p.replicas[0] == 1]
    acting = {p.leader for p in moved}
    for gone in acting:
        live = tuple(b for b in ALL if b != gone)
        changes = preferred_leader_changes(state, live, 10, 100)
        assert sorted((c.stream, c.partition) for c in changes) == sorted(
            (p.stream, p.partition) for p in moved if p.leader != gone)
    assert len(preferred_leader_changes(state, ALL, 10, 100)) == len(moved)


def test_at_most_limit_changes_a_round_in_a_stable_order() -> None:
    state = cluster(partitions=30)
    fail_over(state, 2)
    rejoin(state, 2)
    everything = preferred_leader_changes(state, ALL, 10, 1000)
    assert len(everything) == 10
    assert preferred_leader_changes(state, ALL, 10, 4) == everything[:4]


@st.composite
def shuffled_states(draw: st.DrawFn) -> tuple[MetadataState, tuple[int, ...]]:
    state = cluster(partitions=draw(st.integers(1, 24)))
    for p in list(state.partitions.values()):
        leader = draw(st.sampled_from(p.replicas))
        if leader != p.leader:
            state.apply(ChangeLeader(p.stream, p.partition, p.leader_epoch, leader))
        p = state.partition(p.stream, p.partition)
        isr = draw(st.sets(st.sampled_from(p.replicas)))
        state.apply(ChangeIsr(p.stream, p.partition, p.leader_epoch,
                              tuple(sorted(isr | {p.leader}))))
    live = tuple(sorted(draw(st.sets(st.sampled_from(ALL), min_size=1))))
    return state, live


@settings(max_examples=200, deadline=None)
@given(shuffled_states(), st.integers(0, 100))
def test_changes_only_go_to_a_live_in_sync_first_replica_and_settle(
        drawn: tuple[MetadataState, tuple[int, ...]], percentage: int) -> None:
    state, live = drawn
    changes = preferred_leader_changes(state, live, percentage, 10_000)
    for change in changes:
        p = state.partition(change.stream, change.partition)
        assert change.leader == p.replicas[0] != p.leader
        assert change.leader in live and change.leader in p.isr and p.leader in live
        assert change.expected_epoch == p.leader_epoch
    for change in changes:
        state.apply(change)
    assert preferred_leader_changes(state, live, percentage, 10_000) == []
