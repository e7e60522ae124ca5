"""The `parquet` transport: a datastream's records as Parquet files (pyarrow), for Spark and
anything else that reads files.

Settings: `path` (required: a directory, local or shared by the brokers, or an object store
URL such as `s3://bucket/prefix` or `file:///dir`: jetstream.datastreams.parquet_files),
`file_rows_max` (100,000), `file_bytes_max` (64 MiB of keys and values), `roll_ms` (60,000:
a file is closed this long after its first row even if small). Columns: `source` (string),
`partition` (int32), `offset` (int64), `timestamp_ms` (int64), `key` and `value` (binary,
nullable), `headers` (map<string, binary>).

Each source partition fills its own file: rows are buffered in memory, made into one
Parquet file when the file rolls (by rows, bytes or age), stored complete as
`<path>/part-<partition>-<first offset>-<end offset>.parquet` and only then recorded in the
partition's manifest under `<path>/_manifest/` (one entry per complete file: file, partition,
first_offset, end_offset, rows, bytes; how each place does it: parquet_files). The
checkpoint moves to a file's end offset only after that, so the source is re-read from the
end of the last complete file after a crash; rows buffered but not yet in a file are simply
read again. Readers see only complete files (`_`-prefixed paths, which Spark and Hadoop
skip, hold the rest), and the manifests list exactly the complete files. Exactly once: a
writer reads the manifests when it opens and drops records below the end of a partition's
last complete file (a crash between a file's manifest entry and the checkpoint), so a
file's rows are never written twice.
"""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jetstream.datastreams.connector import (
    Endpoints,
    SourceRecord,
    WriterContext,
    check_known,
    setting_str,
)
from jetstream.datastreams.parquet_files import (
    MANIFEST_DIR,
    TMP_DIR,
    Files,
    LocalFiles,
    entry_of,
    file_name,
    files_at,
    is_url,
)
from jetstream.errors import InvalidDatastreamConfig

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["MANIFEST_DIR", "TMP_DIR", "ParquetSink", "ParquetWriter", "RollLimits",
           "file_name", "read_manifest", "should_roll"]

SETTINGS = ("path", "file_rows_max", "file_bytes_max", "roll_ms")
#: The object stores a `path` URL may name (those of tiered storage's fragment stores).
STORE_SCHEMES = ("s3://", "s3a://", "gs://", "az://", "abfs://", "abfss://", "file://")
FILE_ROWS_MAX = 100_000
FILE_BYTES_MAX = 64 * 1024 * 1024
ROLL_MS = 60_000
#: Bounds of the roll settings.
ROWS_LIMIT = 10_000_000
BYTES_LIMIT = 1024 * 1024 * 1024
ROLL_MS_LIMIT = 24 * 3600 * 1000


@cache
def schema() -> pa.Schema:
    """The files' columns. pyarrow is imported when a sink first writes (a broker that runs
    no Parquet datastream does not pay for importing it)."""
    import pyarrow as pa
    return pa.schema([
        pa.field("source", pa.string()), pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()), pa.field("timestamp_ms", pa.int64()),
        pa.field("key", pa.binary()), pa.field("value", pa.binary()),
        pa.field("headers", pa.map_(pa.string(), pa.binary())),
    ])


@dataclass(frozen=True, slots=True)
class RollLimits:
    rows_max: int = FILE_ROWS_MAX
    bytes_max: int = FILE_BYTES_MAX
    roll_ms: int = ROLL_MS


def should_roll(rows: int, size_bytes: int, age_ms: int, limits: RollLimits) -> bool:
    """Whether a partition's buffered rows make a file now (pure)."""
    return rows > 0 and (rows >= limits.rows_max or size_bytes >= limits.bytes_max
                         or age_ms >= limits.roll_ms)


def _int_setting(settings: Mapping[str, Any], name: str, default: int, high: int) -> int:
    value = settings.get(name, default)
    if isinstance(value, str) and value.isdigit():
        value = int(value)  # from the command line's KEY=VALUE
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
        raise InvalidDatastreamConfig(
            f"destination.settings.{name} must be an integer in [1, {high}], got {value!r}",
            field=f"destination.settings.{name}")
    return value


def limits_of(settings: Mapping[str, Any]) -> RollLimits:
    return RollLimits(_int_setting(settings, "file_rows_max", FILE_ROWS_MAX, ROWS_LIMIT),
                      _int_setting(settings, "file_bytes_max", FILE_BYTES_MAX, BYTES_LIMIT),
                      _int_setting(settings, "roll_ms", ROLL_MS, ROLL_MS_LIMIT))


