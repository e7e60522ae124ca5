"""The on-disk and on-the-wire record batch format, declared once.

Theory of operation: the leader appends records in batches, one batch per append, and the
batch is the unit of everything afterwards: it is written to the segment file as is, copied
byte for byte to followers, and sent to consumers straight from the file (zero copy). So the
same bytes are the storage format and the wire format; clients decode them with
`decode_batches`. The design follows Kafka's record batch v2 with fixed-width fields instead of
varints (cheaper to encode and decode in Python).

    RecordBatch (big-endian), 47-byte header then the records:
      base_offset        i64  offset of the first record
      batch_length       u32  bytes after this field, to the end of the batch
      leader_epoch       u32  epoch of the leader that appended the batch
      magic              u8   format version, 1
      crc                u32  CRC32C of every other byte of the batch: the 17 bytes before
                              this field, then everything after it
      attributes         u16  reserved (compression, control batches), 0
      last_offset_delta  u32  last offset the batch covers minus base_offset (after compaction
                              the batch keeps its range even where its records are gone)
      first_timestamp    i64  ms since the Unix epoch, of the first record
      max_timestamp      i64  largest record timestamp in the batch
      record_count       u32  0 only in a batch the log cleaner emptied: it keeps its offset
                              range so the log stays contiguous (readers skip it)
    Record, repeated record_count times:
      length             u32  bytes after this field, to the end of the record
      offset_delta       u32  record offset minus base_offset (gaps allowed: compaction)
      timestamp_delta    i64  record timestamp minus first_timestamp
      key_length         i32  -1 when the record has no key
      value_length       u32  NULL_VALUE_LENGTH (0xFFFFFFFF) when the value is null: a
                              tombstone (a null value is not the empty value b"")
      subject_length     u16  NATS subject the record arrived on, UTF-8, may be empty
      header_count       u16
      key, value, subject bytes
      header, repeated header_count times:
        name_length u16, name (UTF-8), value_length u32, value
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Mapping, Sequence
from types import MappingProxyType, ModuleType
from typing import Any, NamedTuple, TypeVar

import crc32c as _crc32c

_format_c: ModuleType | None
try:  # the records loop in C, when it was built (setup.py; optional)
    from jetstream.stream import _format_c
except ImportError:  # pragma: no cover - a build without a C compiler
    _format_c = None

#: Whether `encode_batch_parts` encodes its records in C (built at install; the
#: Python loop makes the same bytes, slower, without it).
ACCELERATED = _format_c is not None

MAGIC = 1

# base_offset | batch_length: the part of the header outside the CRC and the length.
LOG_OVERHEAD = struct.Struct(">qI")
assert LOG_OVERHEAD.size == 12

BATCH_HEADER = struct.Struct(">qIIBIHIqqI")
assert BATCH_HEADER.size == 47
# The CRC covers every byte but its own: [0, CRC_OFFSET) and [CRC_START, end).
CRC_OFFSET = 8 + 4 + 4 + 1
CRC_START = CRC_OFFSET + 4
assert CRC_START == 21
# A batch_length smaller than this cannot hold the header.
BATCH_LENGTH_MIN = BATCH_HEADER.size - LOG_OVERHEAD.size
# Everything after the CRC field: attributes .. record_count.
_AFTER_CRC = struct.Struct(">HIqqI")
assert CRC_START + _AFTER_CRC.size == BATCH_HEADER.size
BEFORE_CRC = struct.Struct(">qIIB")
_BEFORE_CRC = BEFORE_CRC
assert _BEFORE_CRC.size == CRC_OFFSET

RECORD_HEADER = struct.Struct(">IIqiIHH")
assert RECORD_HEADER.size == 28
_RECORD_HEADER_AFTER_LENGTH = RECORD_HEADER.size - 4

#: `value_length` of a record whose value is null (a tombstone, with a key).
NULL_VALUE_LENGTH = 0xFFFFFFFF

HEADER_NAME = struct.Struct(">H")
HEADER_VALUE = struct.Struct(">I")

U16_MAX = 0xFFFF
U32_MAX = 0xFFFFFFFF

crc32c = _crc32c.crc32c
_T = TypeVar("_T", bound=tuple[Any, ...])

#: The headers of every record that has none (read-only, shared).
NO_HEADERS: Mapping[str, bytes] = MappingProxyType({})


class Record(NamedTuple):
    """A record to append. `timestamp_ms` None means: stamp it with the log's clock. A null
    `value` (None) is a tombstone: on a compacted stream it deletes its key.
    (A named tuple: the broker builds one per message it ingests.)"""

    value: bytes | None
    key: bytes | None = None
    headers: Mapping[str, bytes] = NO_HEADERS
    subject: str = ""
    timestamp_ms: int | None = None


class StoredRecord(NamedTuple):
    """A record read back from the log, with the offset and timestamp it was given.
    (A named tuple: decoding builds hundreds of thousands a second.)"""

    offset: int
    timestamp_ms: int
    value: bytes | None
    key: bytes | None
    headers: Mapping[str, bytes]
    subject: str
    leader_epoch: int


class BatchHeader(NamedTuple):
    """A batch's header as stored. (A named tuple: every append, read and recovery parses
    one per batch.)"""

    base_offset: int
    batch_length: int
    leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    first_timestamp: int
    max_timestamp: int
    record_count: int

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def size(self) -> int:
        """Bytes of the whole batch, header included."""
        return LOG_OVERHEAD.size + self.batch_length


class BatchFormatError(ValueError):
    """Bytes that do not form a valid batch. Callers translate it into their own error."""


def record_size(record: Record) -> int:
    """Encoded size of one record, header included."""
    size = RECORD_HEADER.size + len(record.subject.encode())
    if record.value is not None:
        size += len(record.value)
    if record.key is not None:
        size += len(record.key)
    for name, value in record.headers.items():
        size += HEADER_NAME.size + len(name.encode()) + HEADER_VALUE.size + len(value)
    return size


class RecordTooLargeToEncode(ValueError):
    """A record whose encoded size passes the limit `encode_batch_parts` was given."""

    def __init__(self, size: int) -> None:
        super().__init__(f"a record of {size} bytes")
        self.size = size


#: name -> its encoded length and bytes, for the header names seen most (a bounded cache).
_HEADER_NAMES: dict[str, bytes] = {}
_HEADER_NAMES_MAX = 256


def _header_name(name: str) -> bytes:
    encoded = name.encode()
    prefixed = HEADER_NAME.pack(len(encoded)) + encoded
    if len(_HEADER_NAMES) < _HEADER_NAMES_MAX:
        _HEADER_NAMES[name] = prefixed
    return prefixed


def encode_batch_parts(
    base_offset: int,
    leader_epoch: int,
    records: Sequence[Record],
    now_ms: int,
    offset_deltas: Sequence[int] | None = None,
    last_offset_delta: int | None = None,
    record_bytes_max: int | None = None,
) -> tuple[bytes, bytes]:
    """Encode `records` as one batch at `base_offset`, as (47-byte header, records bytes):
    written with one pwritev, a large batch is never copied into one buffer again. Records
    without a timestamp get now_ms. `offset_deltas` (increasing) keeps the offsets of a batch
    that has gaps; by default the records take consecutive offsets. `last_offset_delta` keeps
    a range that ends past the last record (a compacted batch); by default it ends there.
    A record larger than `record_bytes_max` (header included) raises
    RecordTooLargeToEncode."""
    if not records:
        raise ValueError("a batch holds at least one record")
    if offset_deltas is not None and len(offset_deltas) != len(records):
        raise ValueError("one offset delta per record")
    encoded = None if _format_c is None or offset_deltas is not None else \
        _format_c.encode_records(records, now_ms,
                                 -1 if record_bytes_max is None else record_bytes_max, Record)
    if encoded is None:  # declined (or no C part): the same bytes, or its error, from Python
        encoded = _encode_records(records, now_ms, offset_deltas, record_bytes_max)
    body, first_ts, max_ts = encoded
    last_delta = len(records) - 1 if offset_deltas is None else offset_deltas[-1]
    if last_offset_delta is not None:
        if last_offset_delta < last_delta:
            raise ValueError("the batch's range must hold its records")
        last_delta = last_offset_delta
    after_crc = _AFTER_CRC.pack(0, last_delta, first_ts, max_ts, len(records))
    batch_length = BATCH_HEADER.size - LOG_OVERHEAD.size + len(body)
    before_crc = _BEFORE_CRC.pack(base_offset, batch_length, leader_epoch, MAGIC)
    crc = crc32c(body, crc32c(after_crc, crc32c(before_crc)))
    return b"".join((before_crc, crc.to_bytes(4, "big"), after_crc)), body


def _encode_records(records: Sequence[Record], now_ms: int, offset_deltas: Sequence[int] | None,
                    record_bytes_max: int | None) -> tuple[bytes, int, int]:
    """The records of a batch in Python: (their bytes, first timestamp, largest timestamp)."""
    first_ts = records[0].timestamp_ms
    if first_ts is None:
        first_ts = now_ms
    max_ts = first_ts
    parts: list[bytes] = []
    append = parts.append
    pack_record = RECORD_HEADER.pack
    for i, record in enumerate(records):
        delta = i if offset_deltas is None else offset_deltas[i]
        ts = record.timestamp_ms
        if ts is None:
            ts = now_ms
        if ts > max_ts:
            max_ts = ts
        key = record.key
        value = record.value
        if value is None:
            value, value_len = b"", NULL_VALUE_LENGTH
        else:
            value_len = len(value)
        subject = record.subject.encode() if record.subject else b""
        headers = record.headers
        if headers:
            hparts = []
            for name, hvalue in headers.items():
                hparts.append(_HEADER_NAMES.get(name) or _header_name(name))
                hparts.append(HEADER_VALUE.pack(len(hvalue)))
                hparts.append(hvalue)
            hbytes = b"".join(hparts)
        else:
            hbytes = b""
        if len(subject) > U16_MAX or len(headers) > U16_MAX:
            raise ValueError("subject or header count exceeds 65535")
        length = (_RECORD_HEADER_AFTER_LENGTH + len(value) + len(subject) + len(hbytes)
                  + (0 if key is None else len(key)))
        if record_bytes_max is not None and length + 4 > record_bytes_max:
            raise RecordTooLargeToEncode(length + 4)
        if key is None:
            append(pack_record(length, delta, ts - first_ts, -1, value_len, len(subject),
                               len(headers)))
        else:
            append(pack_record(length, delta, ts - first_ts, len(key), value_len, len(subject),
                               len(headers)))
            append(key)
        append(value)
        if subject:
            append(subject)
        if hbytes:
            append(hbytes)
    return b"".join(parts), first_ts, max_ts


def encode_batch(
    base_offset: int,
    leader_epoch: int,
    records: Sequence[Record],
    now_ms: int,
    offset_deltas: Sequence[int] | None = None,
    last_offset_delta: int | None = None,
) -> bytes:
    """Encode `records` as one batch at `base_offset` (see `encode_batch_parts`)."""
    head, body = encode_batch_parts(base_offset, leader_epoch, records, now_ms, offset_deltas,
                                    last_offset_delta)
    return head + body


def encode_empty_batch(base_offset: int, leader_epoch: int, last_offset_delta: int,
                       first_timestamp: int, max_timestamp: int) -> bytes:
    """A batch without records that holds the offsets [base_offset, base_offset +
    last_offset_delta]: what the log cleaner leaves where it removed every record of a run
    of batches, so the log's batches still follow each other without a gap."""
    after_crc = _AFTER_CRC.pack(0, last_offset_delta, first_timestamp, max_timestamp, 0)
    before_crc = _BEFORE_CRC.pack(base_offset, BATCH_LENGTH_MIN, leader_epoch, MAGIC)
    crc = crc32c(after_crc, crc32c(before_crc))
    return b"".join((before_crc, crc.to_bytes(4, "big"), after_crc))


