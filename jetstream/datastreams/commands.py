"""The metadata commands of datastreams and how the state machine applies them.

Theory of operation: datastreams live in the metadata state (`MetadataState.datastreams`,
name -> DatastreamState) and change only through these commands, committed through the
metadata Raft log like every stream change. The functions here are the state machine's
handlers (jetstream.raft_meta.fsm calls them): pure, deterministic, given the metadata
version so that what they stamp (creation version, assignment epochs) is the same on every
broker. A refused command raises a JetstreamError and changes nothing.

`AssignTasks` is compare-and-set on the datastream's `generation` (and creation version),
like leader changes on the leader epoch: an assignment planned on stale state is refused.
A task whose broker or partitions change gets the metadata version as its new epoch; a task
that stays as it was keeps its epoch, so a broker keeps running it undisturbed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from jetstream.datastreams.model import (
    DATASTREAMS_MAX,
    DatastreamConfig,
    DatastreamState,
    TaskAssignment,
    check_partitions,
    layout_from,
)
from jetstream.datastreams.updates import check_fixed
from jetstream.errors import (
    DatastreamExists,
    InvalidDatastreamConfig,
    JetstreamError,
    UnknownDatastream,
)


class StaleDatastreamGeneration(JetstreamError):
    """A task assignment was planned on a datastream generation that is no longer current:
    plan again from the current state."""

    code = "STALE_DATASTREAM_GENERATION"
    retriable = True

    def __init__(self, name: str, expected: int, current: int) -> None:
        super().__init__(f"datastream {name!r} is at generation {current}, not {expected}",
                         name=name, expected_generation=expected, current_generation=current)


@dataclass(frozen=True, slots=True)
class CreateDatastream:
    config: DatastreamConfig


@dataclass(frozen=True, slots=True)
class DeleteDatastream:
    name: str


@dataclass(frozen=True, slots=True)
class PauseDatastream:
    """Pause (`pause`) or resume the whole datastream (`partitions` None) or some of its
    source partitions."""

    name: str
    pause: bool
    partitions: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class AssignTasks:
    """The coordinator's plan for one datastream: its source partition count and tasks (and
    for a label-selector source the layout those partitions come from)."""

    name: str
    expected_generation: int
    created_version: int
    source_partitions: int
    tasks: tuple[TaskAssignment, ...]
    source_streams: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, slots=True)
class RenewTaskEpoch:
    """The broker running a task takes a new epoch for it before it (re)opens its writer:
    compare-and-set on the task's broker and epoch. Writes at the older epoch are fenced."""

    name: str
    task: int
    broker: int
    expected_epoch: int


@dataclass(frozen=True, slots=True)
class DrainTasks:
    """A stopping broker has stopped its tasks (`draining`): the coordinator assigns it none
    and moves those it had at once. Proposed again with `draining` False when it starts."""

    broker: int
    draining: bool


@dataclass(frozen=True, slots=True)
class UpdateDatastreams:
    """New definitions of existing datastreams, all applied or none (a batch update is one
    command). Tasks of a changed datastream restart with it: each takes a new epoch."""

    configs: tuple[DatastreamConfig, ...]


DatastreamCommand = (CreateDatastream | DeleteDatastream | PauseDatastream | AssignTasks
                     | RenewTaskEpoch | DrainTasks | UpdateDatastreams)


@dataclass(frozen=True, slots=True)
class DatastreamCreated:
    state: DatastreamState
    existed: bool


Datastreams = dict[str, DatastreamState]


def apply_create(datastreams: Datastreams, command: CreateDatastream,
                 version: int) -> DatastreamCreated:
    config = command.config
    existing = datastreams.get(config.name)
    if existing is not None:
        if existing.config != config:
            raise DatastreamExists(config.name)
        return DatastreamCreated(existing, existed=True)
    if len(datastreams) >= DATASTREAMS_MAX:
        raise InvalidDatastreamConfig(f"a cluster holds at most {DATASTREAMS_MAX} datastreams",
                                      field="name")
    state = datastreams[config.name] = DatastreamState(config, created_version=version)
    return DatastreamCreated(state, existed=False)


def apply_delete(datastreams: Datastreams, command: DeleteDatastream) -> DatastreamState:
    state = datastreams.pop(command.name, None)
    if state is None:
        raise UnknownDatastream(command.name)
    return state


def apply_update(datastreams: Datastreams, command: UpdateDatastreams,
                 version: int) -> tuple[DatastreamState, ...]:
    """Every datastream must exist and keep its fixed fields, or nothing changes. A changed
    one moves to the next generation (a plan made before is stale) and its tasks take
    `version` as their epoch, so the brokers running them stop them and start them again
    with the new definition."""
    current = [_get(datastreams, config.name) for config in command.configs]
    for state, config in zip(current, command.configs, strict=True):
        check_fixed(state.config, config)
    updated = []
    for state, config in zip(current, command.configs, strict=True):
        if state.config != config:
            state = datastreams[config.name] = replace(
                state, config=config, generation=state.generation + 1,
                tasks=tuple(replace(t, epoch=version) for t in state.tasks))
        updated.append(state)
    return tuple(updated)


def apply_pause(datastreams: Datastreams, command: PauseDatastream) -> DatastreamState:
    state = _get(datastreams, command.name)
    new = datastreams[command.name] = state.with_pause(command.pause, command.partitions)
    return new


