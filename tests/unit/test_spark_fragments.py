"""Spark tasks reading fragments straight from the store (jetstream.spark.fragment_reader)
and their planning (jetstream.spark.store_planning.fragment_tasks), on a real log offloaded
to a real `file://` store: the rows equal the log's as the source's decoder reads them, from
segment and from Parquet fragments, cut to any range and timestamp bounds; a corrupt
fragment is CORRUPT_FRAGMENT naming its URL; a fragment gone since planning (or an
unreachable store under readFrom auto) hands the rest to the leader."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from jetstream.errors import CorruptFragment, FragmentStoreUnavailable
from jetstream.spark import arrow_decode
from jetstream.spark.fragment_reader import FragmentGone, FragmentSplit, read_fragments
from jetstream.spark.store_planning import PartitionFragments, fragment_tasks
from jetstream.stream.log import Log
from jetstream.tiered import parquet
from jetstream.tiered.index import Coverage, StoredFragment
from jetstream.tiered.names import Compression, FragmentKind
from jetstream.tiered.settings import FragmentFormat
from jetstream.tiered.store import FragmentStore
from tests.unit.log_helpers import Clock, make
from tests.unit.test_tiered_parquet import (
    PARTITION,
    STREAM,
    by_kind,
    mixed_records,
    new_tier,
    run_passes,
)

COLUMNS = parquet.COLUMNS
COUNT = 600


@pytest.fixture
def offloaded(tmp_path: Path) -> tuple[str, list[StoredFragment], list[StoredFragment], pa.Table]:
    """A store holding both kinds of fragment of a log, and the log's rows."""
    log: Log = make(tmp_path / "log", Clock(), segment_bytes_max=8192)
    try:
        mixed_records(log, COUNT)
        url = f"file://{tmp_path / 'store'}"
        tier = new_tier(url, tmp_path, FragmentFormat.BOTH, compression=Compression.ZSTD)
        run_passes(tier, log)
        data, offset = b"", 0
        while offset < log.log_end_offset:
            piece, offset = log.read_bytes(offset, 1 << 20, upper_bound=log.log_end_offset)
            data += piece
        rows = pa.Table.from_batches([arrow_decode.decode(
            data, stream=STREAM, partition=PARTITION, columns=COLUMNS, start=0,
            end=log.log_end_offset).batch])
        assert rows.num_rows == COUNT
    finally:
        log.close()
    segments = sorted(by_kind(tier, FragmentKind.SEGMENT), key=lambda f: f.begin)
    parquets = sorted(by_kind(tier, FragmentKind.PARQUET), key=lambda f: f.begin)
    assert len(segments) >= 5 and len(parquets) == len(segments)
    return url, segments, parquets, rows


def read(split: FragmentSplit, low_ms: int | None = None, high_ms: int | None = None
         ) -> pa.Table:
    batches = read_fragments(split, COLUMNS, timestamp_min_ms=low_ms, timestamp_max_ms=high_ms)
    return pa.Table.from_batches(list(batches),
                                 schema=arrow_decode.arrow_schema(COLUMNS))


def wanted(rows: pa.Table, start: int, end: int) -> list[dict[str, Any]]:
    return [r for r in rows.to_pylist() if start <= r["offset"] < end]


@pytest.mark.parametrize("kind", [FragmentKind.SEGMENT, FragmentKind.PARQUET])
def test_fragments_read_straight_from_the_store_equal_the_log(
        offloaded: tuple[str, list[StoredFragment], list[StoredFragment], pa.Table],
        kind: FragmentKind) -> None:
    url, segments, parquets, rows = offloaded
    fragments = segments if kind is FragmentKind.SEGMENT else parquets
    end = fragments[-1].end
    whole = FragmentSplit(STREAM, PARTITION, 0, end, url, tuple(f.name for f in fragments))
    assert read(whole).to_pylist() == wanted(rows, 0, end)
    # A range starting and ending inside fragments.
    start, stop = fragments[1].begin + 3, fragments[3].end - 2
    names = tuple(f.name for f in fragments[1:4])
    assert read(FragmentSplit(STREAM, PARTITION, start, stop, url, names)).to_pylist() == \
        wanted(rows, start, stop)
    # Timestamp bounds (inclusive), as the source applies them.
    stamps = [int(r["timestamp"].timestamp() * 1000) for r in wanted(rows, 0, end)]
    low, high = stamps[40], stamps[90]
    got = read(whole, low, high).to_pylist()
    assert [r["offset"] for r in got] == list(range(40, 91))


