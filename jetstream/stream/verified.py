"""Which stored bytes were checked, and what a failed check found.

Theory of operation: every batch carries a CRC32C (jetstream.stream.format). Bytes this
process wrote were checked as they were written (a leader encodes them, a follower checks
its leader's before appending, recovery checks what it scans); bytes an earlier process
wrote and opening trusted without a scan (below the recovery point) were not, and a disk
may damage any byte later. A segment keeps the byte ranges it has checked
(`VerifiedRanges`): a read of checked bytes is sent as it is (zero copy), a read of
unchecked bytes is checked first, and the scrubber checks every byte again at its pace.

A check that fails yields a `Damage`: one damaged byte range of one segment file and the
offsets it held (from the expected base offset of the first bad batch to that of the first
good batch after it), which is what a repair replaces with a healthy replica's batches.

Pure: no IO. `first_bad_batch` walks bytes the caller read.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

from jetstream.stream import format as fmt

#: Ranges a segment remembers; past it the smallest are forgotten (checked again later).
RANGES_MAX = 64


class VerifiedRanges:
    """Disjoint, sorted byte ranges [start, end) of one segment file that were checked."""

    __slots__ = ("_ends", "_starts")

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []

    def __len__(self) -> int:
        return len(self._starts)

    def __repr__(self) -> str:
        return f"VerifiedRanges({list(zip(self._starts, self._ends, strict=True))})"

    @property
    def ranges(self) -> list[tuple[int, int]]:
        return list(zip(self._starts, self._ends, strict=True))

    def covers(self, start: int, end: int) -> bool:
        """Whether every byte of [start, end) was checked (an empty range always was)."""
        if start >= end:
            return True
        i = bisect_right(self._starts, start) - 1
        return i >= 0 and self._ends[i] >= end

    def add(self, start: int, end: int) -> None:
        """[start, end) was checked: merge it with the ranges it touches."""
        if start >= end:
            return
        i = bisect_right(self._starts, start) - 1
        if i >= 0 and self._ends[i] >= start:
            start = self._starts[i]
        else:
            i += 1
        j = i
        while j < len(self._starts) and self._starts[j] <= end:
            end = max(end, self._ends[j])
            j += 1
        self._starts[i:j] = [start]
        self._ends[i:j] = [end]
        if len(self._starts) > RANGES_MAX:
            smallest = min(range(len(self._starts)),
                           key=lambda k: self._ends[k] - self._starts[k])
            del self._starts[smallest], self._ends[smallest]

    def discard(self, start: int, end: int | None = None) -> None:
        """[start, end) (to the end of the file when `end` is None) is no longer known good:
        damage was found there, or the file was cut or rewritten there."""
        if end is not None and start >= end:
            return
        kept: list[tuple[int, int]] = []
        for s, e in zip(self._starts, self._ends, strict=True):
            if (end is not None and (e <= start or s >= end)) or (end is None and e <= start):
                kept.append((s, e))
                continue
            if s < start:
                kept.append((s, start))
            if end is not None and e > end:
                kept.append((end, e))
        self._starts = [s for s, _e in kept]
        self._ends = [e for _s, e in kept]

    def clear(self) -> None:
        self._starts.clear()
        self._ends.clear()


@dataclass(frozen=True, slots=True)
class Damage:
    """Bytes [position, end_position) of the segment file `path` (base offset
    `segment_base`) fail their check; they held the offsets [first_offset, end_offset)."""

    segment_base: int
    path: str
    position: int
    end_position: int
    first_offset: int
    end_offset: int
    reason: str

    def describe(self) -> str:
        return (f"offsets [{self.first_offset}, {self.end_offset}) at bytes "
                f"[{self.position}, {self.end_position}) of {self.path}: {self.reason}")

    def to_dict(self) -> dict[str, int | str]:
        return {"first_offset": self.first_offset, "end_offset": self.end_offset,
                "path": self.path, "position": self.position,
                "end_position": self.end_position, "reason": self.reason}


@dataclass(frozen=True, slots=True)
class BadBatch:
    """Where a walk over stored batches stopped: at `position` of the buffer, where a batch
    starting at `expected_offset` should be, for `reason`."""

    position: int
    expected_offset: int
    reason: str


def walk_checked(buf: bytes | bytearray | memoryview, expected_offset: int,
                 end_offset: int | None = None) -> tuple[int, BadBatch | None]:
    """Walk the whole batches that fill `buf` exactly, the first at `expected_offset`, each
    next one where the previous ended (and none reaching past `end_offset` when given),
    checking each header and CRC: (the offset after the last good batch, the first bad one
    or None when all pass)."""
    position = 0
    expected = expected_offset
    while position < len(buf):
        try:
            header = fmt.parse_header(buf, position)
        except fmt.BatchFormatError as exc:
            return expected, BadBatch(position, expected, f"bad batch header: {exc}")
        if header.base_offset != expected:
            return expected, BadBatch(
                position, expected,
                f"batch starts at offset {header.base_offset}, expected {expected}")
        if position + header.size > len(buf):
            return expected, BadBatch(
                position, expected, f"batch of {header.size} bytes runs past its range")
        if end_offset is not None and header.next_offset > end_offset:
            return expected, BadBatch(
                position, expected,
                f"batch ends at offset {header.next_offset}, past {end_offset}")
        if not fmt.verify_crc(buf, position, header):
            return expected, BadBatch(position, expected, "CRC mismatch")
        position += header.size
        expected = header.next_offset
    return expected, None


def first_bad_batch(buf: bytes | bytearray | memoryview, expected_offset: int
                    ) -> BadBatch | None:
    """The first batch of `buf` that fails its check (see walk_checked), or None."""
    return walk_checked(buf, expected_offset)[1]


def batches_span(buf: bytes | bytearray | memoryview, first_offset: int,
                 end_offset: int) -> str | None:
    """Why `buf` is not exactly the checked batches holding offsets [first_offset,
    end_offset) (None when it is): what a repair may write over a `Damage`."""
    if not buf:
        return "no batches"
    reached, bad = walk_checked(buf, first_offset, end_offset)
    if bad is not None:
        return f"at byte {bad.position}: {bad.reason}"
    if reached != end_offset:
        return f"batches end at offset {reached}, not {end_offset}"
    return None
