"""Batches copied into a mirror as they are (jetstream.stream.copying): what is kept, cut,
re-stamped and refused, and what a copier takes out of a Fetch answer."""

from __future__ import annotations

import pytest

from jetstream.stream import format as fmt
from jetstream.stream.copying import CopyError, committed_batches, empty_range, plan_copy

NOW_MS = 1_700_000_000_000


def batch(base: int, count: int, epoch: int = 3, deltas: list[int] | None = None) -> bytes:
    records = [fmt.Record(b"v%d" % i, b"k%d" % i, {"h": b"%d" % i}, "orders.in", NOW_MS + i)
               for i in range(count)]
    return fmt.encode_batch(base, epoch, records, NOW_MS, deltas)


def headers(data: bytes) -> list[fmt.BatchHeader]:
    return [h for _pos, h in fmt.iter_batches(data, verify=True)]


def test_a_copy_keeps_its_records_and_takes_the_leaders_epoch() -> None:
    data = batch(0, 3) + batch(3, 2, deltas=[0, 4])  # a compacted batch: 3..7 with a gap
    plan = plan_copy(data, 0, 9)
    assert (plan.first_offset, plan.next_offset, plan.records, plan.batches) == (0, 8, 5, 2)
    assert [h.leader_epoch for h in headers(plan.data)] == [9, 9]  # the CRC matches (verify)
    assert [(r.offset, r.value, r.key, r.headers, r.subject, r.timestamp_ms)
            for r in fmt.decode_batches(plan.data)] == \
        [(r.offset, r.value, r.key, r.headers, r.subject, r.timestamp_ms)
         for r in fmt.decode_batches(data)]
    assert plan_copy(data, 0, 3).data == data  # the same epoch: byte for byte


def test_what_the_log_holds_is_left_out_and_a_straddling_batch_is_cut() -> None:
    data = batch(0, 3) + batch(3, 4)
    assert plan_copy(data, 7, 1).data == b""  # a retry of everything
    assert plan_copy(data, 7, 1).next_offset == 7
    tail = plan_copy(data, 3, 1)
    assert (tail.first_offset, tail.records) == (3, 4)
    cut = plan_copy(data, 5, 1)
    assert (cut.first_offset, cut.next_offset, cut.records) == (5, 7, 2)
    assert [r.offset for r in fmt.decode_batches(cut.data)] == [5, 6]


def test_bad_copies_are_refused() -> None:
    good = batch(0, 2)
    damaged = bytearray(good)
    damaged[-1] ^= 0xFF
    for bad in (bytes(damaged), good + batch(5, 1), good + b"\x00\x01", b""):
        with pytest.raises(CopyError):
            plan_copy(bad, 0, 1)
    assert plan_copy(batch(4, 1), 2, 1).first_offset == 4  # a gap: the caller refuses it


def test_a_fetch_answer_becomes_a_contiguous_copy() -> None:
    # Batches 0..2 and 6..7 (compaction emptied 3..5: readers do not get it), then one past
    # the high watermark.
    answer = batch(0, 3) + batch(6, 2) + batch(8, 2)
    copied = committed_batches(answer, 1, 8)
    assert copied is not None
    assert (copied.first_offset, copied.next_offset, copied.records) == (0, 8, 5)
    found = headers(copied.data)
    assert [(h.base_offset, h.next_offset, h.record_count) for h in found] == \
        [(0, 3, 3), (3, 6, 0), (6, 8, 2)]
    assert copied.last_timestamp_ms == NOW_MS + 1
    assert plan_copy(copied.data, 0, 1).next_offset == 8  # it appends as one contiguous run
    assert committed_batches(answer, 8, 8) is None
    skipped = committed_batches(batch(5, 2), 2, 10)  # retention removed 2..4 meanwhile
    assert skipped is not None and [h.base_offset for h in headers(skipped.data)] == [2, 5]
    gone = empty_range(0, 100, 0)
    assert [(h.base_offset, h.next_offset, h.record_count) for h in headers(gone.data)] == \
        [(0, 100, 0)]
