"""Random sequences of log operations checked against a plain in-memory model after every step.

The model keeps every record (value, timestamp, epoch) by offset and the batch and segment
layout the log must produce (rolls by size and record time, truncation inside batches,
retention by age, bytes and count). After every step the log must agree with it: offsets dense
from the log start and never reused, reads equal to what was appended, nothing returned at or
past the bound, the same segment files, the same epoch cache."""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
)

from jetstream.errors import OffsetOutOfRange, StaleLeaderEpoch
from jetstream.stream import format as fmt
from jetstream.stream.config import FsyncPolicy, LogConfig
from jetstream.stream.epoch import UNDEFINED, EpochEndOffset
from jetstream.stream.handles import HandlePool
from jetstream.stream.log import Log

T0 = 1_700_000_000_000


@dataclass
class Batch:
    base: int
    values: list[bytes]
    timestamps: list[int]
    epoch: int

    @property
    def last(self) -> int:
        return self.base + len(self.values) - 1

    @property
    def size(self) -> int:
        return fmt.BATCH_HEADER.size + sum(fmt.RECORD_HEADER.size + len(v)
                                           for v in self.values)

    @property
    def first_ts(self) -> int:
        return self.timestamps[0]

    @property
    def max_ts(self) -> int:
        return max(self.timestamps)


@dataclass
class Segment:
    base: int
    batches: list[Batch] = field(default_factory=list)

    @property
    def size(self) -> int:
        return sum(b.size for b in self.batches)

    @property
    def end(self) -> int:
        return self.batches[-1].last + 1 if self.batches else self.base

    @property
    def max_ts(self) -> int:
        return max((b.max_ts for b in self.batches), default=-1)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now


# Value sizes of the records of one batch.
sizes = st.lists(st.integers(0, 1200), min_size=1, max_size=4)


