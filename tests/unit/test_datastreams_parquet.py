"""The Parquet sink's roll decision, its files and manifests, and exactly once across a
writer that is replaced after a crash (real files in a temporary directory)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from jetstream.datastreams.connector import Endpoints, SourceRecord, WriterContext
from jetstream.datastreams.parquet_sink import (
    MANIFEST_DIR,
    ParquetSink,
    RollLimits,
    read_manifest,
    should_roll,
)
from jetstream.errors import InvalidDatastreamConfig

CONTEXT = WriterContext("ds", 1, "events", "same", 100)


def records(partition: int, first: int, count: int) -> list[SourceRecord]:
    return [SourceRecord(partition, o, b"v%d" % o, None if o % 3 else b"k%d" % o,
                         {"h": b"%d" % o}, 1000 + o) for o in range(first, first + count)]


def test_should_roll() -> None:
    limits = RollLimits(rows_max=10, bytes_max=100, roll_ms=1000)
    assert not should_roll(0, 0, 10_000, limits)  # nothing to write
    assert should_roll(10, 1, 0, limits)
    assert should_roll(1, 100, 0, limits)
    assert should_roll(1, 1, 1000, limits)
    assert not should_roll(9, 99, 999, limits)


def test_settings_are_checked() -> None:
    sink = ParquetSink()
    sink.check({"path": "/tmp/x", "file_rows_max": "5", "roll_ms": 10})
    for bad, field in (({}, "destination.settings.path"),
                       ({"path": "/x", "file_rows_max": 0}, "destination.settings.file_rows_max"),
                       ({"path": "/x", "colour": 1}, "destination.settings.colour")):
        with pytest.raises(InvalidDatastreamConfig) as info:
            sink.check(bad)
        assert info.value.fields["field"] == field


def test_files_manifests_and_exactly_once(tmp_path: Path) -> None:
    async def scenario() -> None:
        settings = {"path": str(tmp_path), "file_rows_max": 10, "roll_ms": 3_600_000}
        writer = await ParquetSink().open(settings, Endpoints(""), CONTEXT, "test")
        await writer.write(records(0, 0, 25))
        assert writer.checkpointable(0, 25) == 20  # 5 rows not in a file yet
        assert writer.checkpointable(1, 7) == 7  # nothing of partition 1 buffered
        await writer.close()  # a crash: the 5 buffered rows are read again
        again = await ParquetSink().open(settings, Endpoints(""), CONTEXT, "test")
        await again.write(records(0, 15, 20))  # from an older checkpoint: 15..19 are filed
        assert again.checkpointable(0, 35) == 30
        await again.write(records(0, 35, 5))
        assert again.checkpointable(0, 40) == 40
        files = read_manifest(tmp_path, 0)
        assert [(f["first_offset"], f["end_offset"]) for f in files] == [
            (0, 10), (10, 20), (20, 30), (30, 40)]
        table = pq.read_table(str(tmp_path))
        assert table.column("offset").to_pylist() == list(range(40))
        row = table.to_pylist()[3]
        assert (row["key"], row["value"], row["timestamp_ms"]) == (b"k3", b"v3", 1003)
        assert dict(row["headers"]) == {"h": b"3"}
        assert row["source"] == "events" and row["partition"] == 0
        # A torn manifest line (a crash while appending) is left out.
        manifest = tmp_path / MANIFEST_DIR / "partition-00000.jsonl"
        manifest.write_text(manifest.read_text() + '{"file": "torn')
        assert len(read_manifest(tmp_path, 0)) == 4

    asyncio.run(scenario())
