"""Opening a log: which segment files to trust, which to scan, where the log ends.

Theory of operation
- A compaction swap interrupted by a crash is first finished or undone
  (jetstream.stream.cleaning.complete_swaps).
- The recovery point (a checkpoint beside the segments) is an offset below which every byte
  was fsynced and checked. Segments sealed below it are trusted once their index files agree
  with the log file; everything from it on is scanned batch by batch (CRC), and the file is
  cut after the last valid batch. A cut or a missing segment drops every later segment, so
  offsets stay dense.
- The leader epoch cache must agree with the batches on disk: its first entry starts at the
  log start and its latest epoch is the last batch's. Otherwise it is rebuilt from the batch
  headers, each checked against its CRC; damage found there (in a trusted segment, where
  opening did not look) ends the log at the damage instead of failing to open.
- Whatever recovery changed is made durable (segments sealed and fsynced, directory fsynced)
  and the recovery point moved to the log end, so the next open can trust it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from jetstream.errors import CorruptRecord
from jetstream.stream import checkpoint
from jetstream.stream import format as fmt
from jetstream.stream.cleaning import CLEANED_SUFFIX, SWAP_SUFFIX, complete_swaps
from jetstream.stream.config import LogConfig
from jetstream.stream.epoch import LeaderEpochCache
from jetstream.stream.handles import HandlePool
from jetstream.stream.segment import DELETED_SUFFIX, Segment
from jetstream.stream.segment_list import SegmentList

RECOVERY_POINT_FILE = "recovery-point-checkpoint"


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    scanned_segments: int
    truncated_bytes: int
    dropped_segments: int


def write_recovery_point(directory: Path, offset: int) -> None:
    checkpoint.write_offset(directory / RECOVERY_POINT_FILE, "recovery-point", offset)


def raise_recovery_point(directory: Path, offset: int, *, durable: bool = True) -> bool:
    """Move the recovery point up to `offset` when the disk has room for it. A recovery point
    that stays lower only makes the next open scan more, so a full disk is not an error here
    (lowering it, after a truncation, must use write_recovery_point). Not `durable`: no
    fsync (the caller syncs the file system)."""
    return checkpoint.write_offset_if_room(directory / RECOVERY_POINT_FILE, "recovery-point",
                                           offset, durable=durable)


def segment_bases(directory: Path) -> list[int]:
    """Base offsets of the segment files in `directory`, oldest first. Only names the log
    writes (`%020d.log`); anything else is not ours to read."""
    return _bases_of(os.listdir(directory))


def _bases_of(names: list[str]) -> list[int]:
    return sorted(int(name[:20]) for name in names
                  if len(name) == 24 and name.endswith(".log") and name[:20].isdigit())


class Recovery:
    """One opening of one log directory: fills `segments` and returns what it had to do."""

    def __init__(self, directory: Path, config: LogConfig, pool: HandlePool,
                 epochs: LeaderEpochCache, segments: SegmentList) -> None:
        self.directory = directory
        self.config = config
        self.pool = pool
        self.epochs = epochs
        self.segments = segments

    def _segment(self, base: int) -> Segment:
        return Segment(self.directory, base, self.pool, self.config.index_interval_bytes)

    def run(self) -> RecoveryReport:
        directory = self.directory
        # One listing (a broker opens thousands of logs at start), again only if a swap ran.
        names = os.listdir(directory)
        for name in names:
            if name.endswith((".tmp", DELETED_SUFFIX)):
                (directory / name).unlink()
        if any(name.endswith((CLEANED_SUFFIX, SWAP_SUFFIX)) for name in names):
            complete_swaps(directory, self.pool)
            names = os.listdir(directory)
        bases = _bases_of(names)
        for suffix in (".index", ".timeindex"):
            for name in names:
                stem = name[:-len(suffix)]
                if name.endswith(suffix) and len(stem) == 20 and stem.isdigit() and \
                        int(stem) not in bases:
                    (directory / name).unlink()
        recovery_point = checkpoint.read_offset(directory / RECOVERY_POINT_FILE,
                                                "recovery-point")
        rp = recovery_point if recovery_point is not None else 0
        segments = self.segments
        scanned = truncated = dropped = 0
        for i, base in enumerate(bases):
            segment = self._segment(base)
            if len(segments) and base != segments.active.next_offset:
                dropped += self._drop_files(bases[i:])
                break
            sealed_below_rp = i + 1 < len(bases) and bases[i + 1] <= rp
            trusted = segment.load() and (sealed_below_rp or segment.next_offset <= rp)
            if not trusted:
                scanned += 1
                cut = segment.recover()
                truncated += cut
                if cut and i + 1 < len(bases):
                    segments.append(segment)
                    dropped += self._drop_files(bases[i + 1:])
                    break
            segments.append(segment)
        if not len(segments):
            start = recovery_point or 0
            segments.append(Segment.create(directory, start, self.pool,
                                           self.config.index_interval_bytes))
        rescanned, cut, gone = self._check_epoch_cache(rp)
        scanned, truncated, dropped = scanned + rescanned, truncated + cut, dropped + gone
        log_end_offset = segments.active.next_offset
        if scanned or dropped or recovery_point != log_end_offset:
            # Make what recovery kept durable, so the next open can trust it.
            for segment in segments:
                segment.seal(fsync=True)
            checkpoint.fsync_dir(directory)
            raise_recovery_point(directory, log_end_offset)
        return RecoveryReport(scanned, truncated, dropped)

    def _drop_files(self, bases: list[int]) -> int:
        for base in bases:
            self._segment(base).delete()
        return len(bases)

    def _check_epoch_cache(self, recovery_point: int) -> tuple[int, int, int]:
        """Make the epoch cache agree with the batches on disk: add the epochs it lacks from
        the batches past the recovery point when that is enough, else rebuild it. Returns
        the (scanned, truncated bytes, dropped) segments a damaged batch cost."""
        segments, epochs = self.segments, self.epochs
        log_start, log_end = segments[0].base_offset, segments.active.next_offset
        # Kept in memory: a crash before the file is next written makes recovery do it again.
        epochs.truncate_from_end(log_end, durable=False)
        epochs.truncate_from_start(log_start, durable=False)
        if log_end == log_start:
            return 0, 0, 0
        last = segments.active if segments.active.size else segments[len(segments) - 2]
        location = last.find(last.next_offset - 1)
        assert location is not None
        entries = epochs.entries
        if entries and entries[0].start_offset == log_start:
            if epochs.latest_epoch == location.header.leader_epoch:
                return 0, 0, 0
            if self._assign_newer_epochs(max(recovery_point, entries[-1].start_offset)):
                epochs.write_unwritten(log_end)
                return 0, 0, 0
        scanned = truncated = dropped = 0
        epochs.clear(durable=False)
        i = 0
        while i < len(segments):
            segment = segments[i]
            try:
                self._assign_epochs_of(segment)
            except CorruptRecord:
                # Damage in a trusted segment, where opening did not look. Rather than fail
                # to open (or learn an epoch from a damaged header), scan it as recovery
                # would without a recovery point: the log ends at the damage.
                scanned, truncated = scanned + 1, truncated + segment.recover()
                dropped += self._drop_files([s.base_offset for s in segments.drop_after(i)])
                epochs.clear(durable=False)
                i = 0
                continue
            i += 1
        # Written once (a full disk keeps them in memory: the next open makes them again).
        epochs.write_unwritten(segments.active.next_offset)
        return scanned, truncated, dropped

    def _assign_newer_epochs(self, offset: int) -> bool:
        """Add the epochs of the batches from `offset` on that the cache lacks, when the
        batch at `offset` is of the cache's latest epoch (then no epoch began before it that
        the cache lacks: only epochs that begin at the log's end go unwritten, and they are
        written before a roll raises the recovery point). False when it is not so or a
        batch there is damaged: the caller rebuilds the whole cache."""
        segments, epochs = self.segments, self.epochs
        if offset >= segments.active.next_offset:
            return False
        index = max(i for i in range(len(segments)) if segments[i].base_offset <= offset)
        found = segments[index].find(offset)
        if found is None or found.header.leader_epoch != epochs.latest_epoch:
            return False
        try:
            for i in range(index, len(segments)):
                self._assign_epochs_of(segments[i], offset if i == index else None)
        except CorruptRecord:
            return False
        return True

    def _assign_epochs_of(self, segment: Segment, offset: int | None = None) -> None:
        """Assign the epochs of a segment's batches (from the one holding `offset`, when
        given), each checked against its CRC."""
        if offset is not None:
            found = segment.find(offset)
            assert found is not None
            offset = found.header.base_offset
        else:
            offset = segment.base_offset
        while offset < segment.next_offset:
            found = segment.find(offset)
            assert found is not None
            header = found.header
            if not fmt.verify_crc(segment.read_at(found.position, header.size), 0, header):
                raise CorruptRecord(f"CRC mismatch in {segment.log_path} at {found.position}",
                                    path=str(segment.log_path), position=found.position)
            if header.leader_epoch > self.epochs.latest_epoch:
                self.epochs.assign(header.leader_epoch, header.base_offset, durable=False)
            offset = header.next_offset
