"""The `parquet` transport: a datastream's records as Parquet files (pyarrow), for Spark and
anything else that reads files.

Settings: `path` (required: a directory, local or shared by the brokers), `file_rows_max`
(100,000), `file_bytes_max` (64 MiB of keys and values), `roll_ms` (60,000: a file is closed
this long after its first row even if small). Columns: `source` (string), `partition`
(int32), `offset` (int64), `timestamp_ms` (int64), `key` and `value` (binary, nullable),
`headers` (map<string, binary>).

Each source partition fills its own file: rows are buffered in memory, written as one
Parquet file under `<path>/_tmp/` when the file rolls (by rows, bytes or age), fsynced,
renamed to `<path>/part-<partition>-<first offset>-<end offset>.parquet`, and only then
recorded in the partition's manifest `<path>/_manifest/partition-<p>.jsonl` (one JSON line
per complete file: file, partition, first_offset, end_offset, rows, bytes), fsynced. The
checkpoint moves to a file's end offset only after that, so the source is re-read from the
end of the last complete file after a crash; rows buffered but not yet in a file are simply
read again. Readers see only complete files: the temporary ones sit under `_tmp`, which
Spark and Hadoop skip (a leading underscore), and the manifests list exactly the complete
files. Exactly once: a writer reads the manifests when it opens and drops records below the
end of a partition's last complete file (a crash between a file's manifest line and the
checkpoint), so a file's rows are never written twice.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from jetstream.datastreams.connector import (
    Endpoints,
    SourceRecord,
    WriterContext,
    check_known,
    setting_str,
)
from jetstream.errors import InvalidDatastreamConfig

SETTINGS = ("path", "file_rows_max", "file_bytes_max", "roll_ms")
FILE_ROWS_MAX = 100_000
FILE_BYTES_MAX = 64 * 1024 * 1024
ROLL_MS = 60_000
#: Bounds of the roll settings.
ROWS_LIMIT = 10_000_000
BYTES_LIMIT = 1024 * 1024 * 1024
ROLL_MS_LIMIT = 24 * 3600 * 1000
MANIFEST_DIR = "_manifest"
TMP_DIR = "_tmp"

SCHEMA = pa.schema([
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


def file_name(partition: int, first_offset: int, end_offset: int) -> str:
    return f"part-{partition:05d}-{first_offset:020d}-{end_offset:020d}.parquet"


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


def read_manifest(directory: Path, partition: int) -> list[dict[str, Any]]:
    """The complete files of a partition, in order (a torn last line is left out: its file
    was renamed but not recorded, and will be written again under the same name)."""
    path = directory / MANIFEST_DIR / f"partition-{partition:05d}.jsonl"
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    out = []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            break
    return out


class ParquetSink:
    def check(self, settings: Mapping[str, Any]) -> None:
        check_known(settings, SETTINGS, "destination.settings")
        setting_str(settings, "path", "destination.settings", required=True)
        limits_of(settings)

    async def open(self, settings: Mapping[str, Any], endpoints: Endpoints,
                   context: WriterContext, client_id: str) -> ParquetWriter:
        directory = Path(str(settings["path"]))
        await asyncio.to_thread(_make_dirs, directory)
        return ParquetWriter(directory, context.source_name, limits_of(settings))


def _make_dirs(directory: Path) -> None:
    for sub in (TMP_DIR, MANIFEST_DIR):
        (directory / sub).mkdir(parents=True, exist_ok=True)


@dataclass(slots=True)
class _Buffer:
    rows: list[SourceRecord] = field(default_factory=list)
    size_bytes: int = 0
    started: float = 0.0


class ParquetWriter:
    def __init__(self, directory: Path, source: str, limits: RollLimits) -> None:
        self.directory = directory
        self._source = source
        self._limits = limits
        self._buffers: dict[int, _Buffer] = {}
        #: Per partition: the end offset of its last complete file (-1: none yet).
        self._durable: dict[int, int] = {}
        self._rolling: set[int] = set()
        self.files_written = 0

    def _durable_end(self, partition: int) -> int:
        end = self._durable.get(partition)
        if end is None:
            files = read_manifest(self.directory, partition)
            end = self._durable[partition] = files[-1]["end_offset"] if files else -1
        return end

    async def write(self, records: Sequence[SourceRecord]) -> None:
        now = time.monotonic()
        touched = set(self._buffers)
        for record in records:
            if record.position < self._durable_end(record.partition):
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
        end = self._durable_end(partition)
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
        table = pa.Table.from_batches([pa.RecordBatch.from_arrays(
            [pa.array(values, type=f.type) for values, f in zip(columns, SCHEMA, strict=True)],
            schema=SCHEMA)], schema=SCHEMA)
        tmp = self.directory / TMP_DIR / name
        pq.write_table(table, str(tmp))
        _fsync(tmp)
        final = self.directory / name
        os.replace(tmp, final)
        _fsync(self.directory)
        line = json.dumps({"file": name, "partition": partition, "first_offset": first,
                           "end_offset": end, "rows": len(rows),
                           "bytes": final.stat().st_size}) + "\n"
        manifest = self.directory / MANIFEST_DIR / f"partition-{partition:05d}.jsonl"
        with open(manifest, "a") as out:
            out.write(line)
            out.flush()
            os.fsync(out.fileno())
        self._durable[partition] = end
        self.files_written += 1

    async def close(self) -> None:
        self._buffers.clear()  # not in a file: read again from the checkpoint


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
