"""What a source connector and a destination transport provide to a datastream task.

Theory of operation (Brooklin's connector / transport provider split): a task reads records
from its source partitions through a `SourceReader`, hands them to a `DestinationWriter`, and
once the writer says the destination acknowledged them, stores the source position as the
partition's checkpoint through the reader (`commit`). A position is the source's own: for a
Jetstream stream the next offset to read. Both sides are opened from their settings by a
connector class registered in jetstream.datastreams.registry; adding one is one module that
implements these two protocols and one line there.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from jetstream.stream.copying import CopiedRange


@dataclass(frozen=True, slots=True)
class SourceRecord:
    """One record read from a source partition, at `position` (its offset); the position
    after it is `position + 1`."""

    partition: int
    position: int
    value: bytes | None
    key: bytes | None
    headers: Mapping[str, bytes] = field(default_factory=dict)
    timestamp_ms: int = 0

    def size_bytes(self) -> int:
        """What the record carries: key, value, header names and values (bytes metrics)."""
        return len(self.value or b"") + len(self.key or b"") + sum(
            len(name.encode()) + len(value) for name, value in self.headers.items())


@dataclass(frozen=True, slots=True)
class SourceBatch:
    records: list[SourceRecord]
    #: Where the next read starts, and the source's end (its high watermark) at this read.
    next_position: int
    end_position: int
    #: A mirror's read (jetstream.datastreams.batch_copy): whole record batches as bytes,
    #: instead of `records`.
    copied: CopiedRange | None = None

    @property
    def record_count(self) -> int:
        return self.copied.records if self.copied is not None else len(self.records)

    def size_bytes(self) -> int:
        """What the batch carries (bytes metrics): the records' keys, values and headers, or
        the copied batches' bytes."""
        if self.copied is not None:
            return len(self.copied.data)
        return sum(record.size_bytes() for record in self.records)

    @property
    def last_timestamp_ms(self) -> int:
        if self.copied is not None:
            return self.copied.last_timestamp_ms
        return self.records[-1].timestamp_ms if self.records else 0


@dataclass(frozen=True, slots=True)
class Endpoints:
    """Where this broker's own cluster is: a connector's default when its settings name no
    brokers."""

    local_brokers: str


class SourceReader(Protocol):
    async def partitions(self) -> int:
        """How many partitions the source has now."""

    async def checkpoint(self, group: str, partition: int) -> int | None:
        """The position committed for `partition` (None: none yet)."""

    async def start_position(self, partition: int) -> int:
        """Where a partition without a checkpoint starts (the connector's `start` setting)."""

    async def read(self, partition: int, position: int, max_records: int,
                   wait_ms: int) -> SourceBatch:
        """Records from `position`, up to `max_records`, waiting up to `wait_ms` for some."""

    async def commit(self, group: str, partition: int, position: int) -> None:
        """Store `position` as the partition's checkpoint (only after the destination
        acknowledged everything before it)."""

    async def close(self) -> None: ...


class DestinationWriter(Protocol):
    async def write(self, records: Sequence[SourceRecord]) -> None:
        """Write `records` (in order per source partition; none: time passed) and return
        once the destination took them; raise when it could not. Writing records again after
        a failure must not duplicate them where the destination can tell (idempotence)."""

    def checkpointable(self, partition: int, position: int) -> int | None:
        """Everything of `partition` before `position` was passed to `write`: the position
        the source may checkpoint now (the destination holds everything before it for good),
        or None when nothing new is."""

    async def close(self) -> None: ...


class SourceConnector(Protocol):
    def check(self, settings: Mapping[str, Any]) -> None:
        """Raise InvalidDatastreamConfig (`field`: `source.settings.<name>`) for bad settings."""

    async def open(self, settings: Mapping[str, Any], endpoints: Endpoints,
                   client_id: str) -> SourceReader: ...


@dataclass(frozen=True, slots=True)
class WriterContext:
    """What a writer needs besides its settings: the datastream, the task's epoch (it fences
    an older owner's writes) and how records map to destination partitions."""

    datastream: str
    epoch: int
    source_name: str
    partition_mapping: str
    in_flight_max: int


class DestinationTransport(Protocol):
    def check(self, settings: Mapping[str, Any]) -> None:
        """Raise InvalidDatastreamConfig (`field`: `destination.settings.<name>`)."""

    async def open(self, settings: Mapping[str, Any], endpoints: Endpoints,
                   context: WriterContext, client_id: str) -> DestinationWriter: ...


def setting_str(settings: Mapping[str, Any], name: str, where: str, *, required: bool = False,
                default: str | None = None, choices: Sequence[str] = ()) -> str | None:
    """A string setting, checked; InvalidDatastreamConfig names it as `<where>.<name>`."""
    from jetstream.errors import InvalidDatastreamConfig

    value = settings.get(name, default)
    if value is None:
        if required:
            raise InvalidDatastreamConfig(f"{where}.{name} is required",
                                          field=f"{where}.{name}")
        return None
    if not isinstance(value, str) or not value or (choices and value not in choices):
        wanted = f"one of {list(choices)}" if choices else "a non-empty string"
        raise InvalidDatastreamConfig(f"{where}.{name} must be {wanted}, got {value!r}",
                                      field=f"{where}.{name}")
    return value


def check_known(settings: Mapping[str, Any], known: Sequence[str], where: str) -> None:
    from jetstream.errors import InvalidDatastreamConfig

    unknown = sorted(set(settings) - set(known))
    if unknown:
        raise InvalidDatastreamConfig(f"unknown {where} settings {unknown} (known: "
                                      f"{sorted(known)})", field=f"{where}.{unknown[0]}")
