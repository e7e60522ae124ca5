"""Writes that run out of room, through an injected file layer: a log closes and opens again
without writing its index files (they are a cache) and keeps every record; checkpoints that
may stay stale keep their old content; the disk reserve frees room for the write that must
be made."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from jetstream.stream import checkpoint, index
from jetstream.stream.reserve import DiskReserve
from tests.unit.log_helpers import Clock, append_n, make, read_all

ENOSPC = OSError(errno.ENOSPC, "No space left on device")


def test_a_log_closes_and_opens_without_room_for_its_indexes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    log = make(tmp_path, clock, segment_bytes_max=4096)
    append_n(log, 150, size=100)
    records = read_all(log)

    def full(path: Path, data: bytes, fsync: bool) -> None:
        raise ENOSPC

    monkeypatch.setattr("jetstream.stream.segment.write_file", full)
    log.close()  # seals the active segment: no room for its index
    monkeypatch.setattr(os, "write", lambda fd, data: (_ for _ in ()).throw(ENOSPC))
    reopened = make(tmp_path, clock, segment_bytes_max=4096)  # recovery writes nothing
    monkeypatch.undo()
    assert read_all(reopened) == records
    assert not list(tmp_path.glob("*.tmp"))
    reopened.close()
    assert read_all(make(tmp_path, clock, segment_bytes_max=4096)) == records


def test_a_stale_checkpoint_is_kept_when_the_disk_is_full(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "hw"
    checkpoint.write_offset(path, "high-watermark", 5)
    monkeypatch.setattr(os, "write", lambda fd, data: (_ for _ in ()).throw(ENOSPC))
    assert not checkpoint.write_offset_if_room(path, "high-watermark", 9)
    monkeypatch.undo()
    assert checkpoint.read_offset(path, "high-watermark") == 5
    assert [p.name for p in tmp_path.iterdir()] == ["hw"]  # no temporary file left
    with pytest.raises(OSError):  # other errors are errors
        checkpoint.write_offset_if_room(tmp_path / "missing" / "hw", "high-watermark", 1)


def test_the_reserve_frees_room_for_a_write_that_must_be_made(tmp_path: Path) -> None:
    reserve = DiskReserve(tmp_path, 64 * 1024)
    assert reserve.ensure() and reserve.held
    assert reserve.path.stat().st_size == 64 * 1024
    attempts: list[bool] = []

    def write() -> str:
        attempts.append(reserve.held)
        if reserve.held:
            raise ENOSPC
        return "written"

    assert reserve.write(write) == "written"
    assert attempts == [True, False] and not reserve.held
    with pytest.raises(OSError):  # no reserve left to release: the error stands
        reserve.write(lambda: (_ for _ in ()).throw(ENOSPC))
    with pytest.raises(PermissionError):  # not a full disk: not the reserve's business
        reserve.write(lambda: (_ for _ in ()).throw(PermissionError("no")))
    assert reserve.ensure() and reserve.held
    assert DiskReserve(tmp_path / "none", 0).ensure()  # no reserve wanted


def test_index_files_removed_on_a_full_disk_are_rebuilt(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    log = make(tmp_path, clock, segment_bytes_max=4096)
    monkeypatch.setattr("jetstream.stream.segment.write_file",
                        lambda path, data, fsync: (_ for _ in ()).throw(ENOSPC))
    append_n(log, 120, size=100)  # rolls: no index files written
    monkeypatch.undo()
    assert not list(tmp_path.glob("*.index"))
    records = read_all(log)
    log.close()
    reopened = make(tmp_path, clock, segment_bytes_max=4096)
    assert read_all(reopened) == records
    assert list(tmp_path.glob("*.index"))
    assert index.OffsetIndex.from_bytes((sorted(tmp_path.glob("*.index"))[0]).read_bytes())
