"""Retention of the commit log by age, bytes and record count, never past the high watermark."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from jetstream.errors import (
    OffsetOutOfRange,
)
from jetstream.stream.log import Log
from tests.unit.log_helpers import (
    T0,
    Clock,
    append_n,
    assert_dense,
    crash,
    log_files,
    make,
    read_all,
)

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


def test_deleted_segments_leave_the_lock_before_their_files_go(
        tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    """Retention renames a segment's files under the log's lock and unlinks them after it
    (an unlink of a large file is slow; appends wait on that lock); a crash in between
    leaves `*.deleted` files that the next open removes, with the log starting after them."""
    log, bases = retention_log(tmp_path, clock, retention_messages=20)
    log.start_leader_epoch(3)
    append_n(log, 1, size=400, epoch=3)
    unlinked: list[str] = []
    held_at_unlink: list[bool] = []

    def lock_free() -> bool:  # whether another thread (an append) could take the lock now
        free: list[bool] = []

        def probe() -> None:
            free.append(log._lock.acquire(blocking=False))
            if free[0]:
                log._lock.release()

        thread = threading.Thread(target=probe)
        thread.start()
        thread.join()
        return free[0]

    def spy(paths: list[Path]) -> None:
        held_at_unlink.append(not lock_free())
        unlinked.extend(p.name for p in paths)

    monkeypatch.setattr("jetstream.stream.log._unlink", spy)  # a crash before the unlinks
    assert log.apply_retention() == bases[:8]
    assert held_at_unlink == [False]
    assert sorted(unlinked) == sorted(f"{base:020d}{suffix}.deleted" for base in bases[:8]
                                      for suffix in (".log", ".index", ".timeindex"))
    assert log_files(tmp_path)[0] == f"{64:020d}.log"
    assert len(list(tmp_path.glob("*.deleted"))) == 24
    crash(log)
    monkeypatch.undo()
    log = make(tmp_path, clock, segment_bytes_max=4096)
    assert not list(tmp_path.glob("*.deleted"))
    assert (log.log_start_offset, log.log_end_offset) == (64, 81)
    assert [(e.epoch, e.start_offset) for e in log.epochs.entries] == [(0, 64), (3, 80)]
    assert_dense(read_all(log)[:-1], 64, 80, size=400)
    log.close()
