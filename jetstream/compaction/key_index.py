"""The key index of a compacted partition replica: key -> its latest committed record, in LMDB.

Theory of operation: the index holds, for every key seen in the partition's committed records
(below the high watermark: never ahead of it), the newest record's offset, timestamp, value
(None for a tombstone) and headers — so `get` answers from one LMDB lookup, without reading
the log. The broker applies committed records in batches as the high watermark moves
(`apply`, from a worker thread: one write transaction per batch), and records the offset it
covers (`covered_offset`: the next offset to index). Compaction never removes a key's newest
record, so it never makes the index stale; retention may remove old records, whose entries
keep their values.

The index is a cache of the log: it is not fsynced per write (`sync=False`), and after a crash
it may be behind the log (it is caught up from `covered_offset`) — or ahead of it, when a power
loss cost the log its unsynced tail: `needs_rebuild` then says so and the broker rebuilds it
from the log. An environment that cannot be opened or read, of another format version or
another incarnation of the stream (`created_version`), is wiped and rebuilt.

    LMDB key   b"\\x00" + key                          (keys up to SHORT_KEY_MAX bytes)
               b"\\x01" + blake2b-256(key)             (longer keys: LMDB keys are bounded)
    LMDB value ENTRY header, then [key (hashed entries only)], value, headers
      ENTRY: offset i64 | timestamp_ms i64 | flags u8 (1: tombstone, 2: hashed key) |
             key_length u32 | value_length u32 | header_count u16
      header: name_length u16 | name (UTF-8) | value_length u32 | value
    meta: b"format" -> u32, b"created_version" -> u64, b"covered" -> u64
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import lmdb

from jetstream.errors import JetstreamError, StorageError
from jetstream.stream import format as fmt
from jetstream.stream.format import StoredRecord
from jetstream.stream.log import Log

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
SHORT_KEY_MAX = 400
KEYS_LIMIT_MAX = 10_000
DEFAULT_MAP_SIZE_BYTES = 1 << 30
#: Descriptors an open index holds: lock.mdb, and data.mdb twice (LMDB writes its meta pages
#: through a second, synchronous descriptor).
ENV_FILES = 3
#: Bytes of log read per index transaction while catching up.
CATCH_UP_READ_BYTES = 1 << 20

ENTRY = struct.Struct(">qqBIIH")
assert ENTRY.size == 27
HEADER_NAME = struct.Struct(">H")
HEADER_VALUE = struct.Struct(">I")
U32 = struct.Struct(">I")
U64 = struct.Struct(">Q")
_TOMBSTONE = 1
_HASHED = 2
_SHORT = b"\x00"
_LONG = b"\x01"
_NO_HEADERS: Mapping[str, bytes] = MappingProxyType({})


class KeyIndexFull(JetstreamError):
    """The key index reached its size limit (`key_index_bytes_max`): get answers what it held
    before. Raise the limit and restart the broker; the index catches up from the log."""

    code = "KEY_INDEX_FULL"


@dataclass(frozen=True, slots=True)
class IndexEntry:
    """A key's newest committed record; `value` None: the key was deleted (a tombstone)."""

    offset: int
    timestamp_ms: int
    value: bytes | None
    headers: Mapping[str, bytes]


@dataclass(frozen=True, slots=True)
class KeyIndexStats:
    entries: int
    covered_offset: int


def lmdb_key(key: bytes) -> bytes:
    if len(key) <= SHORT_KEY_MAX:
        return _SHORT + key
    return _LONG + hashlib.blake2b(key, digest_size=32).digest()


def encode_entry(record: StoredRecord) -> bytes:
    assert record.key is not None
    hashed = len(record.key) > SHORT_KEY_MAX
    flags = (_TOMBSTONE if record.value is None else 0) | (_HASHED if hashed else 0)
    value = record.value or b""
    parts = [ENTRY.pack(record.offset, record.timestamp_ms, flags,
                        len(record.key) if hashed else 0, len(value), len(record.headers))]
    if hashed:
        parts.append(record.key)
    parts.append(value)
    for name, hvalue in record.headers.items():
        bname = name.encode()
        parts += [HEADER_NAME.pack(len(bname)), bname, HEADER_VALUE.pack(len(hvalue)), hvalue]
    return b"".join(parts)