class LogMachine(RuleBasedStateMachine):
    config = LogConfig(
        segment_bytes_max=4096,
        segment_ms_max=10_000,
        index_interval_bytes=300,
        retention_ms=60_000,
        retention_bytes=10_000,
        retention_messages=25,
        fsync=FsyncPolicy.ALWAYS,
    )
    max_open = 3

    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="jetstream-stateful-"))
        self.clock = Clock()
        self.pool = HandlePool(self.max_open)
        self.log = self._open()
        self.segments = [Segment(0)]
        self.epoch = 0
        self.hw: int | None = None
        self.sequence = 0

    def values(self, value_sizes: list[int]) -> list[bytes]:
        """Values unique across the run: a record that comes back at an offset reused after a
        truncation cannot pass for the new one."""
        out = []
        for size in value_sizes:
            self.sequence += 1
            tag = b"<%d>" % self.sequence
            out.append((tag * (size // len(tag) + 1))[:size])
        return out

    def _open(self) -> Log:
        return Log(self.directory, self.config, pool=self.pool, clock=self.clock)

    def teardown(self) -> None:
        self.log.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    # -- the model --------------------------------------------------------------------------

    @property
    def start(self) -> int:
        return self.segments[0].base

    @property
    def end(self) -> int:
        return self.segments[-1].end

    def batches(self) -> list[Batch]:
        return [b for s in self.segments for b in s.batches]

    def records(self) -> list[tuple[int, bytes, int, int]]:
        return [(b.base + i, v, b.timestamps[i], b.epoch)
                for b in self.batches() for i, v in enumerate(b.values)]

    def latest_epoch(self) -> int:
        batches = self.batches()
        return batches[-1].epoch if batches else UNDEFINED

    def epoch_entries(self) -> list[tuple[int, int]]:
        entries: list[tuple[int, int]] = []
        for offset, _v, _t, epoch in self.records():
            if not entries or entries[-1][0] != epoch:
                entries.append((epoch, offset))
        return entries

    def model_append(self, batch: Batch) -> None:
        active = self.segments[-1]
        cfg = self.config
        if active.batches and (
            active.size + batch.size > cfg.segment_bytes_max
            or batch.max_ts - active.batches[0].first_ts >= cfg.segment_ms_max
        ):
            active = Segment(batch.base)
            self.segments.append(active)
            event("segment rolled")
        active.batches.append(batch)

    def segment_for(self, offset: int) -> Segment:
        return [s for s in self.segments if s.base <= offset][-1]

    # -- rules ------------------------------------------------------------------------------

    @initialize(batches=st.lists(sizes, max_size=20))
    def prefill(self, batches: list[list[int]]) -> None:
        """Start from an empty log or from one with a few segments already."""
        assert (self.log.log_start_offset, self.log.log_end_offset) == (0, 0)
        self.append(batches, bump=False, clock_step=1000)

    @rule(batches=st.lists(sizes, min_size=1, max_size=6), bump=st.booleans(),
          clock_step=st.integers(0, 3000))
    def append(self, batches: list[list[int]], bump: bool, clock_step: int) -> None:
        self.epoch += bump
        for value_sizes in batches:
            vals = self.values(value_sizes)
            info = self.log.append([fmt.Record(v) for v in vals], self.epoch)
            batch = Batch(self.end, vals, [self.clock.now] * len(vals), self.epoch)
            assert (info.base_offset, info.last_offset, info.size_bytes) == (
                batch.base, batch.last, batch.size)
            self.model_append(batch)
            assert info.log_end_offset == self.end
            self.clock.now += clock_step

    @rule(runs=st.lists(st.tuples(sizes, st.integers(0, 8000)), min_size=1, max_size=6),
          bump=st.booleans())
    def append_as_follower(self, runs: list[tuple[list[int], int]], bump: bool) -> None:
        self.epoch += bump
        data = []
        base = self.end
        new = []
        for value_sizes, ts_step in runs:
            vals = self.values(value_sizes)
            # The leader's clock: behind or ahead of ours.
            ts = self.clock.now - 20_000 + ts_step
            data.append(fmt.encode_batch(base, self.epoch, [fmt.Record(v) for v in vals], ts))
            new.append(Batch(base, vals, [ts] * len(vals), self.epoch))
            base += len(vals)
        info = self.log.append_batches(b"".join(data))
        assert (info.base_offset, info.log_end_offset) == (new[0].base, base)
        for batch in new:
            self.model_append(batch)

    @rule()
    def append_with_a_stale_epoch(self) -> None:
        if self.latest_epoch() <= 0:
            return
        stale = self.latest_epoch() - 1
        with pytest.raises(StaleLeaderEpoch):
            self.log.append([fmt.Record(b"stale")], stale)
        with pytest.raises(StaleLeaderEpoch):
            self.log.append_batches(fmt.encode_batch(self.end, stale, [fmt.Record(b"s")], 1))

    @rule(ms=st.integers(0, 15_000))
    def advance_clock(self, ms: int) -> None:
        self.clock.now += ms

    @rule(data=st.data(), max_bytes=st.sampled_from([0, 1, 200, 700, 1500, 5000]))
    def read(self, data: st.DataObject, max_bytes: int) -> None:
        bound = data.draw(st.none() | st.integers(self.start, self.end + 2), label="bound")
        limit = self.end if bound is None else min(bound, self.end)
        if limit < self.start:
            return
        offset = data.draw(st.integers(self.start, limit), label="offset")
        with self.log.read(offset, max_bytes, bound) as piece:
            raw = piece.read()
            expected = self.expected_span(offset, max_bytes, limit)
            assert (piece.first_offset, piece.next_offset, piece.length) == expected
        if piece.length and piece.next_offset < limit:
            event("read stopped before the bound")
        records = fmt.decode_batches(raw, min_offset=offset)
        want = [r for r in self.records() if offset <= r[0] < expected[1]] if expected[2] else []
        assert [(r.offset, r.value, r.timestamp_ms, r.leader_epoch) for r in records] == want
        assert all(r.offset < limit for r in records)
        assert self.log.read_records(offset, max_bytes, bound) == records

    def expected_span(self, offset: int, max_bytes: int, bound: int) -> tuple[int, int, int]:
        if offset == bound:
            return offset, offset, 0
        batches = self.segment_for(offset).batches
        k = next(i for i, b in enumerate(batches) if b.last >= offset)
        if batches[k].last >= bound:
            return offset, offset, 0
        total = batches[k].size
        next_offset = batches[k].last + 1
        for batch in batches[k + 1:]:
            if batch.last >= bound or total + batch.size > max(1, max_bytes):
                break
            total += batch.size
            next_offset = batch.last + 1
        return batches[k].base, next_offset, total

    @rule(data=st.data())
    def read_out_of_range(self, data: st.DataObject) -> None:
        bound = data.draw(st.none() | st.integers(self.start, self.end), label="bound")
        newest = self.end if bound is None else min(bound, self.end)
        offset = data.draw(st.integers(0, self.start - 1) if self.start else
                           st.integers(newest + 1, newest + 5), label="offset")
        if self.start <= offset <= newest:
            return
        with pytest.raises(OffsetOutOfRange) as err:
            self.log.read(offset, 100, bound)
        assert (err.value.offset, err.value.oldest, err.value.newest) == (
            offset, self.start, newest)

    @rule(data=st.data())
    def truncate_to(self, data: st.DataObject) -> None:
        offset = data.draw(st.integers(self.start, self.end + 3), label="offset")
        self.log.truncate_to(offset)
        if offset >= self.end:
            return
        i = max(i for i, s in enumerate(self.segments) if s.base <= offset)
        if offset == self.segments[i].base and i > 0:
            i -= 1
        if i + 1 < len(self.segments):
            event("truncation deleted segments")
        del self.segments[i + 1:]
        kept = []
        for batch in self.segments[i].batches:
            if batch.last < offset:
                kept.append(batch)
            elif batch.base < offset:
                event("truncated inside a batch")
                n = offset - batch.base
                kept.append(Batch(batch.base, batch.values[:n], batch.timestamps[:n],
                                  batch.epoch))
        self.segments[i].batches = kept
        assert self.end == offset

    @rule(gap=st.integers(0, 5))
    def truncate_fully_and_start_at(self, gap: int) -> None:
        offset = self.end + gap
        self.log.truncate_fully_and_start_at(offset)
        self.segments = [Segment(offset)]

    @rule(data=st.data())
    def apply_retention(self, data: st.DataObject) -> None:
        max_offset = data.draw(st.none() | st.integers(self.start, self.end), label="hw")
        deleted = self.log.apply_retention(max_offset=max_offset)
        cfg = self.config
        limit = self.end if max_offset is None else max_offset
        now = self.clock.now
        total = sum(s.size for s in self.segments)
        expected = []
        while len(self.segments) > 1:
            oldest = self.segments[0]
            if oldest.end > limit:
                break
            too_old = cfg.retention_ms is not None and 0 <= oldest.max_ts < now - cfg.retention_ms
            too_big = cfg.retention_bytes is not None and total > cfg.retention_bytes
            too_many = (cfg.retention_messages is not None
                        and self.end - oldest.base > cfg.retention_messages)
            if not (too_old or too_big or too_many):
                break
            expected.append(oldest.base)
            total -= oldest.size
            del self.segments[0]
        assert deleted == expected
        if deleted:
            event("retention deleted segments")

    @rule()
    def close_and_reopen(self) -> None:
        self.log.close()
        self.log = self._open()
        report = self.log.recovery
        assert (report.scanned_segments, report.truncated_bytes, report.dropped_segments) == (
            0, 0, 0)

    @rule()
    def crash_and_reopen(self) -> None:
        log = self.log
        for segment in log._segments:
            segment.close()
        log._release_lock()
        log._closed = True
        self.log = self._open()
        # A killed process loses nothing the OS has; only the unsealed tail is rescanned.
        assert self.log.recovery.truncated_bytes == 0
        assert self.log.recovery.dropped_segments == 0
        if self.config.fsync is not FsyncPolicy.NEVER:
            assert self.log.recovery.scanned_segments <= 1

    @rule(data=st.data())
    def write_high_watermark(self, data: st.DataObject) -> None:
        self.hw = data.draw(st.integers(0, self.end), label="hw")
        self.log.write_high_watermark(self.hw)

    @rule(delta=st.integers(-20_000, 20_000))
    def offset_for_timestamp(self, delta: int) -> None:
        target = self.clock.now + delta
        expected = next((o for o, _v, ts, _e in self.records() if ts >= target), self.end)
        assert self.log.offset_for_timestamp(target) == expected

    @rule(requested=st.integers(0, 12))
    def end_offset_for_epoch(self, requested: int) -> None:
        entries = self.epoch_entries()
        known = [i for i, (e, _s) in enumerate(entries) if e <= requested]
        if not known:
            expected = EpochEndOffset(UNDEFINED, UNDEFINED)
        else:
            i = known[-1]
            end = entries[i + 1][1] if i + 1 < len(entries) else self.end
            expected = EpochEndOffset(entries[i][0], end)
        assert self.log.end_offset_for_epoch(requested) == expected

    # -- invariants ---------------------------------------------------------------------------

    @invariant()
    def offsets_and_segments_agree(self) -> None:
        log = self.log
        assert (log.log_start_offset, log.log_end_offset) == (self.start, self.end)
        assert log.segment_base_offsets == [s.base for s in self.segments]
        assert log.size_bytes == sum(s.size for s in self.segments)
        on_disk = sorted(p.name for p in self.directory.glob("*.log"))
        assert on_disk == [f"{s.base:020d}.log" for s in self.segments]
        for segment in self.segments:
            path = self.directory / f"{segment.base:020d}.log"
            assert path.stat().st_size == segment.size
            assert segment.size <= self.config.segment_bytes_max or len(segment.batches) == 1
        assert self.pool.open_count <= self.max_open

    @invariant()
    def everything_reads_back(self) -> None:
        got = []
        offset = self.start
        while offset < self.end:
            records = self.log.read_records(offset, 3000)
            assert records and records[0].offset == offset
            got.extend(records)
            offset = records[-1].offset + 1
        assert [(r.offset, r.value, r.timestamp_ms, r.leader_epoch) for r in got] == (
            self.records())
        assert self.log.read_records(self.end) == []

    @invariant()
    def durability_and_checkpoints(self) -> None:
        if self.config.fsync is FsyncPolicy.ALWAYS:
            assert self.log.durable_offset >= self.end
        assert [(e.epoch, e.start_offset) for e in self.log.epochs.entries] == (
            self.epoch_entries())
        assert self.log.latest_epoch == self.latest_epoch()
        expected_hw = self.start if self.hw is None else max(self.start, min(self.hw, self.end))
        assert self.log.read_high_watermark() == expected_hw


class NeverSyncLogMachine(LogMachine):
    """Policy NEVER, larger segments, an index entry per batch, a time-only retention."""

    config = LogConfig(
        segment_bytes_max=4096,
        segment_ms_max=30_000,
        index_interval_bytes=1,
        retention_ms=40_000,
        fsync=FsyncPolicy.NEVER,
    )
    max_open = 2


bounded = settings(max_examples=100, stateful_step_count=30, deadline=None)
TestLog = LogMachine.TestCase
TestLog.settings = bounded
TestNeverSyncLog = NeverSyncLogMachine.TestCase
TestNeverSyncLog.settings = bounded
