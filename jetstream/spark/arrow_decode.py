"""Decode record batches (jetstream.stream.format) straight into Arrow columns, with numpy.

Theory of operation: Spark reads a stream by decoding committed segment bytes into
pyarrow RecordBatches, so decoding must cost little beside Spark's own Arrow transfer. It
takes three steps over one buffer of whole batches, none of which builds a Python object
per record on the fast path:

1. Batch headers are walked in Python (one per batch, ~100 records): each is checked, its
   CRC32C verified, and batches that cannot hold a wanted row (wholly outside [start, end),
   emptied by compaction, or all older than `timestamp_min_ms`) are left out unread. The
   walk stops at the first batch at or past `end` and before a trailing partial batch.
   A batch whose records region is record_count * L bytes (L >= 28) may hold records of
   one length L; any other batch has its record lengths walked in Python right away (one
   unpack per record, while its bytes are still in the CPU cache from the CRC).
2. Record start positions: a cumulative sum of the strides L of the first kind, the walked
   positions of the second. The 28-byte record headers of all of them are then copied at
   once through an overlapping view of the buffer (one 28-byte numpy element starting at
   every byte: `view[positions]`) and read as a structured dtype with format.RECORD_HEADER's
   layout; a batch taken for uniform whose length fields are not all L - 4 is walked after
   all (so a wrong guess costs time, never correctness).
3. Every wanted column is gathered once for the whole buffer. Variable-length fields (key,
   value, subject) are copied the same way as the headers: one element of L bytes per
   record when every length is L, otherwise in chunks of 64, then 8, then 1 bytes (a
   record's last partial chunk is copied ending at the record's end, overlapping the chunk
   before it, so no copy writes past the record it belongs to). The copies become Arrow
   data buffers with int32 offsets and validity bitmaps (null key: key_length -1;
   tombstone: value_length 0xFFFFFFFF). Nothing keeps a reference to `buf`.

Only the asked columns are gathered: a read of (partition, offset, key) never touches
values. Headers are rare, so they are decoded in Python for the records that have them and
an empty map is built vectorised for the rest. A `_tombstone` column (value is null) lets a
compacted read (`latest_per_key`) run without decoding values.

Checks are those of `format.decode_records_as`, vectorised: a record running past its batch,
field lengths not adding up to the record length, an offset delta past last_offset_delta.
The header bytes of a record are only walked when `headers` is decoded; otherwise its fields
must leave room for them (6 bytes each at least). `first_timestamp` is the first record's
timestamp, not the smallest (producers may set any timestamp), so only `max_timestamp` can
rule a batch out; `timestamp_max_ms` filters rows.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from jetstream.stream import format as fmt

I64 = npt.NDArray[np.int64]
U8 = npt.NDArray[np.uint8]

HEADERS_TYPE = pa.map_(pa.string(), pa.binary())
TIMESTAMP_TYPE = pa.timestamp("us", tz="UTC")

#: The columns a read can produce, in this order, with their Spark DDL types.
ARROW_FIELDS: tuple[pa.Field, ...] = (
    pa.field("stream", pa.string()),
    pa.field("partition", pa.int32()),
    pa.field("offset", pa.int64()),
    pa.field("timestamp", TIMESTAMP_TYPE),
    pa.field("subject", pa.string()),
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("headers", HEADERS_TYPE),
    pa.field("leader_epoch", pa.int64()),
)
_DDL_TYPES = ("STRING", "INT", "BIGINT", "TIMESTAMP", "STRING", "BINARY", "BINARY",
              "MAP<STRING, BINARY>", "BIGINT")
assert len(_DDL_TYPES) == len(ARROW_FIELDS)
SPARK_DDL = ", ".join(f"`{f.name}` {t}" for f, t in zip(ARROW_FIELDS, _DDL_TYPES, strict=True))

#: Extra column, True where the value is null; decoded without touching values.
TOMBSTONE = "_tombstone"
_FIELDS = {f.name: f for f in (*ARROW_FIELDS, pa.field(TOMBSTONE, pa.bool_()))}

# The record header of format.RECORD_HEADER as a numpy structured dtype (same layout).
_NUMPY_CODES = {"I": "u4", "q": "i8", "i": "i4", "H": "u2"}
_RECORD_DTYPE = np.dtype([
    (name, ">" + _NUMPY_CODES[code])
    for name, code in zip(
        ("length", "offset_delta", "timestamp_delta", "key_length", "value_length",
         "subject_length", "header_count"),
        fmt.RECORD_HEADER.format.lstrip(">"), strict=True)
])
assert _RECORD_DTYPE.itemsize == fmt.RECORD_HEADER.size
_RECORD_BYTES = np.dtype(f"V{fmt.RECORD_HEADER.size}")
# The length field counts the bytes after itself; the fields then follow the header.
_AFTER_LENGTH = fmt.RECORD_HEADER.size - 4
_HEADER_MIN = fmt.HEADER_NAME.size + fmt.HEADER_VALUE.size
_U32 = struct.Struct(">I")
# Chunk sizes for copying fields of differing lengths (see the module docstring).
_CHUNKS = (64, 8, 1)
# Offsets of Arrow's binary and string arrays are int32.
BUFFER_BYTES_MAX = 2**31 - 1


class Decoded(NamedTuple):
    """`batch`: the wanted rows; `consumed`: bytes of the whole batches walked (a trailing
    partial batch, or the batches from the first at or past `end`, are left); `next_offset`:
    the next offset after the last batch walked, None when none was."""

    batch: pa.RecordBatch
    consumed: int
    next_offset: int | None


def arrow_schema(columns: Sequence[str]) -> pa.Schema:
    """The schema of a read of `columns` (names of ARROW_FIELDS, or TOMBSTONE)."""
    unknown = [c for c in columns if c not in _FIELDS]
    if unknown:
        raise ValueError(f"unknown columns {unknown}; known: {list(_FIELDS)}")
    if len(set(columns)) != len(columns):
        raise ValueError(f"columns named twice in {list(columns)}")
    return pa.schema([_FIELDS[c] for c in columns])


class _Batches(NamedTuple):
    """The batches whose records are read: one entry per batch."""

    records_at: I64  # position of the first record
    region: I64  # bytes of records
    records: I64  # record_count
    base: I64
    last_delta: I64
    first_ts: I64
    epoch: I64
    stride: I64  # the length of every record, 0 if they differ (then they were walked)


def _scan(view: memoryview, start: int, end: int, ts_min: int | None,
          verify: bool) -> tuple[_Batches, array[int], int, int | None]:
    """The batches to read, the record positions of those not of one record length (walked
    while the batch is in the CPU cache after its CRC), the bytes walked, the next offset."""
    # The same checks as format.parse_header and format.verify_crc, without building a
    # BatchHeader per batch (a third of the cost of a narrow read); a batch failing them is
    # handed to format.check_header for the error.
    rows: list[tuple[int, int, int, int, int, int, int, int]] = []
    walked: array[int] = array("q")
    pos = 0
    size = len(view)
    next_offset: int | None = None
    unpack = fmt.BATCH_HEADER.unpack_from
    while size - pos >= fmt.BATCH_HEADER.size:
        fields = unpack(view, pos)
        base, length, epoch, magic, crc, attributes, last_delta, first_ts, max_ts, count = fields
        if (magic != fmt.MAGIC or length < fmt.BATCH_LENGTH_MIN or base < 0 or attributes
                or count > last_delta + 1):
            try:
                fmt.check_header(fmt.BatchHeader(*fields))
            except fmt.BatchFormatError as exc:
                raise fmt.BatchFormatError(f"malformed batch at offset {base}: {exc}") from None
        batch_end = pos + fmt.LOG_OVERHEAD.size + length
        if base >= end or batch_end > size:
            break
        if verify and crc != fmt.batch_crc(view, pos, batch_end):
            raise fmt.BatchFormatError(f"CRC mismatch in batch at offset {base}")
        if not count and batch_end - pos != fmt.BATCH_HEADER.size:
            raise fmt.BatchFormatError(f"an empty batch holds record bytes at offset {base}")
        next_offset = base + last_delta + 1
        if count and next_offset > start and (ts_min is None or max_ts >= ts_min):
            at = pos + fmt.BATCH_HEADER.size
            region = batch_end - at
            stride = region // count
            if stride * count != region or stride < fmt.RECORD_HEADER.size:
                stride = 0
                _walk(view, at, region, count, base, walked)
            rows.append((at, region, count, base, last_delta, first_ts, epoch, stride))
        pos = batch_end
    table = np.array(rows, dtype=np.int64).reshape(len(rows), len(_Batches._fields)).T
    return _Batches(*(np.ascontiguousarray(c) for c in table)), walked, pos, next_offset


def _walk(view: memoryview, at: int, region: int, count: int, base: int,
          out: array[int]) -> None:
    """Append the record positions of one batch, found by its length fields, to `out`."""
    end = at + region
    last = end - fmt.RECORD_HEADER.size  # where the last record header may start
    append = out.append
    unpack = _U32.unpack_from
    for _ in range(count):
        if at > last:
            raise fmt.BatchFormatError(f"record header runs past the batch at offset {base}")
        append(at)
        (length,) = unpack(view, at)
        at += 4 + length
    if at != end:
        raise fmt.BatchFormatError(f"batch length does not match its records at offset {base}")


def _windows(buf: Any, dtype: np.dtype[Any], size: int) -> npt.NDArray[Any]:
    """`buf` seen as one `dtype` element starting at each of its first bytes (overlapping)."""
    return np.ndarray(shape=(size - dtype.itemsize + 1,), dtype=dtype, buffer=buf,
                      strides=(1,))


def _positions(view: memoryview, b: _Batches, first: I64,
               walked: array[int]) -> tuple[I64, I64, npt.NDArray[Any]]:
    """Start positions of every record of the batches `b`, their length fields and their
    headers; `walked` holds the positions in the batches without a stride."""
    total = int(b.records.sum())
    if total == 0:
        return (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64),
                np.zeros(0, dtype=_RECORD_DTYPE))
    stride = b.stride.copy()
    # Positions as a running sum of steps: the stride within a batch, the jump to the next
    # batch's first record at its start.
    step = np.repeat(stride, b.records)
    last_at = b.records_at + stride * (b.records - 1)
    step[first] = b.records_at - np.concatenate(([0], last_at[:-1]))
    positions = np.cumsum(step)
    walk = stride == 0
    for _pass in range(2):
        if walk.any():
            positions[np.repeat(walk, b.records)] = np.frombuffer(walked, dtype=np.int64)
        # Gathered as plain 28-byte elements (a structured gather copies field by field).
        headers = _windows(view, _RECORD_BYTES, len(view))[positions].view(_RECORD_DTYPE)
        length = headers["length"].astype(np.int64)
        # A batch taken as uniform whose length fields disagree is walked instead.
        wrong = length != np.repeat(stride - 4, b.records)
        if not stride.all():
            wrong &= np.repeat(stride > 0, b.records)
        if not wrong.any():
            return positions, length, headers
        walk = np.zeros(len(stride), dtype=np.bool_)
        walk[np.unique(np.repeat(np.arange(len(b.records)), b.records)[wrong])] = True
        stride[walk] = 0
        walked = array("q")
        for i in np.flatnonzero(walk).tolist():
            _walk(view, int(b.records_at[i]), int(b.region[i]), int(b.records[i]),
                  int(b.base[i]), walked)
    raise AssertionError("walked batches are consistent with their length fields")


def _fail_at(b: _Batches, first: I64, bad: npt.NDArray[np.bool_], what: str) -> None:
    if bad.any():
        record = int(np.argmax(bad))
        batch = int(np.searchsorted(first, record, side="right")) - 1
        raise fmt.BatchFormatError(f"{what} in the batch at offset {int(b.base[batch])}")


def _bitmap(valid: npt.NDArray[np.bool_]) -> pa.Buffer | None:
    return None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))


def _gather(view: memoryview, starts: I64, lengths: I64) -> tuple[U8, npt.NDArray[np.int32]]:
    """The bytes [starts[i], starts[i] + lengths[i]) of every record, back to back, and
    the Arrow offsets into them."""
    if not len(starts):
        return np.zeros(0, dtype=np.uint8), np.zeros(1, dtype=np.int32)
    lo, hi = int(lengths.min()), int(lengths.max())
    if lo == hi:  # one copy of `hi` bytes per record
        offsets = np.arange(len(starts) + 1, dtype=np.int32) * np.int32(hi)
        if not hi:
            return np.zeros(0, dtype=np.uint8), offsets
        data: U8 = _windows(view, np.dtype(f"V{hi}"), len(view))[starts].view(np.uint8)
        return data, offsets
    offsets64 = np.zeros(len(starts) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets64[1:])
    total = int(offsets64[-1])
    data = np.empty(total, dtype=np.uint8)
    out_starts = offsets64[:-1]
    upper = hi + 1
    for chunk in _CHUNKS:
        take = (lengths >= chunk) & (lengths < upper)
        upper = chunk
        if not take.any():
            continue
        src, dst, n = starts[take], out_starts[take], lengths[take]
        whole = n // chunk
        first = np.zeros(len(whole), dtype=np.int64)
        np.cumsum(whole[:-1], out=first[1:])
        step = (np.arange(int(whole.sum()), dtype=np.int64) - np.repeat(first, whole)) * chunk
        dtype = np.dtype(f"V{chunk}")
        source = _windows(view, dtype, len(view))
        target = _windows(data, dtype, total)
        target[np.repeat(dst, whole) + step] = source[np.repeat(src, whole) + step]
        tail = n % chunk != 0
        if tail.any():
            target[(dst + n)[tail] - chunk] = source[(src + n)[tail] - chunk]
    return data, offsets64.astype(np.int32)


def _binary(view: memoryview, starts: I64, lengths: I64, valid: npt.NDArray[np.bool_],
            kind: pa.DataType) -> pa.Array:
    data, offsets = _gather(view, starts, lengths)
    return pa.Array.from_buffers(kind, len(starts), [
        _bitmap(valid), pa.py_buffer(offsets), pa.py_buffer(data)])


def _subjects(view: memoryview, starts: I64, lengths: I64, offsets: I64) -> pa.Array:
    column = _binary(view, starts, lengths, np.ones(len(starts), dtype=np.bool_), pa.string())
    try:
        column.validate(full=True)
    except pa.ArrowInvalid:
        for i, (at, n) in enumerate(zip(starts.tolist(), lengths.tolist(), strict=True)):
            try:
                bytes(view[at:at + n]).decode()
            except UnicodeDecodeError:
                raise fmt.BatchFormatError(
                    f"subject is not UTF-8 at offset {int(offsets[i])}") from None
        raise fmt.BatchFormatError("subjects are not valid UTF-8") from None
    return column


def _constant_string(text: str, n: int) -> pa.Array:
    encoded = text.encode()
    offsets = np.arange(n + 1, dtype=np.int64) * len(encoded)
    if offsets[-1] > BUFFER_BYTES_MAX:
        raise ValueError(f"{n} rows of {text!r} exceed a string array: decode less at once")
    return pa.Array.from_buffers(pa.string(), n, [
        None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(encoded * n)])


def _headers(view: memoryview, starts: I64, ends: I64, counts: I64 | None,
             offsets: I64) -> pa.Array:
    """The headers of each record (`counts` None: no record has any)."""
    n = len(starts)
    entries = np.zeros(n + 1, dtype=np.int32)
    has = np.flatnonzero(counts) if counts is not None else np.zeros(0, dtype=np.intp)
    if not len(has):
        return pa.MapArray.from_arrays(pa.array(entries), pa.array([], pa.string()),
                                       pa.array([], pa.binary()), type=HEADERS_TYPE)
    names: list[str] = []
    values: list[bytes] = []
    sizes = np.zeros(n, dtype=np.int32)
    assert counts is not None
    for i in has.tolist():
        decoded: dict[str, bytes] = {}
        p, end = int(starts[i]), int(ends[i])
        try:
            for _ in range(int(counts[i])):
                (name_len,) = fmt.HEADER_NAME.unpack_from(view, p)
                p += fmt.HEADER_NAME.size
                name = bytes(view[p:p + name_len]).decode()
                p += name_len
                (value_len,) = fmt.HEADER_VALUE.unpack_from(view, p)
                p += fmt.HEADER_VALUE.size
                decoded[name] = bytes(view[p:p + value_len])
                p += value_len
        except (struct.error, UnicodeDecodeError) as exc:
            raise fmt.BatchFormatError(
                f"bad headers at offset {int(offsets[i])}: {exc}") from None
        if p != end:
            raise fmt.BatchFormatError(
                f"record length does not match its fields at offset {int(offsets[i])}")
        names.extend(decoded)
        values.extend(decoded.values())
        sizes[i] = len(decoded)
    np.cumsum(sizes, out=entries[1:])
    return pa.MapArray.from_arrays(pa.array(entries), pa.array(names, pa.string()),
                                   pa.array(values, pa.binary()), type=HEADERS_TYPE)


def decode(buf: bytes | bytearray | memoryview, *, stream: str, partition: int,
           columns: Sequence[str], start: int, end: int, timestamp_min_ms: int | None = None,
           timestamp_max_ms: int | None = None, verify: bool = True) -> Decoded:
    """Decode the whole batches of `buf` into the rows with start <= offset < end (and
    timestamp_min_ms <= timestamp <= timestamp_max_ms when given), as the `columns` asked.
    Raises format.BatchFormatError on a bad CRC (when `verify`) or a malformed batch."""
    schema = arrow_schema(columns)
    view = memoryview(buf).cast("B")
    if len(view) > BUFFER_BYTES_MAX:
        raise ValueError(f"decode at most {BUFFER_BYTES_MAX} bytes at once, not {len(view)}")
    b, walked, consumed, next_offset = _scan(view, start, end, timestamp_min_ms, verify)
    first = np.zeros(len(b.records), dtype=np.int64)
    np.cumsum(b.records[:-1], out=first[1:])
    positions, length, rec = _positions(view, b, first, walked)

    key_len = rec["key_length"].astype(np.int64)
    has_key = key_len >= 0
    np.maximum(key_len, 0, out=key_len)
    value_len = rec["value_length"].astype(np.int64)
    tombstone = value_len == fmt.NULL_VALUE_LENGTH
    value_len[tombstone] = 0
    subject_len = rec["subject_length"].astype(np.int64)
    header_count = rec["header_count"].astype(np.int64)
    # Bytes left for the headers: exactly none without headers, at least 6 per header.
    spare = length - _AFTER_LENGTH
    spare -= key_len
    spare -= value_len
    spare -= subject_len
    any_headers = bool(header_count.any())
    _fail_at(b, first, (spare < header_count * _HEADER_MIN) | ((spare != 0) & (header_count == 0))
             if any_headers else spare != 0, "record length does not match its fields")
    delta = rec["offset_delta"].astype(np.int64)
    if len(delta):
        past = np.maximum.reduceat(delta, first) > b.last_delta
        if past.any():
            raise fmt.BatchFormatError(
                f"record runs past the batch at offset {int(b.base[np.argmax(past)])}")
    offsets = np.repeat(b.base, b.records) + delta
    by_time = timestamp_min_ms is not None or timestamp_max_ms is not None
    timestamps = (np.repeat(b.first_ts, b.records) + rec["timestamp_delta"]
                  if "timestamp" in columns or by_time else None)

    # Rows to keep: only batches straddling start or end, and timestamp bounds, filter.
    picked: slice | npt.NDArray[np.intp] = slice(None)
    n = len(offsets)
    straddle = (b.base < start) | (b.base + b.last_delta >= end)
    if straddle.any() or by_time:
        keep = (offsets >= start) & (offsets < end)
        if timestamps is not None and timestamp_min_ms is not None:
            keep &= timestamps >= timestamp_min_ms
        if timestamps is not None and timestamp_max_ms is not None:
            keep &= timestamps <= timestamp_max_ms
        if not keep.all():
            picked = np.flatnonzero(keep)
            n = len(picked)
            offsets = offsets[picked]
    keys_at = positions[picked] + fmt.RECORD_HEADER.size
    key_len, value_len, subject_len = key_len[picked], value_len[picked], subject_len[picked]

    arrays: list[pa.Array] = []
    for name in columns:
        if name == "stream":
            arrays.append(_constant_string(stream, n))
        elif name == "partition":
            arrays.append(pa.array(np.full(n, partition, dtype=np.int32)))
        elif name == "offset":
            arrays.append(pa.array(offsets))
        elif name == "timestamp":
            assert timestamps is not None
            micros = timestamps[picked] * 1000
            arrays.append(pa.Array.from_buffers(TIMESTAMP_TYPE, n, [None, pa.py_buffer(micros)]))
        elif name == "subject":
            arrays.append(_subjects(view, keys_at + key_len + value_len, subject_len, offsets))
        elif name == "key":
            arrays.append(_binary(view, keys_at, key_len, has_key[picked], pa.binary()))
        elif name == "value":
            arrays.append(_binary(view, keys_at + key_len, value_len, ~tombstone[picked],
                                  pa.binary()))
        elif name == "headers":
            arrays.append(_headers(view, keys_at + key_len + value_len + subject_len,
                                   (positions + 4 + length)[picked],
                                   header_count[picked] if any_headers else None, offsets))
        elif name == "leader_epoch":
            arrays.append(pa.array(np.repeat(b.epoch, b.records)[picked]))
        else:
            assert name == TOMBSTONE
            arrays.append(pa.array(tombstone[picked]))
    if not columns:  # a count: rows without columns (from_arrays would make them 0 rows)
        rows = pa.RecordBatch.from_struct_array(pa.Array.from_buffers(pa.struct([]), n, [None]))
        return Decoded(rows, consumed, next_offset)
    return Decoded(pa.RecordBatch.from_arrays(arrays, schema=schema), consumed, next_offset)


def latest_per_key(rows: pa.Table | pa.RecordBatch | Iterable[pa.RecordBatch],
                   columns: Sequence[str]) -> pa.Table:
    """The rows of a compacted read: per key only the row with the highest offset, unless
    that row is a tombstone; no row without a key; ordered by offset; `columns` only.

    `rows` (of one partition: offsets are unique) must hold `key`, `offset` and TOMBSTONE."""
    if isinstance(rows, pa.Table):
        table = rows
    elif isinstance(rows, pa.RecordBatch):
        table = pa.Table.from_batches([rows])
    else:
        batches = list(rows)
        if not batches:
            return arrow_schema(columns).empty_table()
        table = pa.Table.from_batches(batches)
    missing = {"key", "offset", TOMBSTONE} - set(table.column_names)
    if missing:
        raise ValueError(f"latest_per_key needs the columns {sorted(missing)}")
    arrow_schema(columns)
    keyed = table.select(["key", "offset"]).filter(pc.is_valid(table["key"]))
    latest = keyed.group_by("key", use_threads=False).aggregate([("offset", "max")])
    # Offsets are unique: a row is its key's latest when its offset is a latest offset.
    wanted = pc.and_(pc.is_in(table["offset"], value_set=latest["offset_max"]),
                     pc.invert(table[TOMBSTONE]))
    kept = table.select(list(dict.fromkeys([*columns, "offset"]))).filter(wanted)
    return kept.sort_by("offset").select(list(columns))