def read_manifest(path: Path | str, partition: int) -> list[dict[str, Any]]:
    """The complete files of a partition, in order, as its manifest lists them (a local
    directory or an object store URL, like the `path` setting)."""
    files = files_at(path) if isinstance(path, str) else LocalFiles(path)
    return files.complete(partition)


class ParquetSink:
    def check(self, settings: Mapping[str, Any]) -> None:
        check_known(settings, SETTINGS, "destination.settings")
        path = setting_str(settings, "path", "destination.settings", required=True)
        assert path is not None
        if is_url(path) and not path.startswith(STORE_SCHEMES):
            raise InvalidDatastreamConfig(
                f"destination.settings.path: a URL must start with one of {list(STORE_SCHEMES)}",
                field="destination.settings.path")
        limits_of(settings)

    async def open(self, settings: Mapping[str, Any], endpoints: Endpoints,
                   context: WriterContext, client_id: str) -> ParquetWriter:
        files = await asyncio.to_thread(files_at, str(settings["path"]))
        await asyncio.to_thread(files.prepare)
        return ParquetWriter(files, context.source_name, limits_of(settings))


@dataclass(slots=True)
class _Buffer:
    rows: list[SourceRecord] = field(default_factory=list)
    size_bytes: int = 0
    started: float = 0.0


class ParquetWriter:
    def __init__(self, files: Files, source: str, limits: RollLimits) -> None:
        self._files = files
        self._source = source
        self._limits = limits
        self._buffers: dict[int, _Buffer] = {}
        #: Per partition: the end offset of its last complete file (-1: none yet).
        self._durable: dict[int, int] = {}
        self._rolling: set[int] = set()
        self.files_written = 0

    async def write(self, records: Sequence[SourceRecord]) -> None:
        for partition in {r.partition for r in records} - set(self._durable):
            self._durable[partition] = await asyncio.to_thread(self._files.end_offset,
                                                               partition)
        now = time.monotonic()
        touched = set(self._buffers)
        for record in records:
            if record.position < self._durable[record.partition]:
                continue  # in a complete file already (a crash before its checkpoint)
            filling = self._buffers.setdefault(record.partition, _Buffer(started=now))
            if not filling.rows:
                filling.started = now
            filling.rows.append(record)
            filling.size_bytes += len(record.value or b"") + len(record.key or b"")
            touched.add(record.partition)
        for partition in sorted(touched):
            await self._roll_due(partition, now)

    async def _roll_due(self, partition: int, now: float) -> None:
        """Write files of the partition's buffered rows while they are due, each of at most
        `rows_max` rows (the rest stays buffered)."""
        while (buffer := self._buffers.get(partition)) is not None and should_roll(
                len(buffer.rows), buffer.size_bytes, int((now - buffer.started) * 1000),
                self._limits):
            rows, rest = buffer.rows[:self._limits.rows_max], \
                buffer.rows[self._limits.rows_max:]
            # Swapped out before the thread runs: another partition's write cannot roll the
            # same rows, and `checkpointable` waits for the file while it is rolling.
            self._buffers[partition] = _Buffer(
                rest, sum(len(r.value or b"") + len(r.key or b"") for r in rest),
                buffer.started if rest else now)
            self._rolling.add(partition)
            try:
                await asyncio.to_thread(self._roll, partition, rows)
            finally:
                self._rolling.discard(partition)

    def checkpointable(self, partition: int, position: int) -> int | None:
        end = self._durable.get(partition, -1)  # unknown: nothing was written to it yet
        buffer = self._buffers.get(partition)
        if partition not in self._rolling and (buffer is None or not buffer.rows):
            return max(position, end)  # everything read is in complete files
        return end if end >= 0 else None

    def _roll(self, partition: int, rows: list[SourceRecord]) -> None:
        """Write one complete file of `rows` (a thread: blocking IO)."""
        first, end = rows[0].position, rows[-1].position + 1
        name = file_name(partition, first, end)
        columns = ([self._source] * len(rows), [partition] * len(rows),
                   [r.position for r in rows], [r.timestamp_ms for r in rows],
                   [r.key for r in rows], [r.value for r in rows],
                   [list(r.headers.items()) for r in rows])
        import pyarrow as pa
        import pyarrow.parquet as pq
        columns_of = schema()
        table = pa.Table.from_batches([pa.RecordBatch.from_arrays(
            [pa.array(values, type=f.type) for values, f in zip(columns, columns_of,
                                                                  strict=True)],
            schema=columns_of)], schema=columns_of)
        sink = io.BytesIO()
        pq.write_table(table, sink)
        payload = sink.getvalue()
        self._files.put(partition, name, payload,
                        entry_of(name, partition, first, end, len(rows), len(payload)))
        self._durable[partition] = end
        self.files_written += 1

    async def close(self) -> None:
        self._buffers.clear()  # not in a file: read again from the checkpoint
