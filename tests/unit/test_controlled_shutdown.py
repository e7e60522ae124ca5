"""A stopping broker's mark in the metadata (`ControlledShutdown`): no leadership goes to a
broker that is shutting down, by leader change, failover or preferred-leader round, and the
mark comes off when it starts again."""

from __future__ import annotations

import json

from jetstream.raft_meta.changes import Touched, touched
from jetstream.raft_meta.codec import decode_command, encode_command
from jetstream.raft_meta.controller import FailoverController
from jetstream.raft_meta.fsm import (
    BrokerShuttingDown,
    ChangeIsr,
    ChangeLeader,
    ChangeLeaders,
    ControlledShutdown,
    MetadataState,
    ShutdownMark,
)
from jetstream.raft_meta.rebalance import preferred_leader_changes
from tests.unit.test_leader_rebalance import ALL, cluster


def test_the_mark_is_set_once_and_taken_off() -> None:
    state = cluster(partitions=3)
    assert state.apply(ControlledShutdown(1, True)) == ShutdownMark(True)
    marked_at = state.shutting_down[1]
    assert state.apply(ControlledShutdown(1, True)) == ShutdownMark(False)  # kept
    assert state.shutting_down == {1: marked_at}
    led = frozenset(key for key, p in state.partitions.items() if p.leader == 1)
    assert led  # placement spreads three partitions' leaderships over three brokers
    off = state.apply(ControlledShutdown(1, False))
    assert off == ShutdownMark(True, led)
    assert state.shutting_down == {}
    assert state.apply(ControlledShutdown(1, False)) == ShutdownMark(False)


def test_the_mark_coming_off_touches_what_the_broker_leads() -> None:
    """The followers other brokers held back while it was marked start then."""
    state = cluster(partitions=3)
    mark = ControlledShutdown(1, True)
    assert touched(mark, state.apply(mark)) == Touched()
    led = frozenset(key for key, p in state.partitions.items() if p.leader == 1)
    off = ControlledShutdown(1, False)
    assert touched(off, state.apply(off)) == Touched(led)
    assert touched(off, state.apply(off)) == Touched()  # no mark to take off


def test_a_leader_change_to_a_broker_shutting_down_is_refused() -> None:
    state = cluster(partitions=3)
    p = state.partition("s", 0)
    target = next(b for b in p.isr if b != p.leader)
    state.apply(ControlledShutdown(target, True))
    version = state.version
    (refused,) = state.apply(ChangeLeaders((ChangeLeader("s", 0, p.leader_epoch, target),)))
    assert isinstance(refused, BrokerShuttingDown)
    assert refused.code == "BROKER_SHUTTING_DOWN" and refused.retriable
    assert state.partition("s", 0) == p and state.version == version + 1
    # The leader itself may renew its own leadership (a start after a clean stop).
    state.apply(ControlledShutdown(p.leader, True))
    renewed = state.apply(ChangeLeader("s", 0, p.leader_epoch, p.leader))
    assert renewed.leader == p.leader and renewed.leader_epoch == p.leader_epoch + 1
    # Back: leaderships may go to it again.
    state.apply(ControlledShutdown(target, False))
    moved = state.apply(ChangeLeader("s", 0, renewed.leader_epoch, target))
    assert moved.leader == target


def test_the_mark_survives_the_dump_and_the_raft_encoding() -> None:
    state = cluster(partitions=3)
    state.apply(ControlledShutdown(2, True))
    again = MetadataState.from_dict(json.loads(json.dumps(state.to_dict())))
    assert again.shutting_down == state.shutting_down
    assert again.to_dict() == state.to_dict()
    older = state.to_dict()
    del older["shutting_down"]  # a dump written before the mark existed
    assert MetadataState.from_dict(older).shutting_down == {}
    for command in (ControlledShutdown(2, True), ControlledShutdown(0, False)):
        assert decode_command(json.loads(json.dumps(encode_command(command)))) == command


def test_failover_passes_over_a_broker_shutting_down() -> None:
    state = cluster(partitions=1)
    p = state.partition("s", 0)
    first, second = (b for b in p.replicas if b != p.leader)
    c = FailoverController(report_window_ms=5_000, broker_timeout_ms=3_000)
    for broker in ALL:
        c.on_broker_seen(broker, 0)
    state.apply(ControlledShutdown(first, True))
    for broker in (first, second):  # the leader is gone, the others are seen
        c.on_broker_seen(broker, 10_000)
    (decision,) = c.decide(state, 10_000)
    assert decision.leader == second
    # Every in-sync replica shutting down: the leadership stays where it was.
    state.apply(ControlledShutdown(second, True))
    c.retry("s", 0)
    assert c.decide(state, 10_000) == []
    state.apply(ControlledShutdown(first, False))  # started again
    (decision,) = c.decide(state, 10_000)
    assert decision.leader == first


def test_preferred_leader_rounds_pass_over_a_broker_shutting_down() -> None:
    state = cluster(partitions=12)
    preferred_by_1 = sorted(k for k, p in state.partitions.items() if p.replicas[0] == 1)
    for key in preferred_by_1:  # broker 1's partitions led elsewhere, 1 still in sync
        p = state.partitions[key]
        state.apply(ChangeLeader(p.stream, p.partition, p.leader_epoch, p.replicas[1]))
        p = state.partitions[key]
        state.apply(ChangeIsr(p.stream, p.partition, p.leader_epoch, ALL))
    state.apply(ControlledShutdown(1, True))
    assert preferred_leader_changes(state, ALL, 10, 100) == []
    state.apply(ControlledShutdown(1, False))
    changes = preferred_leader_changes(state, ALL, 10, 100)
    assert sorted((c.stream, c.partition) for c in changes) == preferred_by_1
