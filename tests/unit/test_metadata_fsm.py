"""The metadata state machine: commands, compare-and-set on epochs, placement, persistence."""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jetstream.errors import (
    InvalidStreamConfig,
    JetstreamError,
    NotEnoughReplicas,
    StreamExists,
    UnknownPartition,
    UnknownStream,
)
from jetstream.raft_meta.fsm import (
    BATCH_ITEMS_MAX,
    ChangeIsr,
    ChangeIsrs,
    ChangeLeader,
    ChangeLeaders,
    CreateStream,
    DeleteStream,
    MetadataState,
    RegisterBroker,
    StaleMetadataEpoch,
    UpdateStream,
    recount,
)
from jetstream.raft_meta.model import BrokerInfo, PartitionState, StreamConfig


def cluster(n: int) -> MetadataState:
    state = MetadataState()
    for i in range(n):
        state.apply(RegisterBroker(BrokerInfo(i, "127.0.0.1", 7000 + i)))
    return state


def test_create_is_idempotent_for_the_same_config_and_refuses_another() -> None:
    state = cluster(1)
    config = StreamConfig("orders", "orders.*")
    first = state.apply(CreateStream(config))
    again = state.apply(CreateStream(StreamConfig("orders", "orders.*")))
    assert not first.existed and again.existed
    assert again.partitions == first.partitions
    with pytest.raises(StreamExists) as exc:
        state.apply(CreateStream(StreamConfig("orders", "orders.>")))
    assert exc.value.code == "STREAM_EXISTS"
    assert state.streams["orders"] == config


def test_replication_factor_above_the_broker_count_is_refused() -> None:
    state = cluster(2)
    with pytest.raises(NotEnoughReplicas) as exc:
        state.apply(CreateStream(StreamConfig("s", "s", replication_factor=3, min_isr=2)))
    assert (exc.value.needed, exc.value.available) == (3, 2)
    assert "s" not in state.streams and not state.partitions


def test_replicas_go_to_live_brokers_only() -> None:
    state = cluster(4)
    with pytest.raises(NotEnoughReplicas) as exc:
        state.apply(CreateStream(StreamConfig("s", "s", replication_factor=3, min_isr=2),
                                 live=(0, 3)))
    assert (exc.value.needed, exc.value.available) == (3, 2)
    created = state.apply(CreateStream(StreamConfig("t", "t", partitions=4,
                                                    replication_factor=2, min_isr=1),
                                       live=(0, 2, 3)))
    assert {r for p in created.partitions for r in p.replicas} == {0, 2, 3}


def test_delete_removes_partitions_and_unknown_streams_are_errors() -> None:
    state = cluster(1)
    state.apply(CreateStream(StreamConfig("s", "s", partitions=3)))
    assert len(state.stream_partitions("s")) == 3
    state.apply(DeleteStream("s"))
    assert not state.partitions
    with pytest.raises(UnknownStream):
        state.apply(DeleteStream("s"))
    with pytest.raises(UnknownStream):
        state.partition("s", 0)


def test_a_stream_created_again_has_a_larger_created_version() -> None:
    state = cluster(1)
    first = state.apply(CreateStream(StreamConfig("s", "s", partitions=2))).partitions
    assert {p.created_version for p in first} == {first[0].created_version}
    state.apply(DeleteStream("s"))
    again = state.apply(CreateStream(StreamConfig("s", "s", partitions=2))).partitions
    assert again[0].created_version > first[0].created_version
    assert [p.leader_epoch for p in again] == [0, 0]
    restored = MetadataState.from_dict(json.loads(json.dumps(state.to_dict())))
    assert restored.partitions[("s", 1)] == again[1]
    # A state written before the field existed reads as version 0.
    old = state.to_dict()
    for p in old["partitions"]:
        del p["created_version"]
    assert MetadataState.from_dict(old).partitions[("s", 0)].created_version == 0


