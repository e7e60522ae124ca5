"""What survives a cleaning pass, and the batches that hold the survivors (pure).

Theory of operation
- The rule (Kafka's): a keyless record is always kept; a keyed record is dropped when the
  offset map holds a newer offset for its key; a surviving tombstone (a key with a null
  value) is dropped once `delete_retention_ms` has passed since the cleaner first passed it
  (jetstream.compaction.checkpoint) — tombstones in this pass's dirty range are first
  passed now.
- Batches keep their offset ranges, so the log stays contiguous: a batch whose records all
  survive is kept byte for byte (no re-encoding: most batches of a well-compacted log, and
  what makes the cleaner fast); a batch that lost some records is re-encoded with the same
  base offset, leader epoch and range, and its survivors' offsets, timestamps, keys, values,
  headers and subjects; a run of batches that lost every record becomes one empty batch
  holding the run's range; a run never crosses a change of leader epoch, so every batch
  keeps the epoch its records were written in.
- A batch holding a register change (jetstream.idempotence.headers) is kept whole: the
  partition's registers are rebuilt from the newest one. So is a batch holding a message id
  or a producer stamp whose newest record is inside the duplicate window
  (`window_start_ms`): a new leader rebuilds the window from them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from jetstream.compaction.checkpoint import CleanerCheckpoint
from jetstream.compaction.offset_map import KeyInfo, OffsetMap, scan_keys
from jetstream.idempotence.headers import MSG_ID, PRODUCER, REGISTERS
from jetstream.stream import format as fmt

Keep = Callable[[int, bytes | None, bool], bool]
_REGISTERS = REGISTERS.encode()
_WINDOWED = (MSG_ID.encode(), PRODUCER.encode())


def retention_rule(offset_map: OffsetMap, checkpoint: CleanerCheckpoint, now_ms: int,
                   delete_retention_ms: int, stats: PassStats) -> Keep:
    """The keep(offset, key, is_tombstone) decision of one pass; counts in `stats` the
    tombstones it keeps that this pass passes first (they need a mark in the checkpoint)."""
    get = offset_map.get
    horizon = now_ms - delete_retention_ms  # a tombstone first passed before this goes
    first_passed = checkpoint.first_passed_ms

    def keep(offset: int, key: bytes | None, tombstone: bool) -> bool:
        if key is None:
            return True
        newest = get(key)
        if newest is not None and newest > offset:
            return False
        if not tombstone:
            return True
        passed = first_passed(offset)
        if passed is None:
            if now_ms > horizon:
                stats.new_tombstones += 1
                return True
            return False
        return passed > horizon

    return keep


@dataclass(slots=True)
class PassStats:
    records_read: int = 0
    records_removed: int = 0
    tombstones_removed: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    #: Tombstones kept that this pass was the first to pass.
    new_tombstones: int = 0


@dataclass(slots=True)
class _EmptyRun:
    base_offset: int
    last_offset: int
    leader_epoch: int
    first_timestamp: int
    max_timestamp: int

    def encode(self) -> bytes:
        return fmt.encode_empty_batch(self.base_offset, self.leader_epoch,
                                      self.last_offset - self.base_offset,
                                      self.first_timestamp, self.max_timestamp)


def filter_batches(batches: Iterable[tuple[bytes, int, fmt.BatchHeader]], keep: Keep,
                   stats: PassStats, window_start_ms: int | None = None) -> Iterator[bytes]:
    """The cleaned batches for `batches` ((buffer, position, header), in offset order,
    CRC-verified), tiling exactly the same offsets."""
    empty: _EmptyRun | None = None
    for buf, pos, header in batches:
        stats.bytes_read += header.size
        infos = scan_keys(buf, pos, header)
        stats.records_read += len(infos)
        end = pos + header.size
        if buf.find(_REGISTERS, pos, end) >= 0 or (
                window_start_ms is not None and header.max_timestamp >= window_start_ms
                and any(buf.find(name, pos, end) >= 0 for name in _WINDOWED)):
            kept = [True] * len(infos)  # a new leader rebuilds its registers or window from it
        else:
            kept = [keep(offset, key, tombstone) for offset, key, tombstone in infos]
        removed = kept.count(False)
        if removed:
            stats.records_removed += removed
            stats.tombstones_removed += sum(
                1 for info, k in zip(infos, kept, strict=True) if info[2] and not k)
        if removed == len(infos):
            if empty is not None and empty.leader_epoch != header.leader_epoch:
                # A range holder keeps one leader epoch: truncation and followers compare
                # epochs batch by batch, so a run never crosses an epoch change.
                yield _written(empty.encode(), stats)
                empty = None
            if empty is None:
                empty = _EmptyRun(header.base_offset, header.last_offset, header.leader_epoch,
                                  header.first_timestamp, header.max_timestamp)
            else:
                empty.last_offset = header.last_offset
                empty.max_timestamp = max(empty.max_timestamp, header.max_timestamp)
            continue
        if empty is not None:
            yield _written(empty.encode(), stats)
            empty = None
        if not removed:
            yield _written(buf[pos:pos + header.size], stats)
        else:
            yield _written(_reencode(buf, pos, header, infos, kept), stats)
    if empty is not None:
        yield _written(empty.encode(), stats)


def _written(data: bytes, stats: PassStats) -> bytes:
    stats.bytes_written += len(data)
    return data


def _reencode(buf: bytes, pos: int, header: fmt.BatchHeader, infos: list[KeyInfo],
              kept: list[bool]) -> bytes:
    records = [r for r, k in zip(fmt.decode_records(buf, pos, header), kept, strict=True) if k]
    base = header.base_offset
    return fmt.encode_batch(
        base, header.leader_epoch,
        [fmt.Record(r.value, r.key, r.headers, r.subject, r.timestamp_ms) for r in records],
        records[0].timestamp_ms, [r.offset - base for r in records], header.last_offset_delta)
