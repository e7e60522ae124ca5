"""The metadata journal's file on a full disk (jetstream.raft_meta._pysyncobj): its blocks are
allocated before they are written, running out of room is an OSError (never a write through
mmap into a page with no block, which kills the process), and the room maker registered for
its directory (the disk reserve) is asked for room once before giving up. Failures are
injected into posix_fallocate and the meta file's writer."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from jetstream.raft_meta import _pysyncobj
from jetstream.raft_meta._pysyncobj import AllocatedFile, make_room_for

# Through jetstream's import only: pysyncobj imported first would break socket.inet_ntop.
pysyncobj_journal = _pysyncobj._journal


def enospc() -> OSError:
    return OSError(errno.ENOSPC, "No space left on device")


@pytest.fixture
def room(tmp_path: Path) -> Iterator[list[str]]:
    """A room maker for `tmp_path` that frees room (it records each call)."""
    calls: list[str] = []

    def make_room() -> bool:
        calls.append("freed")
        return True

    make_room_for(str(tmp_path), make_room)
    yield calls
    make_room_for(str(tmp_path), None)


def full_once(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """posix_fallocate fails with ENOSPC on its next call only; the sizes asked for."""
    real, asked = os.posix_fallocate, []

    def fallocate(fd: int, offset: int, length: int) -> None:
        asked.append(length)
        if len(asked) == 1:
            raise enospc()
        real(fd, offset, length)

    monkeypatch.setattr(os, "posix_fallocate", fallocate)
    return asked


def allocated(path: Path) -> bool:
    stats = path.stat()
    return stats.st_blocks * 512 >= stats.st_size


def test_pysyncobj_journals_are_written_through_allocated_files(tmp_path: Path) -> None:
    assert pysyncobj_journal.ResizableFile is AllocatedFile
    path = tmp_path / "raft.journal"
    journal = pysyncobj_journal.FileJournal(str(path))
    entries = [(b"x" * (100 + i), i + 1, 1) for i in range(200)]
    for entry in entries:
        journal.add(*entry)
    journal._destroy()
    assert path.stat().st_size > 16 * 1024 and allocated(path)
    reopened = pysyncobj_journal.FileJournal(str(path))
    assert [reopened[i] for i in range(len(reopened))] == entries
    reopened._destroy()


def test_growing_past_the_allocated_blocks_asks_for_room_once(
        tmp_path: Path, room: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    file = AllocatedFile(str(tmp_path / "journal"), defaultContent=b"head")
    asked = full_once(monkeypatch)
    file.write(100, b"within")  # the allocated size: no allocation, nothing asked
    assert (asked, room) == ([], [])
    file.write(4000, b"beyond")
    assert asked == [4006, 4006] and room == ["freed"]
    assert file.read(4000, 6) == b"beyond" and file.read(0, 4) == b"head"
    file._destroy()
    assert allocated(tmp_path / "journal")


@pytest.mark.parametrize("freed", [None, False])
def test_without_room_a_write_fails_and_writes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, freed: bool | None) -> None:
    if freed is not None:
        make_room_for(str(tmp_path), lambda: freed)
    try:
        file = AllocatedFile(str(tmp_path / "journal"), defaultContent=b"head")
        monkeypatch.setattr(os, "posix_fallocate", lambda *args: (_ for _ in ()).throw(enospc()))
        with pytest.raises(OSError) as failed:
            file.write(5000, b"beyond")
        assert failed.value.errno == errno.ENOSPC
        file.write(10, b"fits")  # what it holds stays writable
        assert file.read(0, 4) == b"head" and file.read(10, 4) == b"fits"
        file._destroy()
        assert (tmp_path / "journal").stat().st_size == 1024
    finally:
        make_room_for(str(tmp_path), None)


def test_a_sparse_journal_without_room_opens_all_the_same(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "journal"
    with open(path, "wb") as f:
        f.truncate(8192)  # as an older version left it: no blocks
    monkeypatch.setattr(os, "posix_fallocate", lambda *args: (_ for _ in ()).throw(enospc()))
    file = AllocatedFile(str(path))
    assert file.read(0, 4) == b"\0" * 4
    file._destroy()


def test_the_meta_file_is_stored_with_room_made_for_it(
        tmp_path: Path, room: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    assert pysyncobj_journal.MetaStorer is _pysyncobj._MetaStorer
    pysyncobj_storer = _pysyncobj._MetaStorer.__mro__[1]  # pysyncobj's own, which writes
    real = pysyncobj_storer.storeMeta
    calls: list[object] = []

    def store(self: object, meta: object) -> None:
        calls.append(meta)
        if len(calls) == 1:
            raise enospc()
        real(self, meta)

    monkeypatch.setattr(pysyncobj_storer, "storeMeta", store)
    storer = _pysyncobj._MetaStorer(str(tmp_path / "raft.journal.meta"))
    storer.storeMeta({"raftCommitIndex": 7})
    assert room == ["freed"] and len(calls) == 2
    assert storer.getMeta() == {"raftCommitIndex": 7}
