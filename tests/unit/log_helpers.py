"""Shared helpers of the commit log's tests: a settable clock, a log factory, values that
name their offset, reads of a whole log, a simulated crash, an fsync spy."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from jetstream.stream import format as fmt
from jetstream.stream.config import LogConfig
from jetstream.stream.handles import HandlePool
from jetstream.stream.log import Log

REPO = Path(__file__).resolve().parents[2]
T0 = 1_700_000_000_000


class Clock:
    def __init__(self, now: int = T0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def make(directory: Path, clock: Clock, pool: HandlePool | None = None,
         **config: object) -> Log:
    return Log(directory, LogConfig(**config), pool=pool or HandlePool(64), clock=clock)


def value(offset: int, size: int = 100) -> bytes:
    """A value that says which offset it was appended at."""
    head = f"{offset:010d}|".encode()
    return (head * (size // len(head) + 1))[:size]


def batch_size(*value_sizes: int) -> int:
    return fmt.BATCH_HEADER.size + sum(fmt.RECORD_HEADER.size + n for n in value_sizes)


def append_n(log: Log, count: int, size: int = 100, per_batch: int = 1,
             epoch: int = 0) -> None:
    for _ in range(count):
        base = log.log_end_offset
        log.append([fmt.Record(value(base + i, size)) for i in range(per_batch)], epoch)


def read_all(log: Log, start: int | None = None,
             upper_bound: int | None = None) -> list[fmt.StoredRecord]:
    offset = log.log_start_offset if start is None else start
    end = log.log_end_offset if upper_bound is None else min(upper_bound, log.log_end_offset)
    out: list[fmt.StoredRecord] = []
    while offset < end:
        records = log.read_records(offset, 5000, upper_bound)
        if not records:
            break
        assert records[0].offset == offset
        out.extend(records)
        offset = records[-1].offset + 1
    return out


def assert_dense(records: list[fmt.StoredRecord], start: int, end: int,
                 size: int | None = 100) -> None:
    assert [r.offset for r in records] == list(range(start, end))
    if size is not None:
        assert [r.value for r in records] == [value(o, size) for o in range(start, end)]


def crash(log: Log) -> None:
    """Drop a log without closing it, as a killed process would: nothing is sealed, no
    recovery point is written; its descriptors and lock go away."""
    for segment in log._segments:
        segment.close()
    log._release_lock()
    log._closed = True


def log_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.suffix == ".log")


class FsyncSpy:
    """Counts os.fsync calls by the base name of the file they flushed."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.paths: list[str] = []
        self._real = os.fsync
        monkeypatch.setattr(os, "fsync", self)

    def __call__(self, fd: int) -> None:
        self.paths.append(os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
        self._real(fd)

    def of_logs(self) -> list[str]:
        return [p for p in self.paths if p.endswith(".log")]

    def clear(self) -> None:
        self.paths.clear()
