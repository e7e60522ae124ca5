"""The cleaner's offset map (key -> offset of its newest record in the dirty range) and the
fast scan of record keys it is built from (pure: bytes in, values out).

Theory of operation: a pass first reads the dirty range and remembers, per key, the offset of
its newest record; then it rewrites the log keeping a keyed record only if no newer record of
its key is in the map. The map is bounded by a byte budget (`cleaner_buffer_bytes`), counted
as the key's length plus a fixed overhead per entry (a Python dict entry, the bytes object,
the int). Kafka's rule for a full map: the pass ends after the last *whole segment* that fit,
and the next pass goes on from there; `OffsetMap.add_segment` gives that all-or-nothing per
segment.

`scan_keys` reads only what the cleaner needs of each record (offset, key, tombstone or not)
with one `struct.unpack_from` per record and one slice for the key: no record objects. Its
loop is also written in C (jetstream/compaction/_scan_c.c, `ACCELERATED`), which declines any
batch it finds malformed to the Python loop, which raises the error.
"""

from __future__ import annotations

from collections.abc import Iterable
from types import ModuleType

from jetstream.stream import format as fmt

_scan_c: ModuleType | None
try:
    from jetstream.compaction import _scan_c
except ImportError:  # built without a C compiler: the Python loop
    _scan_c = None

#: Whether record keys are scanned by the C loop.
ACCELERATED = _scan_c is not None

#: Bytes one map entry costs beyond its key: dict slot, bytes and int objects.
ENTRY_OVERHEAD_BYTES = 120

KeyInfo = tuple[int, bytes | None, bool]  # offset, key (None: keyless), tombstone

_unpack_record = fmt.RECORD_HEADER.unpack_from
_RECORD_HEADER_SIZE = fmt.RECORD_HEADER.size
_NULL = fmt.NULL_VALUE_LENGTH


def scan_keys(buf: bytes, pos: int, header: fmt.BatchHeader) -> list[KeyInfo]:
    """(offset, key, is_tombstone) of every record of the batch at `pos` of `buf` (whose
    CRC the caller verified). Raises BatchFormatError on a malformed record."""
    if _scan_c is not None:
        found: list[KeyInfo] | None = _scan_c.scan_keys(
            buf, pos, header.size, header.base_offset, header.last_offset_delta,
            header.record_count)
        if found is not None:
            return found
    return _scan_keys(buf, pos, header)


def _scan_keys(buf: bytes, pos: int, header: fmt.BatchHeader) -> list[KeyInfo]:
    """`scan_keys` in Python: the reference, and what decides a batch C declines."""
    out: list[KeyInfo] = []
    append = out.append
    end = pos + header.size
    p = pos + fmt.BATCH_HEADER.size
    base = header.base_offset
    last_delta = header.last_offset_delta
    for _ in range(header.record_count):
        if p + _RECORD_HEADER_SIZE > end:
            raise fmt.BatchFormatError("record header runs past the batch")
        length, delta, _ts, key_len, value_len, _subject, _headers = _unpack_record(buf, p)
        rec_end = p + 4 + length
        if rec_end > end or delta > last_delta:
            raise fmt.BatchFormatError("record runs past the batch")
        if key_len >= 0:
            start = p + _RECORD_HEADER_SIZE
            append((base + delta, buf[start:start + key_len], value_len == _NULL))
        else:
            append((base + delta, None, value_len == _NULL))
        p = rec_end
    if p != end:
        raise fmt.BatchFormatError("batch length does not match its records")
    return out


class OffsetMap:
    """key -> newest offset, within `budget_bytes`."""

    def __init__(self, budget_bytes: int) -> None:
        if budget_bytes <= 0:
            raise ValueError("the offset map needs a positive budget")
        self.budget_bytes = budget_bytes
        self.used_bytes = 0
        self._offsets: dict[bytes, int] = {}
        #: One past the last offset the map covers (the end of the last segment added).
        self.end_offset: int | None = None

    def __len__(self) -> int:
        return len(self._offsets)

    def get(self, key: bytes) -> int | None:
        return self._offsets.get(key)

    def add_segment(self, keys: Iterable[KeyInfo], next_offset: int) -> bool:
        """Add one segment's keys, all or nothing: False (the map unchanged) when they do not
        fit the budget."""
        staged: dict[bytes, int] = {}
        offsets = self._offsets
        used = self.used_bytes
        for offset, key, _tombstone in keys:
            if key is None:
                continue
            if key not in staged and key not in offsets:
                used += len(key) + ENTRY_OVERHEAD_BYTES
                if used > self.budget_bytes:
                    return False
            staged[key] = offset
        offsets.update(staged)
        self.used_bytes = used
        self.end_offset = next_offset
        return True