def test_leader_and_isr_changes_are_compare_and_set_on_the_epoch() -> None:
    state = cluster(3)
    created = state.apply(CreateStream(StreamConfig("s", "s", replication_factor=3,
                                                    min_isr=2)))
    p = created.partitions[0]
    other = next(b for b in p.replicas if b != p.leader)
    moved = state.apply(ChangeLeader("s", 0, expected_epoch=0, leader=other))
    assert (moved.leader, moved.leader_epoch) == (other, 1)
    with pytest.raises(StaleMetadataEpoch) as exc:
        state.apply(ChangeLeader("s", 0, expected_epoch=0, leader=p.leader))
    assert exc.value.current_epoch == 1
    shrunk = state.apply(ChangeIsr("s", 0, expected_epoch=1, isr=(other,)))
    assert shrunk.isr == (other,) and shrunk.leader_epoch == 1
    # The leader stays in its ISR, and a leader comes only from the ISR.
    with pytest.raises(InvalidStreamConfig):
        state.apply(ChangeIsr("s", 0, expected_epoch=1, isr=tuple(b for b in p.replicas
                                                                  if b != other)))
    with pytest.raises(InvalidStreamConfig):
        state.apply(ChangeLeader("s", 0, expected_epoch=1, leader=p.leader))
    with pytest.raises(UnknownPartition):
        state.apply(ChangeIsr("s", 5, expected_epoch=0, isr=(0,)))


def test_placement_spreads_replicas_and_leaders_evenly() -> None:
    state = cluster(3)
    for i in range(4):
        state.apply(CreateStream(StreamConfig(f"s{i}", f"s{i}", partitions=3,
                                              replication_factor=2)))
    replicas = Counter(r for p in state.partitions.values() for r in p.replicas)
    leaders = Counter(p.leader for p in state.partitions.values())
    assert max(replicas.values()) - min(replicas.values()) <= 1
    assert max(leaders.values()) - min(leaders.values()) <= 1
    for p in state.partitions.values():
        assert p.leader == p.replicas[0] and len(set(p.replicas)) == 2


def test_state_round_trips_through_json() -> None:
    state = cluster(3)
    state.apply(CreateStream(StreamConfig("s", "s.*", partitions=2, replication_factor=3,
                                          min_isr=2, labels={"app": "shop"}, ingest_group="g")))
    data = json.loads(json.dumps(state.to_dict()))
    again = MetadataState.from_dict(data)
    assert again.to_dict() == state.to_dict()
    assert again.streams["s"] == state.streams["s"]


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"name": "bad name", "subject": "x"}, "name"),
        ({"name": "s", "subject": "a..b"}, "subject"),
        ({"name": "s", "subject": "a.>", "partitions": 2}, "subject"),
        ({"name": "s", "subject": "a", "partitions": 0}, "partitions"),
        ({"name": "s", "subject": "a", "replication_factor": 2, "min_isr": 3}, "min_isr"),
        ({"name": "s", "subject": "a", "ack_policy": "sometimes"}, "ack_policy"),
        ({"name": "s", "subject": "a", "fsync": "rarely"}, "fsync"),
        ({"name": "s", "subject": "a", "retention_ms": 0}, "retention_ms"),
        ({"name": "s", "subject": "a", "labels": {"bad key!": "v"}}, "labels"),
        ({"name": "s", "subject": "a", "colour": "red"}, "colour"),
        ({"name": "s", "subject": "a", "cleanup_policy": "shred"}, "cleanup_policy"),
        ({"name": "s", "subject": "a", "delete_retention_ms": -1}, "delete_retention_ms"),
        ({"name": "s", "subject": "a", "min_compaction_lag_ms": 10,
          "max_compaction_lag_ms": 5}, "max_compaction_lag_ms"),
        ({"name": "s", "subject": "a", "segment_ms_max": 0}, "segment_ms_max"),
        ({"subject": "a"}, "name"),
        ({"name": "s", "subject": "a", "ingest_group": "bad group"}, "ingest_group"),
        ({"name": "s", "subject": "a", "group": "a", "ingest_group": "b"}, "ingest_group"),
    ],
)
def test_invalid_stream_configs_name_the_field(fields: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidStreamConfig) as exc:
        StreamConfig.from_dict(fields)
    assert exc.value.fields["field"] == field


