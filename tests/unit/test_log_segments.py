"""Segment files and rolls: names, sizes, record-time age, followers rolling where leaders did, and
time lookups."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from jetstream.errors import LogClosed
from jetstream.stream import format as fmt
from jetstream.stream.index import OffsetIndex, TimeIndex
from jetstream.stream.log import Log
from jetstream.stream.segment import log_file_name
from tests.unit.log_helpers import (
    T0,
    Clock,
    append_n,
    assert_dense,
    batch_size,
    log_files,
    make,
    read_all,
    value,
)

# -- segment files and rolling -------------------------------------------------------------------


def test_empty_log(tmp_path: Path, clock: Clock) -> None:
    with make(tmp_path, clock) as log:
        assert (log.log_start_offset, log.log_end_offset) == (0, 0)
        assert log.segment_base_offsets == [0]
        assert log.read_records(0) == []
        assert log.offset_for_timestamp(0) == 0
        assert log.size_bytes == 0
        assert log.latest_epoch == -1
        assert log_files(tmp_path) == [f"{0:020d}.log"]


def test_segment_files_are_named_by_base_offset(tmp_path: Path, clock: Clock) -> None:
    log = make(tmp_path, clock, segment_bytes_max=4096)
    append_n(log, 30, size=400)  # 475-byte batches: 8 to a segment
    assert log.segment_base_offsets == [0, 8, 16, 24]
    names = sorted(p.name for p in tmp_path.iterdir())
    for base in (0, 8, 16):  # sealed: the log and both indexes
        for suffix in (".log", ".index", ".timeindex"):
            assert f"{base:020d}{suffix}" in names
    assert f"{24:020d}.log" in names
    for name in names:
        assert re.fullmatch(r"\d{20}\.(log|index|timeindex)|[a-z-]+-checkpoint|\.lock", name), name
    log.close()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert f"{24:020d}.index" in names and f"{24:020d}.timeindex" in names
    for base in (0, 8, 16, 24):
        offsets = OffsetIndex.from_bytes((tmp_path / f"{base:020d}.index").read_bytes())
        times = TimeIndex.from_bytes((tmp_path / f"{base:020d}.timeindex").read_bytes())
        assert offsets is not None and offsets.lookup(0) == (0, 0)
        assert times is not None and len(times) >= 1
        assert (tmp_path / f"{base:020d}.log").stat().st_size == (6 if base == 24 else 8) * 475


def test_roll_at_segment_bytes_max(tmp_path: Path, clock: Clock) -> None:
    rng = random.Random(7)
    sizes = [rng.randrange(1, 1500) for _ in range(120)]
    with make(tmp_path, clock, segment_bytes_max=4096) as log:
        for i, size in enumerate(sizes):
            log.append([fmt.Record(value(i, size))], 0)
        bases = log.segment_base_offsets
        assert len(bases) > 10
        ends = [*bases[1:], log.log_end_offset]
        for base, end in zip(bases, ends, strict=True):
            segment_size = sum(batch_size(s) for s in sizes[base:end])
            assert (tmp_path / f"{base:020d}.log").stat().st_size == segment_size
            assert segment_size <= 4096
            if end < len(sizes):  # it rolled because the next batch did not fit
                assert segment_size + batch_size(sizes[end]) > 4096
        assert_dense(read_all(log), 0, 120, size=None)


def test_segment_snapshot_lists_every_segment_with_its_size(tmp_path: Path,
                                                             clock: Clock) -> None:
    log = make(tmp_path, clock, segment_bytes_max=4096, retention_bytes=8000)
    append_n(log, 30, size=400)  # 475-byte batches: 8 to a segment
    snapshot = log.segment_snapshot()
    assert snapshot.segments == ((0, 8 * 475), (8, 8 * 475), (16, 8 * 475), (24, 6 * 475))
    assert (snapshot.log_start_offset, snapshot.log_end_offset) == (0, 30)
    for base, size in snapshot.segments:
        assert (tmp_path / log_file_name(base)).stat().st_size == size
    log.apply_retention()
    snapshot = log.segment_snapshot()
    assert snapshot.segments[0][0] == snapshot.log_start_offset == log.log_start_offset > 0
    assert snapshot.segments[-1] == (24, 6 * 475)
    log.close()
    with pytest.raises(LogClosed):
        log.segment_snapshot()


def test_a_batch_larger_than_a_segment_gets_its_own(tmp_path: Path, clock: Clock) -> None:
    with make(tmp_path, clock, segment_bytes_max=4096) as log:
        append_n(log, 2)
        log.append([fmt.Record(value(2, 6000))], 0)
        append_n(log, 2)
        assert log.segment_base_offsets == [0, 2, 3]
        assert [r.value for r in read_all(log)][2] == value(2, 6000)


def test_roll_at_segment_ms_max(tmp_path: Path, clock: Clock) -> None:
    log = make(tmp_path, clock, segment_ms_max=1000)
    append_n(log, 1)
    clock.now += 999
    append_n(log, 1)
    assert log.segment_base_offsets == [0]
    clock.now += 1
    append_n(log, 1)
    assert log.segment_base_offsets == [0, 2]
    clock.now += 500
    append_n(log, 1)
    log.close()
    # The age of the active segment's first record survives a reopen.
    log = make(tmp_path, clock, segment_ms_max=1000)
    clock.now += 499
    append_n(log, 1)
    assert log.segment_base_offsets == [0, 2]
    clock.now += 1
    append_n(log, 1)
    assert log.segment_base_offsets == [0, 2, 5]
    assert_dense(read_all(log), 0, 6)
    log.close()


def test_old_timestamps_do_not_roll_every_batch(tmp_path: Path, clock: Clock) -> None:
    # Replaying data stamped a month ago must not give each batch a segment of its own.
    day = 24 * 3600 * 1000
    with make(tmp_path, clock, segment_ms_max=day) as log:
        for i in range(20):
            log.append([fmt.Record(value(i), timestamp_ms=T0 - 30 * day + i)], 0)
        assert log.segment_base_offsets == [0]
        # A day's worth of record time within the segment does roll it.
        log.append([fmt.Record(value(20), timestamp_ms=T0 - 29 * day)], 0)
        assert log.segment_base_offsets == [0, 20]


def follow(leader: Log, follower: Log, max_bytes: int) -> None:
    offset = follower.log_end_offset
    while offset < leader.log_end_offset:
        data, offset = leader.read_bytes(offset, max_bytes)
        follower.append_batches(data)


@pytest.mark.parametrize("fetch_bytes", [1, 3000, 20_000, 1 << 20])
def test_follower_segments_match_the_leader(tmp_path: Path, clock: Clock,
                                           fetch_bytes: int) -> None:
    rng = random.Random(fetch_bytes)
    leader = make(tmp_path / "leader", clock, segment_bytes_max=4096, segment_ms_max=60_000)
    follower = make(tmp_path / "follower", clock, segment_bytes_max=4096, segment_ms_max=60_000)
    for i in range(150):
        clock.now += rng.randrange(0, 3000)
        leader.append([fmt.Record(value(i, rng.randrange(1, 900)))], i // 50)
        if rng.random() < 0.1:
            follow(leader, follower, fetch_bytes)
    # The follower replays the leader's data later, on a clock far ahead.
    clock.now += 10 * 24 * 3600 * 1000
    follow(leader, follower, fetch_bytes)
    assert follower.segment_base_offsets == leader.segment_base_offsets
    for base in leader.segment_base_offsets:
        name = f"{base:020d}.log"
        assert (tmp_path / "follower" / name).read_bytes() == (
            tmp_path / "leader" / name).read_bytes()
    assert follower.epochs.entries == leader.epochs.entries
    leader.close()
    follower.close()


# -- time lookups ------------------------------------------------------------------------------


def test_offset_for_timestamp(tmp_path: Path, clock: Clock) -> None:
    rng = random.Random(11)
    stamps: list[int] = []
    log = make(tmp_path, clock, segment_bytes_max=4096, index_interval_bytes=200,
               retention_messages=150)
    for _ in range(80):
        clock.now += rng.randrange(0, 50)
        count = rng.randrange(1, 4)
        # Explicit timestamps may go backwards inside a batch and between batches.
        batch = [fmt.Record(value(0), timestamp_ms=None if rng.random() < 0.5
                            else clock.now - rng.randrange(0, 200)) for _ in range(count)]
        log.append(batch, 0)
        stamps.extend(clock.now if r.timestamp_ms is None else r.timestamp_ms for r in batch)
    assert len(log.segment_base_offsets) > 3

    def check() -> None:
        start, leo = log.log_start_offset, log.log_end_offset
        for target in range(T0 - 300, clock.now + 20, 7):
            expected = next((o for o in range(start, leo) if stamps[o] >= target), leo)
            assert log.offset_for_timestamp(target) == expected, target

    check()
    log.close()
    log = make(tmp_path, clock, segment_bytes_max=4096, index_interval_bytes=200,
               retention_messages=150)
    assert log.recovery.scanned_segments == 0
    check()
    log.close()
    for index in tmp_path.glob("*.timeindex"):
        index.unlink()
    log = make(tmp_path, clock, segment_bytes_max=4096, index_interval_bytes=200,
               retention_messages=100)
    assert log.recovery.scanned_segments == len(log.segment_base_offsets)
    check()
    assert log.apply_retention()
    check()
    log.truncate_to(log.log_end_offset - 7)
    check()
    log.close()