def apply_assign(datastreams: Datastreams, command: AssignTasks,
                 version: int) -> DatastreamState:
    state = _get(datastreams, command.name)
    if state.generation != command.expected_generation \
            or state.created_version != command.created_version:
        raise StaleDatastreamGeneration(command.name, command.expected_generation,
                                        state.generation)
    _check_tasks(command)
    # A new layout renumbers the partitions: every task starts again on it.
    before = {t.task: t for t in state.tasks} \
        if command.source_streams == state.source_streams else {}
    tasks = []
    for task in command.tasks:
        old = before.get(task.task)
        same = old is not None and (old.broker, old.partitions) == (task.broker, task.partitions)
        tasks.append(replace(task, epoch=old.epoch if same and old is not None else version))
    new = datastreams[command.name] = replace(
        state, source_partitions=command.source_partitions, tasks=tuple(tasks),
        generation=state.generation + 1, source_streams=command.source_streams)
    return new


def apply_renew(datastreams: Datastreams, command: RenewTaskEpoch,
                version: int) -> TaskAssignment:
    state = _get(datastreams, command.name)
    tasks = list(state.tasks)
    current = tasks[command.task] if 0 <= command.task < len(tasks) else None
    if current is None or (current.broker, current.epoch) != (command.broker,
                                                              command.expected_epoch):
        raise StaleDatastreamGeneration(command.name, state.generation, state.generation)
    renewed = tasks[command.task] = replace(current, epoch=version)
    datastreams[command.name] = replace(state, tasks=tuple(tasks))
    return renewed


def apply_drain(draining: dict[int, int], command: DrainTasks, version: int) -> bool:
    """Mark or unmark a draining broker (value: the version that marked it); whether this
    changed anything."""
    if command.draining:
        if command.broker in draining:
            return False
        draining[command.broker] = version
        return True
    return draining.pop(command.broker, None) is not None


def _check_tasks(command: AssignTasks) -> None:
    """Bugs, not input: the coordinator builds these. Every source partition in exactly one
    task, task ids 0..n-1."""
    owned = sorted(p for t in command.tasks for p in t.partitions)
    assert owned == list(range(command.source_partitions)), (command.name, owned)
    assert [t.task for t in command.tasks] == list(range(len(command.tasks))), command.tasks


def _get(datastreams: Datastreams, name: str) -> DatastreamState:
    state = datastreams.get(name)
    if state is None:
        raise UnknownDatastream(name)
    return state


# -- plain data (the Raft log's form; jetstream.raft_meta.codec) -----------------------------


def encode(command: DatastreamCommand) -> dict[str, Any]:
    match command:
        case CreateDatastream(config=config):
            return {"type": "CreateDatastream", "config": config.to_dict()}
        case DeleteDatastream(name=name):
            return {"type": "DeleteDatastream", "name": name}
        case PauseDatastream(name=name, pause=pause, partitions=partitions):
            return {"type": "PauseDatastream", "name": name, "pause": pause,
                    "partitions": None if partitions is None else list(partitions)}
        case AssignTasks():
            return {"type": "AssignTasks", "name": command.name,
                    "expected_generation": command.expected_generation,
                    "created_version": command.created_version,
                    "source_partitions": command.source_partitions,
                    "tasks": [t.to_dict() for t in command.tasks],
                    "source_streams": [list(s) for s in command.source_streams]}
        case RenewTaskEpoch(name=name, task=task, broker=broker, expected_epoch=epoch):
            return {"type": "RenewTaskEpoch", "name": name, "task": task, "broker": broker,
                    "expected_epoch": epoch}
        case DrainTasks(broker=broker, draining=draining):
            return {"type": "DrainTasks", "broker": broker, "draining": draining}
        case UpdateDatastreams(configs=configs):
            return {"type": "UpdateDatastreams", "configs": [c.to_dict() for c in configs]}
    raise TypeError(f"not a datastream command: {command!r}")


def decode(data: Mapping[str, Any]) -> DatastreamCommand | None:
    """The command `encode` made, or None when `data` is not a datastream command."""
    kind = data.get("type")
    if kind == "CreateDatastream":
        return CreateDatastream(DatastreamConfig.from_dict(data["config"]))
    if kind == "DeleteDatastream":
        return DeleteDatastream(data["name"])
    if kind == "PauseDatastream":
        return PauseDatastream(data["name"], bool(data["pause"]),
                               check_partitions(data["partitions"]))
    if kind == "AssignTasks":
        return AssignTasks(data["name"], int(data["expected_generation"]),
                           int(data["created_version"]), int(data["source_partitions"]),
                           tuple(TaskAssignment.from_dict(t) for t in data["tasks"]),
                           layout_from(data.get("source_streams", ())))
    if kind == "RenewTaskEpoch":
        return RenewTaskEpoch(data["name"], int(data["task"]), int(data["broker"]),
                              int(data["expected_epoch"]))
    if kind == "DrainTasks":
        return DrainTasks(int(data["broker"]), bool(data["draining"]))
    if kind == "UpdateDatastreams":
        return UpdateDatastreams(tuple(DatastreamConfig.from_dict(c) for c in data["configs"]))
    return None
