"""Truncation of the commit log: truncate_to inside and across segments, durability of the cut,
truncate_fully_and_start_at."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from jetstream.errors import (
    OffsetOutOfRange,
)
from jetstream.stream import format as fmt
from jetstream.stream.log import Log
from tests.unit.log_helpers import (
    Clock,
    append_n,
    assert_dense,
    log_files,
    make,
    read_all,
    value,
)

# -- truncation --------------------------------------------------------------------------------


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
