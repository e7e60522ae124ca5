"""The descriptor pool's tiers and leases, the log directory locks that replace a descriptor
per log, and the broker's open-file budget."""

from __future__ import annotations

import os
import resource
from pathlib import Path

import pytest

from jetstream.errors import StorageError
from jetstream.server.config import OPEN_FILES_MIN
from jetstream.server.files import NOFILE_CEILING, budget, raise_limit
from jetstream.stream.config import LogConfig
from jetstream.stream.dir_lock import LOG_LOCK_FILE, LOGS_LOCK_FILE, DirLock
from jetstream.stream.handles import HandlePool
from jetstream.stream.log import Log
from tests.unit.log_helpers import Clock, append_n, assert_dense


def _files(directory: Path, n: int) -> list[Path]:
    paths = [directory / f"f{i}" for i in range(n)]
    for path in paths:
        path.write_bytes(path.name.encode())
    return paths


def _read(pool: HandlePool, path: Path) -> bytes:
    with pool.pinned(path) as fd:
        return os.pread(fd, 8, 0)


class _Resource:
    """A leased object that records whether it was closed."""

    def __init__(self) -> None:
        self.closed = False

    def opener(self) -> _Resource:
        return self

    def close(self) -> None:
        assert not self.closed, "closed twice"
        self.closed = True


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


# -- the pool ------------------------------------------------------------------------------


def test_hot_files_outlive_a_scan_of_cold_ones(tmp_path: Path) -> None:
    pool = HandlePool(max_open=4)
    hot = _files(tmp_path, 2)
    cold = [tmp_path / "cold" / f"c{i}" for i in range(40)]
    (tmp_path / "cold").mkdir()
    for path in cold:
        path.write_bytes(path.name.encode())
    for path in hot:
        pool.set_hot(path, True)
        assert _read(pool, path) == path.name.encode()
    for path in cold:
        assert _read(pool, path) == path.name.encode()
        assert pool.open_count <= 4
        assert pool.hot_count == 2
    # Every cold read opened its file; the hot ones were opened once and never again.
    opens = pool.opens
    assert opens == 2 + 40
    for path in hot:
        assert _read(pool, path) == path.name.encode()
    assert pool.opens == opens
    assert pool.evictions == 40 - 2


def test_more_hot_files_than_the_budget_stay_within_it(tmp_path: Path) -> None:
    pool = HandlePool(max_open=3)
    paths = _files(tmp_path, 8)
    for path in paths:
        pool.set_hot(path, True)
    for _ in range(3):
        for path in paths:
            assert _read(pool, path) == path.name.encode()
            assert pool.open_count <= 3
    assert pool.hot_count == 3
    assert pool.opens == 3 * 8


def test_a_file_made_cold_again_is_closed_first(tmp_path: Path) -> None:
    pool = HandlePool(max_open=2)
    a, b, c = _files(tmp_path, 3)
    for path in (a, b):
        pool.set_hot(path, True)
        _read(pool, path)
    pool.set_hot(a, False)  # a sealed segment now
    _read(pool, b)
    _read(pool, c)  # evicts a (cold), not b (hot), though a was used after b... before b
    opens = pool.opens
    _read(pool, b)
    assert pool.opens == opens
    _read(pool, a)
    assert pool.opens == opens + 1


def test_leases_count_their_cost_and_are_closed_by_eviction(tmp_path: Path) -> None:
    pool = HandlePool(max_open=5)
    leased = [_Resource() for _ in range(3)]
    for i, resource_ in enumerate(leased):
        with pool.lease(f"env{i}", resource_.opener, 2) as got:
            assert got is resource_
            assert pool.open_count <= 5
    # Three leases of 2 do not fit in 5: the oldest was closed.
    assert [r.closed for r in leased] == [True, False, False]
    assert pool.open_count == 4
    for path in _files(tmp_path, 4):
        _read(pool, path)
    assert all(r.closed for r in leased)  # older than every file
    assert pool.open_count <= 5


def test_a_lease_in_use_is_closed_only_after_its_use(tmp_path: Path) -> None:
    pool = HandlePool(max_open=2)
    first = _Resource()
    with pool.lease("env", lambda: first, 2) as got:
        for path in _files(tmp_path, 3):
            _read(pool, path)  # over the budget rather than close what is in use
        assert not got.closed
        pool.close("env")  # e.g. its partition's log was reopened
        assert not got.closed
    assert first.closed
    second = _Resource()
    with pool.lease("env", lambda: second, 2) as again:
        assert again is second  # opened afresh
    assert pool.open_count <= 2


