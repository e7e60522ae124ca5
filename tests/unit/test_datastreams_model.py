"""Datastream definitions and their metadata commands: checks, the state machine's handlers,
the Raft log's plain-data form and the state's dump."""

from __future__ import annotations

import pytest

from jetstream.datastreams.commands import (
    AssignTasks,
    CreateDatastream,
    DeleteDatastream,
    PauseDatastream,
    StaleDatastreamGeneration,
)
from jetstream.datastreams.model import DatastreamConfig, TaskAssignment
from jetstream.errors import DatastreamExists, InvalidDatastreamConfig, UnknownDatastream
from jetstream.raft_meta.codec import decode_command, encode_command
from jetstream.raft_meta.fsm import MetadataState

MIRROR = {"name": "orders-dr", "source": {"type": "jetstream", "settings": {
    "brokers": "127.0.0.1:1", "stream": "orders"}}, "destination": {
    "type": "jetstream", "settings": {"stream": "orders"}}, "max_tasks": 2}


def test_config_round_trips_and_refuses_bad_input() -> None:
    config = DatastreamConfig.from_dict(MIRROR)
    assert DatastreamConfig.from_dict(config.to_dict()) == config
    assert config.checkpoint_group == "__datastream_orders-dr"
    for bad, field in (({**MIRROR, "name": "a.b"}, "name"),
                       ({**MIRROR, "max_tasks": 0}, "max_tasks"),
                       ({**MIRROR, "batch_records_max": True}, "batch_records_max"),
                       ({**MIRROR, "partition_mapping": "random"}, "partition_mapping"),
                       ({**MIRROR, "colour": "red"}, "colour"),
                       ({k: v for k, v in MIRROR.items() if k != "source"}, "source"),
                       ({**MIRROR, "destination": {"type": "x", "extra": 1}}, "destination")):
        with pytest.raises(InvalidDatastreamConfig) as info:
            DatastreamConfig.from_dict(bad)
        assert info.value.fields["field"] == field
        assert info.value.code == "INVALID_DATASTREAM_CONFIG"


def test_create_pause_assign_delete() -> None:
    state = MetadataState()
    config = DatastreamConfig.from_dict(MIRROR)
    created = state.apply(CreateDatastream(config))
    assert not created.existed and created.state.created_version == 0
    assert state.apply(CreateDatastream(config)).existed  # same definition: a no-op
    with pytest.raises(DatastreamExists):
        state.apply(CreateDatastream(DatastreamConfig.from_dict({**MIRROR, "max_tasks": 3})))
    paused = state.apply(PauseDatastream("orders-dr", True, (3, 0)))
    assert paused.paused_partitions == (0, 3) and paused.partition_paused(3)
    assert not paused.partition_paused(1)
    assert state.apply(PauseDatastream("orders-dr", False, (0,))).paused_partitions == (3,)
    whole = state.apply(PauseDatastream("orders-dr", True))
    assert whole.paused and whole.partition_paused(1)
    assert not state.apply(PauseDatastream("orders-dr", False)).paused
    tasks = (TaskAssignment(0, (0, 2), 1, 0), TaskAssignment(1, (1, 3), 2, 0))
    assigned = state.apply(AssignTasks("orders-dr", 0, 0, 4, tasks))
    first_epoch = assigned.tasks[0].epoch
    assert assigned.generation == 1 and first_epoch == state.version - 1
    with pytest.raises(StaleDatastreamGeneration):
        state.apply(AssignTasks("orders-dr", 0, 0, 4, tasks))
    moved = (tasks[0], TaskAssignment(1, (1, 3), 3, 0))
    again = state.apply(AssignTasks("orders-dr", 1, 0, 4, moved))
    assert again.tasks[0].epoch == first_epoch  # unchanged task keeps its epoch
    assert again.tasks[1].epoch > first_epoch  # a moved task gets a newer one
    restored = MetadataState.from_dict(state.to_dict())
    assert restored.datastreams == state.datastreams
    assert state.copy().datastreams == state.datastreams
    state.apply(DeleteDatastream("orders-dr"))
    for command in (DeleteDatastream("orders-dr"), PauseDatastream("orders-dr", True)):
        with pytest.raises(UnknownDatastream):
            state.apply(command)


def test_commands_round_trip_through_the_codec() -> None:
    config = DatastreamConfig.from_dict(MIRROR)
    for command in (CreateDatastream(config), DeleteDatastream("x"),
                    PauseDatastream("x", True, (1, 2)), PauseDatastream("x", False),
                    AssignTasks("x", 3, 9, 2, (TaskAssignment(0, (0, 1), None, 4),))):
        assert decode_command(encode_command(command)) == command


def test_renew_task_epoch_is_compare_and_set() -> None:
    from jetstream.datastreams.commands import RenewTaskEpoch

    state = MetadataState()
    state.apply(CreateDatastream(DatastreamConfig.from_dict(MIRROR)))
    assigned = state.apply(AssignTasks("orders-dr", 0, 0, 1, (TaskAssignment(0, (0,), 2, 0),)))
    epoch = assigned.tasks[0].epoch
    renewed = state.apply(RenewTaskEpoch("orders-dr", 0, 2, epoch))
    assert renewed.epoch > epoch and state.datastreams["orders-dr"].tasks[0] == renewed
    for stale in (RenewTaskEpoch("orders-dr", 0, 2, epoch),  # an older epoch
                  RenewTaskEpoch("orders-dr", 0, 3, renewed.epoch),  # another broker
                  RenewTaskEpoch("orders-dr", 5, 2, renewed.epoch)):  # no such task
        with pytest.raises(StaleDatastreamGeneration):
            state.apply(stale)
    command = RenewTaskEpoch("orders-dr", 0, 2, 7)
    assert decode_command(encode_command(command)) == command


def test_the_socket_request_checks_its_action() -> None:
    from jetstream.errors import ProtocolError
    from jetstream.protocol import messages as m

    request = m.DatastreamRequest("pause", "orders-dr", {"partitions": [1]})
    assert m.DatastreamRequest.from_header(request.to_header()) == request
    with pytest.raises(ProtocolError):
        m.DatastreamRequest("explode", "orders-dr")
