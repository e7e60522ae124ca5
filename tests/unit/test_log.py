"""Behaviour of the commit log: segment files and rolls, bounded reads (bytes and as records),
time lookups, truncation, durability policies and group commit, recovery, retention, limits,
the descriptor pool, locking and a full disk."""

from __future__ import annotations

import errno
import json
import os
import random
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from jetstream.errors import (
    BatchTooLarge,
    CorruptRecord,
    InvalidBatch,
    InvalidConfig,
    LogClosed,
    OffsetOutOfRange,
    RecordTooLarge,
    StaleLeaderEpoch,
    StorageError,
)
from jetstream.stream import format as fmt
from jetstream.stream.config import FsyncPolicy, LogConfig
from jetstream.stream.handles import HandlePool
from jetstream.stream.index import OffsetIndex, TimeIndex
from jetstream.stream.log import RECOVERY_POINT_FILE, Log
from jetstream.stream.segment import Segment

REPO = Path(__file__).resolve().parents[2]
T0 = 1_700_000_000_000


class Clock:
    def __init__(self, now: int = T0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def make(directory: Path, clock: Clock, pool: HandlePool | None = None,
         **config: object) -> Log:
    return Log(directory, LogConfig(**config), pool=pool or HandlePool(64), clock=clock)


def value(offset: int, size: int = 100) -> bytes:
    """A value that says which offset it was appended at."""
    head = f"{offset:010d}|".encode()
    return (head * (size // len(head) + 1))[:size]


def batch_size(*value_sizes: int) -> int:
    return fmt.BATCH_HEADER.size + sum(fmt.RECORD_HEADER.size + n for n in value_sizes)


def append_n(log: Log, count: int, size: int = 100, per_batch: int = 1,
             epoch: int = 0) -> None:
    for _ in range(count):
        base = log.log_end_offset
        log.append([fmt.Record(value(base + i, size)) for i in range(per_batch)], epoch)


def read_all(log: Log, start: int | None = None,
             upper_bound: int | None = None) -> list[fmt.StoredRecord]:
    offset = log.log_start_offset if start is None else start
    end = log.log_end_offset if upper_bound is None else min(upper_bound, log.log_end_offset)
    out: list[fmt.StoredRecord] = []
    while offset < end:
        records = log.read_records(offset, 5000, upper_bound)
        if not records:
            break
        assert records[0].offset == offset
        out.extend(records)
        offset = records[-1].offset + 1
    return out


def assert_dense(records: list[fmt.StoredRecord], start: int, end: int,
                 size: int | None = 100) -> None:
    assert [r.offset for r in records] == list(range(start, end))
    if size is not None:
        assert [r.value for r in records] == [value(o, size) for o in range(start, end)]


def crash(log: Log) -> None:
    """Drop a log without closing it, as a killed process would: nothing is sealed, no
    recovery point is written; its descriptors and lock go away."""
    for segment in log._segments:
        segment.close()
    log._release_lock()
    log._closed = True


def log_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.suffix == ".log")


class FsyncSpy:
    """Counts os.fsync calls by the base name of the file they flushed."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.paths: list[str] = []
        self._real = os.fsync
        monkeypatch.setattr(os, "fsync", self)

    def __call__(self, fd: int) -> None:
        self.paths.append(os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
        self._real(fd)

    def of_logs(self) -> list[str]:
        return [p for p in self.paths if p.endswith(".log")]

    def clear(self) -> None:
        self.paths.clear()


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


# -- reads -------------------------------------------------------------------------------------


@pytest.fixture
def batched(tmp_path: Path, clock: Clock) -> Iterator[tuple[Log, list[tuple[int, int, int]]]]:
    """One segment of batches of 1 to 4 records; yields the log and (base, last, size) of each
    batch."""
    rng = random.Random(3)
    log = make(tmp_path, clock, segment_bytes_max=1 << 20, index_interval_bytes=300)
    layout = []
    for _ in range(25):
        base = log.log_end_offset
        count = rng.randrange(1, 5)
        info = log.append([fmt.Record(value(base + i)) for i in range(count)], 0)
        layout.append((info.base_offset, info.last_offset, info.size_bytes))
        clock.now += 10
    yield log, layout
    log.close()


def expected_span(layout: list[tuple[int, int, int]], offset: int, max_bytes: int,
                  bound: int) -> tuple[int, int, int]:
    """(first offset, next offset, length) of a read, from the batch layout."""
    k = next(i for i, (_b, last, _s) in enumerate(layout) if last >= offset)
    base, last, size = layout[k]
    if last >= bound:
        return offset, offset, 0
    total, next_offset = size, last + 1
    for _b_base, b_last, b_size in layout[k + 1:]:
        if b_last >= bound or total + b_size > max_bytes:
            break
        total, next_offset = total + b_size, b_last + 1
    return base, next_offset, total


def test_reads_follow_max_bytes_and_the_bound(
    batched: tuple[Log, list[tuple[int, int, int]]]
) -> None:
    log, layout = batched
    leo = log.log_end_offset
    bounds = sorted({leo, leo - 1, leo // 2, layout[3][0], layout[3][0] + 1, 1, 0})
    checked = 0
    for bound in bounds:
        for offset in range(bound):
            for max_bytes in (0, 1, 300, 700, 1500, 10_000):
                first, next_offset, length = expected_span(layout, offset, max_bytes, bound)
                with log.read(offset, max_bytes, upper_bound=bound) as piece:
                    assert (piece.first_offset, piece.next_offset, piece.length) == (
                        first, next_offset, length), (offset, max_bytes, bound)
                    data = piece.read()
                records = fmt.decode_batches(data, min_offset=offset)
                assert_dense(records, offset, next_offset if length else offset)
                assert all(r.offset < bound for r in records)
                assert log.read_records(offset, max_bytes, bound) == records
                checked += 1
    assert checked > 1000


def test_a_read_returns_at_least_one_whole_batch(
    batched: tuple[Log, list[tuple[int, int, int]]]
) -> None:
    log, layout = batched
    for base, last, size in layout:
        for offset in range(base, last + 1):
            piece = log.read(offset, 1)
            assert (piece.first_offset, piece.next_offset, piece.length) == (base, last + 1, size)
            assert fmt.parse_header(piece.read()).base_offset == base
            piece.close()
            assert piece.fd == -1


def test_reads_at_the_bound_are_empty_and_past_it_out_of_range(
    batched: tuple[Log, list[tuple[int, int, int]]]
) -> None:
    log, layout = batched
    leo = log.log_end_offset
    hw = layout[10][0]
    for offset, bound in ((leo, None), (hw, hw), (0, 0)):
        piece = log.read(offset, 1000, bound)
        assert (piece.length, piece.first_offset, piece.next_offset) == (0, offset, offset)
        assert piece.read() == b""
        piece.close()
        assert log.read_records(offset, 1000, bound) == []
    # A bound inside a batch: that batch is not returned at all.
    inside = layout[10][0] + 1 if layout[10][1] > layout[10][0] else layout[11][0] + 1
    records = read_all(log, upper_bound=inside)
    assert records and all(r.offset < inside for r in records)
    # A bound past the log end is the log end.
    assert_dense(read_all(log, upper_bound=leo + 100), 0, leo)
    for offset, bound, newest in ((leo + 1, None, leo), (hw + 1, hw, hw), (leo + 5, leo + 9, leo)):
        with pytest.raises(OffsetOutOfRange) as err:
            log.read(offset, 1000, bound)
        assert (err.value.offset, err.value.oldest, err.value.newest) == (offset, 0, newest)
        assert err.value.code == "OFFSET_OUT_OF_RANGE"
    with pytest.raises(OffsetOutOfRange):
        log.read_records(-1)


def test_reads_stop_at_the_end_of_a_segment(tmp_path: Path, clock: Clock) -> None:
    with make(tmp_path, clock, segment_bytes_max=4096) as log:
        append_n(log, 40, size=400)
        bases = log.segment_base_offsets
        piece = log.read(0, 1 << 20)
        assert (piece.first_offset, piece.next_offset) == (0, bases[1])
        piece.close()
        offset, reads = 0, 0
        while offset < log.log_end_offset:
            with log.read(offset, 1 << 20) as piece:
                assert piece.first_offset == offset and piece.next_offset in [*bases, 40]
                offset = piece.next_offset
            reads += 1
        assert reads == len(bases)
        assert_dense(read_all(log), 0, 40, size=400)


def test_read_slice_works_with_sendfile(tmp_path: Path, clock: Clock) -> None:
    with make(tmp_path, clock, segment_bytes_max=8192, retention_messages=1) as log:
        append_n(log, 100, per_batch=2)
        assert len(log.segment_base_offsets) > 2
        piece = log.read(5, 3000)
        assert piece.position > 0 and piece.length > 0
        # The segment goes away (retention); the slice owns a descriptor and stays readable.
        assert log.apply_retention() and log.log_start_offset > piece.next_offset
        a, b = socket.socketpair()
        try:
            sent = 0
            while sent < piece.length:
                sent += os.sendfile(a.fileno(), piece.fd, piece.position + sent,
                                    piece.length - sent)
            received = b""
            while len(received) < piece.length:
                received += b.recv(65536)
        finally:
            a.close()
            b.close()
            piece.close()
        records = fmt.decode_batches(received, min_offset=5)
        assert records[0].offset == 5
        assert_dense(records, 5, piece.next_offset)


def test_read_records_returns_all_fields(tmp_path: Path, clock: Clock) -> None:
    with make(tmp_path, clock) as log:
        records = [
            fmt.Record(b"v1", key=b"k1", headers={"h": b"x", "ü": b""}, subject="orders.eu"),
            fmt.Record(b"", key=None, subject="", timestamp_ms=T0 - 5),
            fmt.Record(b"v3", key=b""),
        ]
        log.append(records, 4)
        got = log.read_records(0)
        assert [(r.offset, r.value, r.key, dict(r.headers), r.subject, r.timestamp_ms,
                 r.leader_epoch) for r in got] == [
            (0, b"v1", b"k1", {"h": b"x", "ü": b""}, "orders.eu", T0, 4),
            (1, b"", None, {}, "", T0 - 5, 4),
            (2, b"v3", b"", {}, "", T0, 4),
        ]
        assert log.read_records(1) == got[1:]


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


# -- truncation --------------------------------------------------------------------------------


@pytest.fixture
def segmented(tmp_path: Path, clock: Clock) -> Iterator[Log]:
    """120 offsets in 40 batches of 3, over several segments, epochs 0, 1, 2."""
    log = make(tmp_path, clock, segment_bytes_max=4096)
    for i in range(40):
        clock.now += 1
        append_n(log, 1, per_batch=3, epoch=i // 15)
    assert len(log.segment_base_offsets) >= 4
    yield log
    log.close()


def truncation_points(log: Log) -> list[int]:
    bases = log.segment_base_offsets
    return sorted({0, 1, 2, 3, 4, bases[1], bases[1] + 1, bases[1] - 1, bases[2], 60, 61,
                   bases[-1], bases[-1] + 1, 118, 119, 120, 121})


@pytest.mark.parametrize("point", range(17))
def test_truncate_to(tmp_path: Path, clock: Clock, segmented: Log, point: int) -> None:
    log = segmented
    bases_before = log.segment_base_offsets
    offset = truncation_points(log)[point]
    stamps = {r.offset: r.timestamp_ms for r in read_all(log)}
    log.truncate_to(offset)
    end = min(offset, 120)
    assert log.log_end_offset == end
    assert log.durable_offset == end
    assert log.log_start_offset == 0
    kept = [b for b in bases_before if b < end] or [0]
    assert log.segment_base_offsets == kept
    assert log_files(tmp_path) == [f"{b:020d}.log" for b in kept]
    records = read_all(log)
    assert_dense(records, 0, end)
    # A batch cut in two keeps the epoch and timestamps of its remaining records.
    assert all(r.timestamp_ms == stamps[r.offset] for r in records)
    assert all(r.leader_epoch == r.offset // 3 // 15 for r in records)
    entries = [(e.epoch, e.start_offset) for e in log.epochs.entries]
    assert entries == [(e, s) for e, s in ((0, 0), (1, 45), (2, 90)) if s < end]
    # Appends continue at the new end with new values; a reopen keeps all of it.
    log.append([fmt.Record(value(end))], 3)
    log.close()
    log = make(tmp_path, clock, segment_bytes_max=4096)
    assert_dense(read_all(log), 0, end + 1)
    log.close()


def test_truncation_makes_deleted_segments_durable(tmp_path: Path, clock: Clock,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    log = make(tmp_path, clock, segment_bytes_max=4096)
    append_n(log, 30, size=400)
    bases = log.segment_base_offsets
    assert len(bases) == 4
    events: list[str] = []
    real_fsync, real_unlink = os.fsync, Path.unlink

    def fsync(fd: int) -> None:
        events.append("fsync " + os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def unlink(path: Path, missing_ok: bool = False) -> None:
        events.append("unlink " + path.name)
        real_unlink(path, missing_ok=missing_ok)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(Path, "unlink", unlink)
    # At a segment boundary: the segment before it is not cut, so nothing but the directory
    # records that the later ones are gone.
    log.truncate_to(bases[2])
    last_unlink = max(i for i, e in enumerate(events) if e.startswith("unlink"))
    assert f"unlink {bases[3]:020d}.log" in events
    assert f"fsync {tmp_path.name}" in events[last_unlink:]
    log.close()


def test_truncate_below_the_log_start_is_refused(segmented: Log) -> None:
    log = segmented
    log.truncate_fully_and_start_at(500)
    append_n(log, 3)
    with pytest.raises(OffsetOutOfRange) as err:
        log.truncate_to(499)
    assert (err.value.offset, err.value.oldest, err.value.newest) == (499, 500, 503)
    assert log.log_end_offset == 503


def test_truncate_fully_and_start_at(tmp_path: Path, clock: Clock, segmented: Log) -> None:
    log = segmented
    log.write_high_watermark(100)
    log.truncate_fully_and_start_at(1000)
    assert (log.log_start_offset, log.log_end_offset, log.durable_offset) == (1000, 1000, 1000)
    assert log.segment_base_offsets == [1000]
    assert log_files(tmp_path) == [f"{1000:020d}.log"]
    assert not list(tmp_path.glob(f"{0:020d}.*"))
    assert log.read_records(1000) == []
    assert log.epochs.entries == []
    with pytest.raises(OffsetOutOfRange):
        log.read(999, 100)
    info = log.append([fmt.Record(value(1000))], 5)
    assert (info.base_offset, info.last_offset, info.log_end_offset) == (1000, 1000, 1001)
    log.close()
    log = make(tmp_path, clock, segment_bytes_max=4096)
    assert (log.log_start_offset, log.log_end_offset) == (1000, 1001)
    assert_dense(read_all(log), 1000, 1001)
    assert log.read_high_watermark() == 1000  # 100 is clamped into the new log
    log.close()


# -- close and reopen --------------------------------------------------------------------------


def test_close_and_reopen_keep_everything(tmp_path: Path, clock: Clock,
                                          segmented: Log) -> None:
    log = segmented
    before = read_all(log)
    state = (log.log_start_offset, log.log_end_offset, log.segment_base_offsets,
             log.epochs.entries, log.size_bytes)
    log.write_high_watermark(77)
    log.close()
    log.close()  # idempotent
    for call in (lambda: log.append([fmt.Record(b"x")], 5), lambda: log.read(0, 10),
                 lambda: log.read_records(0), lambda: log.truncate_to(3),
                 lambda: log.offset_for_timestamp(0),
                 lambda: log.append_batches(fmt.encode_batch(120, 5, [fmt.Record(b"x")], 1))):
        with pytest.raises(LogClosed) as err:
            call()
        assert err.value.code == "LOG_CLOSED"
    log = make(tmp_path, clock, segment_bytes_max=4096)
    # A clean close makes every segment trusted: nothing is scanned at open.
    assert (log.recovery.scanned_segments, log.recovery.truncated_bytes,
            log.recovery.dropped_segments) == (0, 0, 0)
    assert (log.log_start_offset, log.log_end_offset, log.segment_base_offsets,
            log.epochs.entries, log.size_bytes) == state
    assert read_all(log) == before
    assert log.read_high_watermark() == 77
    assert log.durable_offset == log.log_end_offset
    log.close()


def test_reopen_after_a_crash_scans_only_past_the_recovery_point(
    tmp_path: Path, clock: Clock, segmented: Log
) -> None:
    log = segmented
    before = read_all(log)
    crash(log)
    log = make(tmp_path, clock, segment_bytes_max=4096)
    assert log.recovery.scanned_segments == 1  # the active segment
    assert log.recovery.truncated_bytes == 0
    assert read_all(log) == before
    log.close()


def test_a_second_log_on_the_same_directory_is_refused(tmp_path: Path, clock: Clock) -> None:
    log = make(tmp_path, clock)
    append_n(log, 2)
    with pytest.raises(StorageError) as err:
        make(tmp_path, clock)
    assert err.value.code == "STORAGE_ERROR"
    assert_dense(read_all(log), 0, 2)
    log.close()
    with make(tmp_path, clock) as again:
        assert again.log_end_offset == 2


def test_a_second_log_in_another_process_is_refused(tmp_path: Path, clock: Clock) -> None:
    script = (
        "import sys\n"
        "from jetstream.errors import StorageError\n"
        "from jetstream.stream.log import Log\n"
        "try:\n"
        "    Log(sys.argv[1])\n"
        "except StorageError as exc:\n"
        "    print(exc.code)\n"
    )
    with make(tmp_path, clock):
        out = subprocess.run([sys.executable, "-c", script, str(tmp_path)], cwd=REPO,
                             capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "STORAGE_ERROR"


@pytest.mark.parametrize("stray", ["notes.index", "backup.timeindex", "3.log", "7.index",
                                   f"{0:020d}.index.bak", f"{9:020d}.log.old", "README"])
def test_stray_files_are_left_alone(tmp_path: Path, clock: Clock, stray: str) -> None:
    with make(tmp_path, clock) as log:
        append_n(log, 3)
    (tmp_path / stray).write_bytes(b"not a segment")
    with make(tmp_path, clock) as log:
        assert (log.log_end_offset, log.segment_base_offsets) == (3, [0])
        assert_dense(read_all(log), 0, 3)
    assert (tmp_path / stray).read_bytes() == b"not a segment"


def test_index_files_without_a_segment_are_removed(tmp_path: Path, clock: Clock) -> None:
    with make(tmp_path, clock) as log:
        append_n(log, 3)
    for suffix in (".index", ".timeindex"):
        (tmp_path / f"{50:020d}{suffix}").write_bytes(b"")
    with make(tmp_path, clock) as log:
        assert log.segment_base_offsets == [0]
    assert not list(tmp_path.glob(f"{50:020d}.*"))


def test_delete_removes_the_directory(tmp_path: Path, clock: Clock) -> None:
    log = make(tmp_path / "p0", clock)
    append_n(log, 3)
    log.delete()
    assert not (tmp_path / "p0").exists()
    with pytest.raises(LogClosed):
        log.append([fmt.Record(b"x")], 0)


# -- durability --------------------------------------------------------------------------------


def test_fsync_always(tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    log = make(tmp_path, clock, segment_bytes_max=4096, fsync=FsyncPolicy.ALWAYS)
    spy = FsyncSpy(monkeypatch)
    for i in range(30):
        spy.clear()
        info = log.append([fmt.Record(value(i, 400))], 0)
        assert log.durable_offset >= info.log_end_offset == log.log_end_offset
        assert f"{log.segment_base_offsets[-1]:020d}.log" in spy.of_logs()
    # A caller that syncs itself: nothing is flushed until it asks.
    spy.clear()
    info = log.append([fmt.Record(value(30, 400))], 0, sync=False)
    assert spy.of_logs() == [] and log.durable_offset < info.log_end_offset
    log.sync_through(info.log_end_offset)
    assert spy.of_logs() and log.durable_offset >= info.log_end_offset
    # Already durable: no fsync.
    spy.clear()
    log.sync_through(info.log_end_offset)
    assert spy.paths == []
    log.close()


def test_fsync_interval(tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    log = make(tmp_path, clock, fsync=FsyncPolicy.INTERVAL, fsync_interval_ms=1000)
    spy = FsyncSpy(monkeypatch)
    append_n(log, 1)
    clock.now += 999
    append_n(log, 1)
    log.maybe_sync()
    assert spy.of_logs() == [] and log.durable_offset == 0
    clock.now += 1
    append_n(log, 1)
    assert spy.of_logs() == [f"{0:020d}.log"] and log.durable_offset == 3
    append_n(log, 1)
    assert log.durable_offset == 3
    clock.now += 1000
    log.maybe_sync()  # the shell's timer
    assert log.durable_offset == 4 and len(spy.of_logs()) == 2
    log.close()


def test_fsync_interval_without_sync_leaves_the_fsync_to_the_caller(
        tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    log = make(tmp_path, clock, fsync=FsyncPolicy.INTERVAL, fsync_interval_ms=1000)
    spy = FsyncSpy(monkeypatch)
    clock.now += 5000
    log.append([fmt.Record(b"x")], 0, sync=False)  # an event loop must not wait on the disk
    assert spy.of_logs() == [] and log.durable_offset == 0
    log.maybe_sync()  # the caller's timer, in a thread
    assert spy.of_logs() == [f"{0:020d}.log"] and log.durable_offset == 1
    log.close()


def test_fsync_interval_syncs_segments_when_they_roll(tmp_path: Path, clock: Clock,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    log = make(tmp_path, clock, fsync=FsyncPolicy.INTERVAL, segment_bytes_max=4096)
    spy = FsyncSpy(monkeypatch)
    append_n(log, 20, size=400)
    bases = log.segment_base_offsets
    assert len(bases) == 3
    assert sorted(set(spy.of_logs())) == [f"{b:020d}.log" for b in bases[:-1]]
    assert log.durable_offset == bases[-1]
    log.close()


def test_fsync_never(tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    log = make(tmp_path, clock, fsync=FsyncPolicy.NEVER, segment_bytes_max=4096)
    spy = FsyncSpy(monkeypatch)
    append_n(log, 40, size=400)
    log.truncate_to(35)
    assert len(log.segment_base_offsets) == 5
    # Checkpoints are always written atomically; segment files are left to the OS.
    assert [p for p in spy.paths if re.fullmatch(r"\d{20}\..*", p)] == []
    assert log.durable_offset == 0
    # A clean close flushes everything, so the next open can trust it.
    log.close()
    assert sorted(set(spy.of_logs())) == log_files(tmp_path)
    log = make(tmp_path, clock, fsync=FsyncPolicy.NEVER, segment_bytes_max=4096)
    assert log.recovery.scanned_segments == 0
    assert_dense(read_all(log), 0, 35, size=400)
    log.close()


def test_explicit_sync_with_policy_never_covers_rolled_segments(
    tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = make(tmp_path, clock, fsync=FsyncPolicy.NEVER, segment_bytes_max=4096)
    spy = FsyncSpy(monkeypatch)
    append_n(log, 30, size=400)
    assert len(log.segment_base_offsets) == 4
    log.sync_through(log.log_end_offset)
    # durable_offset promises every offset below it was fsynced: so every segment was.
    assert log.durable_offset == 30
    assert sorted(set(spy.of_logs())) == log_files(tmp_path)
    log.close()


def test_group_commit_shares_fsyncs(tmp_path: Path, clock: Clock,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    threads_count = 6
    log = make(tmp_path, clock, fsync=FsyncPolicy.ALWAYS)
    log_fsyncs: list[int] = []
    real_fsync = os.fsync
    waiting = threading.Semaphore(0)
    all_waiting = threading.Event()
    arrived = [0]
    arrived_lock = threading.Lock()

    def fsync(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".log"):
            log_fsyncs.append(fd)
            # Hold the first fsync until every appender has written and waits for one:
            # they must all be covered by at most one more.
            assert all_waiting.wait(30), "appenders did not all arrive"
        real_fsync(fd)

    real_sync_through = log.sync_through

    def sync_through(offset: int) -> None:
        with arrived_lock:
            arrived[0] += 1
            if arrived[0] == threads_count:
                all_waiting.set()
        real_sync_through(offset)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(log, "sync_through", sync_through)
    results: list[tuple[int, int]] = []
    errors: list[BaseException] = []

    def appender(i: int) -> None:
        try:
            info = log.append([fmt.Record(b"t%d" % i)], 0)
            results.append((info.log_end_offset, log.durable_offset))
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            waiting.release()

    workers = [threading.Thread(target=appender, args=(i,)) for i in range(threads_count)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    assert errors == []
    assert len(results) == threads_count
    # Every append returned only once durable.
    assert all(durable >= end for end, durable in results)
    assert sorted(end for end, _d in results) == list(range(1, threads_count + 1))
    assert 1 <= len(log_fsyncs) <= 2 < threads_count
    assert sorted(r.value for r in read_all(log)) == sorted(b"t%d" % i
                                                           for i in range(threads_count))
    log.close()


def test_concurrent_appenders(tmp_path: Path, clock: Clock,
                              monkeypatch: pytest.MonkeyPatch) -> None:
    log = make(tmp_path, clock, fsync=FsyncPolicy.ALWAYS, segment_bytes_max=8192)
    spy = FsyncSpy(monkeypatch)
    per_thread, threads_count = 40, 6
    seen: dict[int, list[tuple[int, int]]] = {i: [] for i in range(threads_count)}
    errors: list[BaseException] = []

    def appender(t: int) -> None:
        try:
            for i in range(per_thread):
                info = log.append([fmt.Record(b"%d:%d" % (t, i)) for _ in range(1 + i % 3)], 0)
                assert log.durable_offset >= info.log_end_offset
                seen[t].append((info.base_offset, info.last_offset))
        except BaseException as exc:
            errors.append(exc)

    workers = [threading.Thread(target=appender, args=(t,)) for t in range(threads_count)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    assert errors == []
    records = read_all(log)
    assert [r.offset for r in records] == list(range(log.log_end_offset))
    for t, spans in seen.items():
        bases = [b for b, _l in spans]
        assert bases == sorted(bases)  # each thread's appends are in its order
        for i, (base, last) in enumerate(spans):
            assert [r.value for r in records[base:last + 1]] == [b"%d:%d" % (t, i)] * (
                1 + i % 3)
    appends = per_thread * threads_count
    assert len(spy.of_logs()) <= appends
    log.close()


def test_fsync_racing_a_truncation(tmp_path: Path, clock: Clock,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A follower truncates while an fsync of the segment it deletes is running in a thread."""
    log = make(tmp_path, clock, fsync=FsyncPolicy.ALWAYS)
    append_n(log, 5)
    in_fsync, release = threading.Event(), threading.Event()
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".log"):
            in_fsync.set()
            assert release.wait(30)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    errors: list[BaseException] = []

    def appender() -> None:
        try:
            log.append([fmt.Record(value(5))], 0)
        except BaseException as exc:
            errors.append(exc)

    fd_count = len(os.listdir("/proc/self/fd"))
    worker = threading.Thread(target=appender)
    worker.start()
    assert in_fsync.wait(30)
    try:
        log.truncate_fully_and_start_at(100)
    finally:
        release.set()
        worker.join(30)
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert errors == []
    assert (log.log_start_offset, log.log_end_offset, log.durable_offset) == (100, 100, 100)
    log.append([fmt.Record(value(100))], 1)
    assert_dense(read_all(log), 100, 101)
    log.close()
    assert len(os.listdir("/proc/self/fd")) <= fd_count  # the deleted file's descriptor too


def test_fsync_racing_a_truncation_before_it_starts(tmp_path: Path, clock: Clock,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The segment an fsync is about to flush is deleted before the fsync opens it."""
    log = make(tmp_path, clock, fsync=FsyncPolicy.ALWAYS)
    append_n(log, 5)
    about_to_sync, release = threading.Event(), threading.Event()
    real_sync = Segment.sync

    def sync(segment: Segment) -> None:
        about_to_sync.set()
        assert release.wait(30)
        real_sync(segment)

    monkeypatch.setattr(Segment, "sync", sync)
    errors: list[BaseException] = []

    def appender() -> None:
        try:
            log.append([fmt.Record(value(5))], 0)
        except BaseException as exc:
            errors.append(exc)

    worker = threading.Thread(target=appender)
    worker.start()
    assert about_to_sync.wait(30)
    try:
        log.truncate_fully_and_start_at(100)
    finally:
        release.set()
        worker.join(30)
    assert errors == []
    # The truncation wins: the fsync that raced it claims nothing.
    assert (log.log_end_offset, log.durable_offset) == (100, 100)
    assert log_files(tmp_path) == [f"{100:020d}.log"]
    monkeypatch.setattr(Segment, "sync", real_sync)
    log.append([fmt.Record(value(100))], 1)
    assert log.durable_offset == 101
    log.close()


def test_a_failed_fsync_is_not_counted_durable(tmp_path: Path, clock: Clock,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    log = make(tmp_path, clock, fsync=FsyncPolicy.ALWAYS)
    append_n(log, 3)
    real_fsync = os.fsync

    def failing(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".log"):
            raise OSError(errno.EIO, "I/O error")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", failing)
    with pytest.raises(OSError):
        log.append([fmt.Record(value(3))], 0)
    assert log.log_end_offset == 4
    assert log.durable_offset == 3
    with pytest.raises(OSError):
        log.sync_through(4)
    assert log.durable_offset == 3
    monkeypatch.setattr(os, "fsync", real_fsync)
    log.sync_through(4)
    assert log.durable_offset == 4
    log.close()


# -- recovery ----------------------------------------------------------------------------------


def test_torn_tail_is_truncated(tmp_path: Path, clock: Clock) -> None:
    log = make(tmp_path, clock, segment_bytes_max=4096)
    append_n(log, 20, size=400)
    bases = log.segment_base_offsets
    crash(log)
    active = tmp_path / f"{bases[-1]:020d}.log"
    size = active.stat().st_size
    with open(active, "r+b") as f:
        f.truncate(size - 100)  # the last batch is cut short
    log = make(tmp_path, clock, segment_bytes_max=4096)
    assert log.recovery.truncated_bytes == batch_size(400) - 100
    assert log.recovery.scanned_segments == 1
    assert log.log_end_offset == 19
    assert active.stat().st_size == size - batch_size(400)
    assert_dense(read_all(log), 0, 19, size=400)
    info = log.append([fmt.Record(value(19, 400))], 0)
    assert info.base_offset == 19
    assert_dense(read_all(log), 0, 20, size=400)
    log.close()


@pytest.mark.parametrize("tail", [b"\x00" * 5000, b"\xff" * 30, b"x"])
def test_garbage_tail_is_truncated(tmp_path: Path, clock: Clock, tail: bytes) -> None:
    log = make(tmp_path, clock)
    append_n(log, 10)
    crash(log)
    with open(tmp_path / f"{0:020d}.log", "ab") as f:
        f.write(tail)
    log = make(tmp_path, clock)
    assert log.recovery.truncated_bytes == len(tail)
    assert_dense(read_all(log), 0, 10)
    log.close()


def test_a_torn_copy_of_a_valid_batch_is_not_taken(tmp_path: Path, clock: Clock) -> None:
    """A tail whose header is a valid batch header but whose body was never written."""
    log = make(tmp_path, clock)
    append_n(log, 3)
    crash(log)
    good = fmt.encode_batch(3, 0, [fmt.Record(value(3))], T0)
    with open(tmp_path / f"{0:020d}.log", "ab") as f:
        f.write(good[:-1] + bytes([good[-1] ^ 0xFF]))
    log = make(tmp_path, clock)
    assert log.log_end_offset == 3
    log.close()


@pytest.mark.parametrize("damage", ["missing", "garbage", "odd_size", "wrong_positions",
                                    "past_the_end", "empty", "time_missing", "time_garbage"])
def test_missing_or_corrupt_indexes_are_rebuilt(tmp_path: Path, clock: Clock,
                                               damage: str) -> None:
    cfg: dict[str, object] = {"segment_bytes_max": 4096, "index_interval_bytes": 500}
    log = make(tmp_path, clock, **cfg)
    for _ in range(40):
        clock.now += 10
        append_n(log, 1, size=300)
    stamps = {r.offset: r.timestamp_ms for r in read_all(log)}
    bases = log.segment_base_offsets
    log.close()
    target = tmp_path / f"{bases[1]:020d}.index"
    if damage == "missing":
        target.unlink()
    elif damage == "garbage":
        target.write_bytes(os.urandom(target.stat().st_size))
    elif damage == "odd_size":
        target.write_bytes(target.read_bytes() + b"\x01")
    elif damage == "wrong_positions":
        # Well-formed, increasing, but pointing inside batches.
        target.write_bytes(b"".join(fmt_entry for fmt_entry in (
            (0).to_bytes(4, "big") + (0).to_bytes(4, "big"),
            (2).to_bytes(4, "big") + (100).to_bytes(4, "big"),
            (5).to_bytes(4, "big") + (1000).to_bytes(4, "big"))))
    elif damage == "past_the_end":
        target.write_bytes((0).to_bytes(8, "big") + (1).to_bytes(4, "big")
                           + (99999).to_bytes(4, "big"))
    elif damage == "empty":
        target.write_bytes(b"")
    elif damage == "time_missing":
        target.with_suffix(".timeindex").unlink()
    else:
        target.with_suffix(".timeindex").write_bytes(os.urandom(24))
    log = make(tmp_path, clock, **cfg)
    assert log.recovery.scanned_segments == 1
    assert log.recovery.truncated_bytes == 0
    assert log.segment_base_offsets == bases
    assert_dense(read_all(log), 0, 40, size=300)
    for target_ts in range(T0, clock.now + 10, 5):
        assert log.offset_for_timestamp(target_ts) == next(
            (o for o in range(40) if stamps[o] >= target_ts), 40)
    assert OffsetIndex.from_bytes(target.read_bytes()) is not None
    log.close()
    log = make(tmp_path, clock, **cfg)
    assert log.recovery.scanned_segments == 0  # the rebuilt index is trusted again
    log.close()


def batch_positions(path: Path) -> list[tuple[int, fmt.BatchHeader]]:
    return list(fmt.iter_batches(path.read_bytes()))


@pytest.mark.parametrize(
    "field",
    ["value", "crc", "base_offset", "batch_length_small", "batch_length_large", "magic",
     "record_count", "timestamp", "attributes", "last_offset_delta", "leader_epoch"],
)
def test_damage_in_a_trusted_segment_is_reported_at_read(tmp_path: Path, clock: Clock,
                                                         field: str) -> None:
    # An index entry for every batch: opening walks only the last batch of each segment.
    cfg: dict[str, object] = {"segment_bytes_max": 4096, "index_interval_bytes": 1}
    log = make(tmp_path, clock, **cfg)
    append_n(log, 30, size=300)
    bases = log.segment_base_offsets
    assert len(bases) == 3
    log.close()
    path = tmp_path / f"{bases[1]:020d}.log"
    position, header = batch_positions(path)[3]
    victim = header.base_offset
    data = bytearray(path.read_bytes())
    at = {
        "value": position + fmt.BATCH_HEADER.size + fmt.RECORD_HEADER.size + 7,
        "crc": position + fmt.CRC_OFFSET + 1,
        "base_offset": position + 7,
        "batch_length_small": position + 11,
        "batch_length_large": position + 9,
        "magic": position + 16,
        "record_count": position + 46,
        "timestamp": position + 31,
        "attributes": position + 22,
        "last_offset_delta": position + 25,  # claims 1024 more offsets than it has
        "leader_epoch": position + 13,
    }[field]
    data[at] ^= 0x04
    path.write_bytes(bytes(data))
    log = make(tmp_path, clock, **cfg)
    assert log.recovery.scanned_segments == 0  # trusted: sealed and below the recovery point
    assert log.log_end_offset == 30
    for offset in range(30):
        try:
            records = log.read_records(offset, 1)
        except CorruptRecord as exc:
            assert exc.code == "CORRUPT_RECORD"
            assert exc.to_dict()["code"] == "CORRUPT_RECORD"
            assert bases[1] <= offset < bases[2]
            continue
        assert offset != victim, "the damaged batch was served"
        assert_dense(records, offset, offset + 1, size=300)
    with pytest.raises(CorruptRecord):
        log.read_records(victim, 1)
    with pytest.raises(CorruptRecord):
        read_all(log)
    # Segments after the damaged one still serve.
    assert_dense(read_all(log, start=bases[2]), bases[2], 30, size=300)
    # Appends go on.
    log.append([fmt.Record(value(30, 300))], 0)
    assert_dense(read_all(log, start=30), 30, 31, size=300)
    assert log.segment_base_offsets == [*bases, 30]
    log.close()
    # A full scan (no recovery point) cuts the log at the damage instead.
    (tmp_path / RECOVERY_POINT_FILE).unlink()
    log = make(tmp_path, clock, **cfg)
    assert log.log_end_offset == victim
    assert log.recovery.dropped_segments == 2  # the ones after the damaged segment
    assert_dense(read_all(log), 0, victim, size=300)
    log.close()


def test_time_lookup_over_a_damaged_batch_raises_corrupt_record(tmp_path: Path,
                                                                clock: Clock) -> None:
    log = make(tmp_path, clock, segment_bytes_max=4096)
    for _ in range(20):
        clock.now += 100
        append_n(log, 1, size=300)
    log.close()
    path = tmp_path / f"{0:020d}.log"
    position, header = batch_positions(path)[4]
    data = bytearray(path.read_bytes())
    data[position + fmt.BATCH_HEADER.size + 40] ^= 0x01
    path.write_bytes(bytes(data))
    log = make(tmp_path, clock, segment_bytes_max=4096)
    assert log.offset_for_timestamp(T0 + 300) == 2
    with pytest.raises(CorruptRecord):
        log.offset_for_timestamp(header.max_timestamp)
    log.close()


# -- retention ---------------------------------------------------------------------------------


def retention_log(tmp_path: Path, clock: Clock, **cfg: object) -> tuple[Log, list[int]]:
    """10 segments of 8 records (475 bytes each), one segment per second of record time."""
    log = make(tmp_path, clock, segment_bytes_max=4096, **cfg)
    for i in range(80):
        if i % 8 == 0:
            clock.now += 1000
        append_n(log, 1, size=400)
    bases = log.segment_base_offsets
    assert bases == list(range(0, 80, 8))
    return log, bases


def check_out_of_range(log: Log) -> None:
    start = log.log_start_offset
    for offset in (0, start - 1):
        with pytest.raises(OffsetOutOfRange) as err:
            log.read(offset, 100)
        assert (err.value.offset, err.value.oldest, err.value.newest) == (
            offset, start, log.log_end_offset)
        assert err.value.to_dict() == {
            "code": "OFFSET_OUT_OF_RANGE", "message": str(err.value), "offset": offset,
            "oldest": start, "newest": log.log_end_offset}


def test_retention_by_age(tmp_path: Path, clock: Clock) -> None:
    log, bases = retention_log(tmp_path, clock, retention_ms=3500)
    start_ts = T0  # segment k holds records stamped T0 + (k+1) * 1000
    assert log.apply_retention(now_ms=start_ts + 4000) == []
    assert log.apply_retention(now_ms=start_ts + 4501) == [0]
    # The clock is the default "now".
    clock.now = start_ts + 8000
    assert log.apply_retention() == [8, 16, 24]
    assert log.log_start_offset == 32
    assert log_files(tmp_path)[0] == f"{32:020d}.log"
    assert not list(tmp_path.glob(f"{24:020d}.*"))
    check_out_of_range(log)
    assert_dense(read_all(log), 32, 80, size=400)
    # Everything expired: the active segment stays.
    clock.now += 10**9
    assert log.apply_retention() == bases[4:-1]
    assert log.segment_base_offsets == [72]
    assert log.apply_retention() == []
    assert_dense(read_all(log), 72, 80, size=400)
    log.close()
    log = make(tmp_path, clock, segment_bytes_max=4096)
    assert (log.log_start_offset, log.log_end_offset) == (72, 80)
    log.close()


def test_retention_by_bytes(tmp_path: Path, clock: Clock) -> None:
    log, bases = retention_log(tmp_path, clock, retention_bytes=5 * 8 * 475 - 1)
    assert log.size_bytes == 80 * 475
    deleted = log.apply_retention()
    # Whole segments, oldest first, until the log holds no more than the limit.
    assert deleted == bases[:6]
    assert log.size_bytes == 4 * 8 * 475
    assert log.log_start_offset == 48
    check_out_of_range(log)
    assert_dense(read_all(log), 48, 80, size=400)
    log.close()


def test_retention_by_message_count(tmp_path: Path, clock: Clock) -> None:
    log, bases = retention_log(tmp_path, clock, retention_messages=20)
    assert log.apply_retention() == bases[:8]
    assert log.log_start_offset == 64
    assert log.log_end_offset - log.log_start_offset <= 20
    check_out_of_range(log)
    log.close()


def test_retention_never_passes_the_high_watermark(tmp_path: Path, clock: Clock) -> None:
    log, bases = retention_log(tmp_path, clock, retention_messages=1)
    assert log.apply_retention(max_offset=23) == [0, 8]  # [16, 24) holds offset 23
    assert log.apply_retention(max_offset=24) == [16]
    assert log.apply_retention(max_offset=0) == []
    assert log.apply_retention() == bases[3:-1]
    assert log.segment_base_offsets == [72]
    log.close()


def test_no_retention_configured_keeps_everything(tmp_path: Path, clock: Clock) -> None:
    log, bases = retention_log(tmp_path, clock)
    assert log.apply_retention(now_ms=T0 + 10**12) == []
    assert log.segment_base_offsets == bases
    log.close()


# -- limits and bad input ----------------------------------------------------------------------


def assert_unchanged(log: Log, directory: Path, end: int) -> None:
    assert log.log_end_offset == end
    assert sum(p.stat().st_size for p in directory.glob("*.log")) == log.size_bytes
    assert_dense(read_all(log), 0, end, size=None)


def test_record_too_large(tmp_path: Path, clock: Clock) -> None:
    with make(tmp_path, clock, record_bytes_max=1024) as log:
        append_n(log, 2)
        log.append([fmt.Record(b"x" * (1024 - fmt.RECORD_HEADER.size))], 0)  # exactly the limit
        for record in (
            fmt.Record(b"x" * (1024 - fmt.RECORD_HEADER.size + 1)),
            fmt.Record(b"x" * 10, key=b"k" * 1000),
            fmt.Record(b"x" * 10, headers={"h": b"v" * 1000}),
            fmt.Record(b"x" * 10, subject="s" * 1000),
        ):
            with pytest.raises(RecordTooLarge) as err:
                log.append([fmt.Record(b"ok"), record], 0)
            assert err.value.code == "MESSAGE_TOO_LARGE"
            assert (err.value.size, err.value.limit) == (fmt.record_size(record), 1024)
            assert_unchanged(log, tmp_path, 3)


def test_batch_too_large(tmp_path: Path, clock: Clock) -> None:
    with make(tmp_path, clock, batch_records_max=5, batch_bytes_max=1000) as log:
        log.append([fmt.Record(b"x")] * 5, 0)
        with pytest.raises(BatchTooLarge) as err:
            log.append([fmt.Record(b"x")] * 6, 0)
        assert (err.value.size, err.value.limit, err.value.unit, err.value.code) == (
            6, 5, "records", "BATCH_TOO_LARGE")
        with pytest.raises(BatchTooLarge) as err:
            log.append([fmt.Record(b"x" * 300)] * 3, 0)
        assert (err.value.size, err.value.limit, err.value.unit) == (
            batch_size(300, 300, 300), 1000, "bytes")
        big = fmt.encode_batch(5, 0, [fmt.Record(b"x" * 300)] * 3, T0)
        with pytest.raises(BatchTooLarge):
            log.append_batches(big)
        assert_unchanged(log, tmp_path, 5)


def test_stale_leader_epoch(tmp_path: Path, clock: Clock) -> None:
    with make(tmp_path, clock) as log:
        log.append([fmt.Record(b"a")], 3)
        with pytest.raises(StaleLeaderEpoch) as err:
            log.append([fmt.Record(b"b")], 2)
        assert (err.value.epoch, err.value.latest) == (2, 3)
        good = fmt.encode_batch(1, 3, [fmt.Record(b"c")], T0)
        stale = fmt.encode_batch(2, 1, [fmt.Record(b"d")], T0)
        with pytest.raises(StaleLeaderEpoch):
            log.append_batches(good + stale)
        assert_unchanged(log, tmp_path, 1)
        log.append([fmt.Record(b"e")], 4)
        assert [(e.epoch, e.start_offset) for e in log.epochs.entries] == [(3, 0), (4, 1)]


def _recrc(batch: bytearray) -> bytes:
    """Give damaged batch bytes a CRC that matches them again."""
    crc = fmt.crc32c(bytes(batch[fmt.CRC_START:]),
                     fmt.crc32c(bytes(batch[:fmt.CRC_OFFSET])))
    batch[fmt.CRC_OFFSET:fmt.CRC_START] = crc.to_bytes(4, "big")
    return bytes(batch)


def invalid_follower_data() -> dict[str, bytes]:
    one = fmt.encode_batch(2, 0, [fmt.Record(b"x")], T0)
    two = fmt.encode_batch(3, 0, [fmt.Record(b"y"), fmt.Record(b"z")], T0)
    flipped = bytearray(one)
    flipped[-1] ^= 0x01
    bad_record = bytearray(one)
    bad_record[fmt.BATCH_HEADER.size + 3] ^= 0x01  # record length no longer matches
    return {
        "base_offset_ahead": fmt.encode_batch(3, 0, [fmt.Record(b"x")], T0),
        "base_offset_behind": fmt.encode_batch(1, 0, [fmt.Record(b"x")], T0),
        "gap_between_batches": one + fmt.encode_batch(4, 0, [fmt.Record(b"y")], T0),
        "bad_crc": bytes(flipped),
        "bad_crc_in_second": one + two[:-1] + bytes([two[-1] ^ 0x80]),
        "bad_record_with_good_crc": _recrc(bad_record),
        "trailing_bytes": one + b"\x00\x01",
        "partial_batch": one + two[:-5],
        "only_partial": one[:-1],
        "empty": b"",
        "garbage": random.Random(1).randbytes(100),
        "bad_magic": _recrc(bytearray(one[:16] + b"\x07" + one[17:])),
    }


@pytest.mark.parametrize("case", sorted(invalid_follower_data()))
def test_append_batches_rejects_bad_data(tmp_path: Path, clock: Clock, case: str) -> None:
    with make(tmp_path, clock) as log:
        append_n(log, 2)
        with pytest.raises(InvalidBatch) as err:
            log.append_batches(invalid_follower_data()[case])
        assert err.value.code == "INVALID_BATCH"
        assert_unchanged(log, tmp_path, 2)
        # The log still takes good data.
        info = log.append_batches(fmt.encode_batch(2, 0, [fmt.Record(b"ok")], T0))
        assert (info.base_offset, info.last_offset, info.log_end_offset) == (2, 2, 3)
        assert log.read_records(2)[0].value == b"ok"


def test_append_batches_accepts_several_batches(tmp_path: Path, clock: Clock) -> None:
    with make(tmp_path, clock) as log:
        data = b"".join(fmt.encode_batch(i * 2, 1, [fmt.Record(value(i * 2)),
                                                    fmt.Record(value(i * 2 + 1))], T0)
                        for i in range(10))
        info = log.append_batches(memoryview(data))
        assert (info.base_offset, info.last_offset, info.log_end_offset, info.size_bytes) == (
            0, 19, 20, len(data))
        assert (tmp_path / f"{0:020d}.log").read_bytes() == data
        assert_dense(read_all(log), 0, 20)


@pytest.mark.parametrize(
    ("records", "epoch"),
    [
        ([fmt.Record(b"x")], 2**32),
        ([fmt.Record(b"x", timestamp_ms=2**63)], 0),
        ([fmt.Record(b"x"), fmt.Record(b"y", timestamp_ms=-(2**63) - 1)], 0),
        ([fmt.Record(b"x", headers={"\ud800": b"v"})], 0),
        ([fmt.Record(b"x", subject="\udfff")], 0),
        ([fmt.Record(b"x", key=b"k" * 2000, subject="a\ud800")], 0),
        ([fmt.Record(b"x", headers={f"h{i}": b"" for i in range(70_000)})], 0),
    ],
)
def test_unencodable_records_are_invalid(tmp_path: Path, clock: Clock,
                                         records: list[fmt.Record], epoch: int) -> None:
    with make(tmp_path, clock, record_bytes_max=8 * 1024 * 1024) as log:
        append_n(log, 1)
        with pytest.raises(InvalidBatch) as err:
            log.append(records, epoch)
        assert err.value.code == "INVALID_BATCH"
        assert_unchanged(log, tmp_path, 1)


def test_a_negative_epoch_is_invalid(tmp_path: Path, clock: Clock) -> None:
    with make(tmp_path, clock) as log:
        with pytest.raises(InvalidBatch):
            log.append([fmt.Record(b"x")], -1)
        assert_unchanged(log, tmp_path, 0)
        assert log.epochs.entries == []


def test_an_empty_append_is_a_programming_error(tmp_path: Path, clock: Clock) -> None:
    with make(tmp_path, clock) as log, pytest.raises(ValueError):
        log.append([], 0)


@pytest.mark.parametrize(
    ("field", "bad"),
    [
        ("segment_bytes_max", 100),
        ("segment_bytes_max", 3 * 1024**3),
        ("segment_ms_max", 0),
        ("index_interval_bytes", 0),
        ("record_bytes_max", 10),
        ("batch_bytes_max", 1),
        ("batch_records_max", 0),
        ("fsync", "always"),
        ("fsync_interval_ms", 0),
        ("retention_ms", 0),
        ("retention_bytes", -1),
        ("retention_messages", True),
        ("segment_bytes_max", 4096.0),
    ],
)
def test_config_limits(field: str, bad: object) -> None:
    with pytest.raises(InvalidConfig) as err:
        LogConfig(**{field: bad})  # type: ignore[arg-type]
    assert err.value.code == "INVALID_CONFIG"
    assert err.value.field == field


# -- the descriptor pool -----------------------------------------------------------------------


def test_many_logs_share_a_small_descriptor_pool(tmp_path: Path, clock: Clock) -> None:
    pool = HandlePool(max_open=8)
    baseline = len(os.listdir("/proc/self/fd"))
    logs = []
    for p in range(50):
        log = Log(tmp_path / f"p{p}", LogConfig(segment_bytes_max=4096), pool=pool,
                  clock=clock)
        for i in range(12):
            log.append([fmt.Record(value(i, 1000))], 0)
        assert len(log.segment_base_offsets) == 4
        assert pool.open_count <= 8
        logs.append(log)
    # One lock file per log, and at most 8 segment files across all of them.
    assert len(os.listdir("/proc/self/fd")) - baseline <= 50 + 8
    rng = random.Random(5)
    for _ in range(400):
        log = rng.choice(logs)
        offset = rng.randrange(12)
        records = log.read_records(offset, 1)
        assert_dense(records, offset, offset + 1, size=1000)
        assert pool.open_count <= 8
    assert pool.opens > 400
    for log in logs[:25]:
        log.close()
    for log in logs[:25]:
        log = Log(log.directory, LogConfig(segment_bytes_max=4096), pool=pool, clock=clock)
        assert_dense(read_all(log), 0, 12, size=1000)
        assert pool.open_count <= 8
        logs.append(log)
    for log in logs[25:]:
        log.close()
    assert pool.open_count == 0
    assert len(os.listdir("/proc/self/fd")) <= baseline


def test_pool_does_not_close_a_pinned_descriptor(tmp_path: Path) -> None:
    pool = HandlePool(max_open=2)
    paths = [tmp_path / f"f{i}" for i in range(4)]
    for path in paths:
        path.write_bytes(path.name.encode())
    with pool.pinned(paths[0]) as fd0, pool.pinned(paths[1]) as fd1, \
            pool.pinned(paths[2]) as fd2:
        # Over the limit while all are pinned rather than closing one in use.
        assert pool.open_count == 3
        assert [os.pread(fd, 2, 0) for fd in (fd0, fd1, fd2)] == [b"f0", b"f1", b"f2"]
    assert pool.open_count == 2
    with pool.pinned(paths[3]) as fd3:
        assert os.pread(fd3, 2, 0) == b"f3"
    assert pool.open_count == 2
    with pytest.raises(ValueError):
        HandlePool(max_open=1)


# -- a full disk -------------------------------------------------------------------------------

DISK_FULL_SCRIPT = r"""
import json, os, resource, signal, sys
from jetstream.errors import DiskFull
from jetstream.stream import format as fmt
from jetstream.stream.config import LogConfig
from jetstream.stream.log import Log

directory, limit = sys.argv[1], int(sys.argv[2])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
log = Log(directory, LogConfig(segment_bytes_max=1 << 20))
values = []
error = None
for i in range(10_000):
    v = (b"%06d" % i) * 170
    try:
        log.append([fmt.Record(v)], 0)
    except DiskFull as exc:
        error = exc
        break
    values.append(v)
end = log.log_end_offset
read = []
offset = 0
while offset < end:
    records = log.read_records(offset, 1 << 20)
    read.extend(r.value for r in records)
    offset = records[-1].offset + 1
size = os.path.getsize(os.path.join(directory, "%020d.log" % 0))
# Still full: close and reopen.
log.close()
log = Log(directory, LogConfig(segment_bytes_max=1 << 20))
reopened = [log.log_end_offset, log.recovery.scanned_segments, log.recovery.truncated_bytes]
# Room again (the soft limit goes up): the same append now succeeds.
resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
retry = log.append([fmt.Record(b"after")], 0)
log.close()
print(json.dumps({
    "code": error.code if error else None, "retriable": error.retriable if error else None,
    "appended": len(values), "end": end, "reads_match": read == values, "size": size,
    "reopened": reopened, "retry_base": retry.base_offset,
}))
"""


def test_disk_full(tmp_path: Path) -> None:
    limit = 50_000
    out = subprocess.run(
        [sys.executable, "-c", DISK_FULL_SCRIPT, str(tmp_path / "log"), str(limit)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    batch = batch_size(1020)
    assert result["code"] == "DISK_FULL" and result["retriable"] is True
    assert result["appended"] == limit // batch
    assert result["end"] == result["appended"]
    assert result["reads_match"]
    # The batch that did not fit left nothing behind.
    assert result["size"] == result["appended"] * batch
    # It reopens cleanly (nothing to scan or cut) with the same log end offset.
    assert result["reopened"] == [result["appended"], 0, 0]
    assert result["retry_base"] == result["appended"]
    log = Log(tmp_path / "log", LogConfig(segment_bytes_max=1 << 20), pool=HandlePool(8))
    assert log.recovery.scanned_segments == 0
    assert log.log_end_offset == result["appended"] + 1
    records = read_all(log)
    assert [r.value for r in records[:-1]] == [(b"%06d" % i) * 170
                                               for i in range(result["appended"])]
    assert records[-1].value == b"after"
    log.close()
