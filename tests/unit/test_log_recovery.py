"""Closing, reopening and recovering the commit log: the recovery point, locking, stray and damaged
files, torn tails, index rebuilds, damage in trusted segments."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jetstream.errors import (
    CorruptRecord,
    LogClosed,
    StorageError,
)
from jetstream.stream import checkpoint
from jetstream.stream import format as fmt
from jetstream.stream.epoch import FILE_NAME as EPOCH_FILE
from jetstream.stream.epoch import KIND as EPOCH_KIND
from jetstream.stream.index import OffsetIndex
from jetstream.stream.log import Log
from jetstream.stream.recovery import RECOVERY_POINT_FILE, Recovery
from jetstream.stream.segment import Segment
from tests.unit.log_helpers import (
    REPO,
    T0,
    Clock,
    FsyncSpy,
    append_n,
    assert_dense,
    batch_size,
    crash,
    make,
    read_all,
    value,
)

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


# -- the leader-epoch file at restart ------------------------------------------------------------


def test_a_restart_of_an_idle_leader_writes_no_epoch_file(tmp_path: Path, clock: Clock,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Becoming leader at the log's end and dropping that empty epoch at reopen are kept in
    memory: recovery would make both changes again."""
    log = make(tmp_path, clock)
    log.start_leader_epoch(1)
    append_n(log, 3, epoch=1)
    log.close()
    spy = FsyncSpy(monkeypatch)
    for epoch in (2, 3):  # restarts: each time the leader at a new epoch, nothing appended
        log = make(tmp_path, clock)
        assert [(e.epoch, e.start_offset) for e in log.epochs.entries] == [(1, 0)]
        log.start_leader_epoch(epoch)
        log.close()
    assert not [p for p in spy.paths if p.startswith(EPOCH_FILE)]  # its temp file, renamed


def test_a_clean_close_writes_the_epochs_held_in_memory(tmp_path: Path, clock: Clock) -> None:
    log = make(tmp_path, clock)
    log.start_leader_epoch(1)
    append_n(log, 3, epoch=1)
    log.close()
    log = make(tmp_path, clock)
    log.start_leader_epoch(2)
    append_n(log, 2, epoch=2)
    log.close()
    assert (tmp_path / EPOCH_FILE).read_text().splitlines()[1:3] == ["1 0", "2 3"]


def test_epoch_changes_lost_in_a_crash_are_made_again(tmp_path: Path, clock: Clock) -> None:
    log = make(tmp_path, clock)
    log.start_leader_epoch(1)
    append_n(log, 3, epoch=1)
    log.close()
    durable = (tmp_path / EPOCH_FILE).read_bytes()
    log = make(tmp_path, clock)
    log.start_leader_epoch(4)
    append_n(log, 2, epoch=4)  # records of epoch 4, fsynced; its entry was not
    crash(log)
    (tmp_path / EPOCH_FILE).write_bytes(durable)  # as if the unsynced write never landed
    log = make(tmp_path, clock)
    assert [(e.epoch, e.start_offset) for e in log.epochs.entries] == [(1, 0), (4, 3)]
    assert log.end_offset_for_epoch(1).end_offset == 3
    log.close()


def test_a_follower_append_of_a_new_epoch_writes_no_epoch_file_until_a_roll(
        tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    """A replica's first records of an epoch start at its log end: the entry waits for the
    next roll (before it raises the recovery point) or a clean close."""
    with make(tmp_path / "leader", clock) as leader:
        for epoch in (1, 2):
            append_n(leader, 3, epoch=epoch)
        data, _ = leader.read_bytes(0, 1 << 20)
    spy = FsyncSpy(monkeypatch)
    log = make(tmp_path / "p", clock, segment_bytes_max=4096)
    log.append_batches(data)
    assert [(e.epoch, e.start_offset) for e in log.epochs.entries] == [(1, 0), (2, 3)]
    assert not [p for p in spy.paths if p.startswith(EPOCH_FILE)]
    append_n(log, 40, epoch=2)  # rolls
    assert len(log.segment_base_offsets) > 1
    assert (tmp_path / "p" / EPOCH_FILE).read_text().splitlines()[1:3] == ["1 0", "2 3"]
    log.close()


def test_epochs_a_crash_cost_the_file_are_found_past_the_recovery_point(
        tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    log = make(tmp_path, clock, segment_bytes_max=4096)
    append_n(log, 60, epoch=1)  # several segments; the roll wrote epoch 1
    log.start_leader_epoch(3)
    append_n(log, 2, epoch=3)
    log.append_batches(fmt.encode_batch(log.log_end_offset, 5, [fmt.Record(b"x")], T0))
    bases = log.segment_base_offsets
    crash(log)
    looked_at: list[int] = []
    real = Recovery._assign_epochs_of

    def spy(self: Recovery, segment: Segment, offset: int | None = None) -> None:
        looked_at.append(segment.base_offset)
        real(self, segment, offset)

    monkeypatch.setattr(Recovery, "_assign_epochs_of", spy)
    log = make(tmp_path, clock, segment_bytes_max=4096)
    assert [(e.epoch, e.start_offset) for e in log.epochs.entries] == [(1, 0), (3, 60),
                                                                     (5, 62)]
    assert looked_at == [bases[-1]]  # not every segment: the active one only
    log.close()


def test_an_epoch_missing_before_the_recovery_point_rebuilds_the_whole_cache(
        tmp_path: Path, clock: Clock) -> None:
    """A file that lacks an epoch beginning below the recovery point (written by a broker
    that did not write epochs at each roll) is rebuilt from every batch."""
    log = make(tmp_path, clock, segment_bytes_max=4096)
    append_n(log, 20, epoch=1)
    append_n(log, 40, epoch=2)
    crash(log)
    checkpoint.write_entries(tmp_path / EPOCH_FILE, EPOCH_KIND, [(1, 0)])
    log = make(tmp_path, clock, segment_bytes_max=4096)
    assert [(e.epoch, e.start_offset) for e in log.epochs.entries] == [(1, 0), (2, 20)]
    log.close()


def test_recovery_on_a_full_disk_keeps_the_epochs_it_found_in_memory(
        tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    """Epochs recovery learns from the batches are written once at its end; on a full disk
    they stay in memory (the next open learns them again) and the log still opens."""
    log = make(tmp_path, clock)
    append_n(log, 3, epoch=2)
    crash(log)
    real = checkpoint.write_atomic

    def full(path: Path, data: bytes, *, durable: bool = True) -> None:
        if path.name == EPOCH_FILE:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path, data, durable=durable)

    monkeypatch.setattr(checkpoint, "write_atomic", full)
    log = make(tmp_path, clock)
    assert [(e.epoch, e.start_offset) for e in log.epochs.entries] == [(2, 0)]
    assert not (tmp_path / EPOCH_FILE).exists()
    log.close()