def parse_header(buf: bytes | bytearray | memoryview, pos: int = 0) -> BatchHeader:
    """Parse the batch header at `pos`, checking its structure (not the CRC)."""
    if len(buf) - pos < BATCH_HEADER.size:
        raise BatchFormatError(f"truncated batch header at {pos}")
    header = BatchHeader(*BATCH_HEADER.unpack_from(buf, pos))
    check_header(header)
    return header


def check_header(header: BatchHeader) -> None:
    if header.magic != MAGIC:
        raise BatchFormatError(f"unknown batch magic {header.magic}")
    if header.batch_length < BATCH_LENGTH_MIN:
        raise BatchFormatError(f"batch length {header.batch_length} is too small")
    if header.base_offset < 0:
        raise BatchFormatError(f"negative base offset {header.base_offset}")
    if header.record_count > header.last_offset_delta + 1:
        raise BatchFormatError(
            f"record count {header.record_count} does not fit offset delta "
            f"{header.last_offset_delta}"
        )
    if header.attributes != 0:
        raise BatchFormatError(f"unsupported batch attributes {header.attributes:#x}")


def batch_crc(buf: bytes | bytearray | memoryview, pos: int, end: int) -> int:
    """The CRC the batch in `buf[pos:end]` should carry: of every byte but the CRC field."""
    view = memoryview(buf)
    return crc32c(view[pos + CRC_START:end], crc32c(view[pos:pos + CRC_OFFSET]))


