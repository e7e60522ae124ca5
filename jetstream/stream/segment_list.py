"""The ordered segments of one log, and the base offsets that find them.

Theory of operation: a log is a run of segments in one directory, each starting where the
previous one ends (compaction may leave gaps inside segments, never between their offset
ranges). This list owns that order and the parallel list of base offsets that `bisect`
searches, so the two never disagree: every change goes through a method here. It holds no
lock; the log's lock guards it. It also tells the segments which one is active, so the
descriptor pool keeps that one open first (jetstream.stream.handles).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence

from jetstream.stream.segment import Segment


class SegmentList:
    def __init__(self) -> None:
        self._segments: list[Segment] = []
        self._bases: list[int] = []

    def __len__(self) -> int:
        return len(self._segments)

    def __iter__(self) -> Iterator[Segment]:
        return iter(self._segments)

    def __getitem__(self, index: int) -> Segment:
        return self._segments[index]

    def __contains__(self, segment: object) -> bool:
        return any(s is segment for s in self._segments)

    @property
    def bases(self) -> list[int]:
        """The base offsets, oldest first (a copy)."""
        return list(self._bases)

    @property
    def active(self) -> Segment:
        """The newest segment: the one appends go to."""
        return self._segments[-1]

    def since(self, index: int) -> list[Segment]:
        """The segments from `index` on (a copy)."""
        return self._segments[index:]

    def index_for(self, offset: int) -> int:
        """The index of the segment holding `offset` (the first one for an offset below it)."""
        return max(bisect.bisect_right(self._bases, offset) - 1, 0)

    def segment_for(self, offset: int) -> Segment:
        return self._segments[self.index_for(offset)]

    def append(self, segment: Segment) -> None:
        assert not self._segments or segment.base_offset >= self._segments[-1].next_offset, (
            segment.base_offset, self._segments[-1].next_offset)
        if self._segments:
            self._segments[-1].set_active(False)
        self._segments.append(segment)
        self._bases.append(segment.base_offset)
        segment.set_active(True)

    def pop_oldest(self) -> Segment:
        del self._bases[0]
        return self._segments.pop(0)

    def drop_after(self, index: int) -> list[Segment]:
        """Remove (and return) every segment after `index`; the caller deletes their files."""
        dropped = self._segments[index + 1:]
        del self._segments[index + 1:]
        del self._bases[index + 1:]
        for segment in dropped:
            segment.set_active(False)
        self._segments[-1].set_active(True)
        return dropped

    def clear(self) -> list[Segment]:
        dropped = self._segments
        self._segments, self._bases = [], []
        for segment in dropped:
            segment.set_active(False)
        return dropped

    def replace(self, old: Sequence[Segment], new: Sequence[Segment]) -> None:
        """Put `new` where the consecutive segments `old` are (a compaction swap): the same
        offset range, other files."""
        start = next(i for i, s in enumerate(self._segments) if s is old[0])
        assert all(self._segments[start + i] is s for i, s in enumerate(old)), "not a run"
        self._segments[start:start + len(old)] = new
        self._bases[start:start + len(old)] = [s.base_offset for s in new]
