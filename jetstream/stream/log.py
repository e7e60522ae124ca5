"""The commit log of one partition: an ordered list of segments in one directory.

Theory of operation
- Offsets are dense from the log start offset to the log end offset (LEO), never reused.
  Appends add one batch (leader) or a run of batches copied from the leader (follower); the
  active segment rolls at `segment_bytes_max` / `segment_ms_max`. An append is all or
  nothing: the batch is written whole or the file is cut back to where it was.
- Durability (`FsyncPolicy`): with ALWAYS an append returns after an fsync that covers it;
  concurrent appenders share fsyncs (group commit, jetstream.stream.log_sync: `sync_through`
  runs one fsync at a time and every append that landed before it started is covered by it).
- The recovery point (a checkpoint) is an offset below which every byte was fsynced and
  checked; opening the log trusts what lies below it and scans the rest
  (jetstream.stream.recovery).
- Reads never pass an upper bound given by the caller (the high watermark) and return whole
  batches, as byte ranges of a segment file for `os.sendfile` (jetstream.stream.file_slice)
  or as decoded records (jetstream.stream.log_reads).
- Retention (jetstream.stream.retention decides) deletes whole sealed segments, oldest first;
  the log start offset moves forward and reads below it get `OffsetOutOfRange`.
- A leader epoch cache (jetstream.stream.epoch) and a high watermark checkpoint live beside
  the segments.

No asyncio and no network here: the broker calls these methods from its event loop (cheap
calls) or from a thread (fsync). One lock guards the segment list
(jetstream.stream.segment_list); fsync runs outside it.
"""

from __future__ import annotations

import os
import shutil
import struct
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from jetstream.errors import (
    BatchTooLarge,
    InvalidBatch,
    LogClosed,
    OffsetOutOfRange,
    RecordTooLarge,
    SegmentsChanged,
    StaleLeaderEpoch,
)
from jetstream.stream import checkpoint, cleaning, repair, retention
from jetstream.stream import format as fmt
from jetstream.stream.config import FsyncPolicy, LogConfig
from jetstream.stream.dir_lock import DirLock, lock_log
from jetstream.stream.epoch import EpochEndOffset, LeaderEpochCache
from jetstream.stream.handles import DEFAULT_POOL, HandlePool
from jetstream.stream.log_reads import LogReads
from jetstream.stream.log_sync import LogSync
from jetstream.stream.recovery import (
    Recovery,
    RecoveryReport,
    raise_recovery_point,
    write_recovery_point,
)
from jetstream.stream.segment import Segment
from jetstream.stream.segment_list import SegmentList

HIGH_WATERMARK_FILE = "high-watermark-checkpoint"
_U32_MAX = 0xFFFFFFFF


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def _roll_due(config: LogConfig, used: int, first_timestamp: int, base_offset: int,
              header: fmt.BatchHeader) -> bool:
    """Whether the batch `header` must start a new segment, the active one holding `used`
    bytes from `base_offset` with its first record at `first_timestamp`. An empty segment
    takes any batch.

    Age is measured in record time, as Kafka does (KAFKA-4099): the newest record of the batch
    against the segment's first record. Against the wall clock, a log receiving old data (a
    follower catching up, a replay of old records) would roll at every batch."""
    return used > 0 and (
        used + header.size > config.segment_bytes_max
        or header.max_timestamp - first_timestamp >= config.segment_ms_max
        or header.last_offset - base_offset > _U32_MAX
    )


@dataclass(frozen=True, slots=True)
class AppendInfo:
    base_offset: int
    last_offset: int
    log_end_offset: int
    size_bytes: int


@dataclass(frozen=True, slots=True)
class SegmentSnapshot:
    """The segments of a log at one moment: `(base_offset, size_bytes)` oldest first (the
    last is the active segment), and the log start and end offsets of that moment."""

    log_start_offset: int
    log_end_offset: int
    segments: tuple[tuple[int, int], ...]


