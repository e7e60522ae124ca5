"""Label-selector sources: their checks, the layout of matching streams, partition numbers,
each stream's own definition, and assignments that restart tasks on a new layout."""

from __future__ import annotations

from typing import Any

import pytest

from jetstream.client.types import StreamInfo
from jetstream.datastreams import registry
from jetstream.datastreams.commands import AssignTasks, CreateDatastream
from jetstream.datastreams.model import DatastreamConfig, TaskAssignment
from jetstream.datastreams.selector import config_for, layout_of, parsed, resolve
from jetstream.errors import InvalidDatastreamConfig
from jetstream.raft_meta.codec import decode_command, encode_command
from jetstream.raft_meta.fsm import MetadataState

MIRRORS: dict[str, Any] = {
    "name": "shop-dr",
    "source": {"type": "jetstream", "settings": {"brokers": "127.0.0.1:1",
                                                 "selector": "app=shop,env in (prod)"}},
    "destination": {"type": "jetstream", "settings": {"stream": "mirror-{stream}"}}}


def config(**changes: Any) -> DatastreamConfig:
    return DatastreamConfig.from_dict({**MIRRORS, **changes})


def stream(name: str, partitions: int, **labels: str) -> StreamInfo:
    return StreamInfo.from_dict({"name": name, "subject": name, "labels": labels,
                                 "partitions": [{"partition": p, "leader": 1, "leader_epoch": 0,
                                                 "replicas": [1], "isr": [1]}
                                                for p in range(partitions)]})


def test_checks() -> None:
    registry.check(config())
    parquet = {"type": "parquet", "settings": {"path": "/lake/{stream}"}}
    registry.check(config(destination=parquet))
    for changes, field in (
            ({"destination": {"type": "jetstream", "settings": {"stream": "one"}}},
             "destination.settings.stream"),
            ({"destination": {"type": "parquet", "settings": {"path": "/lake"}}},
             "destination.settings.path"),
            ({"source": {"type": "jetstream", "settings": {"selector": "app=", "x": 1}}},
             "source.settings.selector"),
            ({"source": {"type": "jetstream", "settings": {"selector": "app=shop",
                                                           "stream": "a"}}},
             "source.settings.stream"),
            ({"source": {"type": "nats_jetstream", "settings": {"selector": "a=b"}}},
             "source.settings.selector"),
            ({"destination": {"type": "jetstream", "settings": {"stream": "{stream}.x"}}},
             "destination.settings.stream")):
        with pytest.raises(InvalidDatastreamConfig) as info:
            registry.check(config(**changes))
        assert info.value.fields["field"] == field


def test_layout_partitions_and_per_stream_definitions() -> None:
    streams = [stream("orders", 2, app="shop", env="prod"), stream("audit", 1, app="shop"),
               stream("carts", 3, app="shop", env="prod"), stream("__offsets", 4, app="shop",
                                                                  env="prod")]
    layout = layout_of(streams, parsed(config()))
    assert layout == (("carts", 3), ("orders", 2))
    assert [resolve(layout, p) for p in range(5)] == [
        ("carts", 0), ("carts", 1), ("carts", 2), ("orders", 0), ("orders", 1)]
    with pytest.raises(IndexError):
        resolve(layout, 5)
    many = [stream(f"s{i:04d}", 100, app="shop", env="prod") for i in range(12)]
    assert [name for name, _ in layout_of(many, parsed(config()))] == [
        f"s{i:04d}" for i in range(10)]  # 1,024 partitions at most
    applied = config_for(config(), "orders")
    assert dict(applied.source.settings) == {"brokers": "127.0.0.1:1", "stream": "orders"}
    assert dict(applied.destination.settings) == {"stream": "mirror-orders"}
    assert applied.checkpoint_group == "__datastream_shop-dr"


def test_a_new_layout_restarts_every_task() -> None:
    state = MetadataState()
    state.apply(CreateDatastream(config()))
    tasks = (TaskAssignment(0, (0, 2), 1, 0), TaskAssignment(1, (1,), 2, 0))
    first = state.apply(AssignTasks("shop-dr", 0, 0, 3, tasks, (("a", 1), ("b", 2))))
    assert first.source_streams == (("a", 1), ("b", 2))
    same = state.apply(AssignTasks("shop-dr", 1, 0, 3, first.tasks, first.source_streams))
    assert same.tasks == first.tasks  # nothing changed: epochs kept
    version = state.version
    moved = state.apply(AssignTasks("shop-dr", 2, 0, 3, first.tasks, (("a", 2), ("c", 1))))
    assert {t.epoch for t in moved.tasks} == {version}  # same numbers, other pairs
    assert MetadataState.from_dict(state.to_dict()).datastreams == state.datastreams
    command = AssignTasks("shop-dr", 3, 0, 3, tasks, (("a", 2), ("c", 1)))
    assert decode_command(encode_command(command)) == command
