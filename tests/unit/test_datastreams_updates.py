"""Datastream updates: merging a change into a definition, the fixed fields, the batch
bodies, and the state machine's all-or-nothing `UpdateDatastreams`."""

from __future__ import annotations

from typing import Any

import pytest

from jetstream.datastreams.commands import (
    AssignTasks,
    CreateDatastream,
    StaleDatastreamGeneration,
    UpdateDatastreams,
)
from jetstream.datastreams.model import DatastreamConfig, TaskAssignment
from jetstream.datastreams.updates import BATCH_MAX, batch_names, batch_updates, merged
from jetstream.errors import InvalidDatastreamConfig, UnknownDatastream
from jetstream.raft_meta.codec import decode_command, encode_command
from jetstream.raft_meta.fsm import MetadataState

MIRROR: dict[str, Any] = {
    "name": "orders-dr",
    "source": {"type": "jetstream", "settings": {"brokers": "127.0.0.1:1", "stream": "orders",
                                                 "start": "latest"}},
    "destination": {"type": "jetstream", "settings": {"stream": "orders"}}, "max_tasks": 2}


def config(**changes: Any) -> DatastreamConfig:
    return DatastreamConfig.from_dict({**MIRROR, **changes})


def test_merge_replaces_options_and_merges_settings() -> None:
    new = merged(config(), {"max_tasks": 4, "batch_records_max": 20, "labels": {"env": "prod"},
                            "source": {"settings": {"brokers": "127.0.0.1:2", "start": None}}})
    assert (new.max_tasks, new.batch_records_max, dict(new.labels)) == (4, 20, {"env": "prod"})
    assert dict(new.source.settings) == {"brokers": "127.0.0.1:2", "stream": "orders"}
    assert new.destination == config().destination and new.in_flight_max == 1000
    # Restating what is fixed, unchanged, is allowed.
    same = merged(config(), {"name": "orders-dr", "partition_mapping": "same",
                             "source": {"type": "jetstream"}})
    assert same == config()


@pytest.mark.parametrize(("changes", "field"), [
    ({"name": "other"}, "name"),
    ({"partition_mapping": "key_hash"}, "partition_mapping"),
    ({"source": {"type": "nats_jetstream"}}, "source.type"),
    ({"destination": {"type": "parquet", "settings": {}}}, "destination.type"),
    ({"source": {"settings": {"stream": "payments"}}}, "source.settings.stream"),
    ({"destination": {"settings": {"stream": None}}}, "destination.settings.stream"),
    ({"max_tasks": 0}, "max_tasks"),
    ({"labels": {"bad key!": "x"}}, "labels"),
    ({"colour": "red"}, "colour"),
    ({"source": {"settings": {"x": 1}, "extra": 1}}, "source"),
    ({"source": {"settings": ["brokers"]}}, "source.settings"),
])
def test_merge_refuses_fixed_and_bad_fields(changes: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidDatastreamConfig) as info:
        merged(config(), changes)
    assert info.value.fields["field"] == field
    assert info.value.code == "INVALID_DATASTREAM_CONFIG"


def test_batch_bodies_are_checked() -> None:
    assert batch_names({"names": ["a", "b", "a"]}) == ["a", "b"]
    assert batch_updates({"datastreams": [{"name": "a", "max_tasks": 2}]}) == [
        {"name": "a", "max_tasks": 2}]
    for bad, field in (({"names": []}, "names"), ({"names": ["a.b"]}, "names"),
                       ({"names": ["a"] * (BATCH_MAX + 1)}, "names")):
        with pytest.raises(InvalidDatastreamConfig) as info:
            batch_names(bad)
        assert info.value.fields["field"] == field
    for bad_updates, field in (({"datastreams": "a"}, "datastreams"),
                               ({"datastreams": [{"max_tasks": 2}]}, "datastreams.name"),
                               ({"datastreams": [{"name": "a"}, {"name": "a"}]},
                                "datastreams.name")):
        with pytest.raises(InvalidDatastreamConfig) as info:
            batch_updates(bad_updates)
        assert info.value.fields["field"] == field


def test_update_is_all_or_nothing_and_restarts_tasks() -> None:
    state = MetadataState()
    state.apply(CreateDatastream(config()))
    state.apply(CreateDatastream(config(name="other")))
    tasks = (TaskAssignment(0, (0,), 1, 0), TaskAssignment(1, (1,), 2, 0))
    assigned = state.apply(AssignTasks("orders-dr", 0, 0, 2, tasks))
    before = {t.epoch for t in assigned.tasks}

    # One unknown name: nothing changes.
    with pytest.raises(UnknownDatastream):
        state.apply(UpdateDatastreams((config(max_tasks=5), config(name="nope"))))
    assert state.datastreams["orders-dr"].config.max_tasks == 2
    # One fixed field changed (checked again by the state machine): nothing changes.
    moved_stream = DatastreamConfig.from_dict({**MIRROR, "name": "other", "destination": {
        "type": "jetstream", "settings": {"stream": "elsewhere"}}})
    with pytest.raises(InvalidDatastreamConfig) as info:
        state.apply(UpdateDatastreams((config(max_tasks=5), moved_stream)))
    assert info.value.fields["field"] == "destination.settings.stream"
    assert state.datastreams["orders-dr"].config.max_tasks == 2

    version = state.version
    first, second = state.apply(UpdateDatastreams((config(max_tasks=5),
                                                   config(name="other"))))
    assert first.config.max_tasks == 5 and first.generation == assigned.generation + 1
    assert {t.epoch for t in first.tasks} == {version} and version > max(before)
    assert [(t.broker, t.partitions) for t in first.tasks] == [(1, (0,)), (2, (1,))]
    assert second.generation == 0  # unchanged: not touched
    # A plan made before the update is stale.
    with pytest.raises(StaleDatastreamGeneration):
        state.apply(AssignTasks("orders-dr", assigned.generation, 0, 2, tasks))
    assert MetadataState.from_dict(state.to_dict()).datastreams == state.datastreams
    command = UpdateDatastreams((config(max_tasks=5), config(name="other")))
    assert decode_command(encode_command(command)) == command
