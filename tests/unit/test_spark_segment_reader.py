"""Reading offset ranges from a real log's segment files, against the log's own reads."""

from __future__ import annotations

import itertools
import random
import shutil
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jetstream.spark import arrow_decode as ad
from jetstream.spark import segment_reader
from jetstream.spark.segment_reader import (
    FileSplit,
    SegmentFile,
    SegmentGone,
    read_split,
    segments_for,
    split_offsets,
)
from jetstream.stream import format as fmt
from jetstream.stream.index import OFFSET_ENTRY
from jetstream.stream.log import Log
from jetstream.stream.segment import log_file_name
from tests.unit.log_helpers import T0, Clock, make, read_all

COLUMNS = [f.name for f in ad.ARROW_FIELDS]
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def fill(log: Log, clock: Clock, batches: int, seed: int = 1) -> None:
    """Batches of 1 to 12 records: keyed or not, values of varied or equal sizes, some
    tombstones and headers, the leader epoch rising."""
    rnd = random.Random(seed)
    for i in range(batches):
        clock.now += rnd.randint(0, 3)
        size = rnd.choice([None, 40])  # None: every record its own size
        records = [
            fmt.Record(
                None if rnd.random() < 0.1 else bytes([i % 256]) * (size or rnd.randint(0, 90)),
                None if rnd.random() < 0.2 else b"k%d" % rnd.randint(0, 30),
                {"trace": b"%d" % j} if size is None and rnd.random() < 0.2 else {},
                f"orders.{'é' if i % 3 else 'eu'}",
                clock.now + rnd.randint(-5, 5),
            )
            for j in range(rnd.randint(1, 12))
        ]
        log.append(records, i // 40)


@pytest.fixture(scope="module")
def stream_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A closed log of ~1000 records over many segments, with index entries in each."""
    directory = tmp_path_factory.mktemp("log")
    clock = Clock()
    log = make(directory, clock, segment_bytes_max=4096, index_interval_bytes=500)
    fill(log, clock, 150)
    assert len(log.segment_base_offsets) >= 8
    log.close()
    yield directory


@pytest.fixture
def log_copy(stream_dir: Path, tmp_path: Path) -> Path:
    """A copy of the log a test may damage."""
    target = tmp_path / "copy"
    shutil.copytree(stream_dir, target)
    return target


def open_log(directory: Path) -> Log:
    return make(directory, Clock(), segment_bytes_max=4096, index_interval_bytes=500)


def segment_files(directory: Path, url: bool = False) -> list[SegmentFile]:
    bases = sorted(int(p.stem) for p in directory.glob("*.log"))
    prefix = "file://" if url else ""
    return [SegmentFile(b, f"{prefix}{directory / log_file_name(b)}") for b in bases]


def split_of(directory: Path, start: int, end: int, url: bool = False,
             **kwargs: Any) -> FileSplit:
    segments = segments_for(start, end, segment_files(directory, url))
    return FileSplit("orders", 3, start, end, segments, **kwargs)


def rows(split: FileSplit, columns: list[str] = COLUMNS, **kwargs: Any) -> list[dict[str, Any]]:
    batches = list(read_split(split, columns, **kwargs))
    assert all(b.num_rows for b in batches)
    assert all(b.schema == ad.arrow_schema(columns) for b in batches)
    return [row for b in batches for row in b.to_pylist()]


def expected(records: list[fmt.StoredRecord], start: int, end: int) -> list[dict[str, Any]]:
    return [{
        "stream": "orders", "partition": 3, "offset": r.offset,
        "timestamp": EPOCH + timedelta(milliseconds=r.timestamp_ms), "subject": r.subject,
        "key": r.key, "value": r.value, "headers": list(r.headers.items()),
        "leader_epoch": r.leader_epoch,
    } for r in records if start <= r.offset < end]


@pytest.fixture(scope="module")
def reference(stream_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> list[
        fmt.StoredRecord]:
    copy = tmp_path_factory.mktemp("reference") / "log"
    shutil.copytree(stream_dir, copy)
    with open_log(copy) as log:
        return read_all(log)


@pytest.mark.parametrize("chunk_bytes", [64, 1000, 1 << 20])
def test_ranges_read_as_the_log_reads_them(stream_dir: Path, reference: list[fmt.StoredRecord],
                                           chunk_bytes: int) -> None:
    leo = reference[-1].offset + 1
    bases = [s.base_offset for s in segment_files(stream_dir)]
    rnd = random.Random(chunk_bytes)
    ranges = [(0, leo), (0, 0), (5, 6), (bases[2], bases[3]), (bases[2] + 1, bases[5] - 1),
              (leo - 1, leo)] + [tuple(sorted(rnd.sample(range(leo + 1), 2))) for _ in range(25)]
    for start, end in ranges:
        split = split_of(stream_dir, start, end)
        assert rows(split, chunk_bytes=chunk_bytes) == expected(reference, start, end), (
            start, end)


def test_the_active_segment_is_read_without_its_index(tmp_path: Path) -> None:
    """While the log is open, the active segment has no index file yet, and its last batch
    may be half written; past `end` lie batches not yet committed."""
    clock = Clock()
    log = open_log(tmp_path)
    fill(log, clock, 60)
    records = read_all(log)
    leo = log.log_end_offset
    active = segment_files(tmp_path)[-1]
    assert not Path(active.index_path).exists()
    with open(active.path, "ab") as f:  # a torn append
        f.write(fmt.encode_batch(leo, 9, [fmt.Record(b"x" * 100)], 0)[:70])
    for start, end in [(0, leo), (active.base_offset + 2, leo - 3), (leo - 1, leo)]:
        assert rows(split_of(tmp_path, start, end)) == expected(records, start, end)
    log.close()


def test_a_stale_or_damaged_index_falls_back_to_the_segment_start(
        log_copy: Path, reference: list[fmt.StoredRecord]) -> None:
    segments = segment_files(log_copy)
    Path(segments[1].index_path).write_bytes(b"garbage")
    # A well-formed index of another segment: its positions point at the wrong batches.
    shutil.copy(segments[6].index_path, segments[2].index_path)
    # An entry past the end of the file.
    Path(segments[3].index_path).write_bytes(OFFSET_ENTRY.pack(0, 0) + OFFSET_ENTRY.pack(5, 99_999))
    for segment in segments[1:4]:
        start, end = segment.base_offset + 6, segments[5].base_offset - 1
        assert rows(split_of(log_copy, start, end)) == expected(reference, start, end)


def test_a_missing_segment_raises_segment_gone_at_the_first_unread_offset(
        log_copy: Path, reference: list[fmt.StoredRecord]) -> None:
    segments = segment_files(log_copy)
    gone = segments[3]
    start, end = segments[1].base_offset + 3, segments[6].base_offset
    split = split_of(log_copy, start, end)
    inside = split_of(log_copy, gone.base_offset + 1, end)
    Path(gone.path).unlink()  # after planning: retention deleted it, or the cleaner merged it
    read: list[dict[str, Any]] = []
    with pytest.raises(SegmentGone) as caught:
        for batch in read_split(split, COLUMNS):
            read.extend(batch.to_pylist())
    assert (caught.value.stream, caught.value.partition) == ("orders", 3)
    assert caught.value.offset == gone.base_offset
    assert read == expected(reference, start, gone.base_offset)
    # Starting inside the missing segment: nothing was read.
    with pytest.raises(SegmentGone) as caught:
        rows(inside)
    assert caught.value.offset == gone.base_offset + 1


def test_a_truncated_segment_raises_segment_gone(log_copy: Path,
                                                 reference: list[fmt.StoredRecord]) -> None:
    segments = segment_files(log_copy)
    cut = segments[2]
    data = Path(cut.path).read_bytes()
    Path(cut.path).write_bytes(data[:len(data) // 2])
    whole = list(fmt.iter_batches(data[:len(data) // 2]))
    first_unread = whole[-1][1].next_offset
    start, end = segments[2].base_offset, segments[4].base_offset
    read: list[dict[str, Any]] = []
    with pytest.raises(SegmentGone) as caught:
        for batch in read_split(split_of(log_copy, start, end), COLUMNS, chunk_bytes=512):
            read.extend(batch.to_pylist())
    assert caught.value.offset == first_unread
    assert read == expected(reference, start, first_unread)
    # A range that ends where the shortened file still has data reads fine.
    assert rows(split_of(log_copy, start, first_unread)) == expected(
        reference, start, first_unread)


def test_a_file_ending_before_end_is_segment_gone(stream_dir: Path,
                                                  reference: list[fmt.StoredRecord]) -> None:
    leo = reference[-1].offset + 1
    with pytest.raises(SegmentGone) as caught:
        rows(split_of(stream_dir, leo - 2, leo + 5))
    assert caught.value.offset == leo


def test_compacted_segments_with_gaps_and_emptied_batches(tmp_path: Path) -> None:
    """Batches as the log cleaner leaves them: records missing inside kept offset ranges,
    and batches without records; all copied into a log as a follower would."""
    rnd = random.Random(5)
    data, base = b"", 0
    for i in range(120):
        if i % 7 == 3:
            data += fmt.encode_empty_batch(base, 0, 4, T0, T0)
            base += 5
            continue
        deltas = sorted(rnd.sample(range(10), rnd.randint(1, 6)))
        records = [fmt.Record(b"v%d" % (base + d), b"k%d" % (d % 3), subject="s",
                              timestamp_ms=T0 + base) for d in deltas]
        data += fmt.encode_batch(base, 0, records, T0, deltas, 9)
        base += 10
    with open_log(tmp_path) as log:
        log.append_batches(data)
    records = fmt.decode_batches(data)
    assert len(segment_files(tmp_path)) > 3
    for start, end in [(0, base), (13, base - 17), (50, 51)]:
        assert rows(split_of(tmp_path, start, end)) == expected(records, start, end)
    compacted = ad.latest_per_key(
        read_split(split_of(tmp_path, 0, base), ["key", "offset", "value", ad.TOMBSTONE]),
        ["key", "value"])
    latest = {r.key: r.value for r in records}
    assert compacted.to_pylist() == [{"key": k, "value": v} for k, v in sorted(
        latest.items(), key=lambda kv: max(r.offset for r in records if r.key == kv[0]))]


def test_columns_and_timestamps_filter_rows(stream_dir: Path,
                                            reference: list[fmt.StoredRecord]) -> None:
    leo = reference[-1].offset + 1
    low, high = T0 + 100, T0 + 200
    got = rows(split_of(stream_dir, 10, leo), ["offset", "key"], timestamp_min_ms=low,
               timestamp_max_ms=high)
    assert got == [{"offset": r.offset, "key": r.key} for r in reference
                   if r.offset >= 10 and low <= r.timestamp_ms <= high]


def test_file_urls_go_through_fsspec(stream_dir: Path,
                                     reference: list[fmt.StoredRecord],
                                     log_copy: Path) -> None:
    leo = reference[-1].offset + 1
    assert rows(split_of(stream_dir, 7, leo - 7, url=True)) == expected(reference, 7, leo - 7)
    segments = segment_files(log_copy)
    split = split_of(log_copy, segments[2].base_offset, leo, url=True)
    Path(segments[2].path).unlink()
    with pytest.raises(SegmentGone) as caught:
        rows(split)
    assert caught.value.offset == segments[2].base_offset


def test_the_stream_version_must_match(log_copy: Path,
                                       reference: list[fmt.StoredRecord]) -> None:
    version = log_copy / "stream-version"
    version.write_bytes(b"17")
    split = split_of(log_copy, 4, 30, version_path=str(version), version="17")
    assert rows(split) == expected(reference, 4, 30)
    version.write_bytes(b"18")
    with pytest.raises(SegmentGone) as caught:
        rows(split)
    assert caught.value.offset == 4
    version.unlink()
    with pytest.raises(SegmentGone):
        rows(split)


class Unbuffered:
    """A file with read and seek only (no readinto), as some fsspec file systems give."""

    def __init__(self, path: str) -> None:
        self._file = open(path, "rb")  # noqa: SIM115 - closed by __exit__

    def __enter__(self) -> Unbuffered:
        return self

    def __exit__(self, *exc: object) -> None:
        self._file.close()

    def read(self, size: int = -1) -> bytes:
        return self._file.read(min(size, 700))  # short reads, as a network file may give

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._file.seek(offset, whence)


def test_any_file_opener_and_small_decode_slices(stream_dir: Path,
                                                 reference: list[fmt.StoredRecord],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(segment_reader, "DECODE_BYTES", 100)  # smaller than most batches
    leo = reference[-1].offset + 1
    got = rows(split_of(stream_dir, 3, leo - 3), open_file=Unbuffered, chunk_bytes=5000)
    assert got == expected(reference, 3, leo - 3)


def test_offsets_that_do_not_follow_on_are_segment_gone(tmp_path: Path) -> None:
    """A segment file whose batches skip offsets is not the file the plan was made from."""
    first = fmt.encode_batch(0, 0, [fmt.Record(b"a"), fmt.Record(b"b")], 0)
    skipped = fmt.encode_batch(5, 0, [fmt.Record(b"c")], 0)
    path = tmp_path / log_file_name(0)
    path.write_bytes(first + skipped)
    split = FileSplit("s", 0, 0, 6, (SegmentFile(0, str(path)),))
    with pytest.raises(SegmentGone) as caught:
        list(read_split(split, ["offset"]))
    assert caught.value.offset == 2


def test_a_split_must_hold_its_range() -> None:
    segments = (SegmentFile(0, "a.log"), SegmentFile(10, "b.log"))
    assert segments[1].index_path == "b.index"
    with pytest.raises(ValueError, match="do not hold"):
        FileSplit("s", 0, 0, 30, segments[1:])
    with pytest.raises(ValueError, match="increase"):
        FileSplit("s", 0, 0, 30, segments[::-1])
    with pytest.raises(ValueError, match="bad offset range"):
        FileSplit("s", 0, 5, 4, segments)
    with pytest.raises(ValueError, match="together"):
        FileSplit("s", 0, 0, 30, segments, version_path="v")
    assert list(read_split(FileSplit("s", 0, 3, 3, ()), ["offset"])) == []


@given(bases=st.lists(st.integers(0, 500), unique=True, max_size=12).map(sorted),
       start=st.integers(0, 600), length=st.integers(0, 600),
       target=st.integers(1, 200))
def test_split_offsets_cover_the_range_in_pieces(bases: list[int], start: int, length: int,
                                                 target: int) -> None:
    end = start + length
    ranges = split_offsets(start, end, bases, target)
    assert [a for a, _ in ranges[1:]] == [b for _, b in ranges[:-1]]
    assert (ranges[0][0], ranges[-1][1]) == (start, end) if ranges else start == end
    assert all(0 < b - a <= target for a, b in ranges)
    inner = sorted({b for b in bases if start < b < end})
    pieces = list(zip([start, *inner], [*inner, end], strict=True))
    for _a, b in ranges[:-1]:  # a cut off a segment boundary splits a segment too large
        if b not in inner:
            assert any(lo < b < hi and hi - lo > target for lo, hi in pieces)
    for (a1, _), (_, b2) in itertools.pairwise(ranges):
        # Two neighbours that together fit in one range are not left apart at a boundary
        # between segments they hold whole.
        whole = a1 in (start, *inner) and b2 in (*inner, end)
        assert not (whole and b2 - a1 <= target)


@given(bases=st.lists(st.integers(0, 100), unique=True, min_size=1, max_size=8).map(sorted),
       start=st.integers(0, 120), length=st.integers(1, 50))
def test_segments_for_picks_the_segments_of_a_range(bases: list[int], start: int,
                                                    length: int) -> None:
    end = start + length
    segments = [SegmentFile(b, f"{b}.log") for b in bases]
    picked = segments_for(start, end, segments)
    uppers = [*bases[1:], 10**9]
    assert list(picked) == [s for s, upper in zip(segments, uppers, strict=True)
                            if s.base_offset < end and upper > start]
    if bases[0] <= start:
        FileSplit("s", 0, start, end, picked)  # holds its range


def test_read_split_yields_arrow_batches(stream_dir: Path) -> None:
    batches = list(read_split(split_of(stream_dir, 0, 100), ["offset"]))
    assert all(isinstance(b, pa.RecordBatch) for b in batches)
    assert sum(b.num_rows for b in batches) == 100