def test_a_corrupt_fragment_is_an_error_naming_it(
        offloaded: tuple[str, list[StoredFragment], list[StoredFragment], pa.Table]) -> None:
    url, segments, _parquets, _rows = offloaded
    store = FragmentStore(url)
    victim = segments[1]
    store.put(store.key(victim.name), b"\x28\xb5\x2f\xfd" + b"garbage" * 10)
    split = FragmentSplit(STREAM, PARTITION, 0, segments[2].end, url,
                          tuple(f.name for f in segments[:3]))
    with pytest.raises(CorruptFragment) as caught:
        read(split)
    assert caught.value.code == "CORRUPT_FRAGMENT" and store.url_of(victim.name) in str(
        caught.value)


def test_a_gone_fragment_or_unreachable_store_hands_the_rest_to_the_leader(
        offloaded: tuple[str, list[StoredFragment], list[StoredFragment], pa.Table],
        tmp_path: Path) -> None:
    url, segments, _parquets, rows = offloaded
    store = FragmentStore(url)
    store.delete([store.key(segments[2].name)])
    split = FragmentSplit(STREAM, PARTITION, 0, segments[3].end, url,
                          tuple(f.name for f in segments[:4]))
    got: list[pa.RecordBatch] = []
    with pytest.raises(FragmentGone) as caught:
        got.extend(read_fragments(split, COLUMNS))
    assert caught.value.offset == segments[2].begin  # everything before it was read
    assert sum(b.num_rows for b in got) == len(wanted(rows, 0, segments[2].begin))
    blocker = tmp_path / "not-a-dir"
    blocker.write_bytes(b"")
    names = (segments[0].name,)
    unreachable = FragmentSplit(STREAM, PARTITION, 0, 5, f"file://{blocker}/x", names,
                                fall_back=True)
    with pytest.raises(FragmentGone):
        read(unreachable)
    with pytest.raises(FragmentStoreUnavailable):
        read(FragmentSplit(STREAM, PARTITION, 0, 5, f"file://{blocker}/x", names,
                           fall_back=False))


def test_fragment_tasks_follow_the_chain_of_fragments(
        offloaded: tuple[str, list[StoredFragment], list[StoredFragment], pa.Table]) -> None:
    url, segments, _parquets, _rows = offloaded
    # An overlapping fragment (another leader's cut) and a gap after the fourth.
    first, second = segments[0], segments[1]
    overlap = StoredFragment(type(first.name)(first.begin + 2, second.end, STREAM, PARTITION,
                                              0, first.name.sha256, Compression.NONE), 1, 0)
    listed = [first, overlap, *segments[1:4], *segments[5:]]
    found = PartitionFragments(Coverage(listed), {}, url)
    key = (STREAM, PARTITION)
    tasks, stop = fragment_tasks(key, 1, segments[-1].end, found, split_records=10**9,
                                 fall_back=True)
    assert stop == segments[3].end  # the gap ends the chain: the rest is Fetched
    assert [(t.start, t.end) for t in tasks] == [(1, stop)]
    split = tasks[0].fragments
    assert split is not None and split.store == url and split.fragments[0].begin <= 1
    # Cut where fragments end, at most split_records offsets each.
    small, _ = fragment_tasks(key, 0, stop, found, split_records=1, fall_back=False)
    assert all(t.files is None and t.fragments is not None and not t.fragments.fall_back
               for t in small)
    assert small[0].start == 0 and small[-1].end == stop
    assert all(a.end == b.start for a, b in itertools.pairwise(small))
    nothing, at = fragment_tasks(key, segments[4].begin, segments[4].end, found,
                                 split_records=10, fall_back=True)
    assert nothing == [] and at == segments[4].begin