def verify_crc(buf: bytes | bytearray | memoryview, pos: int, header: BatchHeader) -> bool:
    """True when the batch at `pos` (whose header is `header`) matches its CRC."""
    end = pos + header.size
    return end <= len(buf) and batch_crc(buf, pos, end) == header.crc


def iter_batches(
    buf: bytes | bytearray | memoryview, *, verify: bool = True
) -> Iterator[tuple[int, BatchHeader]]:
    """Yield (position, header) of each whole batch in `buf`. A trailing partial batch is
    ignored (a fetch may end mid-batch); a malformed or CRC-failing one raises."""
    pos = 0
    size = len(buf)
    while size - pos >= LOG_OVERHEAD.size:
        header = parse_header(buf, pos) if size - pos >= BATCH_HEADER.size else None
        if header is None or pos + header.size > size:
            return
        if verify and not verify_crc(buf, pos, header):
            raise BatchFormatError(f"CRC mismatch in batch at offset {header.base_offset}")
        yield pos, header
        pos += header.size


def last_batch_position(buf: bytes | bytearray | memoryview) -> int | None:
    """The position of the last whole batch of `buf` (None: no batch), found by a walk over
    the length fields alone: for bytes already checked, where parsing each header would cost
    a bulk copy most of its time."""
    pos, last, size = 0, None, len(buf)
    unpack = LOG_OVERHEAD.unpack_from
    while size - pos >= BATCH_HEADER.size:
        _base, length = unpack(buf, pos)
        end = pos + LOG_OVERHEAD.size + length
        if length < BATCH_LENGTH_MIN or end > size:
            break
        last, pos = pos, end
    return last


