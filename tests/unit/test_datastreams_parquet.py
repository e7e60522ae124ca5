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
    file_name,
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


@pytest.mark.parametrize("url", [False, True], ids=["directory", "file-url"])
def test_files_manifests_and_exactly_once(tmp_path: Path, url: bool) -> None:
    """The same contract in a directory (fsync, rename, a JSON-lines manifest) and through
    the object store layer (`file://`: whole objects, one manifest object per file)."""
    path = f"file://{tmp_path}" if url else str(tmp_path)

    async def scenario() -> None:
        settings = {"path": path, "file_rows_max": 10, "roll_ms": 3_600_000}
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
        files = read_manifest(path, 0)
        assert [(f["first_offset"], f["end_offset"]) for f in files] == [
            (0, 10), (10, 20), (20, 30), (30, 40)]
        assert all(f["bytes"] == (tmp_path / f["file"]).stat().st_size for f in files)
        table = pq.read_table(str(tmp_path))
        assert table.column("offset").to_pylist() == list(range(40))
        row = table.to_pylist()[3]
        assert (row["key"], row["value"], row["timestamp_ms"]) == (b"k3", b"v3", 1003)
        assert dict(row["headers"]) == {"h": b"3"}
        assert row["source"] == "events" and row["partition"] == 0

    asyncio.run(scenario())


def test_a_torn_manifest_line_is_left_out(tmp_path: Path) -> None:
    async def scenario() -> None:
        settings = {"path": str(tmp_path), "file_rows_max": 10, "roll_ms": 3_600_000}
        writer = await ParquetSink().open(settings, Endpoints(""), CONTEXT, "test")
        await writer.write(records(0, 0, 40))
        manifest = tmp_path / MANIFEST_DIR / "partition-00000.jsonl"
        manifest.write_text(manifest.read_text() + '{"file": "torn')
        assert len(read_manifest(tmp_path, 0)) == 4

    asyncio.run(scenario())


def test_a_store_file_without_its_manifest_entry_is_removed(tmp_path: Path) -> None:
    """A crash between a file's PUT and its manifest entry's: the next writer removes the
    file (its rows come again from the checkpoint), so no row is listed twice."""
    path = f"file://{tmp_path}"

    async def scenario() -> None:
        settings = {"path": path, "file_rows_max": 10, "roll_ms": 3_600_000}
        writer = await ParquetSink().open(settings, Endpoints(""), CONTEXT, "test")
        await writer.write(records(0, 0, 20) + records(1, 0, 10))
        entry = tmp_path / MANIFEST_DIR / "partition-00000" / f"{10:020d}-{20:020d}.json"
        entry.unlink()  # as if the crash came before this entry
        again = await ParquetSink().open({**settings, "file_rows_max": 7}, Endpoints(""),
                                         CONTEXT, "test")
        await again.write(records(0, 10, 15))  # cut otherwise this time: 10..16, 17..23
        await again.write(records(1, 10, 1))
        assert again.checkpointable(0, 25) == 24

    asyncio.run(scenario())
    assert [f["file"] for f in read_manifest(path, 0)] == [
        file_name(0, 0, 10), file_name(0, 10, 17), file_name(0, 17, 24)]
    assert sorted(p.name for p in tmp_path.glob("part-*")) == sorted(
        [file_name(0, 0, 10), file_name(0, 10, 17), file_name(0, 17, 24),
         file_name(1, 0, 10)])
    table = pq.read_table(str(tmp_path))
    assert sorted(zip(table.column("partition").to_pylist(),
                      table.column("offset").to_pylist(), strict=True)) == \
        [(0, o) for o in range(24)] + [(1, o) for o in range(10)]
