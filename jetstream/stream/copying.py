"""Record batches copied from another log as they are (a mirror): which of them to append,
re-stamped with this leader's epoch. Pure: no IO, no clock.

Theory of operation: a mirror keeps its source's offsets, so a batch copied from the source
is appended at its own base offset, and a copy sent again (a retry after a crash, a task
that moved) finds its batches already there. `plan_copy(data, log_end_offset, epoch)`:
- checks every batch's structure and CRC (the bytes crossed a network) and that the batches
  follow each other without a gap;
- drops the batches the log holds already (their range ends below the log end);
- cuts a batch that straddles the log end (the source's cleaner merged batches between two
  copies) with `format.skip_held`, which re-encodes it from the log end on (rare: the only
  per-record work);
- rewrites each kept batch's `leader_epoch` to `epoch` and its CRC: one CRC pass a batch,
  never a record decoded. The records keep their offsets, offset deltas (a compacted
  source's gaps), timestamps, keys, values, headers and subjects byte for byte.
Whether the first kept batch starts at the log end (no gap) is the caller's check:
`CopyPlan.first_offset`.

On the source side, `committed_batches(data, position, high_watermark)` cuts what a copier
sends out of a Fetch answer: the whole batches below the high watermark, with an empty
batch (`format.encode_empty_batch`, what the log cleaner leaves) standing for each range the
answer skips — batches compaction emptied are not sent to readers, and offsets that
retention removed before they were copied (`position` below the answer's first batch) —
so the copy is contiguous and the mirror keeps the source's offsets, gaps and all.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from jetstream.stream import format as fmt


class CopyError(ValueError):
    """Copied bytes that are not whole, valid, contiguous batches (callers translate it)."""


@dataclass(frozen=True, slots=True)
class CopyPlan:
    """What to append: `data` (empty when the log holds everything already), from
    `first_offset` up to `next_offset`, holding `records` records in `batches` batches."""

    data: bytes
    first_offset: int
    next_offset: int
    records: int
    batches: int


def plan_copy(data: bytes | memoryview, log_end_offset: int, epoch: int) -> CopyPlan:
    """The part of `data` (whole batches) a log ending at `log_end_offset` lacks, stamped
    with `epoch`. Raises CopyError for malformed, CRC-failing, partial or non-contiguous
    batches."""
    try:
        batches = list(fmt.iter_batches(data, verify=True))
    except fmt.BatchFormatError as exc:
        raise CopyError(str(exc)) from None
    if not batches:
        raise CopyError("no whole batch in the data")
    last_pos, last = batches[-1]
    if last_pos + last.size != len(data):
        raise CopyError(f"{len(data) - last_pos - last.size} bytes after the last batch")
    for (_, before), (_, after) in itertools.pairwise(batches):
        if after.base_offset != before.next_offset:
            raise CopyError(f"batch at offset {after.base_offset} does not follow the one "
                            f"ending at {before.next_offset}")
    kept = [(pos, h) for pos, h in batches if h.next_offset > log_end_offset]
    if not kept:
        return CopyPlan(b"", log_end_offset, log_end_offset, 0, 0)
    first_pos, first = kept[0]
    out = bytearray(memoryview(data)[first_pos:])
    if first.base_offset < log_end_offset:  # straddles the log end: keep its suffix only
        end = first_pos + first.size
        try:
            suffix = bytes(fmt.skip_held(bytes(memoryview(data)[first_pos:end]),
                                         log_end_offset))
        except (fmt.BatchFormatError, UnicodeDecodeError) as exc:
            raise CopyError(str(exc)) from None
        out[:first.size] = suffix
    records = count = 0
    for header_pos, header in fmt.iter_batches(out, verify=False):
        restamp(out, header_pos, header, epoch)
        records += header.record_count
        count += 1
    first_offset = max(first.base_offset, log_end_offset)
    return CopyPlan(bytes(out), first_offset, last.next_offset, records, count)


def restamp(buf: bytearray, pos: int, header: fmt.BatchHeader, epoch: int) -> None:
    """Set the leader epoch of the batch at `pos` to `epoch` and its CRC to match, in
    place (nothing to do when it has that epoch)."""
    if header.leader_epoch == epoch:
        return
    buf[pos:pos + fmt.CRC_OFFSET] = fmt.BEFORE_CRC.pack(header.base_offset, header.batch_length,
                                                       epoch, fmt.MAGIC)
    crc = fmt.batch_crc(buf, pos, pos + header.size)
    buf[pos + fmt.CRC_OFFSET:pos + fmt.CRC_START] = crc.to_bytes(4, "big")


@dataclass(frozen=True, slots=True)
class CopiedRange:
    """Whole batches to copy, from `first_offset` (a batch's base) up to `next_offset`,
    holding `records` records, the newest stamped `last_timestamp_ms` (0: none)."""

    data: bytes
    first_offset: int
    next_offset: int
    records: int
    last_timestamp_ms: int


def committed_batches(data: bytes | memoryview, position: int, high_watermark: int
                      ) -> CopiedRange | None:
    """The batches of a Fetch answer `data` from the one holding `position` up to the last
    one wholly below `high_watermark`, with empty batches filling the ranges between them
    (see the module doc); None when there is none."""
    parts: list[bytes | memoryview] = []
    view = memoryview(data)
    end = position
    first = -1
    records = last_ts = 0
    for pos, header in fmt.iter_batches(data, verify=False):
        if header.next_offset <= position:
            continue
        if header.next_offset > high_watermark:
            break
        if first < 0:
            first = min(position, header.base_offset)
            end = first
        if header.base_offset > end:  # a skipped range: keep its offsets
            parts.append(fmt.encode_empty_batch(end, header.leader_epoch,
                                                header.base_offset - end - 1,
                                                header.first_timestamp, header.first_timestamp))
        parts.append(view[pos:pos + header.size])
        end = header.next_offset
        records += header.record_count
        last_ts = header.max_timestamp if header.record_count else last_ts
    if first < 0:
        return None
    return CopiedRange(b"".join(parts), first, end, records, last_ts)


def empty_range(first_offset: int, next_offset: int, timestamp_ms: int) -> CopiedRange:
    """An empty batch standing for offsets a copy can no longer read (retention removed them
    at the source before they were copied)."""
    data = fmt.encode_empty_batch(first_offset, 0, next_offset - first_offset - 1, timestamp_ms,
                                  timestamp_ms)
    return CopiedRange(data, first_offset, next_offset, 0, 0)
