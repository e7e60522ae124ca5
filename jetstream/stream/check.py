"""Checking a segment file against its CRCs and indexes (what reads of unchecked bytes and
the scrubber do), and finding the extent of damage.

Theory of operation
- `check_segment` reads a byte range of a segment in chunks and walks its batches: each
  header must parse, start at the expected offset and fit in the range, and each batch must
  match its CRC. A whole-file check also rebuilds the indexes the file implies (the same
  rule appends follow, `Segment.account`), so index files damaged on disk are found too.
- On the first bad batch, `locate_damage` bounds the damage: when the bad batch's header
  still gives a length and a good batch follows right after it, only that batch is damaged;
  otherwise the damage runs to the next index entry that points at a good batch with the
  offset it names, or to the end of the file. The damaged byte range and the offsets it held
  are what a repair replaces (jetstream.stream.verified.Damage).
- `pace(n)` is called with the `n` bytes checked since its last call, before each read of
  the file and at the end (they add up to the range): the scrubber sleeps in it to keep to
  its rate. Nothing here takes the log's lock: the caller records the outcome under it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from jetstream.stream import format as fmt
from jetstream.stream.segment import SCAN_CHUNK_BYTES, Segment
from jetstream.stream.verified import Damage

Pace = Callable[[int], None]
#: Bytes read at once by a paced check (the scrubber): the walk of one chunk holds the
#: interpreter, so a paced check keeps it short. Ingest p99 with the scrubber on / off
#: (bench.scrub --quick, machine busy): 3.2x at 4 MiB, 1.33-1.54x at 64 KiB, 0.82-1.04x at
#: 16 KiB. An unpaced check reads SCAN_CHUNK_BYTES at once.
PACED_CHUNK_BYTES = 16 * 1024


@dataclass(frozen=True, slots=True)
class CheckResult:
    """`checked_to`: bytes [start, checked_to) passed. `damage`: the first damage found
    (None: the range passed whole). `indexes`: for a whole-file check that passed, a
    segment holding the indexes the file implies (to compare with the live ones)."""

    checked_to: int
    damage: Damage | None
    indexes: Segment | None = None


def check_segment(segment: Segment, start: int = 0, end: int | None = None,
                  expected_offset: int | None = None, *, pace: Pace | None = None
                  ) -> CheckResult:
    """Check bytes [start, end) of `segment` (default: the whole file as it is now), whose
    first batch starts at `expected_offset` (default: the segment's base offset, start 0)."""
    end = segment.size if end is None else end
    chunk = SCAN_CHUNK_BYTES if pace is None else PACED_CHUNK_BYTES
    expected = segment.base_offset if expected_offset is None else expected_offset
    assert start == 0 or expected_offset is not None, "a batch's offset is needed mid-file"
    whole = start == 0 and end == segment.size
    shadow = segment.shadow() if whole else None
    position = paced_to = start
    with segment.pinned() as fd:
        buf = b""
        buf_start = position
        while position < end:
            rel = position - buf_start
            if len(buf) - rel < fmt.BATCH_HEADER.size:
                paced_to = _pace(pace, paced_to, position)
                buf = os.pread(fd, min(chunk, end - position), position)
                buf_start, rel = position, 0
                if len(buf) < fmt.BATCH_HEADER.size:
                    return _damaged(segment, fd, position, expected,
                                    "the file ends inside a batch header", end)
            try:
                header = fmt.parse_header(buf, rel)
            except fmt.BatchFormatError as exc:
                return _damaged(segment, fd, position, expected, f"bad batch header: {exc}",
                                end)
            if header.base_offset != expected:
                return _damaged(segment, fd, position, expected,
                                f"batch starts at offset {header.base_offset}, expected "
                                f"{expected}", end)
            if position + header.size > end:
                return _damaged(segment, fd, position, expected,
                                f"batch of {header.size} bytes runs past byte {end}", end)
            if rel + header.size > len(buf):
                paced_to = _pace(pace, paced_to, position)
                buf = os.pread(fd, max(chunk, header.size), position)
                buf_start, rel = position, 0
                if len(buf) < header.size:
                    return _damaged(segment, fd, position, expected,
                                    "the file ends inside a batch", end)
            if not fmt.verify_crc(buf, rel, header):
                return _damaged(segment, fd, position, expected, "CRC mismatch", end)
            if shadow is not None:
                shadow.account(position, header)
            position += header.size
            expected = header.next_offset
        _pace(pace, paced_to, position)
    return CheckResult(position, None, shadow)


def _pace(pace: Pace | None, paced_to: int, position: int) -> int:
    """Report the bytes checked since `paced_to` (a batch that runs past the buffer is read
    again whole, so counting reads would miss the bytes checked before it)."""
    if pace is not None and position > paced_to:
        pace(position - paced_to)
    return position


def _damaged(segment: Segment, fd: int, position: int, expected_offset: int, reason: str,
             end: int) -> CheckResult:
    return CheckResult(position, locate_damage(segment, fd, position, expected_offset,
                                               reason, end))


def locate_damage(segment: Segment, fd: int, position: int, expected_offset: int,
                  reason: str, end: int | None = None) -> Damage:
    """The damage that starts with the bad batch at `position` (where a batch starting at
    `expected_offset` should be): see the module docstring. `end` bounds it (default: the
    file's size)."""
    end = segment.size if end is None else end

    def damage(end_position: int, end_offset: int) -> Damage:
        return Damage(segment.base_offset, str(segment.log_path), position, end_position,
                      expected_offset, end_offset, reason)

    bad = _header_at(fd, position)
    if bad is not None and bad.base_offset == expected_offset \
            and position + bad.size <= end:
        after = position + bad.size
        if after == end and bad.next_offset == _end_offset(segment, end):
            return damage(after, bad.next_offset)
        if _good_batch_at(fd, after, bad.next_offset, end):
            return damage(after, bad.next_offset)
    index = segment.offset_index
    for rel, entry_position in zip(index.relative_offsets, index.positions, strict=True):
        if entry_position <= position or entry_position >= end:
            continue
        offset = segment.base_offset + rel
        if offset > expected_offset and _good_batch_at(fd, entry_position, offset, end):
            return damage(entry_position, offset)
    return damage(end, _end_offset(segment, end))


def _end_offset(segment: Segment, end: int) -> int:
    """The offset that follows byte `end` of the segment: its next offset at its end."""
    if end >= segment.size:
        return segment.next_offset
    found = _header_at_segment(segment, end)
    return found.base_offset if found is not None else segment.next_offset


def _header_at(fd: int, position: int) -> fmt.BatchHeader | None:
    data = os.pread(fd, fmt.BATCH_HEADER.size, position)
    try:
        return fmt.parse_header(data)
    except fmt.BatchFormatError:
        return None


def _header_at_segment(segment: Segment, position: int) -> fmt.BatchHeader | None:
    with segment.pinned() as fd:
        return _header_at(fd, position)


def _good_batch_at(fd: int, position: int, offset: int, end: int) -> bool:
    """Whether a whole batch starting at `offset`, within `end`, matching its CRC, is at
    `position`."""
    header = _header_at(fd, position)
    if header is None or header.base_offset != offset or position + header.size > end:
        return False
    data = os.pread(fd, header.size, position)
    return len(data) == header.size and fmt.verify_crc(data, 0, header)