def decode_records(
    buf: bytes | bytearray | memoryview, pos: int, header: BatchHeader
) -> list[StoredRecord]:
    """Decode the records of the batch at `pos`. Call `verify_crc` first on untrusted bytes."""
    return decode_records_as(buf, pos, header, StoredRecord, ())


def decode_records_as(
    buf: bytes | bytearray | memoryview, pos: int, header: BatchHeader, cls: type[_T],
    prefix: tuple[Any, ...],
) -> list[_T]:
    """Decode the records of the batch at `pos` straight into `cls`, a named tuple whose
    fields are `prefix`'s then StoredRecord's (a client's message type: no second object per
    record)."""
    end = pos + header.size
    if isinstance(buf, bytes):
        data = buf
    else:  # slicing bytes is the cheapest way to cut values out: copy this batch once
        data, pos, end = bytes(buf[pos:end]), 0, header.size
    out: list[_T] = []
    append = out.append
    base = header.base_offset
    first_ts = header.first_timestamp
    epoch = header.leader_epoch
    last_delta = header.last_offset_delta
    p = pos + BATCH_HEADER.size
    unpack = RECORD_HEADER.unpack_from
    header_size = RECORD_HEADER.size
    new = tuple.__new__
    for _ in range(header.record_count):
        if p + header_size > end:
            raise BatchFormatError("record header runs past the batch")
        length, delta, ts_delta, key_len, value_len, subject_len, header_count = unpack(data, p)
        rec_end = p + 4 + length
        if rec_end > end or delta > last_delta:
            raise BatchFormatError("record runs past the batch")
        p += header_size
        if key_len >= 0:
            key: bytes | None = data[p:p + key_len]
            p += key_len
        else:
            key = None
        if value_len == NULL_VALUE_LENGTH:
            value: bytes | None = None
        else:
            value = data[p:p + value_len]
            p += value_len
        if subject_len:
            subject = data[p:p + subject_len].decode()
            p += subject_len
        else:
            subject = ""
        headers: Mapping[str, bytes] = NO_HEADERS
        if header_count:
            decoded: dict[str, bytes] = {}
            p = _decode_headers(data, p, header_count, decoded)
            headers = decoded
        if p != rec_end:
            raise BatchFormatError("record length does not match its fields")
        append(new(cls, (*prefix, base + delta, first_ts + ts_delta, value, key, headers,
                         subject, epoch)))
    if p != end:
        raise BatchFormatError("batch length does not match its records")
    return out