def newest_entries(data: bytes, min_offset: int) -> dict[bytes, tuple[int, bytes]]:
    """LMDB key -> (offset, entry) of the newest record of each key in `data` (whole
    batches whose CRCs were checked) at or past `min_offset`: what `encode_entry` gives for
    the records `fmt.decode_batches` would decode, cut straight from the record bytes (an
    entry's value and headers are laid out as in the record), and only for each key's
    newest record. Raises BatchFormatError on a record that runs past its batch."""
    found: dict[bytes, tuple[int, int, int]] = {}  # key -> (offset, timestamp, position)
    unpack = fmt.RECORD_HEADER.unpack_from
    header_size = fmt.RECORD_HEADER.size
    for pos, header in fmt.iter_batches(data, verify=False):
        if header.last_offset < min_offset:
            continue
        end = pos + header.size
        base, first_ts, last_delta = (header.base_offset, header.first_timestamp,
                                      header.last_offset_delta)
        p = pos + fmt.BATCH_HEADER.size
        for _ in range(header.record_count):
            if p + header_size > end:
                raise fmt.BatchFormatError("record header runs past the batch")
            length, delta, ts_delta, key_len, _v, _s, _h = unpack(data, p)
            if p + 4 + length > end or delta > last_delta:
                raise fmt.BatchFormatError("record runs past the batch")
            if key_len >= 0 and base + delta >= min_offset:  # later records replace earlier
                found[data[p + header_size:p + header_size + key_len]] = (
                    base + delta, first_ts + ts_delta, p)
            p += 4 + length
        if p != end:
            raise fmt.BatchFormatError("batch length does not match its records")
    out: dict[bytes, tuple[int, bytes]] = {}
    for key, (offset, timestamp, p) in found.items():
        length, _d, _t, key_len, value_len, subject_len, header_count = unpack(data, p)
        value_at = p + header_size + key_len
        tombstone = value_len == fmt.NULL_VALUE_LENGTH
        value_end = value_at if tombstone else value_at + value_len
        headers_at, rec_end = value_end + subject_len, p + 4 + length
        if headers_at > rec_end or (headers_at == rec_end) != (header_count == 0):
            raise fmt.BatchFormatError("record length does not match its fields")
        hashed = key_len > SHORT_KEY_MAX
        head = ENTRY.pack(offset, timestamp, (_TOMBSTONE if tombstone else 0) |
                          (_HASHED if hashed else 0), key_len if hashed else 0,
                          value_end - value_at, header_count)
        if hashed:
            out[_LONG + hashlib.blake2b(key, digest_size=32).digest()] = (
                offset, b"".join((head, key, data[value_at:value_end], data[headers_at:rec_end])))
        elif subject_len:
            out[_SHORT + key] = (offset, b"".join(
                (head, data[value_at:value_end], data[headers_at:rec_end])))
        else:  # value and headers are contiguous
            out[_SHORT + key] = (offset, head + data[value_at:rec_end])
    return out


def decode_entry(data: bytes) -> tuple[IndexEntry, bytes | None]:
    """The entry, and the full key when it is stored (hashed entries)."""
    offset, timestamp, flags, key_len, value_len, header_count = ENTRY.unpack_from(data)
    p = ENTRY.size
    key = None
    if flags & _HASHED:
        key, p = data[p:p + key_len], p + key_len
    value = None if flags & _TOMBSTONE else data[p:p + value_len]
    p += value_len
    headers: Mapping[str, bytes] = _NO_HEADERS
    if header_count:
        decoded = {}
        for _ in range(header_count):
            (n,) = HEADER_NAME.unpack_from(data, p)
            name = data[p + 2:p + 2 + n].decode()
            p += 2 + n
            (v,) = HEADER_VALUE.unpack_from(data, p)
            decoded[name] = data[p + 4:p + 4 + v]
            p += 4 + v
        headers = decoded
    return IndexEntry(offset, timestamp, value, headers), key


