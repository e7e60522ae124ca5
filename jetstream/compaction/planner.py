"""Which partition the log cleaner cleans next, and what part of it (pure: no IO, no clock).

Theory of operation (Kafka's log cleaner):
- A compacted partition's log is, oldest first: a *clean* part (already compacted: at most
  one record per key, but keys may repeat later in the log), a *dirty* part (appended since
  the last pass), and an *uncleanable* tail: the active segment, everything at or above the
  high watermark (not committed: it may still be truncated), and segments holding records
  newer than `min_compaction_lag_ms` (consumers get that long to see every update).
- `first_dirty_offset` is the cleaner checkpoint's (jetstream.compaction.checkpoint), never
  below the log start. The dirty ratio is dirty bytes over clean plus dirty bytes, counted in
  whole segments as Kafka does.
- The cleaner picks the partition with the highest dirty ratio at or above its
  `min_cleanable_dirty_ratio`; a partition whose oldest dirty record is older than
  `max_compaction_lag_ms` is due regardless of its ratio, and goes first.
- A pass rewrites the sealed segments from the log start to the end of its offset map, in
  groups (`group_segments`) so compaction does not multiply small files: consecutive
  segments whose sizes before cleaning add up to at most `segment_bytes_max` and whose
  offsets span fits the index's 32-bit relative offsets become one segment.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass

from jetstream.errors import InvalidConfig

#: A segment's offsets are stored relative to its base offset as u32 in its index.
RELATIVE_OFFSET_MAX = 0xFFFFFFFF
DAY_MS = 24 * 3600 * 1000


class CleanupPolicy(enum.StrEnum):
    """What a stream does with old records: `delete` whole segments past retention,
    `compact` them down to the newest record per key, or both (`compact,delete`)."""

    DELETE = "delete"
    COMPACT = "compact"
    COMPACT_DELETE = "compact,delete"

    @property
    def compacts(self) -> bool:
        return self is not CleanupPolicy.DELETE

    @property
    def deletes(self) -> bool:
        return self is not CleanupPolicy.COMPACT


@dataclass(frozen=True, slots=True)
class CompactionConfig:
    """A compacted stream's cleaner settings, with Kafka's meanings."""

    #: Clean once dirty bytes are at least this share of clean + dirty bytes.
    min_cleanable_dirty_ratio: float = 0.5
    #: Records newer than this stay uncompacted (ms).
    min_compaction_lag_ms: int = 0
    #: A record stays uncompacted at most this long (ms), whatever the dirty ratio; None: no bound.
    max_compaction_lag_ms: int | None = None
    #: A tombstone is kept this long after the cleaner first passed it (ms).
    delete_retention_ms: int = DAY_MS
    #: Cleaned segments are grouped up to this size (the stream's segment size).
    segment_bytes_max: int = 64 * 1024 * 1024
    #: A batch holding a message id or a producer stamp is kept whole while it is younger
    #: than this (ms): a new leader rebuilds the duplicate window from it.
    duplicate_window_ms: int = 0

    def __post_init__(self) -> None:
        ratio = self.min_cleanable_dirty_ratio
        if isinstance(ratio, bool) or not isinstance(ratio, int | float) or not 0 <= ratio <= 1:
            raise InvalidConfig("min_cleanable_dirty_ratio must be a number in [0, 1], got "
                                f"{ratio!r}", field="min_cleanable_dirty_ratio")
        _check_ms("min_compaction_lag_ms", self.min_compaction_lag_ms)
        if self.max_compaction_lag_ms is not None:
            _check_ms("max_compaction_lag_ms", self.max_compaction_lag_ms)
            if self.max_compaction_lag_ms < self.min_compaction_lag_ms:
                raise InvalidConfig("max_compaction_lag_ms must not be below "
                                    "min_compaction_lag_ms", field="max_compaction_lag_ms")
        _check_ms("delete_retention_ms", self.delete_retention_ms)


def _check_ms(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 2**62:
        raise InvalidConfig(f"{name} must be an integer number of ms >= 0, got {value!r}",
                            field=name)


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    """What the planner knows of one sealed segment."""

    base_offset: int
    next_offset: int
    size_bytes: int
    #: Timestamp of the segment's first batch and its newest record (ms; -1 when unknown).
    first_timestamp_ms: int
    max_timestamp_ms: int


@dataclass(frozen=True, slots=True)
class PartitionView:
    """One compacted partition replica as the cleaner sees it."""

    key: Hashable
    #: Sealed segments, oldest first (never the active one).
    segments: tuple[SegmentInfo, ...]
    active_base_offset: int
    high_watermark: int
    first_dirty_offset: int
    config: CompactionConfig
    #: When the oldest kept tombstone may go (the cleaner checkpoint's); None: none kept.
    tombstones_due_ms: int | None = None

    @property
    def log_start_offset(self) -> int:
        return self.segments[0].base_offset if self.segments else self.active_base_offset


@dataclass(frozen=True, slots=True)
class CleaningPlan:
    key: Hashable
    first_dirty_offset: int
    first_uncleanable_offset: int
    dirty_ratio: float
    #: True when `max_compaction_lag_ms` made it due, whatever its ratio.
    forced: bool


def first_uncleanable_offset(view: PartitionView, now_ms: int) -> int:
    """Where the cleaner must stop: the active segment, the high watermark, or the first
    segment holding a record newer than `min_compaction_lag_ms`, whichever comes first."""
    bound = min(view.active_base_offset, view.high_watermark)
    lag = view.config.min_compaction_lag_ms
    if lag > 0:
        for segment in view.segments:
            if segment.max_timestamp_ms > now_ms - lag:
                bound = min(bound, segment.base_offset)
                break
    return bound


def _dirty_start(view: PartitionView) -> int:
    return max(view.first_dirty_offset, view.log_start_offset)


def cleanable_segments(view: PartitionView, now_ms: int) -> list[SegmentInfo]:
    """The sealed segments wholly below the first uncleanable offset."""
    bound = first_uncleanable_offset(view, now_ms)
    return [s for s in view.segments if s.next_offset <= bound]


def clean_and_dirty_bytes(view: PartitionView, now_ms: int) -> tuple[int, int]:
    """Bytes of the clean part and of the dirty part (whole segments: a segment holding the
    first dirty offset counts as dirty)."""
    start = _dirty_start(view)
    clean = dirty = 0
    for segment in cleanable_segments(view, now_ms):
        if segment.next_offset <= start:
            clean += segment.size_bytes
        else:
            dirty += segment.size_bytes
    return clean, dirty


def dirty_ratio(view: PartitionView, now_ms: int) -> float:
    clean, dirty = clean_and_dirty_bytes(view, now_ms)
    return dirty / (clean + dirty) if clean + dirty else 0.0


def needs_compaction_now(view: PartitionView, now_ms: int) -> bool:
    """The oldest dirty record is older than `max_compaction_lag_ms` (KIP-354)."""
    lag = view.config.max_compaction_lag_ms
    if lag is None:
        return False
    start = _dirty_start(view)
    for segment in cleanable_segments(view, now_ms):
        if segment.next_offset > start:
            return 0 <= segment.first_timestamp_ms <= now_ms - lag
    return False


def plan(view: PartitionView, now_ms: int) -> CleaningPlan | None:
    """The pass this partition wants now, or None (nothing dirty, ratio below threshold)."""
    clean, dirty = clean_and_dirty_bytes(view, now_ms)
    if dirty == 0:
        # Nothing new, but a pass over the clean part removes tombstones past their horizon.
        due = view.tombstones_due_ms
        if due is not None and due <= now_ms and clean:
            return CleaningPlan(view.key, _dirty_start(view),
                                first_uncleanable_offset(view, now_ms), 0.0, True)
        return None
    ratio = dirty / (clean + dirty)
    forced = needs_compaction_now(view, now_ms)
    if not forced and ratio < view.config.min_cleanable_dirty_ratio:
        return None
    return CleaningPlan(view.key, _dirty_start(view), first_uncleanable_offset(view, now_ms),
                        ratio, forced)


def choose(views: Iterable[PartitionView], now_ms: int,
           skip: frozenset[Hashable] = frozenset()) -> CleaningPlan | None:
    """The filthiest partition: forced ones first, then by dirty ratio (ties: the key order
    given, so the choice is deterministic)."""
    best: CleaningPlan | None = None
    for view in views:
        if view.key in skip:
            continue
        candidate = plan(view, now_ms)
        if candidate is None:
            continue
        if best is None or (candidate.forced, candidate.dirty_ratio) > (best.forced,
                                                                       best.dirty_ratio):
            best = candidate
    return best


def group_segments(segments: Sequence[SegmentInfo], segment_bytes_max: int
                   ) -> list[list[SegmentInfo]]:
    """Consecutive segments cleaned into one: their sizes before cleaning add up to at most
    `segment_bytes_max` and their offsets fit a 32-bit relative offset from the first one's
    base. A segment larger than the limit is a group of its own."""
    groups: list[list[SegmentInfo]] = []
    for segment in segments:
        if groups:
            group = groups[-1]
            size = sum(s.size_bytes for s in group) + segment.size_bytes
            span = segment.next_offset - 1 - group[0].base_offset
            if size <= segment_bytes_max and span <= RELATIVE_OFFSET_MAX:
                group.append(segment)
                continue
        groups.append([segment])
    return groups
