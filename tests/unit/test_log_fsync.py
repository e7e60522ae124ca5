"""Durability policies of the commit log: always, interval, never, group commit, and fsyncs racing
truncations or failing."""

from __future__ import annotations

import errno
import os
import re
import threading
from pathlib import Path

import pytest

from jetstream.stream import format as fmt
from jetstream.stream.checkpoint import read_offset
from jetstream.stream.config import FsyncPolicy
from jetstream.stream.log import close_all
from jetstream.stream.recovery import RECOVERY_POINT_FILE
from jetstream.stream.segment import Segment
from tests.unit.log_helpers import (
    Clock,
    FsyncSpy,
    append_n,
    assert_dense,
    log_files,
    make,
    read_all,
    value,
)

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


def test_close_all_syncs_the_file_system_twice_and_leaves_clean_logs(
        tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    logs = [make(tmp_path / f"p{i}", clock, fsync=FsyncPolicy.NEVER, segment_bytes_max=4096)
            for i in range(3)]
    for i, log in enumerate(logs):
        append_n(log, 10 + i, size=400)
    ends = [log.log_end_offset for log in logs]
    spy = FsyncSpy(monkeypatch)
    #: The recovery points on disk at each file-system sync.
    seen: list[list[int | None]] = []
    monkeypatch.setattr(os, "sync", lambda: seen.append(
        [read_offset(log.directory / RECOVERY_POINT_FILE, "recovery-point") for log in logs]))
    close_all([*logs, logs[0]])  # a log closed already is left alone
    assert spy.paths == []  # no fsync of any file
    # Two syncs: the first before any recovery point vouches for the data, the second after.
    assert len(seen) == 2 and all(point != end for point, end in zip(seen[0], ends, strict=True))
    assert seen[1] == ends
    for i in range(3):
        log = make(tmp_path / f"p{i}", clock, fsync=FsyncPolicy.NEVER, segment_bytes_max=4096)
        assert log.recovery.scanned_segments == 0
        assert_dense(read_all(log), 0, 10 + i, size=400)
        log.close()
