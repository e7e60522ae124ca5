"""The metadata state machine: commands, compare-and-set on epochs, placement, persistence."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from jetstream.errors import (
    InvalidStreamConfig,
    NotEnoughReplicas,
    StreamExists,
    UnknownPartition,
    UnknownStream,
)
from jetstream.raft_meta.fsm import (
    ChangeIsr,
    ChangeLeader,
    CreateStream,
    DeleteStream,
    MetadataState,
    RegisterBroker,
    StaleMetadataEpoch,
    UpdateStream,
)
from jetstream.raft_meta.model import BrokerInfo, StreamConfig


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
    from jetstream.raft_meta.raft import decode_command, encode_command

    command = UpdateStream("s", {"retention_ms": None, "cleanup_policy": "compact"})
    assert decode_command(json.loads(json.dumps(encode_command(command)))) == command