def test_the_deprecated_group_field_names_the_load_balance_group() -> None:
    old = StreamConfig.from_dict({"name": "s", "subject": "a", "group": "workers"})
    assert old.ingest_group == "workers"
    assert "group" not in old.to_dict() and old.to_dict()["ingest_group"] == "workers"
    same = {"name": "s", "subject": "a", "group": "w", "ingest_group": "w"}
    assert StreamConfig.from_dict(same).ingest_group == "w"


def test_update_changes_only_updatable_settings_and_refuses_the_rest() -> None:
    state = cluster(1)
    state.apply(CreateStream(StreamConfig("s", "s", retention_ms=1000)))
    version = state.version
    updated = state.apply(UpdateStream("s", {"retention_ms": None, "cleanup_policy": "compact",
                                             "delete_retention_ms": 5}))
    assert updated == state.streams["s"]
    assert (updated.retention_ms, updated.cleanup_policy.value, updated.delete_retention_ms) == (
        None, "compact", 5)
    assert updated.compaction_config().delete_retention_ms == 5
    before = state.streams["s"]
    for changes, field in (({"partitions": 2}, "partitions"), ({"subject": "t"}, "subject"),
                           ({"min_isr": 1}, "min_isr"), ({"retention_ms": 0}, "retention_ms"),
                           ({}, "")):
        with pytest.raises(InvalidStreamConfig) as exc:
            state.apply(UpdateStream("s", changes))
        assert exc.value.fields["field"] == field
        assert state.streams["s"] == before
    with pytest.raises(UnknownStream):
        state.apply(UpdateStream("nope", {"retention_ms": 1}))
    assert state.version == version + 1


def test_compact_streams_keep_old_segments_from_retention() -> None:
    compact = StreamConfig("s", "s", retention_ms=10, retention_bytes=100,
                           cleanup_policy="compact")  # type: ignore[arg-type]
    assert (compact.log_config().retention_ms, compact.log_config().retention_bytes) == (
        None, None)
    both = StreamConfig("s", "s", retention_ms=10, cleanup_policy="compact,delete")  # type: ignore[arg-type]
    assert both.log_config().retention_ms == 10


def test_update_command_round_trips_through_the_raft_encoding() -> None:
    from jetstream.raft_meta.codec import decode_command, encode_command

    command = UpdateStream("s", {"retention_ms": None, "cleanup_policy": "compact"})
    assert decode_command(json.loads(json.dumps(encode_command(command)))) == command


# -- batches of leader and ISR changes ---------------------------------------------------------


def test_a_batch_applies_each_item_on_its_own_epoch() -> None:
    state = cluster(3)
    state.apply(CreateStream(StreamConfig("s", "s.*", partitions=3, replication_factor=3,
                                          min_isr=2)))
    p0, p1, p2 = state.stream_partitions("s")
    other = next(r for r in p0.replicas if r != p0.leader)
    version = state.version
    outcomes = state.apply(ChangeLeaders((
        ChangeLeader("s", 0, 0, other),
        ChangeLeader("s", 1, 7, p1.leader),  # stale
        ChangeLeader("s", 2, 0, 99),  # not in the ISR
        ChangeLeader("nope", 0, 0, 1))))
    assert state.version == version + 1  # one command
    moved, stale, invalid, unknown = outcomes
    assert moved == state.partition("s", 0) and moved.leader == other
    assert isinstance(stale, StaleMetadataEpoch) and stale.fields["current_epoch"] == 0
    assert isinstance(invalid, InvalidStreamConfig) and isinstance(unknown, UnknownStream)
    assert state.stream_partitions("s")[1:] == (p1, p2)  # refused items changed nothing
    shrunk = state.apply(ChangeIsrs((ChangeIsr("s", 1, 0, (p1.leader,)),
                                     ChangeIsr("s", 0, 0, (other,)))))
    assert shrunk[0] == state.partition("s", 1) and shrunk[0].isr == (p1.leader,)
    assert isinstance(shrunk[1], StaleMetadataEpoch)  # partition 0 is at epoch 1 now