class Log(LogSync, LogReads):
    def __init__(
        self,
        directory: Path | str,
        config: LogConfig | None = None,
        *,
        pool: HandlePool | None = None,
        clock: Callable[[], int] = wall_clock_ms,
        parent_lock: DirLock | None = None,
    ) -> None:
        """Open (or create) the log in `directory`. It holds an flock on `<directory>/.lock`
        while open, unless `parent_lock` (held by the caller on the directory of its logs:
        a broker's) covers it (jetstream.stream.dir_lock). Raises StorageError when another
        process has the log open."""
        self.directory = directory if isinstance(directory, Path) else Path(directory)
        self.config = config or LogConfig()
        self._pool = pool or DEFAULT_POOL
        self._clock = clock
        self._lock = threading.RLock()
        self._sync_cond = threading.Condition()
        self._sync_running = False
        # Bumped by every truncation: an fsync that started before one must not claim
        # offsets that were cut and may be written again.
        self._truncations = 0
        self._closed = False
        try:  # one system call when it exists (a broker opens thousands as it starts)
            os.mkdir(self.directory)
        except FileExistsError:
            pass
        except FileNotFoundError:
            self.directory.mkdir(parents=True, exist_ok=True)
        self._own_lock = lock_log(self.directory, parent_lock)
        try:
            self._segments = SegmentList()
            self._damage = repair.DamageLedger()
            self.epochs = LeaderEpochCache(self.directory)
            self.recovery: RecoveryReport = Recovery(
                self.directory, self.config, self._pool, self.epochs, self._segments).run()
            self._durable_offset = self.log_end_offset
            self._last_sync_ms = self._clock()
        except BaseException:
            self._release_lock()
            raise

    def _write_recovery_point(self, offset: int) -> None:
        write_recovery_point(self.directory, offset)

    # -- state --------------------------------------------------------------------------------

    @property
    def log_start_offset(self) -> int:
        return self._segments[0].base_offset

    @property
    def log_end_offset(self) -> int:
        return self._segments.active.next_offset

    @property
    def durable_offset(self) -> int:
        """Every offset below this one has been fsynced."""
        return self._durable_offset

    @property
    def size_bytes(self) -> int:
        with self._lock:
            return sum(s.size for s in self._segments)

    @property
    def segment_base_offsets(self) -> list[int]:
        with self._lock:
            return self._segments.bases

    def segment_snapshot(self) -> SegmentSnapshot:
        """The segments and their sizes with the log's offsets, taken under the lock that
        appends, rolls, retention, truncation and compaction swaps hold: one consistent
        view (a bulk reader reads the files from it)."""
        with self._lock:
            self._check_open()
            return SegmentSnapshot(self.log_start_offset, self.log_end_offset,
                                   tuple((s.base_offset, s.size) for s in self._segments))

    @property
    def latest_epoch(self) -> int:
        return self.epochs.latest_epoch

    def _check_open(self) -> None:
        if self._closed:
            raise LogClosed(f"log {self.directory} is closed")

    # -- appending ----------------------------------------------------------------------------

    def append(self, records: Sequence[fmt.Record], leader_epoch: int, *,
               sync: bool = True) -> AppendInfo:
        """Append `records` as one batch (the leader's path). With the ALWAYS policy the call
        returns once the batch is fsynced, with INTERVAL it fsyncs when the interval has
        passed; unless `sync` is False: the caller then calls `sync_through` / `maybe_sync`
        itself (from a thread, so an event loop never waits on the disk)."""
        cfg = self.config
        if not records:
            raise ValueError("append needs at least one record")
        if len(records) > cfg.batch_records_max:
            raise BatchTooLarge(len(records), cfg.batch_records_max, "records")
        with self._lock:
            self._check_open()
            if leader_epoch < self.epochs.latest_epoch:
                raise StaleLeaderEpoch(leader_epoch, self.epochs.latest_epoch)
            now = self._clock()
            base = self.log_end_offset
            try:
                head, body = fmt.encode_batch_parts(base, leader_epoch, records, now,
                                                    record_bytes_max=cfg.record_bytes_max)
            except fmt.RecordTooLargeToEncode as exc:
                raise RecordTooLarge(exc.size, cfg.record_bytes_max) from None
            except (ValueError, struct.error) as exc:
                # struct.error: a timestamp or the epoch does not fit its field.
                raise InvalidBatch(f"records cannot be encoded: {exc}") from exc
            size = len(head) + len(body)
            if size > cfg.batch_bytes_max:
                raise BatchTooLarge(size, cfg.batch_bytes_max, "bytes")
            header = fmt.parse_header(head)
            active = self._segments.active
            roll = _roll_due(cfg, active.size, active.first_timestamp, active.base_offset, header)
            self._append_locked((head, body), [header], roll)
            info = AppendInfo(base, header.last_offset, self.log_end_offset, size)
        self._after_append(info.log_end_offset, sync)
        return info

    def append_batches(self, data: bytes | memoryview, *, sync: bool = True,
                       verified: bool = False) -> AppendInfo:
        """Append whole batches copied from the leader (the follower's path). They must start
        at the log end offset, be contiguous, pass their CRC and carry non-decreasing epochs.
        `verified`: the caller checked every batch's CRC and does not need the records
        decoded (a mirror's copy, jetstream.stream.copying.plan_copy: CRCs checked, then
        re-stamped), so neither is done again."""
        try:
            batches = list(fmt.iter_batches(data, verify=not verified))
            for pos, header in () if verified else batches:
                fmt.decode_records(data, pos, header)
        except (fmt.BatchFormatError, UnicodeDecodeError) as exc:
            raise InvalidBatch(f"malformed batch: {exc}") from exc
        if not batches:
            raise InvalidBatch("no whole batch in the data")
        consumed = batches[-1][0] + batches[-1][1].size
        if consumed != len(data):
            raise InvalidBatch(f"{len(data) - consumed} trailing bytes after the last batch")
        with self._lock:
            self._check_open()
            expected = self.log_end_offset
            epoch = self.epochs.latest_epoch
            for _pos, header in batches:
                if header.base_offset != expected:
                    raise InvalidBatch(
                        f"batch at offset {header.base_offset}, log end offset is {expected}")
                if header.leader_epoch < epoch:
                    raise StaleLeaderEpoch(header.leader_epoch, epoch)
                if header.size > self.config.batch_bytes_max:
                    raise BatchTooLarge(header.size, self.config.batch_bytes_max, "bytes")
                expected, epoch = header.next_offset, header.leader_epoch
            base = self.log_end_offset
            view = memoryview(data)
            # Group consecutive batches per segment, rolling before a batch exactly where the
            # leader did (the same rule on the same batches): one write per segment.
            active = self._segments.active
            used, first_ts, seg_base = active.size, active.first_timestamp, active.base_offset
            run_start = 0
            while run_start < len(batches):
                roll = _roll_due(self.config, used, first_ts, seg_base, batches[run_start][1])
                if roll:
                    used = 0
                run_end = run_start
                while run_end < len(batches):
                    header = batches[run_end][1]
                    if run_end > run_start and _roll_due(self.config, used, first_ts, seg_base,
                                                         header):
                        break
                    if used == 0:
                        first_ts, seg_base = header.first_timestamp, header.base_offset
                    used += header.size
                    run_end += 1
                first_pos = batches[run_start][0]
                last_pos, last_header = batches[run_end - 1]
                chunk = bytes(view[first_pos:last_pos + last_header.size])
                self._append_locked((chunk,), [h for _p, h in batches[run_start:run_end]], roll)
                run_start = run_end
            info = AppendInfo(base, self.log_end_offset - 1, self.log_end_offset, len(data))
        self._after_append(info.log_end_offset, sync)
        return info

    def _append_locked(self, data: Sequence[bytes], headers: list[fmt.BatchHeader],
                       roll: bool) -> None:
        if roll:
            self._roll_locked()
        self._segments.active.append(data, headers)
        for header in headers:
            if header.leader_epoch > self.epochs.latest_epoch:
                # At the log's end: written with the next roll or close, or made again by
                # recovery from the batches past the recovery point (LeaderEpochCache._flush).
                self.epochs.assign(header.leader_epoch, header.base_offset, durable=False)

    def _roll_locked(self) -> None:
        fsync = self.config.fsync is not FsyncPolicy.NEVER
        self._segments.active.seal(fsync)
        segment = Segment.create(self.directory, self.log_end_offset, self._pool,
                                 self.config.index_interval_bytes)
        self._segments.append(segment)
        if fsync:
            checkpoint.fsync_dir(self.directory)
            # Every epoch a crash could cost the file now starts at or past the recovery
            # point, where recovery looks for them (jetstream.stream.recovery).
            self.epochs.write_unwritten(self.log_end_offset)
            raise_recovery_point(self.directory, segment.base_offset)
            with self._sync_cond:
                self._durable_offset = max(self._durable_offset, segment.base_offset)

    def end_offset_for_epoch(self, epoch: int) -> EpochEndOffset:
        with self._lock:
            return self.epochs.end_offset_for_epoch(epoch, self.log_end_offset)

    def start_leader_epoch(self, epoch: int) -> None:
        """This replica becomes leader at `epoch`: record that the epoch starts at the LEO
        now, before anything is appended in it, so followers asking where the previous epoch
        ended get this LEO (Kafka does the same on becoming leader)."""
        with self._lock:
            self._check_open()
            latest = self.epochs.latest_epoch
            if epoch < latest:
                raise StaleLeaderEpoch(epoch, latest)
            if epoch > latest:  # at the log's end: needs no fsync (LeaderEpochCache._flush)
                self.epochs.assign(epoch, self.log_end_offset, durable=False)

    # -- truncation and retention ---------------------------------------------------------------

    def truncate_to(self, offset: int) -> None:
        """Remove every record at or past `offset` (none at or past the LEO). Used by a
        follower to drop a suffix its leader does not have. Epochs that begin at the LEO go
        too: they hold no record (this replica led them for an instant), and a leader whose
        log goes on in an older epoch would see its batches refused as stale."""
        with self._lock:
            self._check_open()
            if offset >= self.log_end_offset:
                self.epochs.truncate_from_end(self.log_end_offset)
                return
            if offset < self.log_start_offset:
                raise OffsetOutOfRange(offset, self.log_start_offset, self.log_end_offset)
            i = self._segments.index_for(offset)
            if offset == self._segments[i].base_offset and i > 0:
                i -= 1  # the whole segment goes; the previous one ends exactly at `offset`
            # Until the truncation is done and synced, a crash must rescan from here.
            self._write_recovery_point(self._segments[i].base_offset)
            dropped = self._segments.drop_after(i)
            for segment in dropped:
                segment.delete()
            deleted = len(dropped)
            active = self._segments.active
            cut = active.truncate_to(offset)
            if cut is not None:
                header = fmt.parse_header(cut)
                kept = [r for r in fmt.decode_records(cut, 0, header) if r.offset < offset]
                if kept:
                    rebuilt = fmt.rebase_batch(cut, kept)
                    active.append((rebuilt,), [fmt.parse_header(rebuilt)])
            assert self.log_end_offset == offset
            self.epochs.truncate_from_end(offset)
            synced = self.config.fsync is not FsyncPolicy.NEVER
            if synced:
                active.sync()
                if deleted:
                    # Else a power loss could bring the deleted segments back, and opening
                    # would take them as the continuation of this one.
                    checkpoint.fsync_dir(self.directory)
            with self._sync_cond:
                self._truncations += 1
                self._durable_offset = (offset if synced
                                        else min(self._durable_offset, offset))

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Drop every record and restart the log empty at `offset` (a follower too far behind
        its leader's log start)."""
        with self._lock:
            self._check_open()
            self._write_recovery_point(0)
            for segment in self._segments.clear():
                segment.delete()
            self._segments.append(Segment.create(self.directory, offset, self._pool,
                                                 self.config.index_interval_bytes))
            self.epochs.clear()
            checkpoint.fsync_dir(self.directory)
            self._write_recovery_point(offset)
            with self._sync_cond:
                self._truncations += 1
                self._durable_offset = offset

    def apply_retention(self, now_ms: int | None = None,
                        max_offset: int | None = None) -> list[int]:
        """Delete sealed segments that retention no longer keeps, oldest first; never the
        active segment, never one holding offsets at or past `max_offset` (the HW).
        Returns the base offsets deleted."""
        if not retention.has_limits(self.config):
            return []
        with self._lock:
            self._check_open()
            now = self._clock() if now_ms is None else now_ms
            limit = self.log_end_offset if max_offset is None else max_offset
            count = retention.expired_count(list(self._segments), self.config, now,
                                            self.log_end_offset, limit)
            deleted, doomed = self._delete_oldest(count)
        _unlink(doomed)
        return deleted

    def delete_segments_below(self, offset: int) -> list[int]:
        """Delete the oldest sealed segments that end at or before `offset` (their offsets
        are held, verified, in a fragment store, or were pruned); never the active segment.
        Returns the base offsets deleted."""
        with self._lock:
            self._check_open()
            count = 0
            while (count < len(self._segments) - 1
                   and self._segments[count].next_offset <= offset):
                count += 1
            deleted, doomed = self._delete_oldest(count)
        _unlink(doomed)
        return deleted

    def _delete_oldest(self, count: int) -> tuple[list[int], list[Path]]:
        """Take the `count` oldest segments out of the log (under the lock): their base
        offsets, and their files renamed for the caller to unlink once it lets go of the
        lock. Nothing here waits on the disk: a crash before the unlinks leaves files that
        recovery deletes, or (the renames lost too) segments below the log start that
        retention deletes again; the leader epoch cache is not fsynced either, as recovery
        drops the entries before the log start itself (jetstream.stream.recovery)."""
        deleted: list[int] = []
        doomed: list[Path] = []
        for _ in range(count):
            oldest = self._segments.pop_oldest()
            doomed += oldest.mark_deleted()
            deleted.append(oldest.base_offset)
        if deleted:
            self.epochs.truncate_from_start(self.log_start_offset, durable=False)
        return deleted, doomed

    def reconfigure(self, config: LogConfig) -> None:
        """Apply new settings (a stream update): retention, segment sizes and ages, fsync
        policy and limits take effect from the next append, roll or retention run."""
        with self._lock:
            self._check_open()
            self.config = config

    # -- compaction ---------------------------------------------------------------------------

    def roll_if_older(self, first_timestamp_before_ms: int, high_watermark: int) -> bool:
        """Roll the active segment if it holds records, all of them below `high_watermark`,
        the first older than `first_timestamp_before_ms` (so an idle compacted partition's
        last segment becomes cleanable). True when it rolled."""
        with self._lock:
            self._check_open()
            active = self._segments.active
            if (active.size == 0 or active.next_offset > high_watermark
                    or not 0 <= active.first_timestamp < first_timestamp_before_ms):
                return False
            self._roll_locked()
            return True

    def sealed_segments(self) -> list[Segment]:
        """The sealed segments, oldest first (a snapshot: the log cleaner plans on it)."""
        with self._lock:
            return self._segments.since(0)[:-1]

    def replace_segments(self, replaced: Sequence[Segment], cleaned: Path,
                         hook: cleaning.StepHook | None = None) -> None:
        """Swap the cleaned copy `cleaned` (jetstream.stream.cleaning.write_cleaned) in for the
        consecutive sealed segments `replaced`. Raises SegmentsChanged (and removes
        `cleaned`) when they are no longer what the cleaner read: deleted by retention,
        truncated, or no longer sealed."""
        with self._lock:
            self._check_open()
            if not cleaning.is_sealed_run(self._segments.since(0), replaced):
                cleaned.unlink(missing_ok=True)
                raise SegmentsChanged(f"segments of {self.directory} changed while cleaning")
            new = cleaning.swap_in(self.directory, cleaned, replaced[0].base_offset, replaced,
                                   self._pool, self.config.index_interval_bytes,
                                   hook or (lambda step: None))
            self._segments.replace(replaced, [new])

    # -- checkpoints and lifecycle ----------------------------------------------------------------

    def write_high_watermark(self, high_watermark: int) -> None:
        assert 0 <= high_watermark <= self.log_end_offset, (high_watermark, self.log_end_offset)
        # An older high watermark is a safe one (a restart then re-learns the rest), and so
        # is none (a damaged file reads as none): no fsync, which every partition's
        # checkpoint would pay in turn.
        checkpoint.write_offset_if_room(self.directory / HIGH_WATERMARK_FILE, "high-watermark",
                                        high_watermark, durable=False)

    def read_high_watermark(self) -> int:
        """The last checkpointed high watermark, clamped to the log; the log start offset if
        none was written (or the checkpoint is damaged)."""
        value = checkpoint.read_offset(self.directory / HIGH_WATERMARK_FILE, "high-watermark")
        if value is None:
            return self.log_start_offset
        return max(self.log_start_offset, min(value, self.log_end_offset))

    def close(self) -> None:
        """Seal and fsync the active segment and record a clean recovery point."""
        self._close(durable=True)

    def close_unsynced(self) -> int | None:
        """Close as `close` does, without an fsync and without raising the recovery point:
        the caller syncs the file system, then raises it (`close_all`). The log end offset
        (None when the log was closed already)."""
        return self._close(durable=False)

    def _close(self, durable: bool) -> int | None:
        with self._lock:
            if self._closed:
                return None
            self._closed = True
            try:
                active = self._segments.active
                for segment in self._segments:
                    # Sealed segments were fsynced at roll unless the policy is NEVER.
                    if segment is active or segment.next_offset > self._durable_offset:
                        segment.seal(fsync=durable)
                self.epochs.write_unwritten(self.log_end_offset, durable=durable)
                if durable:
                    checkpoint.fsync_dir(self.directory)
                    raise_recovery_point(self.directory, self.log_end_offset)
                return self.log_end_offset
            finally:
                for segment in self._segments:
                    segment.close()
                self._release_lock()

    def delete(self) -> None:
        """Close the log and remove its directory."""
        with self._lock:
            if not self._closed:
                self._closed = True
                for segment in self._segments:
                    segment.close()
                self._release_lock()
            shutil.rmtree(self.directory, ignore_errors=True)

    def _release_lock(self) -> None:
        if self._own_lock is not None:
            self._own_lock.release()

    def __enter__(self) -> Log:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def close_all(logs: Iterable[Log]) -> None:
    """Close many logs at once (a broker stopping) with two file-system syncs in all instead
    of several fsyncs per log (Kafka keeps one recovery-point file per log directory for the
    same reason): every log's segments, indexes and epochs are written, the file systems
    synced, then each log's clean recovery point written and synced again, so no recovery
    point is durable before the data it vouches for."""
    ends = [(log.directory, end) for log in logs if (end := log.close_unsynced()) is not None]
    os.sync()
    for directory, end in ends:
        raise_recovery_point(directory, end, durable=False)
    os.sync()


def _unlink(paths: list[Path]) -> None:
    for path in paths:
        path.unlink(missing_ok=True)
