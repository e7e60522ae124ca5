"""The datastream data model: definitions, their tasks and where each task runs.

Theory of operation (Brooklin's model): a **datastream** is a managed pipe from a source (a
connector type and its settings) to a destination (a transport type and its settings), with
options that say how records move (batch size, records in flight, partition mapping). The
metadata leader splits it into **tasks**, each owning a subset of the source's partitions, and
assigns each task to one live broker (jetstream.datastreams.planner). Every assignment
carries an **epoch**: the metadata version that made it, so a newer assignment of a task
always has a larger one. The epoch fences an old owner: its writes carry the older epoch and
the destination refuses them once the new owner wrote (idempotent producer epochs).

These are plain frozen values that convert to and from JSON-compatible dicts; they live in
the metadata state (jetstream.raft_meta.fsm) and change only through its commands. Pure: no
IO. Settings are checked here for shape only; each connector checks its own settings
(jetstream.datastreams.registry) before a create is proposed.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from jetstream.datastreams.security import redacted
from jetstream.errors import InvalidDatastreamConfig, InvalidStreamConfig
from jetstream.protocol.names import check_labels

#: Datastream names: short enough that `ds.<name>.<partition>` is a producer id and
#: `__datastream_<name>` a group name.
NAME_CHARS_MAX = 48
_NAME = re.compile(r"[A-Za-z0-9_-]{1,48}")
assert NAME_CHARS_MAX == 48
#: The most tasks one datastream may have, and datastreams one cluster may hold.
TASKS_MAX = 256
DATASTREAMS_MAX = 1000
#: Bounds of the options (records per batch, records in flight per task partition).
BATCH_RECORDS_MAX = 10_000
IN_FLIGHT_MAX = 100_000
#: The highest `rate_limit_records_per_s` (a datastream's records a second, all tasks).
RATE_LIMIT_MAX = 10_000_000
#: The largest settings map (JSON characters), and most source partitions a task reads.
SETTINGS_KEYS_MAX = 64
SOURCE_PARTITIONS_MAX = 1024
CHECKPOINT_GROUP_PREFIX = "__datastream_"


class PartitionMapping(enum.StrEnum):
    """Which destination partition a record goes to: the same number as its source partition
    (`same`), or the hash of its key (`key_hash`; records without a key keep their source
    partition number, modulo the destination's partitions)."""

    SAME = "same"
    KEY_HASH = "key_hash"


class TaskStatus(enum.StrEnum):
    RUNNING = "running"
    PAUSED = "paused"
    FAULTY = "faulty"
    UNASSIGNED = "unassigned"


def check_name(name: object, what: str = "name") -> str:
    if not isinstance(name, str) or _NAME.fullmatch(name) is None:
        raise InvalidDatastreamConfig(
            f"{what} must match [A-Za-z0-9_-]{{1,{NAME_CHARS_MAX}}}, got {name!r}", field=what)
    return name


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A source connector or a destination transport: its type and its settings."""

    type: str
    settings: Mapping[str, Any] = field(default_factory=dict)

    def check(self, what: str) -> None:
        if not isinstance(self.type, str) or not self.type:
            raise InvalidDatastreamConfig(f"{what}.type must be a connector name",
                                          field=f"{what}.type")
        if not isinstance(self.settings, Mapping) or len(self.settings) > SETTINGS_KEYS_MAX \
                or not all(isinstance(k, str) for k in self.settings):
            raise InvalidDatastreamConfig(
                f"{what}.settings must be a map of at most {SETTINGS_KEYS_MAX} named settings",
                field=f"{what}.settings")

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, "settings": dict(self.settings)}

    def shown(self) -> dict[str, Any]:
        """`to_dict` with the secrets of its settings redacted: for APIs, logs, errors."""
        return {"type": self.type, "settings": redacted(self.settings)}

    def __repr__(self) -> str:
        return f"Endpoint(type={self.type!r}, settings={redacted(self.settings)!r})"

    @classmethod
    def from_dict(cls, data: object, what: str) -> Endpoint:
        if isinstance(data, str):
            data = {"type": data}
        if not isinstance(data, Mapping) or set(data) - {"type", "settings"}:
            raise InvalidDatastreamConfig(f"{what} must be {{type, settings}}", field=what)
        endpoint = cls(data.get("type", ""), dict(data.get("settings") or {}))
        endpoint.check(what)
        return endpoint


@dataclass(frozen=True, slots=True)
class DatastreamConfig:
    name: str
    source: Endpoint
    destination: Endpoint
    #: The most tasks the source's partitions are split into.
    max_tasks: int = 1
    #: Records read from a source partition and written in one go.
    batch_records_max: int = 500
    #: Records of one task partition written and not yet acknowledged, at most.
    in_flight_max: int = 1000
    partition_mapping: PartitionMapping = PartitionMapping.SAME
    labels: Mapping[str, str] = field(default_factory=dict)
    #: Records a second the datastream writes at most, shared by its tasks (None: no limit).
    rate_limit_records_per_s: int | None = None

    def __post_init__(self) -> None:
        check_name(self.name)
        self.source.check("source")
        self.destination.check("destination")
        for name, high in (("max_tasks", TASKS_MAX), ("batch_records_max", BATCH_RECORDS_MAX),
                           ("in_flight_max", IN_FLIGHT_MAX)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
                raise InvalidDatastreamConfig(
                    f"{name} must be an integer in [1, {high}], got {value!r}", field=name)
        rate = self.rate_limit_records_per_s
        if rate is not None and (isinstance(rate, bool) or not isinstance(rate, int)
                                 or not 1 <= rate <= RATE_LIMIT_MAX):
            raise InvalidDatastreamConfig(
                f"rate_limit_records_per_s must be null or an integer in [1, {RATE_LIMIT_MAX}],"
                f" got {rate!r}", field="rate_limit_records_per_s")
        try:
            object.__setattr__(self, "partition_mapping",
                               PartitionMapping(self.partition_mapping))
        except ValueError:
            raise InvalidDatastreamConfig(
                f"partition_mapping must be one of {[m.value for m in PartitionMapping]}",
                field="partition_mapping") from None
        try:
            object.__setattr__(self, "labels", check_labels(self.labels))
        except InvalidStreamConfig as exc:
            raise InvalidDatastreamConfig(str(exc), field="labels") from None

    @property
    def checkpoint_group(self) -> str:
        """The consumer group whose committed offsets are this datastream's checkpoints."""
        return CHECKPOINT_GROUP_PREFIX + self.name

    def to_dict(self) -> dict[str, Any]:
        """Everything, secrets included: for the metadata log and its snapshots only."""
        return {**self.shown(), "source": self.source.to_dict(),
                "destination": self.destination.to_dict()}

    def shown(self) -> dict[str, Any]:
        """The definition as APIs show it: the endpoints' secrets redacted."""
        return {"name": self.name, "source": self.source.shown(),
                "destination": self.destination.shown(), "max_tasks": self.max_tasks,
                "batch_records_max": self.batch_records_max,
                "in_flight_max": self.in_flight_max,
                "partition_mapping": self.partition_mapping.value, "labels": dict(self.labels),
                "rate_limit_records_per_s": self.rate_limit_records_per_s}

    @classmethod
    def from_dict(cls, data: object) -> DatastreamConfig:
        """Build from user input: unknown fields are an error (a typo must not pass)."""
        if not isinstance(data, Mapping):
            raise InvalidDatastreamConfig("a datastream is a map of fields", field="")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InvalidDatastreamConfig(f"unknown datastream fields: {unknown}",
                                          field=unknown[0])
        for required in ("name", "source", "destination"):
            if required not in data:
                raise InvalidDatastreamConfig(f"{required} is required", field=required)
        values = dict(data)
        values["source"] = Endpoint.from_dict(data["source"], "source")
        values["destination"] = Endpoint.from_dict(data["destination"], "destination")
        return cls(**values)


@dataclass(frozen=True, slots=True)
class TaskAssignment:
    """One task: the source partitions it owns, the broker running it (None: no live broker)
    and the epoch of this assignment (the metadata version that made it)."""

    task: int
    partitions: tuple[int, ...]
    broker: int | None
    epoch: int

    def to_dict(self) -> dict[str, Any]:
        return {"task": self.task, "partitions": list(self.partitions), "broker": self.broker,
                "epoch": self.epoch}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TaskAssignment:
        return cls(int(data["task"]), tuple(int(p) for p in data["partitions"]),
                   None if data["broker"] is None else int(data["broker"]), int(data["epoch"]))


@dataclass(frozen=True, slots=True)
class DatastreamState:
    """A datastream as the metadata holds it. `paused`: the whole datastream;
    `paused_partitions`: single source partitions. `generation` moves at every change of
    the tasks (assignments are compare-and-set on it). `source_streams`: for a label-selector
    source, the matching streams and their partition counts, whose (stream, partition) pairs
    in order are the datastream's partitions (jetstream.datastreams.selector)."""

    config: DatastreamConfig
    paused: bool = False
    paused_partitions: tuple[int, ...] = ()
    source_partitions: int = 0
    tasks: tuple[TaskAssignment, ...] = ()
    generation: int = 0
    created_version: int = 0
    source_streams: tuple[tuple[str, int], ...] = ()

    @property
    def name(self) -> str:
        return self.config.name

    def partition_paused(self, partition: int) -> bool:
        return self.paused or partition in self.paused_partitions

    def with_pause(self, pause: bool, partitions: tuple[int, ...] | None) -> DatastreamState:
        """Paused or resumed: the whole datastream (`partitions` None) or those partitions."""
        if partitions is None:
            return replace(self, paused=pause, paused_partitions=() if not pause
                           else self.paused_partitions)
        current = set(self.paused_partitions)
        changed = current | set(partitions) if pause else current - set(partitions)
        return replace(self, paused_partitions=tuple(sorted(changed)))

    def to_dict(self) -> dict[str, Any]:
        return {"config": self.config.to_dict(), "paused": self.paused,
                "paused_partitions": list(self.paused_partitions),
                "source_partitions": self.source_partitions,
                "tasks": [t.to_dict() for t in self.tasks], "generation": self.generation,
                "created_version": self.created_version,
                "source_streams": [list(s) for s in self.source_streams]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DatastreamState:
        return cls(DatastreamConfig.from_dict(data["config"]), bool(data["paused"]),
                   tuple(int(p) for p in data["paused_partitions"]),
                   int(data["source_partitions"]),
                   tuple(TaskAssignment.from_dict(t) for t in data["tasks"]),
                   int(data["generation"]), int(data["created_version"]),
                   layout_from(data.get("source_streams", ())))  # absent before selectors


def layout_from(data: object) -> tuple[tuple[str, int], ...]:
    """A layout (`source_streams`) from its plain form: pairs of stream and partitions."""
    assert isinstance(data, list | tuple), data
    return tuple((str(stream), int(count)) for stream, count in data)


def check_partitions(partitions: object) -> tuple[int, ...] | None:
    """A pause or resume's partitions: None (all) or a tuple of partition numbers."""
    if partitions is None:
        return None
    if not isinstance(partitions, list | tuple) or not partitions or len(partitions) > \
            SOURCE_PARTITIONS_MAX or not all(isinstance(p, int) and not isinstance(p, bool)
                                             and 0 <= p < SOURCE_PARTITIONS_MAX
                                             for p in partitions):
        raise InvalidDatastreamConfig(
            f"partitions must be a list of partition numbers in [0, {SOURCE_PARTITIONS_MAX})",
            field="partitions")
    return tuple(sorted(set(partitions)))
