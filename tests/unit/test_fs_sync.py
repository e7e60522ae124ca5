"""One syncfs for many logs: FileSystemSync (the kernel check, errors), the log's side
(`sync_ticket`, `claim_synced`), and BatchedCalls grouping a turn's durable calls."""

from __future__ import annotations

import asyncio
import ctypes
import errno
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from jetstream.server.batched_calls import BatchedCalls, LogFsync, run_fsyncs
from jetstream.stream import format as fmt
from jetstream.stream.config import FsyncPolicy
from jetstream.stream.fs_sync import FileSystemSync, kernel_release
from jetstream.stream.log import Log
from tests.unit.log_helpers import Clock, FsyncSpy, make, value


def add(log: Log, count: int, sync: bool = False) -> None:
    """`count` one-record appends at the log's end."""
    for _ in range(count):
        log.append([fmt.Record(value(log.log_end_offset))], 0, sync=sync)


class CountingSync(FileSystemSync):
    """The real syncfs, counted; or a failing one (`fail`: errno)."""

    def __init__(self, directory: Path, fail: int = 0) -> None:
        def syncfs(fd: int) -> int:
            if fail:
                ctypes.set_errno(fail)
                return -1
            real = FileSystemSync.open(directory)
            assert real is not None
            try:
                real.sync()
            finally:
                real.close()
            return 0

        super().__init__(directory, syncfs)


def test_kernel_releases_are_read_and_old_ones_refused() -> None:
    assert kernel_release("6.1.0-13-amd64") == (6, 1)
    assert kernel_release("5.8.0") == (5, 8)
    assert kernel_release("4.19.282-1rc2") == (4, 19)
    assert kernel_release("nonsense") is None
    assert kernel_release("5.4") < (5, 8) <= kernel_release("5.10.1")  # type: ignore[operator]


def test_this_machine_syncs_its_filesystem(tmp_path: Path) -> None:
    fs = FileSystemSync.open(tmp_path)
    assert fs is not None, "Linux 5.8 or later with syncfs in the C library"
    try:
        fs.sync()
        fs.sync()
        assert (fs.syncs, fs.failures) == (2, 0)
    finally:
        fs.close()


def test_a_failed_syncfs_raises_its_errno(tmp_path: Path) -> None:
    fs = CountingSync(tmp_path, fail=errno.EIO)
    with pytest.raises(OSError) as raised:
        fs.sync()
    assert raised.value.errno == errno.EIO and (fs.syncs, fs.failures) == (1, 1)
    fs.close()


