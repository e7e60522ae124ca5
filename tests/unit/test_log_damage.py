"""Damage in stored bytes (jetstream.stream.verified, .check, .repair, .log_integrity): which
bytes count as checked, reads check what was not, a whole-segment check finds damage and
bounds it, a healthy copy is written over it in place, damaged index files are rebuilt."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jetstream.errors import CorruptRecord, SegmentsChanged
from jetstream.stream import check
from jetstream.stream import format as fmt
from jetstream.stream.log import Log
from jetstream.stream.verified import (
    RANGES_MAX,
    VerifiedRanges,
    batches_span,
    first_bad_batch,
)
from tests.unit.log_helpers import Clock, append_n, assert_dense, make, read_all, value

# -- VerifiedRanges ----------------------------------------------------------------------------


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 200), st.integers(0, 60)),
                max_size=40))
def test_verified_ranges_match_a_set_of_bytes(ops: list[tuple[bool, int, int]]) -> None:
    ranges = VerifiedRanges()
    model: set[int] = set()
    for add, start, length in ops:
        if add:
            ranges.add(start, start + length)
            model |= set(range(start, start + length))
        else:
            ranges.discard(start, start + length)
            model -= set(range(start, start + length))
        pairs = ranges.ranges
        assert all(s < e for s, e in pairs)
        assert all(e1 < s2 for (_s1, e1), (s2, _e2) in itertools.pairwise(pairs))
        assert {b for s, e in pairs for b in range(s, e)} == model
    for start in range(0, 260, 7):
        for end in range(start, 270, 11):
            assert ranges.covers(start, end) == (set(range(start, end)) <= model)


def test_verified_ranges_discard_to_the_end_and_stay_bounded() -> None:
    ranges = VerifiedRanges()
    ranges.add(0, 100)
    ranges.add(200, 300)
    ranges.discard(50)
    assert ranges.ranges == [(0, 50)]
    for i in range(RANGES_MAX * 2):
        ranges.add(1000 + 10 * i, 1005 + 10 * i)
    assert len(ranges) == RANGES_MAX
    assert ranges.covers(0, 50)  # the largest range is kept


# -- walking batches ---------------------------------------------------------------------------


def batches(first: int, count: int) -> bytes:
    return b"".join(fmt.encode_batch(first + i, 0, [fmt.Record(value(first + i))], 1)
                    for i in range(count))


def test_first_bad_batch_names_where_and_why() -> None:
    good = batches(10, 3)
    assert first_bad_batch(good, 10) is None
    size = len(good) // 3
    flipped = bytearray(good)
    flipped[size + fmt.BATCH_HEADER.size + 5] ^= 0x10  # in the second batch's records
    bad = first_bad_batch(flipped, 10)
    assert bad is not None and (bad.position, bad.expected_offset, bad.reason) == (
        size, 11, "CRC mismatch")
    bad = first_bad_batch(good, 11)
    assert bad is not None and bad.position == 0 and "expected 11" in bad.reason
    bad = first_bad_batch(good[:-1], 10)
    assert bad is not None and bad.position == 2 * size
    assert batches_span(good, 10, 13) is None
    assert batches_span(good, 10, 12) is not None
    assert batches_span(good, 10, 14) == "batches end at offset 13, not 14"
    assert batches_span(b"", 10, 13) == "no batches"


# -- a log with damage -------------------------------------------------------------------------


def flip(path: Path, position: int, mask: int = 0x04) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        byte = f.read(1)[0]
        f.seek(position)
        f.write(bytes([byte ^ mask]))


def reopened(log: Log, tmp_path: Path, clock: Clock) -> Log:
    """Closed and opened again: every segment trusted, nothing checked yet."""
    log.close()
    return make(tmp_path, clock, segment_bytes_max=16 * 1024)


@pytest.fixture
def damaged(tmp_path: Path, clock: Clock) -> tuple[Log, int]:
    """A log of 3 segments of 100-byte records, reopened, with bits flipped in the value of
    the record at `offset` (in the first, sealed, segment)."""
    log = make(tmp_path, clock, segment_bytes_max=16 * 1024)
    append_n(log, 300)
    log = reopened(log, tmp_path, clock)
    assert len(log.segment_base_offsets) >= 3
    offset = 40
    segment = log._segments[0]
    location = segment.find(offset)
    assert location is not None
    flip(segment.log_path, location.position + location.header.size - 10)
    return log, offset


def test_writes_and_scans_are_checked_but_trusted_segments_are_not(
        tmp_path: Path, clock: Clock) -> None:
    log = make(tmp_path, clock, segment_bytes_max=16 * 1024)
    append_n(log, 50)
    active = log._segments.active
    assert active.verified.covers(0, active.size)  # appended by this process
    log = reopened(log, tmp_path, clock)
    active = log._segments.active
    assert not active.verified.covers(0, active.size)  # opened trusting the recovery point
    read_all(log)
    assert active.verified.covers(0, active.size)  # a read checked them


def test_a_read_of_damaged_bytes_raises_with_the_damaged_offsets(
        damaged: tuple[Log, int]) -> None:
    log, offset = damaged
    assert_dense(read_all(log, 0, offset), 0, offset)
    with pytest.raises(CorruptRecord) as err:
        log.read_records(offset)
    assert (err.value.first_offset, err.value.end_offset) == (offset, offset + 1)
    assert [(d.first_offset, d.end_offset, d.reason) for d in log.damage] == [
        (offset, offset + 1, "CRC mismatch")]
    # Everything after the damaged batch reads on.
    assert_dense(read_all(log, offset + 1), offset + 1, 300)
    # Checked bytes are sent unchecked: a read never costs a check twice, unless asked.
    segment = log._segments[0]
    assert segment.verified.covers(0, 100)
    assert not segment.verified.covers(0, segment.size)
    with log.read(0, 1 << 20, upper_bound=offset, verify=True) as piece:
        assert piece.length > 0


def test_a_whole_segment_check_finds_damage_and_a_healthy_copy_repairs_it(
        damaged: tuple[Log, int], tmp_path: Path, clock: Clock) -> None:
    log, offset = damaged
    base = log.segment_base_offsets[0]
    found = log.check_segment(base)
    assert found is not None and (found.first_offset, found.end_offset) == (offset, offset + 1)
    assert log.damage == [found]
    # Another replica's copy of the same offsets: byte for byte what this log wrote.
    healthy = make(tmp_path / "replica", clock, segment_bytes_max=16 * 1024)
    append_n(healthy, 300)
    good, _next = healthy.read_bytes(offset, found.end_position - found.position,
                                     upper_bound=found.end_offset)
    assert log.repair(found, good[:-1]) is not None  # not whole batches: refused
    assert log.repair(found, good) is None
    assert log.damage == []
    assert log.check_segment(base) is None
    assert_dense(read_all(log), 0, 300)
    # The repair is on disk: a fresh open reads everything.
    log = reopened(log, tmp_path, clock)
    assert_dense(read_all(log), 0, 300)


def test_a_copy_of_another_length_is_refused(damaged: tuple[Log, int]) -> None:
    log, offset = damaged
    found = log.check_segment(log.segment_base_offsets[0])
    assert found is not None
    other = fmt.encode_batch(offset, 0, [fmt.Record(b"a different layout")], 1)
    why = log.repair(found, other)
    assert why is not None and "bytes" in why
    assert log.damage == [found]


def test_a_damaged_length_field_bounds_the_damage_at_the_next_good_batch(
        tmp_path: Path, clock: Clock) -> None:
    log = make(tmp_path, clock, segment_bytes_max=64 * 1024, index_interval_bytes=1024)
    append_n(log, 200)
    log.close()
    log = make(tmp_path, clock, segment_bytes_max=64 * 1024, index_interval_bytes=1024)
    segment = log._segments[0]
    location = segment.find(50)
    assert location is not None
    flip(segment.log_path, location.position + 8 + 2, 0x40)  # batch_length's high bits
    found = log.check_segment(segment.base_offset)
    assert found is not None and found.first_offset == 50 and found.end_offset > 50
    # It ends at a batch the offset index points at, and everything from there reads on.
    assert found.end_position in segment.offset_index.positions
    assert_dense(read_all(log, found.end_offset), found.end_offset, 200)


def test_damaged_index_files_are_found_and_rebuilt(tmp_path: Path, clock: Clock) -> None:
    log = make(tmp_path, clock, segment_bytes_max=16 * 1024, index_interval_bytes=512)
    append_n(log, 300)
    log.close()
    first = sorted(tmp_path.glob("*.index"))[0]
    data = bytearray(first.read_bytes())
    # Point the second entry at the third entry's batch: well formed, still increasing.
    data[8:16] = data[16:24]
    data[8:12] = (int.from_bytes(data[16:20], "big") - 1).to_bytes(4, "big")
    first.write_bytes(bytes(data))
    log = make(tmp_path, clock, segment_bytes_max=16 * 1024, index_interval_bytes=512)
    segment = log._segments[0]
    assert log.check_segment(segment.base_offset) is None
    assert log.damage == []
    assert_dense(read_all(log), 0, 300)
    # The rebuilt index is on disk again.
    log.close()
    assert first.read_bytes() != bytes(data)
    log = make(tmp_path, clock, segment_bytes_max=16 * 1024, index_interval_bytes=512)
    assert_dense(read_all(log), 0, 300)


def test_damage_goes_with_its_segment(damaged: tuple[Log, int]) -> None:
    log, offset = damaged
    assert log.check_segment(log.segment_base_offsets[0]) is not None
    log.truncate_to(offset)
    assert log.damage == []


def test_a_check_of_the_active_segment_and_a_deleted_one(tmp_path: Path,
                                                         clock: Clock) -> None:
    log = make(tmp_path, clock, segment_bytes_max=16 * 1024)
    append_n(log, 100)
    active = log._segments.active
    assert log.check_segment(active.base_offset) is None
    assert log.check_segment(10**9) is None  # no such segment: nothing to check
    assert active.verified.covers(0, active.size)


def test_pace_hears_every_byte_checked_once(tmp_path: Path, clock: Clock,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The scrubber keeps to its rate by what `pace` hears: every byte of the segment, also
    when a batch runs past the read buffer and is read again whole."""
    monkeypatch.setattr(check, "PACED_CHUNK_BYTES", 4096)
    log = make(tmp_path, clock, segment_bytes_max=1 << 20)
    append_n(log, 100, per_batch=7)  # batches of about 1 KiB: most cross a 4 KiB read
    paced: list[int] = []
    assert log.check_segment(log.segment_base_offsets[0], paced.append) is None
    assert sum(paced) == log.size_bytes
    assert len(paced) > 10 and max(paced) <= 4096


