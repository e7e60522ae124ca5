"""The single broker's metadata files: a snapshot and a journal of commands, written in
proportion to what changed, read back whole after a torn tail or a crash mid-compaction."""

from __future__ import annotations

import asyncio
import errno
import json
import os
from pathlib import Path

import pytest

from jetstream.errors import StorageError, StreamExists
from jetstream.raft_meta import local, local_journal
from jetstream.raft_meta.fsm import CreateStream, DeleteStream, RegisterBroker, UpdateStream
from jetstream.raft_meta.local import LocalMetadata
from jetstream.raft_meta.model import BrokerInfo, StreamConfig


def propose(meta: LocalMetadata, command: object) -> object:
    return asyncio.run(meta.propose(command))  # type: ignore[arg-type]


def create(meta: LocalMetadata, name: str) -> None:
    propose(meta, CreateStream(StreamConfig(name, f"{name}.>")))


def started(directory: Path) -> LocalMetadata:
    meta = LocalMetadata(directory)
    propose(meta, RegisterBroker(BrokerInfo(0, "127.0.0.1", 7000)))
    return meta


def test_commands_are_journaled_and_read_back(tmp_path: Path) -> None:
    meta = started(tmp_path)
    for i in range(5):
        create(meta, f"s{i}")
    propose(meta, DeleteStream("s1"))
    propose(meta, UpdateStream("s2", {"retention_ms": 60_000}))
    again = LocalMetadata(tmp_path)
    assert again.state.to_dict() == meta.state.to_dict()
    assert sorted(again.state.streams) == ["s0", "s2", "s3", "s4"]
    assert again.state.streams["s2"].retention_ms == 60_000
    # One record per command after the first write (which wrote the snapshot).
    lines = (tmp_path / local.JOURNAL_NAME).read_bytes().count(b"\n")
    assert lines == 1 + 7


def test_bytes_written_per_command_do_not_grow_with_the_streams(tmp_path: Path) -> None:
    meta = started(tmp_path)
    journal_sizes = []
    for i in range(1200):
        before = (tmp_path / local.JOURNAL_NAME).stat().st_size
        create(meta, f"s{i}")
        after = (tmp_path / local.JOURNAL_NAME).stat().st_size
        if after > before:
            journal_sizes.append(after - before)
    # Most commands appended one record of the same size; compactions were few.
    assert len(journal_sizes) >= 1200 - 1200 // local_journal.COMPACT_RECORDS_MIN - 1
    assert max(journal_sizes) - min(journal_sizes) <= 8  # the names' digits
    assert sorted(LocalMetadata(tmp_path).state.streams) == sorted(meta.state.streams)


def test_the_journal_is_folded_into_the_snapshot_when_it_outgrows_it(tmp_path: Path) -> None:
    meta = started(tmp_path)
    create(meta, "busy")
    updates = local_journal.COMPACT_RECORDS_MIN + 10
    for i in range(updates):
        propose(meta, UpdateStream("busy", {"retention_ms": 60_000 + i}))
    assert json.loads((tmp_path / local.FILE_NAME).read_bytes())["generation"] == 2
    lines = (tmp_path / local.JOURNAL_NAME).read_bytes().count(b"\n")
    assert lines < 20
    again = LocalMetadata(tmp_path)
    assert again.state.streams["busy"].retention_ms == 60_000 + updates - 1


def test_a_torn_tail_is_ignored_and_compacted_before_the_next_append(tmp_path: Path) -> None:
    meta = started(tmp_path)
    create(meta, "kept")
    with (tmp_path / local.JOURNAL_NAME).open("ab") as f:
        f.write(b'{"type":"DeleteStream","name":"ke')  # a crash mid-append
    again = LocalMetadata(tmp_path)
    assert "kept" in again.state.streams
    generation = json.loads((tmp_path / local.FILE_NAME).read_bytes())["generation"]
    create(again, "next")
    assert json.loads((tmp_path / local.FILE_NAME).read_bytes())["generation"] == generation + 1
    assert sorted(LocalMetadata(tmp_path).state.streams) == ["kept", "next"]


def test_a_journal_of_another_generation_is_ignored(tmp_path: Path) -> None:
    meta = started(tmp_path)
    create(meta, "a")
    stale = (tmp_path / local.JOURNAL_NAME).read_bytes()
    create(meta, "b")
    meta._compact(meta.state)  # a compaction: snapshot at the next generation
    (tmp_path / local.JOURNAL_NAME).write_bytes(stale)  # as if the crash came between
    assert sorted(LocalMetadata(tmp_path).state.streams) == ["a", "b"]


def test_a_snapshot_of_the_first_format_is_read(tmp_path: Path) -> None:
    meta = started(tmp_path)
    create(meta, "old")
    (tmp_path / local.FILE_NAME).write_text(json.dumps(meta.state.to_dict()))
    (tmp_path / local.JOURNAL_NAME).unlink()
    again = LocalMetadata(tmp_path)
    assert list(again.state.streams) == ["old"]
    create(again, "new")
    assert sorted(LocalMetadata(tmp_path).state.streams) == ["new", "old"]


def test_a_refused_command_changes_nothing(tmp_path: Path) -> None:
    meta = started(tmp_path)
    create(meta, "orders")
    files = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(StreamExists):
        propose(meta, CreateStream(StreamConfig("orders", "other.>")))
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == files
    assert meta.state.streams["orders"].subject == "orders.>"


def test_a_failed_append_leaves_no_torn_record(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    meta = started(tmp_path)
    create(meta, "a")
    path = tmp_path / local.JOURNAL_NAME
    size = path.stat().st_size

    def half_then_full(target: Path, data: bytes) -> None:
        with target.open("ab") as f:
            f.write(data[: len(data) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(local, "append_fsynced", half_then_full)
    with pytest.raises(OSError):
        create(meta, "b")
    assert path.stat().st_size == size and "b" not in meta.state.streams
    monkeypatch.undo()
    create(meta, "c")
    assert sorted(LocalMetadata(tmp_path).state.streams) == ["a", "c"]


def test_a_damaged_snapshot_is_a_storage_error(tmp_path: Path) -> None:
    started(tmp_path)
    (tmp_path / local.FILE_NAME).write_bytes(b'{"format": 2, "generation": 1}')
    with pytest.raises(StorageError):
        LocalMetadata(tmp_path)
