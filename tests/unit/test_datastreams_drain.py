"""A stopping broker's mark in the metadata (`DrainTasks`): set once, taken off when it
starts again, kept in the dump and the Raft log's form; the coordinator plans it out at its
next tick and counts the rebalance."""

from __future__ import annotations

from typing import Any

import pytest

from jetstream.datastreams import coordinator as coordinator_module
from jetstream.datastreams.commands import AssignTasks, CreateDatastream, DrainTasks
from jetstream.datastreams.connector import Endpoints
from jetstream.datastreams.coordinator import Coordinator
from jetstream.datastreams.model import DatastreamConfig
from jetstream.datastreams.planner import PlanInput, plan
from jetstream.raft_meta.changes import touched
from jetstream.raft_meta.codec import decode_command, encode_command
from jetstream.raft_meta.fsm import MetadataState

MIRROR = {"name": "dr", "source": {"type": "jetstream", "settings": {"stream": "a"}},
          "destination": {"type": "jetstream", "settings": {"stream": "b"}}, "max_tasks": 2}


def test_drain_marks_and_unmarks_a_broker() -> None:
    state = MetadataState()
    assert state.apply(DrainTasks(2, True)) is True
    marked_at = state.datastream_draining[2]
    assert state.apply(DrainTasks(2, True)) is False  # already marked: kept as it was
    assert state.datastream_draining == {2: marked_at}
    copy = state.copy()
    assert state.apply(DrainTasks(2, False)) is True
    assert state.datastream_draining == {} and copy.datastream_draining == {2: marked_at}
    assert state.apply(DrainTasks(2, False)) is False


def test_drain_survives_the_dump_and_the_codec() -> None:
    state = MetadataState()
    state.apply(DrainTasks(1, True))
    restored = MetadataState.from_dict(state.to_dict())
    assert restored.datastream_draining == state.datastream_draining
    assert MetadataState.from_dict({**state.to_dict(), "datastream_draining": []}
                                   ).datastream_draining == {}
    for command in (DrainTasks(1, True), DrainTasks(7, False)):
        assert decode_command(encode_command(command)) == command
        assert not touched(command, True).streams_changed


def test_a_draining_broker_is_planned_out_at_once() -> None:
    state = MetadataState()
    state.apply(CreateDatastream(DatastreamConfig.from_dict(MIRROR)))
    first = plan([PlanInput("dr", 4, 2, ())], (0, 1, 2))["dr"]
    state.apply(AssignTasks("dr", 0, 0, 4, first))
    leaving = first[0].broker
    assert leaving is not None
    state.apply(DrainTasks(leaving, True))
    live = tuple(b for b in (0, 1, 2) if b not in state.datastream_draining)
    moved = plan([PlanInput("dr", 4, 2, state.datastreams["dr"].tasks)], live)["dr"]
    assert leaving not in {t.broker for t in moved}
    assert [t.partitions for t in moved] == [t.partitions for t in first]
    assert moved[1].broker == first[1].broker  # sticky: the other task stays where it runs


class FourPartitions:
    """A source connector whose source has 4 partitions (no IO)."""

    async def open(self, *_args: Any) -> FourPartitions:
        return self

    async def partitions(self) -> int:
        return 4

    async def close(self) -> None:
        pass


async def test_the_coordinator_moves_a_draining_brokers_tasks_and_counts_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(coordinator_module.registry, "source", lambda _type: FourPartitions())
    state = MetadataState()
    state.apply(CreateDatastream(DatastreamConfig.from_dict(MIRROR)))

    async def propose(command: Any) -> Any:
        return state.apply(command)

    coordinator = Coordinator(lambda: state, lambda: True, lambda: (0, 1, 2), propose,
                              lambda: Endpoints("127.0.0.1:1"))
    await coordinator.tick()
    first = state.datastreams["dr"].tasks
    assert len(first) == 2 and all(t.broker is not None for t in first)
    await coordinator.tick()  # nothing changed: nothing proposed
    assert coordinator.rebalances == {"dr": 1}
    leaving = first[0].broker
    assert leaving is not None
    state.apply(DrainTasks(leaving, True))
    await coordinator.tick()
    moved = state.datastreams["dr"].tasks
    assert leaving not in {t.broker for t in moved} and moved[1] == first[1]
    assert coordinator.rebalances == {"dr": 2}
    assert 'jetstream_datastream_rebalances_total{datastream="dr"} 2' in \
        coordinator.render_metrics()
