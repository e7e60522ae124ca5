"""Rebuild a partition's guard from its log (blocking reads: run it in a worker thread).

Theory of operation: a broker that becomes leader (after a failover or a restart) knows
nothing but its log, and the log holds everything the previous leader decided
(jetstream.idempotence.headers). `rebuild` reads it forward from the first record that can
still matter and replays every record into a fresh `Guard`:
- message ids and producers: from the first record inside the duplicate window (older ids
  and producers have expired anyway);
- registers: they never expire, so the scan starts earlier when needed, at the newest
  segment holding a register change (found by a byte search for the header's name, which is
  cheap next to decoding);
- keys (compacted streams only): from the same place; the guard then knows every key written
  from there on (`keys_from`). The keys of the older records are read by `scan_keys`, which
  the leader runs in the background after it started (a compacted log holds about one record
  per key, but that can be millions), and handed to `Guard.learn_older_keys`.
The new leader's whole log counts, including records above its high watermark: they are the
partition's history from now on (followers truncate to it).
"""

from __future__ import annotations

import collections
from collections.abc import Iterator

from jetstream.idempotence import headers as h
from jetstream.idempotence.dedupe import GuardLimits
from jetstream.idempotence.guard import Guard
from jetstream.stream import format as fmt
from jetstream.stream.log import Log

READ_BYTES = 4 * 1024 * 1024
_REGISTERS_NEEDLE = h.REGISTERS.encode()


def rebuild(log: Log, limits: GuardLimits, now_ms: int, *, track_keys: bool) -> Guard:
    """A guard holding what `log` says of ids, producers, registers (and the keys written
    from where it started reading: `keys_from`)."""
    log_start = log.log_start_offset
    window_start = max(log_start,
                       log.offset_for_timestamp(now_ms - limits.duplicate_window_ms))
    start = _registers_start(log, window_start)
    guard = Guard(limits, track_keys=track_keys, keys_from=start)
    for record in _records(log, start, log.log_end_offset):
        guard.replay(record.offset, record.timestamp_ms, record.key, record.headers)
    guard.ids.expire(now_ms)
    guard.producers.expire(now_ms)
    return guard


def scan_keys(log: Log, start: int, end: int) -> collections.OrderedDict[bytes, int]:
    """Each key's latest offset in the records at [start, end), oldest first."""
    keys: collections.OrderedDict[bytes, int] = collections.OrderedDict()
    for record in _records(log, start, end):
        if record.key is not None:
            keys.pop(record.key, None)
            keys[record.key] = record.offset
    return keys


def _records(log: Log, start: int, end: int) -> Iterator[fmt.StoredRecord]:
    offset = start
    while offset < end:
        data, next_offset = log.read_bytes(offset, READ_BYTES, end)
        yield from fmt.decode_batches(data, min_offset=offset)
        if next_offset <= offset:
            break
        offset = next_offset


def _registers_start(log: Log, window_start: int) -> int:
    """Where the scan must start to meet the last register change: `window_start`, or the
    base of the newest segment before it that holds one."""
    bases = [max(b, log.log_start_offset) for b in log.segment_base_offsets
             if b < window_start]
    high = window_start
    for low in reversed(bases):
        if low < high and _holds_registers(log, low, high):
            return low
        high = low
    return window_start


def _holds_registers(log: Log, low: int, high: int) -> bool:
    offset = low
    while offset < high:
        data, next_offset = log.read_bytes(offset, READ_BYTES, high)
        if _REGISTERS_NEEDLE in data:
            return True
        if next_offset <= offset:
            return False
        offset = next_offset
    return False