def test_a_claimed_ticket_makes_the_appends_durable(tmp_path: Path, clock: Clock,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    log = make(tmp_path, clock, fsync=FsyncPolicy.ALWAYS)
    spy = FsyncSpy(monkeypatch)
    assert log.sync_ticket() is None  # nothing appended
    add(log, 3)
    ticket = log.sync_ticket()
    assert ticket is not None and ticket.target == log.log_end_offset == 3
    log.claim_synced(ticket)
    assert log.sync_ticket() is None
    log.sync_through(3)
    assert spy.of_logs() == []  # already durable: no fsync
    log.close()


def test_a_truncation_between_ticket_and_claim_voids_the_claim(
        tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    log = make(tmp_path, clock, fsync=FsyncPolicy.ALWAYS)
    add(log, 2, sync=True)
    add(log, 3)
    ticket = log.sync_ticket()
    assert ticket is not None and ticket.target == 5
    log.truncate_to(3)
    add(log, 2)  # offsets 3 and 4 again, not synced
    log.claim_synced(ticket)
    spy = FsyncSpy(monkeypatch)
    log.sync_through(5)
    assert len(spy.of_logs()) == 1  # the claim did not cover the new 3 and 4
    log.close()


def test_never_takes_tickets_and_interval_only_once_its_interval_passed(
        tmp_path: Path, clock: Clock) -> None:
    never = make(tmp_path / "never", clock, fsync=FsyncPolicy.NEVER)
    interval = make(tmp_path / "interval", clock, fsync=FsyncPolicy.INTERVAL,
                    fsync_interval_ms=1_000)
    for log in (never, interval):
        add(log, 2)
        assert log.sync_ticket() is None
    clock.now += 1_000
    assert never.sync_ticket() is None
    ticket = interval.sync_ticket()
    assert ticket is not None and ticket.target == 2
    interval.claim_synced(ticket)
    assert interval.durable_offset == 2 and not interval.sync_due()
    for log in (never, interval):
        log.close()


def test_a_batch_of_due_interval_fsyncs_takes_one_syncfs(
        tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    logs = [make(tmp_path / f"p{i}", clock, fsync=FsyncPolicy.INTERVAL,
                 fsync_interval_ms=1_000) for i in range(5)]
    for log in logs:
        add(log, 3)
    clock.now += 1_000
    fs = CountingSync(tmp_path)
    spy = FsyncSpy(monkeypatch)
    ran: list[str] = []
    parts: list[Callable[[], object]] = [LogFsync(log, log.log_end_offset) for log in logs]
    outcomes = run_fsyncs(fs, 4, [*parts, lambda: ran.append("other") or "done"])
    assert outcomes == [None] * 5 + ["done"] and ran == ["other"]
    assert (fs.syncs, spy.of_logs()) == (1, [])
    assert all(log.durable_offset == 3 for log in logs)
    # Fewer than group_min with something to make durable: an fsync each.
    for log in logs[:2]:
        add(log, 1)
    clock.now += 1_000
    assert run_fsyncs(fs, 4, [LogFsync(log, log.log_end_offset) for log in logs]) == \
        [None] * 5
    assert (fs.syncs, len(spy.of_logs())) == (1, 2)
    assert [log.durable_offset for log in logs] == [4, 4, 3, 3, 3]
    for log in logs:
        log.close()
    fs.close()


def _durable_turn(logs: list[Log], calls: BatchedCalls) -> list[object]:
    """One turn: append a record to each log without an fsync, then make it durable."""

    async def main() -> list[object]:
        futures = [calls.call(lambda log=log: add(log, 1), then=log.sync_appended,
                              durable=log) for log in logs]
        return list(await asyncio.gather(*futures, return_exceptions=True))

    return asyncio.run(main())


def test_a_turn_of_durable_calls_takes_one_syncfs(tmp_path: Path, clock: Clock,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    logs = [make(tmp_path / f"p{i}", clock, fsync=FsyncPolicy.ALWAYS) for i in range(6)]
    fs = CountingSync(tmp_path)
    spy = FsyncSpy(monkeypatch)
    with ThreadPoolExecutor(4) as executor:
        calls = BatchedCalls(executor, jobs_max=4, fs=fs, group_min=4)
        outcomes = _durable_turn(logs, calls)
        assert not any(isinstance(o, BaseException) for o in outcomes)
        assert (fs.syncs, calls.groups, spy.of_logs()) == (1, 1, [])
        assert all(log.sync_ticket() is None for log in logs)  # every one durable
        # Fewer than group_min: an fsync each, no syncfs.
        _durable_turn(logs[:3], calls)
        assert (fs.syncs, calls.groups, len(spy.of_logs())) == (1, 1, 3)
    for log in logs:
        log.close()
    fs.close()


def test_a_failed_syncfs_fails_every_call_of_its_group(tmp_path: Path, clock: Clock) -> None:
    logs = [make(tmp_path / f"p{i}", clock, fsync=FsyncPolicy.ALWAYS) for i in range(4)]
    interval = make(tmp_path / "lazy", clock, fsync=FsyncPolicy.INTERVAL)
    fs = CountingSync(tmp_path, fail=errno.EIO)
    with ThreadPoolExecutor(2) as executor:
        calls = BatchedCalls(executor, jobs_max=2, fs=fs, group_min=4)
        outcomes = _durable_turn([*logs, interval], calls)
    assert all(isinstance(o, OSError) and o.errno == errno.EIO for o in outcomes[:4])
    assert not isinstance(outcomes[4], BaseException)  # interval: not in the group
    assert all(log.sync_ticket() is not None for log in logs)  # none claimed durable
    for log in [*logs, interval]:
        log.close()
    fs.close()
