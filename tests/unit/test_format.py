"""Round trips and damage detection of the record batch format."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jetstream.stream import format as fmt

names = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=20)
records = st.builds(
    fmt.Record,
    value=st.none() | st.binary(max_size=300),
    key=st.none() | st.binary(max_size=40),
    headers=st.dictionaries(names, st.binary(max_size=40), max_size=4),
    subject=st.text(max_size=30),
    timestamp_ms=st.none() | st.integers(0, 2**50),
)


@given(
    base=st.integers(0, 2**62),
    epoch=st.integers(0, 2**32 - 1),
    batch=st.lists(records, min_size=1, max_size=20),
    now=st.integers(0, 2**50),
)
def test_batch_round_trip(base: int, epoch: int, batch: list[fmt.Record], now: int) -> None:
    data = fmt.encode_batch(base, epoch, batch, now)
    header = fmt.parse_header(data)
    assert header.size == len(data)
    assert (header.base_offset, header.leader_epoch, header.record_count) == (
        base, epoch, len(batch))
    assert header.last_offset == base + len(batch) - 1
    assert fmt.verify_crc(data, 0, header)
    decoded = fmt.decode_batches(data)
    assert [r.offset for r in decoded] == list(range(base, base + len(batch)))
    for record, got in zip(batch, decoded, strict=True):
        assert got.value == record.value
        assert got.key == record.key
        assert dict(got.headers) == dict(record.headers)
        assert got.subject == record.subject
        assert got.timestamp_ms == (now if record.timestamp_ms is None else record.timestamp_ms)
        assert got.leader_epoch == epoch
    assert header.max_timestamp == max(r.timestamp_ms for r in decoded)
    assert sum(fmt.record_size(r) for r in batch) + fmt.BATCH_HEADER.size == len(data)


def test_a_null_value_is_not_an_empty_value() -> None:
    batch = [fmt.Record(None, b"k"), fmt.Record(b"", b"k"), fmt.Record(None), fmt.Record(b"v")]
    data = fmt.encode_batch(0, 0, batch, 5)
    assert [r.value for r in fmt.decode_batches(data)] == [None, b"", None, b"v"]
    # A tombstone stores no value bytes: its record is as long as the empty value's.
    assert fmt.record_size(batch[0]) == fmt.record_size(batch[1])


@given(batch=st.lists(records, min_size=1, max_size=5), data=st.data())
def test_any_flipped_bit_is_detected(batch: list[fmt.Record], data: st.DataObject) -> None:
    encoded = bytearray(fmt.encode_batch(7, 1, batch, 1000))
    bit = data.draw(st.integers(0, len(encoded) * 8 - 1))
    encoded[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(fmt.BatchFormatError):
        decoded = fmt.decode_batches(bytes(encoded))
        # A flip in base_offset or batch_length can leave a shorter, still well-formed prefix
        # or nothing at all; either way the original batch must not come back intact.
        if not decoded or decoded[0].offset != 7:
            raise fmt.BatchFormatError("changed")


def test_min_offset_skips_records_before_the_requested_offset() -> None:
    data = fmt.encode_batch(10, 0, [fmt.Record(b"a"), fmt.Record(b"b"), fmt.Record(b"c")], 5)
    assert [r.offset for r in fmt.decode_batches(data, min_offset=11)] == [11, 12]
    assert fmt.decode_batches(data, min_offset=13) == []


def test_trailing_partial_batch_is_ignored() -> None:
    one = fmt.encode_batch(0, 0, [fmt.Record(b"x")], 1)
    two = fmt.encode_batch(1, 0, [fmt.Record(b"y")], 1)
    assert [r.value for r in fmt.decode_batches(one + two[:-3])] == [b"x"]


@given(st.lists(st.integers(1, 4), min_size=0, max_size=6), st.integers(0, 40))
def test_the_last_whole_batch_is_found_by_lengths_alone(sizes: list[int], cut: int) -> None:
    batches = []
    for i, count in enumerate(sizes):
        base = sum(sizes[:i])
        batches.append(fmt.encode_batch(base, i, [fmt.Record(b"v" * i)] * count, 1))
    data = b"".join(batches)
    data = data[:len(data) - cut] if cut < len(data) else b""
    whole = [pos for pos, _header in fmt.iter_batches(data, verify=False)]
    assert fmt.last_batch_position(data) == (whole[-1] if whole else None)


def test_rebase_keeps_offset_gaps() -> None:
    data = fmt.encode_batch(100, 3, [fmt.Record(b"a"), fmt.Record(b"b")], 9, offset_deltas=[0, 5])
    records = fmt.decode_batches(data)
    assert [r.offset for r in records] == [100, 105]
    again = fmt.rebase_batch(data, records[:1])
    header = fmt.parse_header(again)
    assert (header.base_offset, header.last_offset, header.leader_epoch) == (100, 100, 3)


def test_skip_held_drops_and_splits_what_the_follower_has() -> None:
    recs = [fmt.Record(f"v{i}".encode(), key=b"k", headers={"h": b"1"}, subject="s",
                       timestamp_ms=1000 + i) for i in range(6)]
    first = fmt.encode_batch(10, 4, recs[:3], 1000)  # 10..12
    second = fmt.encode_batch(13, 5, recs[3:], 1003)  # 13..15
    data = first + second
    assert fmt.skip_held(data, 10) is data
    assert fmt.skip_held(data, 13) == second
    assert fmt.skip_held(data, 16) == b""
    split = fmt.skip_held(data, 11)
    assert fmt.parse_header(split).base_offset == 11
    whole = {r.offset: r for r in fmt.decode_batches(data)}
    got = fmt.decode_batches(split)
    assert [r.offset for r in got] == [11, 12, 13, 14, 15]
    assert all(r == whole[r.offset] for r in got)  # every field kept, epochs too


def test_an_empty_batch_keeps_its_range_and_decodes_to_nothing() -> None:
    empty = fmt.encode_empty_batch(10, 3, 4, 1000, 1005)
    header = fmt.parse_header(empty)
    assert (header.base_offset, header.last_offset, header.record_count) == (10, 14, 0)
    assert (header.first_timestamp, header.max_timestamp, header.size) == (1000, 1005,
                                                                           len(empty))
    assert fmt.verify_crc(empty, 0, header)
    after = fmt.encode_batch(15, 3, [fmt.Record(b"v")], 2000)
    assert fmt.decode_batches(empty + after) == fmt.decode_batches(after)
    flipped = bytearray(empty)
    flipped[-1] ^= 1
    with pytest.raises(fmt.BatchFormatError):
        fmt.decode_batches(bytes(flipped))


def test_a_compacted_batch_keeps_the_range_past_its_last_record() -> None:
    data = fmt.encode_batch(100, 1, [fmt.Record(b"a"), fmt.Record(None, b"k")], 7,
                            offset_deltas=[2, 5], last_offset_delta=9)
    header = fmt.parse_header(data)
    assert (header.base_offset, header.next_offset, header.record_count) == (100, 110, 2)
    assert [(r.offset, r.value) for r in fmt.decode_batches(data)] == [(102, b"a"), (105, None)]
    with pytest.raises(ValueError, match="range"):
        fmt.encode_batch(0, 0, [fmt.Record(b"a")], 0, offset_deltas=[3], last_offset_delta=2)


def test_skip_held_keeps_the_range_of_a_straddling_batch() -> None:
    data = fmt.encode_batch(0, 1, [fmt.Record(b"a"), fmt.Record(b"b")], 7,
                            offset_deltas=[0, 2], last_offset_delta=6)
    rest = fmt.skip_held(data, 3)  # offsets 3..6 hold no record any more
    header = fmt.parse_header(rest)
    assert (header.base_offset, header.next_offset, header.record_count) == (3, 7, 0)
    rest = fmt.skip_held(data, 1)
    header = fmt.parse_header(rest)
    assert (header.base_offset, header.next_offset) == (1, 7)
    assert [r.offset for r in fmt.decode_batches(rest)] == [2]


# -- the C loop against the Python loop -----------------------------------------------------------

plain_records = st.builds(
    fmt.Record,
    value=st.none() | st.binary(max_size=300),
    key=st.none() | st.binary(max_size=40),
    headers=st.just(fmt.NO_HEADERS) | st.just({}) | st.dictionaries(
        names | st.sampled_from(["Nats-Msg-Id", "x\udcff"]), st.binary(max_size=8), max_size=3),
    subject=st.text(max_size=30) | st.sampled_from(["", "bench.in", "x\udcff", "é" * 10]),
    timestamp_ms=st.none() | st.integers(0, 2**50) | st.integers(-2**64, 2**64),
)


@given(batch=st.lists(plain_records, min_size=1, max_size=20),
       now=st.integers(0, 2**50) | st.integers(-2**63, 2**63 - 1),
       limit=st.none() | st.integers(0, 400))
def test_the_c_loop_encodes_what_the_python_loop_encodes(batch: list[fmt.Record], now: int,
                                                         limit: int | None) -> None:
    """The same bytes and timestamps, or declined where the Python loop raises."""
    if not fmt.ACCELERATED:
        pytest.skip("the C loop is not built here")
    from jetstream.stream import _format_c
    try:
        want: tuple[bytes, int, int] | None = fmt._encode_records(batch, now, None, limit)
    except (ValueError, struct.error, UnicodeEncodeError):  # RecordTooLargeToEncode included
        want = None
    got = _format_c.encode_records(batch, now, -1 if limit is None else limit, fmt.Record)
    assert got == want  # declined (None) exactly where the Python loop raises
