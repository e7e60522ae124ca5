"""What to offload, what may leave the local disk, and what retention removes from the store.

Theory of operation: three pure decisions over the sealed segments of a partition's log and
its fragment index (jetstream.tiered.index); the offload shell (jetstream.tiered.offload)
carries them out.
- Offload: a sealed segment wholly below the high watermark (committed, so byte-identical on
  every in-sync replica) and not yet covered by fragments in the store is uploaded, oldest
  first, a few per pass. The active segment is never offloaded: it is not sealed.
- Local deletion (`local_retention_ms` / `local_retention_bytes`): the oldest sealed
  segments go from the local disk once their offsets are covered by fragments verified in
  the store and the local limits no longer keep them, oldest first, never past one that
  must stay. With neither limit set, nothing is deleted locally for the store's sake (the
  store is a copy).
- Store retention (`retention_*`, which with a store covers store and disk as one log):
  the oldest fragments go by age (the object's modification time, which comes after every
  record it holds), by size (stored and local bytes together) and by record count; a prune
  takes every fragment that ends at or before an offset. Everything at or below the cut
  goes, redundant fragments too, and local segments below it with them.
- Parquet fragments (`fragment_format` parquet or both): a sealed, committed segment not yet
  covered by Parquet fragments is written as one, a few per pass; of a compacted stream only
  segments the cleaner has passed (below its first dirty offset), so Parquet holds cleaned
  records. With both formats, a local segment leaves the disk only once Parquet covers it
  too (it is what the Parquet fragment is made from). Retention takes Parquet fragments with
  the history below a cut, and on their own by the same rules (age, their bytes with the
  local log's, record count).
Pure: no IO, no clock (`now_ms` is an argument).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from jetstream.tiered.index import Coverage, FragmentIndex, StoredFragment

#: Most segments one offload pass uploads (the next pass takes the rest).
UPLOADS_PER_PASS_MAX = 4


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    """A sealed local segment: its offsets [base_offset, next_offset), its size and the
    newest record timestamp it holds (-1: none)."""

    base_offset: int
    next_offset: int
    size_bytes: int
    max_timestamp_ms: int


@dataclass(frozen=True, slots=True)
class LocalRetention:
    local_retention_ms: int | None
    local_retention_bytes: int | None


@dataclass(frozen=True, slots=True)
class OffloadPlan:
    """Segments to upload (oldest first), and the offset below which local sealed segments
    may be deleted (`delete_below`: every segment ending at or before it; None: none)."""

    uploads: tuple[SegmentInfo, ...]
    delete_below: int | None
    #: Bytes of sealed, committed segments not in the store yet (the offload backlog).
    backlog_bytes: int


def plan_offload(sealed: Sequence[SegmentInfo], active_bytes: int, high_watermark: int,
                 index: FragmentIndex, retention: LocalRetention, now_ms: int, *,
                 uploads_max: int = UPLOADS_PER_PASS_MAX, parquet_too: bool = False
                 ) -> OffloadPlan:
    """See the module docstring. `sealed`: oldest first; `active_bytes`: the active
    segment's size (it counts toward `local_retention_bytes`); `parquet_too`: a segment
    leaves the disk only once Parquet fragments cover it as well."""
    pending = _not_covered(sealed, high_watermark, index.covers)
    required = [index.covers, index.parquet.covers] if parquet_too else [index.covers]
    return OffloadPlan(tuple(pending[:uploads_max]),
                       _delete_below(sealed, active_bytes, required, retention, now_ms),
                       sum(s.size_bytes for s in pending))


def _not_covered(sealed: Sequence[SegmentInfo], below: int,
                 covers: Callable[[int, int], bool]) -> list[SegmentInfo]:
    return [s for s in sealed if s.next_offset <= below and s.next_offset > s.base_offset
            and not covers(s.base_offset, s.next_offset)]


def plan_parquet(sealed: Sequence[SegmentInfo], high_watermark: int, parquet: Coverage,
                 clean_below: int | None, *, uploads_max: int = UPLOADS_PER_PASS_MAX
                 ) -> tuple[tuple[SegmentInfo, ...], int]:
    """The segments to write as Parquet fragments (oldest first) and the bytes of all not
    yet written. `clean_below`: a compacted stream's first dirty offset (None: not
    compacted)."""
    below = high_watermark if clean_below is None else min(high_watermark, clean_below)
    pending = _not_covered(sealed, below, parquet.covers)
    return tuple(pending[:uploads_max]), sum(s.size_bytes for s in pending)


def _delete_below(sealed: Sequence[SegmentInfo], active_bytes: int,
                  required: Sequence[Callable[[int, int], bool]], retention: LocalRetention,
                  now_ms: int) -> int | None:
    if retention.local_retention_ms is None and retention.local_retention_bytes is None:
        return None
    local_bytes = active_bytes + sum(s.size_bytes for s in sealed)
    below: int | None = None
    for segment in sealed:
        if not all(covers(segment.base_offset, segment.next_offset) for covers in required):
            break
        too_old = (retention.local_retention_ms is not None
                   and 0 <= segment.max_timestamp_ms < now_ms - retention.local_retention_ms)
        too_big = (retention.local_retention_bytes is not None
                   and local_bytes > retention.local_retention_bytes)
        if not (too_old or too_big):
            break
        local_bytes -= segment.size_bytes
        below = segment.next_offset
    return below


@dataclass(frozen=True, slots=True)
class TotalRetention:
    retention_ms: int | None
    retention_bytes: int | None
    retention_messages: int | None


def retention_cut(index: FragmentIndex | Coverage, local_bytes: int, log_end_offset: int,
                  retention: TotalRetention, now_ms: int) -> int | None:
    """The offset below which retention deletes the stored history (None: nothing): of the
    segment fragments of an index, or of the fragments of one Coverage (Parquet)."""
    if (retention.retention_ms is None and retention.retention_bytes is None
            and retention.retention_messages is None):
        return None  # no walk over every fragment in each pass for nothing
    fragments = index.fragments if isinstance(index, FragmentIndex) else index.useful
    total_bytes = local_bytes + (sum(f.size_bytes for f in fragments)
                                 if retention.retention_bytes is not None else 0)
    cut: int | None = None
    for fragment in fragments:
        expired = (
            (retention.retention_ms is not None
             and fragment.modified_ms < now_ms - retention.retention_ms)
            or (retention.retention_bytes is not None
                and total_bytes > retention.retention_bytes)
            or (retention.retention_messages is not None
                and log_end_offset - fragment.begin > retention.retention_messages))
        if not expired:
            break
        total_bytes -= fragment.size_bytes
        cut = fragment.end
    return cut


def fragments_below(index: FragmentIndex, offset: int) -> list[StoredFragment]:
    """Every listed fragment (redundant ones too) that ends at or before `offset`."""
    return [f for f in index.all() if f.end <= offset]


def cut_for_time(index: FragmentIndex, before_ms: int) -> int | None:
    """A prune by time: the end of the last of the oldest fragments modified before
    `before_ms` (so every record they hold is older), None when the oldest is not."""
    cut: int | None = None
    for fragment in index.fragments:
        if fragment.modified_ms >= before_ms:
            break
        cut = fragment.end
    return cut
