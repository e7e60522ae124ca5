"""One cleaning pass over one partition replica's log: the IO around the pure planner and
rewrite rule.

Theory of operation: given a plan (jetstream.compaction.planner), a pass has three steps.
`prepare` (on the log's owner) lists the sealed segments below the plan's bound and reads the
cleaner checkpoint into a `PassJob` of plain values. `rewrite` (anywhere: the broker runs it
in a worker process, so its Python loops never take the interpreter from the event loop)
reads the dirty segments to build the offset map (as many whole segments as `buffer_bytes`
allows), then rewrites every sealed segment from the log start up to the map's end, group by
group, each group into one fsynced `.cleaned` file. `swap` (on the log's owner, in a thread)
puts each file in place of the segments it replaces, crash-safely
(jetstream.stream.cleaning) under the log's lock, and last writes the cleaner checkpoint; the
log goes on taking appends and reads throughout. A corrupt batch raises CorruptRecord (the
caller leaves that partition alone); segments that changed meanwhile raise SegmentsChanged
(the caller plans again), and the cleaned files not swapped in are removed. `clean` runs the
three in the calling thread.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from jetstream.compaction import checkpoint as cleaner_checkpoint
from jetstream.compaction.checkpoint import CleanerCheckpoint
from jetstream.compaction.offset_map import OffsetMap, scan_keys
from jetstream.compaction.planner import (
    CleaningPlan,
    CompactionConfig,
    SegmentInfo,
    group_segments,
)
from jetstream.compaction.rewrite import PassStats, filter_batches, retention_rule
from jetstream.errors import CorruptRecord, SegmentsChanged, StorageError
from jetstream.stream import cleaning
from jetstream.stream import format as fmt
from jetstream.stream.log import Log
from jetstream.stream.segment import Segment

#: Segment files are read in chunks of this size (a larger batch is read whole).
READ_CHUNK_BYTES = 4 * 1024 * 1024


class OffsetMapTooSmall(StorageError):
    """Not even one dirty segment's keys fit the cleaner's buffer: raise
    `cleaner_buffer_bytes` (or lower the stream's segment size)."""

    code = "CLEANER_BUFFER_TOO_SMALL"


@dataclass(frozen=True, slots=True)
class SegmentFile:
    """A sealed segment as a pass reads it: its file and what the planner knows of it."""

    path: Path
    info: SegmentInfo

    @property
    def next_offset(self) -> int:
        return self.info.next_offset


@dataclass(frozen=True, slots=True)
class PassJob:
    """Everything the rewrite needs, as plain values (it may run in a worker process)."""

    directory: Path
    #: The sealed segments the pass may read, oldest first.
    segments: tuple[SegmentFile, ...]
    first_dirty_offset: int
    state: CleanerCheckpoint
    config: CompactionConfig
    buffer_bytes: int
    now_ms: int


@dataclass(frozen=True, slots=True)
class CleanedGroup:
    """One `.cleaned` file and the base offsets of the segments it replaces."""

    path: Path
    replaces: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Rewritten:
    """What the rewrite wrote: swapped in afterwards, on the log's owner."""

    end_offset: int
    stats: PassStats
    groups: tuple[CleanedGroup, ...]
    checkpoint: CleanerCheckpoint


@dataclass(frozen=True, slots=True)
class Prepared:
    job: PassJob
    #: The segments the job names, by base offset: the swap checks they are still there.
    segments: dict[int, Segment]
    started: float


@dataclass(frozen=True, slots=True)
class PassResult:
    end_offset: int
    stats: PassStats
    segments_before: int
    segments_after: int
    duration_s: float
    checkpoint: CleanerCheckpoint


def segment_info(segment: Segment) -> SegmentInfo:
    return SegmentInfo(segment.base_offset, segment.next_offset, segment.size,
                       segment.first_timestamp, segment.max_timestamp)


def read_batches(path: Path) -> Iterator[tuple[bytes, int, fmt.BatchHeader]]:
    """(buffer, position, header) of every batch of a sealed segment file, CRC-checked, read
    in bounded chunks."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise SegmentsChanged(f"{path} was deleted while cleaning") from None
    try:
        size = os.fstat(fd).st_size
        position = 0
        while position < size:
            buf = os.pread(fd, READ_CHUNK_BYTES, position)
            pos = 0
            while pos < len(buf):
                try:
                    header = fmt.parse_header(buf, pos) if len(buf) - pos >= \
                        fmt.BATCH_HEADER.size else None
                except fmt.BatchFormatError as exc:
                    raise CorruptRecord(f"bad batch header in {path} at {position + pos}: "
                                        f"{exc}", path=str(path),
                                        position=position + pos) from exc
                if header is None or pos + header.size > len(buf):
                    if pos == 0:  # one batch larger than a chunk: read it whole
                        need = header.size if header is not None else fmt.BATCH_HEADER.size
                        buf = os.pread(fd, need, position)
                        if len(buf) < need:
                            raise CorruptRecord(f"{path} ends inside a batch",
                                                path=str(path), position=position)
                        continue
                    break
                if not fmt.verify_crc(buf, pos, header):
                    raise CorruptRecord(f"CRC mismatch in {path} at {position + pos}",
                                        path=str(path), position=position + pos)
                yield buf, pos, header
                pos += header.size
            position += pos
    finally:
        os.close(fd)


def build_offset_map(segments: Sequence[SegmentFile], first_dirty_offset: int,
                     budget_bytes: int) -> OffsetMap:
    """The offset map over the dirty segments, as many whole ones as fit."""
    offset_map = OffsetMap(budget_bytes)
    for segment in segments:
        if segment.next_offset <= first_dirty_offset:
            continue
        keys = [info for buf, pos, header in read_batches(segment.path)
                for info in _scan(buf, pos, header, segment.path)]
        if not offset_map.add_segment(keys, segment.next_offset):
            break
    if offset_map.end_offset is None:
        raise OffsetMapTooSmall(f"the keys of one segment do not fit {budget_bytes} bytes",
                                budget_bytes=budget_bytes)
    return offset_map


def _scan(buf: bytes, pos: int, header: fmt.BatchHeader,
          path: Path) -> list[tuple[int, bytes | None, bool]]:
    try:
        return scan_keys(buf, pos, header)
    except fmt.BatchFormatError as exc:
        raise CorruptRecord(f"malformed batch in {path}: {exc}", path=str(path),
                            position=pos) from exc


def prepare(log: Log, plan: CleaningPlan, config: CompactionConfig, buffer_bytes: int,
            now_ms: int | None = None) -> Prepared:
    """The pass's job: the sealed segments below the plan's bound, and the checkpoint."""
    started = time.monotonic()
    now = int(time.time() * 1000) if now_ms is None else now_ms
    state = cleaner_checkpoint.read(log.directory).reset_to(log.log_start_offset)
    sealed = [s for s in log.sealed_segments()
              if s.next_offset <= plan.first_uncleanable_offset]
    job = PassJob(log.directory, tuple(SegmentFile(s.log_path, segment_info(s)) for s in sealed),
                  max(state.first_dirty_offset, plan.first_dirty_offset), state, config,
                  buffer_bytes, now)
    return Prepared(job, {s.base_offset: s for s in sealed}, started)


def rewrite(job: PassJob) -> Rewritten:
    """Build the offset map and write the cleaned copy of each group of segments it covers,
    as `.cleaned` files (removed again if the rewrite fails). Reads and writes files only:
    it runs in a worker process."""
    state, config = job.state, job.config
    if any(s.next_offset > job.first_dirty_offset for s in job.segments):
        offset_map = build_offset_map(job.segments, job.first_dirty_offset, job.buffer_bytes)
        assert offset_map.end_offset is not None
        end_offset = offset_map.end_offset
    else:  # nothing new: a pass over the clean part drops tombstones past their horizon
        offset_map, end_offset = OffsetMap(job.buffer_bytes), job.first_dirty_offset
    stats = PassStats()
    keep = retention_rule(offset_map, state, job.now_ms, config.delete_retention_ms, stats)
    to_clean = [s for s in job.segments if s.next_offset <= end_offset]
    written: list[CleanedGroup] = []
    try:
        by_base = {s.info.base_offset: s for s in to_clean}
        for group in group_segments([s.info for s in to_clean], config.segment_bytes_max):
            replaced = [by_base[info.base_offset] for info in group]
            batches = (item for segment in replaced for item in read_batches(segment.path))
            path = cleaning.write_cleaned(job.directory, group[0].base_offset,
                                          filter_batches(batches, keep, stats,
                                                         job.now_ms - config.duplicate_window_ms))
            written.append(CleanedGroup(path, tuple(info.base_offset for info in group)))
    except BaseException:
        for group_written in written:
            group_written.path.unlink(missing_ok=True)
        raise
    new_state = state.after_pass(end_offset, job.now_ms, config.delete_retention_ms,
                                 stats.new_tombstones > 0) if to_clean else state
    return Rewritten(end_offset, stats, tuple(written), new_state)


def swap(log: Log, prepared: Prepared, rewritten: Rewritten,
         hook: cleaning.StepHook | None = None) -> PassResult:
    """Swap each cleaned file in for the segments it replaces, then write the checkpoint.
    Raises SegmentsChanged (and removes the cleaned files not swapped in) when those segments
    are no longer what the rewrite read."""
    groups = list(rewritten.groups)
    try:
        while groups:
            group = groups[0]
            replaced = [prepared.segments[base] for base in group.replaces]
            log.replace_segments(replaced, group.path, hook)
            groups.pop(0)
    except BaseException:
        for left in groups:
            left.path.unlink(missing_ok=True)
        raise
    if rewritten.groups:
        cleaner_checkpoint.write(log.directory, rewritten.checkpoint)
    return PassResult(rewritten.end_offset, rewritten.stats,
                      sum(len(g.replaces) for g in rewritten.groups), len(rewritten.groups),
                      time.monotonic() - prepared.started, rewritten.checkpoint)


def clean(log: Log, plan: CleaningPlan, config: CompactionConfig, buffer_bytes: int,
          now_ms: int | None = None, hook: cleaning.StepHook | None = None) -> PassResult:
    """Run one pass in this thread (see the module docstring)."""
    prepared = prepare(log, plan, config, buffer_bytes, now_ms)
    return swap(log, prepared, rewrite(prepared.job), hook)
