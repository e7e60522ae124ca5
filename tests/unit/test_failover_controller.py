"""The metadata leader's failover decisions."""

from __future__ import annotations

from jetstream.raft_meta.controller import FailoverController
from jetstream.raft_meta.fsm import (
    ChangeIsr,
    ChangeLeader,
    ChangeLeaders,
    CreateStream,
    MetadataState,
    RegisterBroker,
)
from jetstream.raft_meta.model import BrokerInfo, StreamConfig

WINDOW_MS = 5_000
BROKER_TIMEOUT_MS = 3_000


def cluster(brokers: int = 3, replication_factor: int = 3) -> MetadataState:
    state = MetadataState()
    for i in range(brokers):
        state.apply(RegisterBroker(BrokerInfo(i, "127.0.0.1", 7000 + i)))
    state.apply(CreateStream(StreamConfig("s", "s", replication_factor=replication_factor,
                                          min_isr=min(2, replication_factor))))
    return state


def controller(state: MetadataState, now: int = 0) -> FailoverController:
    c = FailoverController(report_window_ms=WINDOW_MS, broker_timeout_ms=BROKER_TIMEOUT_MS)
    for broker in state.brokers:
        c.on_broker_seen(broker, now)
    return c


def test_nothing_happens_while_everyone_is_alive_and_quiet() -> None:
    state = cluster()
    c = controller(state)
    assert c.decide(state, 1000) == []


def test_a_majority_of_isr_followers_reporting_moves_the_leader_within_the_isr() -> None:
    state = cluster()
    p = state.partition("s", 0)
    followers = [b for b in p.isr if b != p.leader]
    c = controller(state)
    c.on_report("s", 0, p.leader_epoch, followers[0], 100)
    assert c.decide(state, 100) == []  # one of two is not a majority
    c.on_report("s", 0, p.leader_epoch, followers[1], 200)
    (decision,) = c.decide(state, 200)
    assert decision == ChangeLeader("s", 0, p.leader_epoch, next(
        b for b in p.replicas if b != p.leader))
    assert c.decide(state, 300) == []  # decided once per epoch
    moved = state.apply(decision)
    assert moved.leader_epoch == p.leader_epoch + 1 and p.leader not in moved.isr


def test_old_reports_and_reports_about_another_epoch_do_not_count() -> None:
    state = cluster()
    p = state.partition("s", 0)
    followers = [b for b in p.isr if b != p.leader]
    c = controller(state)
    c.on_report("s", 0, p.leader_epoch, followers[0], 0)
    c.on_report("s", 0, p.leader_epoch + 7, followers[1], WINDOW_MS + 10)
    assert c.decide(state, WINDOW_MS + 10) == []
    c.on_report("s", 0, p.leader_epoch, followers[1], WINDOW_MS + 100)
    assert c.decide(state, WINDOW_MS + 100) == []  # the first report is out of the window


def test_a_broker_not_seen_for_the_timeout_loses_its_leaderships() -> None:
    state = cluster()
    p = state.partition("s", 0)
    c = controller(state)
    for broker in state.brokers:
        if broker != p.leader:
            c.on_broker_seen(broker, BROKER_TIMEOUT_MS + 1)
    (decision,) = c.decide(state, BROKER_TIMEOUT_MS + 1)
    assert decision.leader != p.leader and decision.leader in p.isr


def test_no_leader_outside_the_isr_even_when_the_leader_is_gone() -> None:
    state = cluster()
    p = state.partition("s", 0)
    state.apply(ChangeIsr("s", 0, p.leader_epoch, (p.leader,)))  # followers fell behind
    c = controller(state)
    for broker in state.brokers:
        if broker != p.leader:
            c.on_broker_seen(broker, 10_000)
    assert c.decide(state, 10_000) == []  # unavailable rather than lose committed records


def test_the_new_leader_must_be_alive() -> None:
    state = cluster()
    p = state.partition("s", 0)
    c = controller(state)
    survivor = p.replicas[2]
    c.on_broker_seen(survivor, 10_000)
    (decision,) = c.decide(state, 10_000)
    assert decision.leader == survivor


def test_a_decision_that_was_not_committed_is_made_again_after_retry() -> None:
    state = cluster()
    p = state.partition("s", 0)
    c = controller(state)
    for broker in state.brokers:
        if broker != p.leader:
            c.on_broker_seen(broker, 10_000)
    (first,) = c.decide(state, 10_000)
    assert c.decide(state, 10_100) == []
    c.retry("s", 0)  # the proposal timed out: no metadata majority
    assert c.decide(state, 10_200) == [first]


def many_streams(streams: int) -> MetadataState:
    state = cluster()
    for i in range(streams):
        state.apply(CreateStream(StreamConfig(f"idle-{i}", f"idle.{i}", replication_factor=3,
                                              min_isr=2)))
    return state


def test_work_per_decision_does_not_grow_with_the_partitions() -> None:
    state = many_streams(1000)
    c = controller(state)
    for now in range(0, 2000, 200):  # everyone alive, nothing reported: nothing examined
        assert c.decide(state, now) == []
    assert (c.examined, c.indexed) == (0, 0)
    p = state.partition("idle-7", 0)
    for follower in (b for b in p.isr if b != p.leader):
        c.on_report("idle-7", 0, p.leader_epoch, follower, 2000)
    (decision,) = c.decide(state, 2000)
    assert (decision.stream, decision.partition) == ("idle-7", 0)
    assert (c.examined, c.indexed) == (1, 0)
    assert c.decide(state, 2200) == [] and c.examined == 1


def test_a_dead_broker_costs_an_index_of_the_partitions_once_per_state() -> None:
    state = many_streams(300)
    c = controller(state)
    gone = 1
    now = BROKER_TIMEOUT_MS + 1
    for broker in state.brokers:
        if broker != gone:
            c.on_broker_seen(broker, now)
    decisions = c.decide(state, now)
    led = [p for p in state.partitions.values() if p.leader == gone]
    assert sorted((d.stream, d.partition) for d in decisions) == sorted(
        (p.stream, p.partition) for p in led)
    assert c.examined == len(led) and c.indexed == len(state.partitions)
    assert c.decide(state, now + 200) == []  # decided once per epoch; the index is kept
    assert c.indexed == len(state.partitions)
    state.apply(ChangeLeaders(tuple(decisions)))
    for broker in state.brokers:
        if broker != gone:
            c.on_broker_seen(broker, now + 400)
    assert c.decide(state, now + 400) == []  # a new state: indexed again, nothing left
    assert c.indexed == 2 * len(state.partitions)


def test_reports_about_an_epoch_the_state_has_not_reached_wait_for_it() -> None:
    state = cluster()
    p = state.partition("s", 0)
    c = controller(state)
    followers = [b for b in p.isr if b != p.leader]
    new_leader = followers[0]
    ahead = state.apply(ChangeLeader("s", 0, p.leader_epoch, new_leader))
    behind = cluster()  # the metadata leader has not applied the change yet
    for follower in [b for b in ahead.isr if b != ahead.leader]:
        c.on_report("s", 0, ahead.leader_epoch, follower, 100)
    assert c.decide(behind, 100) == []
    (decision,) = c.decide(state, 200)  # looked at again once the state caught up
    assert decision.expected_epoch == ahead.leader_epoch