def test_batches_round_trip_through_the_raft_encoding() -> None:
    from jetstream.errors import ProtocolError
    from jetstream.raft_meta.codec import decode_command, encode_command

    for command in (ChangeLeaders((ChangeLeader("a", 0, 1, 2), ChangeLeader("b", 3, 0, 1))),
                    ChangeIsrs((ChangeIsr("a", 0, 1, (1, 2)),)), ChangeIsrs(())):
        assert decode_command(json.loads(json.dumps(encode_command(command)))) == command
    mixed = encode_command(ChangeLeaders((ChangeLeader("a", 0, 1, 2),)))
    mixed["items"].append(encode_command(ChangeIsr("a", 0, 1, (1,))))
    with pytest.raises(ProtocolError):
        decode_command(mixed)
    too_many = encode_command(ChangeIsrs((ChangeIsr("a", 0, 1, (1,)),) * (BATCH_ITEMS_MAX + 1)))
    with pytest.raises(ProtocolError):
        decode_command(too_many)


# -- load counters ---------------------------------------------------------------------------

commands = st.lists(st.one_of(
    st.tuples(st.just("create"), st.integers(0, 7), st.integers(1, 4), st.integers(1, 3),
              st.sets(st.integers(0, 4), min_size=1)),
    st.tuples(st.just("delete"), st.integers(0, 7)),
    st.tuples(st.just("leader"), st.integers(0, 7), st.integers(0, 3), st.integers(0, 4)),
    st.tuples(st.just("isr"), st.integers(0, 7), st.integers(0, 3), st.integers(0, 4)),
), max_size=40)


def old_placement(state: MetadataState, config: StreamConfig,
                  live: tuple[int, ...]) -> list[PartitionState]:
    """Placement as it was computed before the counters: a count over every partition."""
    brokers = sorted(b for b in state.brokers if b in live)
    replica_load, leader_load = dict.fromkeys(brokers, 0), dict.fromkeys(brokers, 0)
    for existing in state.partitions.values():
        for r in existing.replicas:
            if r in replica_load:
                replica_load[r] += 1
        if existing.leader in leader_load:
            leader_load[existing.leader] += 1
    placed = []
    for p in range(config.partitions):
        replicas = tuple(sorted(replica_load, key=lambda b: (replica_load[b], b))[
            :config.replication_factor])
        leader = min(replicas, key=lambda b: (leader_load[b], b))
        for r in replicas:
            replica_load[r] += 1
        leader_load[leader] += 1
        placed.append(PartitionState(config.name, p, (leader, *(r for r in replicas
                                                                 if r != leader)),
                                     leader, tuple(sorted(replicas)), 0, state.version))
    return placed


@settings(max_examples=200, deadline=None)
@given(commands)
def test_load_counters_always_equal_a_recount(steps: list[tuple[Any, ...]]) -> None:
    state = cluster(5)
    for step in steps:
        name = f"s{step[1]}"
        with contextlib.suppress(JetstreamError):
            if step[0] == "create":
                _, _, partitions, factor, live = step
                config = StreamConfig(name, f"{name}.*", partitions=partitions,
                                      replication_factor=factor, min_isr=1)
                expected = old_placement(state, config, tuple(sorted(live)))
                created = state.apply(CreateStream(config, tuple(sorted(live))))
                if not created.existed:  # the same placement as a recount gives
                    assert list(created.partitions) == expected
            elif step[0] == "delete":
                state.apply(DeleteStream(name))
            else:
                _, _, partition, broker = step
                p = state.partition(name, partition)
                if step[0] == "leader":
                    state.apply(ChangeLeaders((ChangeLeader(name, partition, p.leader_epoch,
                                                            broker),)))
                else:
                    state.apply(ChangeIsr(name, partition, p.leader_epoch,
                                          (p.leader, broker)))
        assert (state.replica_load, state.leader_load) == recount(state.partitions.values())
    restored = MetadataState.from_dict(json.loads(json.dumps(state.to_dict())))
    assert (restored.replica_load, restored.leader_load) == (state.replica_load,
                                                             state.leader_load)