class KeyIndex:
    def __init__(self, directory: Path, env: lmdb.Environment, rebuilt_reason: str | None
                 ) -> None:
        self.directory = directory
        self._env = env
        self._entries = env.open_db(b"entries")
        self._meta = env.open_db(b"meta")
        #: Why the index was wiped when opened (None: it was usable as it was).
        self.rebuilt_reason = rebuilt_reason

    @classmethod
    def open(cls, directory: Path, *, created_version: int,
             map_size_bytes: int = DEFAULT_MAP_SIZE_BYTES) -> KeyIndex:
        reason = None
        try:
            index = cls._open_env(directory, map_size_bytes, None)
            found = index._read_meta()
            if found != (FORMAT_VERSION, created_version):
                reason = ("new index" if found is None else
                          f"format/stream version {found}, wanted "
                          f"{(FORMAT_VERSION, created_version)}")
                index.close()
        except (lmdb.Error, struct.error) as exc:
            reason = f"unreadable: {exc}"
        if reason is None:
            return index
        shutil.rmtree(directory, ignore_errors=True)
        index = cls._open_env(directory, map_size_bytes, reason)
        with index._env.begin(write=True) as txn:
            txn.put(b"format", U32.pack(FORMAT_VERSION), db=index._meta)
            txn.put(b"created_version", U64.pack(created_version), db=index._meta)
            txn.put(b"covered", U64.pack(0), db=index._meta)
        return index

    @classmethod
    def open_existing(cls, directory: Path, *, created_version: int,
                      map_size_bytes: int = DEFAULT_MAP_SIZE_BYTES) -> KeyIndex:
        """Open the index another process created (`open`) for writing beside it; never
        wipes: raises StorageError when it is not there or of another version."""
        if not (directory / "data.mdb").exists():
            raise StorageError(f"no key index in {directory}", directory=str(directory))
        index = cls._open_env(directory, map_size_bytes, None)
        found = index._read_meta()
        if found != (FORMAT_VERSION, created_version):
            index.close()
            raise StorageError(f"the key index in {directory} is {found}, not "
                               f"{(FORMAT_VERSION, created_version)}", directory=str(directory))
        return index

    @classmethod
    def _open_env(cls, directory: Path, map_size_bytes: int, reason: str | None) -> KeyIndex:
        directory.mkdir(parents=True, exist_ok=True)
        # A cache of the log: not fsynced per write (sync/metasync off); see the docstring.
        env = lmdb.open(str(directory), map_size=map_size_bytes, subdir=True, max_dbs=2,
                        sync=False, metasync=False, lock=True, readahead=False)
        return cls(directory, env, reason)

    def _read_meta(self) -> tuple[int, int] | None:
        with self._env.begin(db=self._meta) as txn:
            fmt = txn.get(b"format", db=self._meta)
            version = txn.get(b"created_version", db=self._meta)
            covered = txn.get(b"covered", db=self._meta)
        if fmt is None or version is None or covered is None:
            return None
        return U32.unpack(fmt)[0], U64.unpack(version)[0]

    @property
    def covered_offset(self) -> int:
        """The next offset to index: every committed record below it is in the index."""
        with self._env.begin(db=self._meta) as txn:
            raw = txn.get(b"covered", db=self._meta)
        return 0 if raw is None else U64.unpack(raw)[0]

    def needs_rebuild(self, high_watermark: int) -> bool:
        """The index covers more than the log holds committed: the log lost its unsynced
        tail in a crash, and entries may name records that are gone."""
        return self.covered_offset > high_watermark

    def apply(self, records: Iterable[StoredRecord], covered: int) -> None:
        """Index `records` (committed, in offset order) and record that everything below
        `covered` is indexed. Replays are harmless: an older record never replaces a newer
        entry."""
        newest: dict[bytes, StoredRecord] = {}
        for record in records:  # in offset order: the last of a key is its newest
            if record.key is not None:
                newest[record.key] = record
        self.apply_entries({lmdb_key(key): (record.offset, encode_entry(record))
                            for key, record in newest.items()}, covered)

    def apply_entries(self, entries: Mapping[bytes, tuple[int, bytes]], covered: int) -> None:
        """`apply` for entries encoded already: LMDB key -> (offset, entry), one per key."""
        db = self._entries
        try:
            with self._env.begin(write=True) as txn:
                get, put = txn.get, txn.put
                raw = get(b"covered", db=self._meta)
                # Every entry names a record below the covered offset: records at or past it
                # (a catch-up's) replace what they find without looking.
                fresh = U64.unpack(raw)[0] if raw is not None else 0
                for key, (offset, entry) in entries.items():
                    if offset < fresh:
                        old = get(key, db=db)
                        if old is not None and ENTRY.unpack_from(old)[0] >= offset:
                            continue
                    put(key, entry, db=db)
                put(b"covered", U64.pack(covered), db=self._meta)
        except lmdb.MapFullError:
            raise KeyIndexFull(f"the key index in {self.directory} is full",
                               directory=str(self.directory)) from None

    def get(self, key: bytes) -> IndexEntry | None:
        """The key's newest committed record (value None: deleted), or None: never seen."""
        with self._env.begin(db=self._entries) as txn:
            raw = txn.get(lmdb_key(key), db=self._entries)
        if raw is None:
            return None
        entry, stored_key = decode_entry(raw)
        if stored_key is not None and stored_key != key:
            return None  # another key with the same 256-bit hash: not this one
        return entry

    def raw_entries(self, keys: Iterable[bytes]) -> list[bytes | None]:
        """The encoded entry of each key (None: never seen), from one read transaction; a
        hashed entry may be another key's (`decode_entry` gives its stored key)."""
        with self._env.begin(db=self._entries) as txn:
            get, db = txn.get, self._entries
            return [get(lmdb_key(key), db=db) for key in keys]

    def keys(self, prefix: bytes = b"", after: bytes | None = None, limit: int = 1000
             ) -> list[bytes]:
        """Live keys (not deleted) starting with `prefix`, after `after`, at most `limit`:
        short keys in byte order, then long keys (over SHORT_KEY_MAX bytes) in hash order."""
        return [key for key, _entry in self.items(prefix, after, limit)]

    def items(self, prefix: bytes = b"", after: bytes | None = None, limit: int = 1000
              ) -> list[tuple[bytes, IndexEntry]]:
        """(key, entry) of the live keys `keys` names, in the same order."""
        if not 0 < limit <= KEYS_LIMIT_MAX:
            raise ValueError(f"limit must be in [1, {KEYS_LIMIT_MAX}]")
        out: list[tuple[bytes, IndexEntry]] = []
        with self._env.begin(db=self._entries) as txn, txn.cursor(db=self._entries) as cursor:
            start = lmdb_key(after) if after is not None else _SHORT + prefix
            if not cursor.set_range(start):
                return out
            if after is not None and cursor.key() == start and not cursor.next():
                return out
            while True:
                lkey, raw = cursor.item()
                if lkey[:1] == _SHORT and not lkey[1:].startswith(prefix):
                    # Past the prefix's run of short keys: on to the long keys.
                    if not cursor.set_range(_LONG):
                        break
                    continue
                entry, stored = decode_entry(raw)
                key = stored if stored is not None else lkey[1:]
                if entry.value is not None and key.startswith(prefix):
                    out.append((key, entry))
                    if len(out) >= limit:
                        break
                if not cursor.next():
                    break
        return out

    def stats(self) -> KeyIndexStats:
        with self._env.begin(db=self._entries) as txn:
            entries = txn.stat(self._entries)["entries"]
        return KeyIndexStats(entries, self.covered_offset)

    def reset(self) -> None:
        """Forget every entry (covered 0): the broker rebuilds from the log."""
        with self._env.begin(write=True) as txn:
            txn.drop(self._entries, delete=False)
            txn.put(b"covered", U64.pack(0), db=self._meta)

    def close(self) -> None:
        self._env.close()


def remove(directory: Path) -> None:
    shutil.rmtree(directory, ignore_errors=True)


def catch_up_from(index: KeyIndex, log_: Log, high_watermark: int) -> int:
    """Where a catch-up to `high_watermark` starts: the index's covered offset (the log
    start, if retention removed what it covers), after a reset when the index covers more
    than the log holds committed."""
    if index.needs_rebuild(high_watermark):
        log.warning("%s: key index ahead of the log (lost tail): rebuilding", log_.directory)
        index.reset()
    return max(index.covered_offset, log_.log_start_offset)


def catch_up(index: KeyIndex, log_: Log, high_watermark: int) -> int:
    """Index the log's committed records from the index's covered offset to the HW, in this
    thread. Returns the new covered offset."""
    covered = catch_up_from(index, log_, high_watermark)
    while covered < high_watermark:
        data, next_offset = log_.read_bytes(covered, CATCH_UP_READ_BYTES,
                                            upper_bound=high_watermark, skip_empty=True)
        if next_offset <= covered:
            break
        # read_bytes checked the bytes' CRCs (or knew them checked): no second pass here.
        index.apply_entries(newest_entries(data, covered), next_offset)
        covered = next_offset
    return covered