def _decode_headers(data: bytes, p: int, count: int, headers: dict[str, bytes]) -> int:
    for _h in range(count):
        (name_len,) = HEADER_NAME.unpack_from(data, p)
        p += HEADER_NAME.size
        name = data[p:p + name_len].decode()
        p += name_len
        (value_len,) = HEADER_VALUE.unpack_from(data, p)
        p += HEADER_VALUE.size
        headers[name] = data[p:p + value_len]
        p += value_len
    return p


def decode_batches(
    buf: bytes | bytearray | memoryview, *, min_offset: int = 0, verify: bool = True
) -> list[StoredRecord]:
    """Decode every whole batch in `buf` (a fetch response), dropping records below
    `min_offset` (a fetch starts at the batch holding the requested offset)."""
    return decode_batches_as(buf, StoredRecord, (), min_offset=min_offset, verify=verify)


def decode_batches_as(
    buf: bytes | bytearray | memoryview, cls: type[_T], prefix: tuple[Any, ...], *,
    min_offset: int = 0, verify: bool = True,
) -> list[_T]:
    """`decode_batches` into `cls` (see `decode_records_as`)."""
    out: list[_T] = []
    skip = len(prefix)  # where the offset sits in `cls`
    for pos, header in iter_batches(buf, verify=verify):
        if header.last_offset < min_offset:
            continue
        records = decode_records_as(buf, pos, header, cls, prefix)
        if header.base_offset < min_offset:
            records = [r for r in records if r[skip] >= min_offset]
        out.extend(records)
    return out


def skip_held(data: bytes | memoryview, log_end_offset: int) -> bytes | memoryview:
    """Whole batches `data` (a follower's fetch answer) without the records below
    `log_end_offset`, which the follower holds already: batches wholly below it are dropped,
    and a batch straddling it is re-encoded from its first record at `log_end_offset` on (same
    epoch, offsets, timestamps and contents). Returns `data` itself when it starts there."""
    kept = bytearray()
    for pos, header in iter_batches(data):
        if header.next_offset <= log_end_offset:
            continue
        if header.base_offset >= log_end_offset:
            if not kept and pos == 0:
                return data
            kept += data[pos:]
            break
        suffix = [r for r in decode_records(data, pos, header) if r.offset >= log_end_offset]
        last_delta = header.last_offset - log_end_offset
        if not suffix:  # compaction left no record past log_end_offset: keep the range
            kept += encode_empty_batch(log_end_offset, header.leader_epoch, last_delta,
                                       header.first_timestamp, header.max_timestamp)
            continue
        kept += encode_batch(
            log_end_offset, header.leader_epoch,
            [Record(r.value, r.key, r.headers, r.subject, r.timestamp_ms) for r in suffix],
            suffix[0].timestamp_ms, [r.offset - log_end_offset for r in suffix], last_delta)
    return bytes(kept)


def rebase_batch(batch: bytes, records: Sequence[StoredRecord]) -> bytes:
    """Re-encode a prefix of a batch's records keeping its base offset, epoch and timestamps
    (used to truncate inside a batch)."""
    header = parse_header(batch)
    return encode_batch(
        header.base_offset,
        header.leader_epoch,
        [Record(r.value, r.key, r.headers, r.subject, r.timestamp_ms) for r in records],
        header.first_timestamp,
        [r.offset - header.base_offset for r in records],
    )
