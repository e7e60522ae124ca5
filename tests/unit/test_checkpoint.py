"""Checkpoint files: atomic replacement, CRC-protected content, damage reads as absent, and the
log's high watermark checkpoint (written atomically, read back clamped to the log)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jetstream.stream import checkpoint
from jetstream.stream import format as fmt
from jetstream.stream.config import LogConfig
from jetstream.stream.handles import HandlePool
from jetstream.stream.log import HIGH_WATERMARK_FILE, Log


class Clock:
    def __init__(self, now: int = 1_700_000_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def open_log(directory: Path, **config: object) -> Log:
    return Log(directory, LogConfig(**config), pool=HandlePool(16), clock=Clock())


def fill(log: Log, count: int, size: int = 200) -> None:
    for i in range(count):
        log.append([fmt.Record(i.to_bytes(4, "big") * (size // 4))], 0)


# -- the file format -------------------------------------------------------------------------


def test_offset_round_trip_and_layout(tmp_path: Path) -> None:
    path = tmp_path / "hw"
    checkpoint.write_offset(path, "high-watermark", 1234)
    assert checkpoint.read_offset(path, "high-watermark") == 1234
    lines = path.read_text().split("\n")
    assert lines[0] == "high-watermark 1"
    assert lines[1] == "1234"
    assert lines[2].startswith("crc ") and len(lines[2]) == len("crc ") + 8
    assert lines[3] == ""
    # Overwriting replaces the whole content and leaves no temp file behind.
    checkpoint.write_offset(path, "high-watermark", 7)
    assert checkpoint.read_offset(path, "high-watermark") == 7
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hw"]


def test_entries_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "epochs"
    entries = [(0, 0), (3, 17), (9, 2**40)]
    checkpoint.write_entries(path, "leader-epoch", entries)
    assert checkpoint.read_entries(path, "leader-epoch") == entries
    checkpoint.write_entries(path, "leader-epoch", [])
    assert checkpoint.read_entries(path, "leader-epoch") == []


def test_missing_file_reads_as_absent(tmp_path: Path) -> None:
    assert checkpoint.read_entries(tmp_path / "nope", "x") is None
    assert checkpoint.read_offset(tmp_path / "nope", "x") is None


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"\n",
        b"high-watermark 1\n",
        b"high-watermark 1\n12\n",
        b"\xff\xfe\x00garbage",
        b"high-watermark 1\n12\ncrc zzzzzzzz\n",
        b"high-watermark 1\n12\ncrc 00000000\n",
    ],
)
def test_malformed_content_reads_as_absent(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "hw"
    path.write_bytes(content)
    assert checkpoint.read_offset(path, "high-watermark") is None


def test_other_kind_or_version_reads_as_absent(tmp_path: Path) -> None:
    path = tmp_path / "cp"
    checkpoint.write_offset(path, "recovery-point", 5)
    assert checkpoint.read_offset(path, "high-watermark") is None
    text = path.read_text().replace("recovery-point 1", "recovery-point 2")
    path.write_text(text)
    assert checkpoint.read_offset(path, "recovery-point") is None


def test_offset_needs_exactly_one_non_negative_value(tmp_path: Path) -> None:
    path = tmp_path / "cp"
    checkpoint.write_entries(path, "hw", [(1,), (2,)])
    assert checkpoint.read_offset(path, "hw") is None
    checkpoint.write_entries(path, "hw", [(1, 2)])
    assert checkpoint.read_offset(path, "hw") is None
    checkpoint.write_entries(path, "hw", [(-1,)])
    assert checkpoint.read_offset(path, "hw") is None
    checkpoint.write_entries(path, "hw", [])
    assert checkpoint.read_offset(path, "hw") is None


def test_every_truncation_reads_as_absent(tmp_path: Path) -> None:
    path = tmp_path / "cp"
    checkpoint.write_entries(path, "leader-epoch", [(1, 10), (2, 20), (30, 4000)])
    whole = path.read_bytes()
    for cut in range(len(whole)):
        path.write_bytes(whole[:cut])
        assert checkpoint.read_entries(path, "leader-epoch") is None, cut


def test_every_bit_flip_reads_as_absent_or_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "cp"
    entries = [(1, 10), (2, 20), (30, 4000)]
    checkpoint.write_entries(path, "leader-epoch", entries)
    whole = path.read_bytes()
    unchanged = 0
    for bit in range(len(whole) * 8):
        damaged = bytearray(whole)
        damaged[bit // 8] ^= 1 << (bit % 8)
        path.write_bytes(bytes(damaged))
        got = checkpoint.read_entries(path, "leader-epoch")
        # The CRC's hex digits parse case-insensitively, so a flip of a letter's case bit
        # leaves the value intact: that is fine, a wrong value is not.
        assert got is None or got == entries, bit
        unchanged += got is not None
    assert unchanged < 8 * 2  # only case flips of hex letters can pass


@given(st.lists(st.tuples(st.integers(0, 2**62), st.integers(-(2**62), 2**62)), max_size=8))
def test_entries_round_trip_property(entries: list[tuple[int, int]]) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "cp"
        checkpoint.write_entries(path, "k", list(entries))
        assert checkpoint.read_entries(path, "k") == entries


def test_write_is_atomic_when_the_rename_fails(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "cp"
    checkpoint.write_offset(path, "hw", 1)

    def broken_replace(src: object, dst: object) -> None:
        raise OSError("crash before the rename")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="crash before the rename"):
        checkpoint.write_offset(path, "hw", 2)
    # The old content is intact: a reader sees the old value or the new one, never a mix.
    assert checkpoint.read_offset(path, "hw") == 1


def test_write_fsyncs_the_temp_file_before_renaming_and_the_directory_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "cp"
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append("fsync " + os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        events.append("replace")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    checkpoint.write_offset(path, "hw", 3)
    temp = f"cp.{os.getpid()}-{threading.get_ident()}.tmp"
    assert events == [f"fsync {temp}", "replace", f"fsync {tmp_path.name}"]


# -- the log's high watermark checkpoint -------------------------------------------------------


def test_high_watermark_absent_reads_as_log_start(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        assert log.read_high_watermark() == 0
        fill(log, 3)
        assert log.read_high_watermark() == 0
        log.truncate_fully_and_start_at(50)
        assert log.read_high_watermark() == 50


def test_high_watermark_round_trip_and_reload(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        fill(log, 10)
        log.write_high_watermark(7)
        assert log.read_high_watermark() == 7
        assert checkpoint.read_offset(tmp_path / HIGH_WATERMARK_FILE, "high-watermark") == 7
        log.write_high_watermark(10)
        assert log.read_high_watermark() == 10
    with open_log(tmp_path) as log:
        assert log.read_high_watermark() == 10


def test_high_watermark_is_clamped_to_the_log(tmp_path: Path) -> None:
    with open_log(tmp_path, segment_bytes_max=4096, retention_messages=20) as log:
        fill(log, 60)
        log.write_high_watermark(60)
        log.truncate_to(45)
        # A checkpoint past the log end (the suffix was truncated) reads as the log end.
        assert log.read_high_watermark() == 45
        log.write_high_watermark(5)
        assert log.apply_retention() != []
        assert log.log_start_offset > 5
        # One below the log start (retention removed it) reads as the log start.
        assert log.read_high_watermark() == log.log_start_offset


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage", "empty"])
def test_damaged_high_watermark_reads_as_absent(tmp_path: Path, damage: str) -> None:
    with open_log(tmp_path) as log:
        fill(log, 10)
        log.write_high_watermark(8)
    path = tmp_path / HIGH_WATERMARK_FILE
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        data = data[:-3]
    elif damage == "flip":
        data[len("high-watermark 1\n")] ^= 0x01  # "8" -> "9": the CRC catches it
    elif damage == "garbage":
        data = bytearray(os.urandom(len(data)))
    else:
        data = bytearray()
    path.write_bytes(bytes(data))
    with open_log(tmp_path) as log:
        assert log.log_end_offset == 10
        assert log.read_high_watermark() == log.log_start_offset == 0


def test_leftover_temp_files_are_removed_at_open(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        fill(log, 2)
        log.write_high_watermark(2)
    (tmp_path / (HIGH_WATERMARK_FILE + ".tmp")).write_bytes(b"half a wri")
    with open_log(tmp_path) as log:
        assert not list(tmp_path.glob("*.tmp"))
        assert log.read_high_watermark() == 2


def test_writers_of_one_checkpoint_at_once_never_collide(tmp_path: Path) -> None:
    """A thread and the event loop may write the same checkpoint at once (a partition's
    periodic checkpoint and its abdication): each keeps its own temporary file, nothing
    fails, and the file holds one whole write."""
    path = tmp_path / "high-watermark"
    errors: list[BaseException] = []

    def writer(base: int) -> None:
        try:
            for i in range(200):
                checkpoint.write_offset(path, "high-watermark", base + i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n * 1000,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert checkpoint.read_offset(path, "high-watermark") in {n * 1000 + 199 for n in range(4)}
    assert not list(tmp_path.glob("*.tmp"))
