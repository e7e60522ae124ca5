"""What an applied metadata command touched, and the dirty set that coalesces them."""

from __future__ import annotations

from jetstream.errors import JetstreamError
from jetstream.raft_meta import fsm
from jetstream.raft_meta.changes import (
    DIRTY_KEYS_MAX,
    EVERYTHING,
    Dirty,
    StateRestored,
    Touched,
    touched,
)
from jetstream.raft_meta.model import BrokerInfo, StreamConfig


def test_each_command_touches_its_own_partitions() -> None:
    state = fsm.MetadataState()
    broker = fsm.RegisterBroker(BrokerInfo(0, "127.0.0.1", 7000))
    assert touched(broker, state.apply(broker)) == EVERYTHING
    create = fsm.CreateStream(StreamConfig("s", "s.*", partitions=3))
    keys = frozenset({("s", 0), ("s", 1), ("s", 2)})
    assert touched(create, state.apply(create)) == Touched(keys, streams_changed=True)
    assert touched(create, state.apply(create)) == Touched(keys)  # existed: nothing new
    update = fsm.UpdateStream("s", {"retention_ms": 5})
    assert touched(update, state.apply(update)) == Touched(keys)
    isr = fsm.ChangeIsr("s", 1, 0, (0,))
    assert touched(isr, state.apply(isr)) == Touched(frozenset({("s", 1)}))
    leader = fsm.ChangeLeader("s", 2, 0, 0)
    assert touched(leader, state.apply(leader)) == Touched(frozenset({("s", 2)}))
    batch = fsm.ChangeLeaders((fsm.ChangeLeader("s", 0, 0, 0), fsm.ChangeLeader("s", 1, 5, 0)))
    outcomes = state.apply(batch)
    assert isinstance(outcomes[1], JetstreamError)  # refused: touched nothing
    assert touched(batch, outcomes) == Touched(frozenset({("s", 0)}))
    isrs = fsm.ChangeIsrs((fsm.ChangeIsr("s", 0, 1, (0,)), fsm.ChangeIsr("s", 1, 0, (0,))))
    assert touched(isrs, state.apply(isrs)).keys == {("s", 0), ("s", 1)}
    delete = fsm.DeleteStream("s")
    assert touched(delete, state.apply(delete)) == Touched(keys, streams_changed=True)
    assert touched(StateRestored(9), None) == EVERYTHING


def test_dirty_partitions_are_coalesced_until_taken() -> None:
    dirty = Dirty()
    assert not dirty
    dirty.add(Touched(frozenset({("a", 0)})))
    dirty.add(Touched(frozenset({("a", 0), ("b", 1)})))
    assert dirty.take() == Touched(frozenset({("a", 0), ("b", 1)}))
    assert not dirty and dirty.take() == Touched()
    dirty.add(Touched(frozenset({("a", 0)})))
    dirty.add(EVERYTHING)
    dirty.add(Touched(frozenset({("c", 0)})))
    assert dirty.take() == EVERYTHING and not dirty


def test_too_many_dirty_partitions_make_everything_dirty() -> None:
    dirty = Dirty()
    dirty.add(Touched(frozenset(("s", p) for p in range(DIRTY_KEYS_MAX + 1))))
    assert dirty.everything and not dirty.keys
