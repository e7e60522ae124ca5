"""The Arrow decoder of record batches against the format's own decoder (the model)."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jetstream.spark import arrow_decode as ad
from jetstream.stream import format as fmt

ALL = [f.name for f in ad.ARROW_FIELDS]
EVERY = [*ALL, ad.TOMBSTONE]
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
TS = st.integers(-(10**12), 4 * 10**12)  # ms: years 1938 to 2096

names = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=6)
subjects = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=10)
records = st.builds(
    fmt.Record,
    value=st.none() | st.binary(max_size=80),
    key=st.none() | st.binary(max_size=10),
    headers=st.just({}) | st.dictionaries(names, st.binary(max_size=6), max_size=3),
    subject=subjects,
    timestamp_ms=TS,
)


@st.composite
def uniform_records(draw: st.DrawFn) -> list[fmt.Record]:
    """Records of one length: every one starts at base + i * stride (the fast path)."""
    n = draw(st.integers(1, 8))
    key_len = draw(st.none() | st.integers(0, 8))
    value_len = draw(st.integers(0, 40))
    subject = draw(subjects)
    out = []
    for _ in range(n):
        fill = draw(st.integers(0, 255))
        key = None if key_len is None else bytes([fill]) * key_len
        # A tombstone is as long as an empty value: both may share a uniform batch.
        value = (draw(st.sampled_from([None, b""])) if value_len == 0
                 else bytes([fill, 255 - fill]) * (value_len // 2) + b"z" * (value_len % 2))
        out.append(fmt.Record(value, key, subject=subject, timestamp_ms=draw(TS)))
    return out


@dataclass(frozen=True)
class Spec:
    """One batch to encode: records (None: a batch compaction emptied) and its gaps."""

    records: list[fmt.Record] | None
    deltas: list[int]
    last_delta: int
    epoch: int


@st.composite
def specs(draw: st.DrawFn) -> Spec:
    epoch = draw(st.integers(0, 2**32 - 1))
    if draw(st.integers(0, 9)) == 0:
        return Spec(None, [], draw(st.integers(0, 5)), epoch)
    recs = draw(uniform_records() | st.lists(records, min_size=1, max_size=6))
    gaps = draw(st.booleans())
    if gaps:  # offsets compaction left: increasing, with holes, the range kept past them
        deltas = sorted(draw(st.sets(st.integers(0, 3 * len(recs)), min_size=len(recs),
                                     max_size=len(recs))))
    else:
        deltas = list(range(len(recs)))
    last = deltas[-1] + (draw(st.integers(0, 3)) if gaps else 0)
    return Spec(recs, deltas, last, epoch)


@dataclass(frozen=True)
class Encoded:
    data: bytes
    bounds: list[tuple[int, int, int]]  # per batch: byte end, base offset, next offset


def encode(batches: list[Spec], base: int = 0) -> Encoded:
    parts, bounds, size = [], [], 0
    for spec in batches:
        if spec.records is None:
            data = fmt.encode_empty_batch(base, spec.epoch, spec.last_delta, 5, 9)
        else:
            data = fmt.encode_batch(base, spec.epoch, spec.records, 0, spec.deltas,
                                    spec.last_delta)
        parts.append(data)
        size += len(data)
        bounds.append((size, base, base + spec.last_delta + 1))
        base += spec.last_delta + 1
    return Encoded(b"".join(parts), bounds)


batch_lists = st.lists(specs(), min_size=0, max_size=4)


def model_rows(data: bytes, timestamps: bool = True) -> list[dict[str, Any]]:
    rows = []
    for r in fmt.decode_batches(data):
        row = {
            "stream": "orders", "partition": 7, "offset": r.offset, "subject": r.subject,
            "key": r.key, "value": r.value, "headers": list(r.headers.items()),
            "leader_epoch": r.leader_epoch, ad.TOMBSTONE: r.value is None,
        }
        if timestamps:
            row["timestamp"] = EPOCH + timedelta(milliseconds=r.timestamp_ms)
        rows.append({c: row[c] for c in EVERY if c in row})
    return rows


def decode(data: bytes | memoryview, columns: list[str] = EVERY, start: int = 0,
           end: int = 2**63 - 1, **kwargs: Any) -> ad.Decoded:
    return ad.decode(data, stream="orders", partition=7, columns=columns, start=start,
                     end=end, **kwargs)


@settings(max_examples=300)
@given(batches=batch_lists)
def test_decode_equals_the_format_decoder(batches: list[Spec]) -> None:
    encoded = encode(batches, base=1000)
    decoded = decode(encoded.data)
    assert decoded.batch.schema == ad.arrow_schema(EVERY)
    assert decoded.batch.to_pylist() == model_rows(encoded.data)
    assert decoded.consumed == len(encoded.data)
    assert decoded.next_offset == (encoded.bounds[-1][2] if batches else None)


@given(batches=batch_lists, columns=st.lists(st.sampled_from(EVERY), unique=True))
def test_a_subset_of_columns_gives_exactly_those(batches: list[Spec],
                                                 columns: list[str]) -> None:
    encoded = encode(batches)
    got = decode(encoded.data, columns).batch
    assert got.schema.names == columns
    assert got.to_pylist() == [{c: row[c] for c in columns} for row in model_rows(encoded.data)]


@given(batches=batch_lists, data=st.data())
def test_offset_and_timestamp_bounds_select_the_rows(batches: list[Spec],
                                                     data: st.DataObject) -> None:
    encoded = encode(batches, base=50)
    last = encoded.bounds[-1][2] if batches else 50
    start = data.draw(st.integers(40, last + 2))
    end = data.draw(st.integers(start, last + 3))
    low = data.draw(st.none() | TS)
    high = data.draw(st.none() | TS)
    got = decode(encoded.data, start=start, end=end, timestamp_min_ms=low,
                 timestamp_max_ms=high)
    expected = [
        row for row in model_rows(encoded.data)
        if start <= row["offset"] < end
        and (low is None or row["timestamp"] >= EPOCH + timedelta(milliseconds=low))
        and (high is None or row["timestamp"] <= EPOCH + timedelta(milliseconds=high))
    ]
    assert got.batch.to_pylist() == expected
    # The walk stops before the first batch at or past `end`.
    walked = [(stop, nxt) for stop, base, nxt in encoded.bounds if base < end]
    assert got.consumed == (walked[-1][0] if walked else 0)
    assert got.next_offset == (walked[-1][1] if walked else None)


@given(batches=st.lists(specs(), min_size=1, max_size=4), data=st.data())
def test_a_trailing_partial_batch_is_left(batches: list[Spec], data: st.DataObject) -> None:
    encoded = encode(batches)
    whole = encoded.bounds[-2][0] if len(batches) > 1 else 0
    cut = data.draw(st.integers(whole, len(encoded.data) - 1))
    got = decode(memoryview(encoded.data)[:cut])
    assert got.consumed == whole
    assert got.next_offset == (encoded.bounds[-2][2] if len(batches) > 1 else None)
    assert got.batch.to_pylist() == model_rows(encoded.data[:whole])


@given(batches=st.lists(specs(), min_size=1, max_size=4), data=st.data())
def test_a_flipped_byte_is_a_format_error(batches: list[Spec], data: st.DataObject) -> None:
    encoded = encode(batches)
    starts = [0] + [stop for stop, _, _ in encoded.bounds[:-1]]
    i = data.draw(st.integers(0, len(batches) - 1))
    # Past base_offset and batch_length: a flip there may just move the batch's end.
    at = data.draw(st.integers(starts[i] + fmt.LOG_OVERHEAD.size, encoded.bounds[i][0] - 1))
    damaged = bytearray(encoded.data)
    damaged[at] ^= data.draw(st.integers(1, 255))
    with pytest.raises(fmt.BatchFormatError, match="offset"):
        decode(bytes(damaged))


def reseal(batch: bytearray) -> None:
    """Give a batch whose bytes were changed the CRC of its new bytes."""
    crc = fmt.crc32c(batch[fmt.CRC_START:], fmt.crc32c(batch[:fmt.CRC_OFFSET]))
    batch[fmt.CRC_OFFSET:fmt.CRC_START] = crc.to_bytes(4, "big")


@settings(max_examples=300)
@given(batches=st.lists(specs(), min_size=1, max_size=3), data=st.data())
def test_malformed_records_fail_as_in_the_format_decoder(batches: list[Spec],
                                                         data: st.DataObject) -> None:
    """A damaged batch with a valid CRC (a writer's bug): decode fails where the format's
    decoder does, and otherwise gives the same rows."""
    encoded = encode(batches)
    starts = [0] + [stop for stop, _, _ in encoded.bounds[:-1]]
    i = data.draw(st.integers(0, len(batches) - 1))
    batch = bytearray(encoded.data[starts[i]:encoded.bounds[i][0]])
    at = data.draw(st.integers(fmt.CRC_OFFSET + 4, len(batch) - 1))
    batch[at] ^= data.draw(st.integers(1, 255))
    reseal(batch)
    damaged = encoded.data[:starts[i]] + bytes(batch) + encoded.data[encoded.bounds[i][0]:]
    try:
        expected: list[dict[str, Any]] | None = model_rows(damaged, timestamps=False)
    except (fmt.BatchFormatError, UnicodeDecodeError, struct.error):
        expected = None
    if expected is None:
        with pytest.raises(fmt.BatchFormatError):
            decode(damaged)
    else:
        columns = [c for c in EVERY if c != "timestamp"]  # a changed delta may overflow
        assert decode(damaged, columns).batch.to_pylist() == [
            {c: row[c] for c in columns} for row in expected]


def test_records_of_one_length_and_mixed_lengths_in_one_buffer() -> None:
    uniform = [fmt.Record(b"v" * 10, b"k%d" % i, subject="a.b", timestamp_ms=i)
               for i in range(5)]
    mixed = [fmt.Record(b"v" * i, None if i % 2 else b"key", {"h": b"1"} if i == 3 else {},
                        "é" * i, i) for i in range(6)]
    data = (fmt.encode_batch(0, 1, uniform, 0) + fmt.encode_batch(5, 2, mixed, 0)
            + fmt.encode_empty_batch(11, 2, 3, 0, 0) + fmt.encode_batch(15, 2, uniform, 0))
    assert decode(data).batch.to_pylist() == model_rows(data)


def test_a_length_field_that_breaks_the_stride_is_walked_and_caught() -> None:
    """Equal-sized records whose length fields disagree with the stride: the batch is
    walked record by record, which finds the damage."""
    batch = bytearray(fmt.encode_batch(0, 0, [fmt.Record(b"abcd", b"k")] * 4, 0))
    second = fmt.BATCH_HEADER.size + fmt.RECORD_HEADER.size + 5
    struct.pack_into(">I", batch, second, 1)
    reseal(batch)
    with pytest.raises(fmt.BatchFormatError, match="offset 0"):
        decode(bytes(batch))


def test_an_offset_delta_past_the_batch_is_caught() -> None:
    batch = bytearray(fmt.encode_batch(9, 0, [fmt.Record(b"a"), fmt.Record(b"b")], 0))
    struct.pack_into(">I", batch, fmt.BATCH_HEADER.size + 4, 5)
    reseal(batch)
    with pytest.raises(fmt.BatchFormatError, match="offset 9"):
        decode(bytes(batch))


def test_an_empty_batch_with_record_bytes_is_caught() -> None:
    batch = bytearray(fmt.encode_batch(4, 0, [fmt.Record(b"a")], 0))
    struct.pack_into(">I", batch, fmt.BATCH_HEADER.size - 4, 0)  # record_count
    reseal(batch)
    with pytest.raises(fmt.BatchFormatError, match="offset 4"):
        decode(bytes(batch))


@pytest.mark.parametrize("field", ["subject", "header"])
def test_text_that_is_not_utf8_is_caught(field: str) -> None:
    record = fmt.Record(b"v", b"k", {"name": b"x"}, "subj", 0)
    batch = bytearray(fmt.encode_batch(6, 0, [fmt.Record(b"ok", subject="fine"), record], 0))
    text = b"subj" if field == "subject" else b"name"
    batch[batch.index(text)] = 0xFF
    reseal(batch)
    with pytest.raises(UnicodeDecodeError):
        fmt.decode_batches(bytes(batch))
    with pytest.raises(fmt.BatchFormatError, match="offset 7"):
        decode(bytes(batch))
    # Not asked for, the column is not decoded: its bytes are not checked either.
    assert decode(bytes(batch), ["offset", "key"]).batch.num_rows == 2


def test_a_narrow_read_never_touches_values(monkeypatch: pytest.MonkeyPatch) -> None:
    records = [fmt.Record(b"x" * (100 + i), b"k%d" % i, {"h": b"v"}, "subject")
               for i in range(3)]
    data = fmt.encode_batch(0, 0, records, 0)
    gathered: list[int] = []
    real = ad._gather

    def spy(view: memoryview, starts: Any, lengths: Any) -> Any:
        gathered.append(int(lengths.sum()))
        return real(view, starts, lengths)

    monkeypatch.setattr(ad, "_gather", spy)
    got = decode(data, ["partition", "offset", "key"]).batch
    assert got.to_pylist() == [{"partition": 7, "offset": i, "key": b"k%d" % i}
                               for i in range(3)]
    assert gathered == [6]  # the keys, and nothing else


def test_rows_without_columns_still_count() -> None:
    data = fmt.encode_batch(0, 0, [fmt.Record(b"a"), fmt.Record(b"b")], 0)
    assert decode(data, []).batch.num_rows == 2


def test_empty_and_unknown_columns() -> None:
    assert decode(b"").batch.num_rows == 0
    assert decode(b"").next_offset is None
    with pytest.raises(ValueError, match="unknown"):
        decode(b"", ["offset", "nope"])
    with pytest.raises(ValueError, match="twice"):
        decode(b"", ["offset", "offset"])
    assert ad.SPARK_DDL.startswith("`stream` STRING, `partition` INT, `offset` BIGINT")


keyed = st.builds(fmt.Record, value=st.none() | st.binary(max_size=3),
                  key=st.none() | st.sampled_from([b"a", b"b", b"c", b""]),
                  headers=st.just({}), subject=st.just(""), timestamp_ms=st.just(1))


@given(batches=st.lists(st.lists(keyed, min_size=1, max_size=6), max_size=5),
       columns=st.lists(st.sampled_from(ALL), unique=True))
def test_latest_per_key_equals_a_dict(batches: list[list[fmt.Record]],
                                      columns: list[str]) -> None:
    data, base = b"", 0
    for recs in batches:
        data += fmt.encode_batch(base, 0, recs, 1)
        base += len(recs)
    chunks = [decode(data, ["key", "offset", "value", ad.TOMBSTONE], start=k, end=k + 4).batch
              for k in range(0, base, 4)]
    latest: dict[bytes, dict[str, Any]] = {}
    for row in model_rows(data):
        if row["key"] is not None:
            latest[row["key"]] = row
    expected = sorted((r for r in latest.values() if r["value"] is not None),
                      key=lambda r: r["offset"])
    wanted = [c for c in columns if c in ("key", "offset", "value")]
    got = ad.latest_per_key(chunks, wanted)
    assert got.column_names == wanted
    if len(chunks) == 1:
        assert ad.latest_per_key(chunks[0], wanted).equals(got)
    assert got.to_pylist() == [{c: r[c] for c in wanted} for r in expected]
    assert ad.latest_per_key(pa.Table.from_batches(chunks, ad.arrow_schema(
        ["key", "offset", "value", ad.TOMBSTONE])), wanted).equals(got)


def test_latest_per_key_needs_its_helper_columns() -> None:
    rows = decode(fmt.encode_batch(0, 0, [fmt.Record(b"v", b"k")], 0), ["key", "offset"])
    with pytest.raises(ValueError, match="_tombstone"):
        ad.latest_per_key(rows.batch, ["key"])
    assert ad.latest_per_key([], ["key"]).column_names == ["key"]
