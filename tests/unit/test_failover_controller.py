"""The metadata leader's failover decisions."""

from __future__ import annotations

from jetstream.raft_meta.controller import FailoverController
from jetstream.raft_meta.fsm import (
    ChangeIsr,
    ChangeLeader,
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