def test_a_whole_sealed_segment_read_is_checked_once_and_names_its_damage(
        damaged: tuple[Log, int], tmp_path: Path, clock: Clock) -> None:
    """`read_segment` (tiered storage's offload): the file's bytes exactly, checked where they
    were not since the log opened; damage raises with its offsets and is recorded."""
    log, offset = damaged
    first, second = log._segments[0], log._segments[1]
    with pytest.raises(CorruptRecord) as err:
        log.read_segment(first.base_offset, first.size, first.next_offset)
    assert (err.value.first_offset, err.value.end_offset) == (offset, offset + 1)
    assert [(d.first_offset, d.end_offset) for d in log.damage] == [(offset, offset + 1)]
    assert not second.verified.covers(0, second.size)
    data = log.read_segment(second.base_offset, second.size, second.next_offset)
    assert data == second.log_path.read_bytes()
    assert second.verified.covers(0, second.size)  # checked now: the next read is not
    assert log.read_segment(second.base_offset, second.size, second.next_offset) == data


def test_a_whole_segment_read_of_a_segment_no_longer_as_planned_raises_segments_changed(
        tmp_path: Path, clock: Clock) -> None:
    log = make(tmp_path, clock, segment_bytes_max=16 * 1024)
    append_n(log, 300)
    sealed, active = log._segments[0], log._segments.active
    for base, size, end in ((sealed.base_offset, sealed.size + 1, sealed.next_offset),
                            (sealed.base_offset, sealed.size, sealed.next_offset - 1),
                            (sealed.base_offset + 1, sealed.size, sealed.next_offset),
                            (active.base_offset, active.size, active.next_offset)):
        with pytest.raises(SegmentsChanged):
            log.read_segment(base, size, end)
    log.delete_segments_below(sealed.next_offset)
    with pytest.raises(SegmentsChanged):
        log.read_segment(sealed.base_offset, sealed.size, sealed.next_offset)
    log.close()