def test_closing_forgets_that_a_file_is_hot(tmp_path: Path) -> None:
    pool = HandlePool(max_open=2)
    a, b, c = _files(tmp_path, 3)
    pool.set_hot(a, True)
    _read(pool, a)
    pool.close(a)  # its segment was deleted; a new file of that name is not active
    assert pool.hot_count == 0 and pool.open_count == 0
    for path in (a, b, c):
        _read(pool, path)
    assert pool.hot_count == 0 and pool.open_count == 2


# -- logs: the active segment stays open, and no descriptor per log under a parent lock -----


def test_reading_sealed_segments_of_many_logs_does_not_reopen_the_active_ones(
        tmp_path: Path, clock: Clock) -> None:
    pool = HandlePool(max_open=16)
    lock = DirLock(tmp_path, LOGS_LOCK_FILE)
    logs = [Log(tmp_path / f"p{p}", LogConfig(segment_bytes_max=4096), pool=pool,
                clock=clock, parent_lock=lock) for p in range(10)]
    for log in logs:
        append_n(log, 11, size=1000)  # three sealed segments of 3, the active one holds 2
        assert len(log.segment_base_offsets) == 4
    for _ in range(3):
        for log in logs:
            for offset in range(9):  # the three sealed segments
                assert_dense(log.read_records(offset, 1), offset, offset + 1, size=1000)
            assert pool.open_count <= 16
    assert pool.hot_count == 10
    opens = pool.opens
    for log in logs:
        append_n(log, 1, size=1000)  # to the active segment: already open
        assert_dense(log.read_records(9), 9, 12, size=1000)
        assert len(log.segment_base_offsets) == 4
    assert pool.opens == opens
    for log in logs:
        log.close()
    assert pool.open_count == 0
    lock.release()


def test_logs_under_a_parent_lock_hold_no_descriptor_of_their_own(tmp_path: Path,
                                                                  clock: Clock) -> None:
    pool = HandlePool(max_open=4)
    lock = DirLock(tmp_path, LOGS_LOCK_FILE)
    before = _fds()
    logs = [Log(tmp_path / f"p{p}", pool=pool, clock=clock, parent_lock=lock)
            for p in range(20)]
    for log in logs:
        append_n(log, 1, size=1000)
    assert _fds() - before <= 4  # the pool's, and nothing per log
    assert not (tmp_path / "p0" / LOG_LOCK_FILE).exists()
    # Another open of a log under the held lock is refused, from here or another process.
    with pytest.raises(StorageError):
        DirLock(tmp_path, LOGS_LOCK_FILE)
    with pytest.raises(StorageError):
        Log(tmp_path / "p0", pool=pool, clock=clock)
    with pytest.raises(StorageError):
        Log(tmp_path / "p99", pool=pool, clock=clock)  # a new one too
    for log in logs:
        log.close()
    lock.release()
    # Released: a log opens on its own, and then the broker's lock cannot cover it.
    alone = Log(tmp_path / "p0", pool=pool, clock=clock)
    again = DirLock(tmp_path, LOGS_LOCK_FILE)
    with pytest.raises(StorageError):
        Log(tmp_path / "p0", pool=pool, clock=clock, parent_lock=again)
    assert_dense(alone.read_records(0), 0, 1, size=1000)
    alone.close()
    with Log(tmp_path / "p0", pool=pool, clock=clock, parent_lock=again) as log:
        assert log.log_end_offset == 1
    again.release()


# -- the broker's budget ------------------------------------------------------------------


@pytest.mark.parametrize(("limit", "configured", "expected"), [
    (1024, 0, 512),
    (1_048_576, 0, 524_288),
    (20, 0, OPEN_FILES_MIN),
    (resource.RLIM_INFINITY, 0, NOFILE_CEILING // 2),
    (1024, 64, 64),
    (1024, 4096, 4096),  # as set (the broker warns: sockets may run short)
])
def test_the_budget_is_half_the_limit_unless_set(limit: int, configured: int,
                                                 expected: int) -> None:
    assert budget(limit, configured) == expected


def test_the_soft_limit_is_raised_to_the_hard_one() -> None:
    soft, hard = raise_limit()
    assert (soft, hard) == resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY:
        assert soft == hard
