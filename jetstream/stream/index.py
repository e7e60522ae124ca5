"""Sparse offset and time indexes of one segment, kept in memory and appended to a file.

    Offset index entry (<base>.index):     relative offset u32 | file position u32
    Time index entry   (<base>.timeindex): max timestamp so far i64 | relative offset u32

An entry is added for a batch when at least `index_interval_bytes` of log were written since
the previous entry (and always for the first batch), so the index stays small and a lookup
walks at most a few batch headers. Relative offsets and positions point at batch starts.
The files are a cache: recovery rebuilds them from the log whenever they disagree with it.
"""

from __future__ import annotations

import os
import struct
from array import array
from bisect import bisect_left, bisect_right
from pathlib import Path

from jetstream.stream.checkpoint import write_and_close

OFFSET_ENTRY = struct.Struct(">II")
assert OFFSET_ENTRY.size == 8
TIME_ENTRY = struct.Struct(">qI")
assert TIME_ENTRY.size == 12


class OffsetIndex:
    def __init__(self) -> None:
        self.relative_offsets = array("L")
        self.positions = array("L")

    def __len__(self) -> int:
        return len(self.relative_offsets)

    def append(self, relative_offset: int, position: int) -> bytes:
        assert not self.relative_offsets or relative_offset > self.relative_offsets[-1]
        assert not self.positions or position > self.positions[-1]
        self.relative_offsets.append(relative_offset)
        self.positions.append(position)
        return OFFSET_ENTRY.pack(relative_offset, position)

    def lookup(self, relative_offset: int) -> tuple[int, int]:
        """The last entry at or before `relative_offset`, or (0, 0): where to start walking."""
        i = bisect_right(self.relative_offsets, relative_offset) - 1
        if i < 0:
            return 0, 0
        return self.relative_offsets[i], self.positions[i]

    def truncate(self, relative_offset: int) -> int:
        """Drop entries at or past `relative_offset`; returns how many remain."""
        keep = bisect_left(self.relative_offsets, relative_offset)
        del self.relative_offsets[keep:]
        del self.positions[keep:]
        return keep

    @classmethod
    def from_bytes(cls, data: bytes) -> OffsetIndex | None:
        """Parse an index file; None if it is not a well-formed, increasing index."""
        if len(data) % OFFSET_ENTRY.size:
            return None
        index = cls()
        for rel, pos in OFFSET_ENTRY.iter_unpack(data):
            if index.relative_offsets and (
                rel <= index.relative_offsets[-1] or pos <= index.positions[-1]
            ):
                return None
            index.relative_offsets.append(rel)
            index.positions.append(pos)
        if index.relative_offsets and (index.relative_offsets[0] != 0 or index.positions[0] != 0):
            return None
        return index

    def to_bytes(self) -> bytes:
        return b"".join(
            OFFSET_ENTRY.pack(r, p)
            for r, p in zip(self.relative_offsets, self.positions, strict=True)
        )


class TimeIndex:
    def __init__(self) -> None:
        self.timestamps = array("q")
        self.relative_offsets = array("L")

    def __len__(self) -> int:
        return len(self.timestamps)

    def append(self, timestamp: int, relative_offset: int) -> bytes:
        assert not self.timestamps or timestamp > self.timestamps[-1]
        self.timestamps.append(timestamp)
        self.relative_offsets.append(relative_offset)
        return TIME_ENTRY.pack(timestamp, relative_offset)

    @property
    def last_timestamp(self) -> int:
        return self.timestamps[-1] if self.timestamps else -1

    def lookup(self, timestamp: int) -> int:
        """The relative offset of a batch where a search for the first record with a timestamp
        >= `timestamp` can start: every record before that batch is older."""
        i = bisect_left(self.timestamps, timestamp) - 1
        if i < 0:
            return 0
        # The entry's batch holds only records older than `timestamp`; start at it anyway (a
        # batch boundary the offset index can find), the walk skips it by its max timestamp.
        return self.relative_offsets[i]

    def truncate(self, relative_offset: int) -> int:
        keep = bisect_left(self.relative_offsets, relative_offset)
        del self.timestamps[keep:]
        del self.relative_offsets[keep:]
        return keep

    @classmethod
    def from_bytes(cls, data: bytes) -> TimeIndex | None:
        if len(data) % TIME_ENTRY.size:
            return None
        index = cls()
        for ts, rel in TIME_ENTRY.iter_unpack(data):
            if index.timestamps and (
                ts <= index.timestamps[-1] or rel <= index.relative_offsets[-1]
            ):
                return None
            index.timestamps.append(ts)
            index.relative_offsets.append(rel)
        return index

    def to_bytes(self) -> bytes:
        return b"".join(
            TIME_ENTRY.pack(t, r) for t, r in zip(self.timestamps, self.relative_offsets,
                                                  strict=True)
        )




def write_file(path: Path, data: bytes, fsync: bool) -> None:
    write_and_close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644),
                    data, fsync)
