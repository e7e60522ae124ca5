"""Damage a log knows of, and healing it in place with a healthy replica's batches.

Theory of operation
- A log records each damage its checks find (`DamageLedger`, at most `DAMAGE_MAX`): it is
  what `stream info` shows and what the broker heals, until a repair or a check that passes
  clears it, or the segment leaves the log (retention, truncation, compaction).
- Replicas copy their leader's batches byte for byte, so a healthy replica's batches for
  the damaged offsets normally have exactly the damaged range's length. `write_over`
  writes them over it in place: the file keeps its length, every other byte, its offsets
  and its indexes. It refuses (False) batches that are not exactly the checked batches of
  those offsets with that length (a replica that compacted differently): the caller then
  truncates (a follower) or hands its leadership over (a leader).
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from jetstream.stream.segment import Segment
from jetstream.stream.verified import Damage, batches_span

#: Damage records one log keeps (past it the oldest are dropped; a check finds them again).
DAMAGE_MAX = 256


class DamageLedger:
    """The damage found in one log and not yet healed, each with the segment it is in."""

    def __init__(self) -> None:
        self._found: dict[tuple[int, int], tuple[Damage, Segment]] = {}

    def __len__(self) -> int:
        return len(self._found)

    def record(self, damage: Damage, segment: Segment) -> bool:
        """True when it was not known yet."""
        key = (damage.segment_base, damage.position)
        new = key not in self._found
        self._found[key] = (damage, segment)
        while len(self._found) > DAMAGE_MAX:
            self._found.pop(next(iter(self._found)))
        return new

    def current(self, segments: Iterable[Segment]) -> list[Damage]:
        """The damage still in `segments` (the log's now), oldest offsets first; forgets the
        rest (its segment left the log, was replaced, or was cut before it)."""
        if not self._found:
            return []
        alive = {id(s): s for s in segments}
        for key, (damage, segment) in list(self._found.items()):
            if alive.get(id(segment)) is not segment or segment.size < damage.end_position:
                del self._found[key]
        return sorted((d for d, _s in self._found.values()), key=lambda d: d.first_offset)

    def healed(self, damage: Damage) -> None:
        self._found.pop((damage.segment_base, damage.position), None)

    def passed(self, segment: Segment) -> None:
        """A check of the whole of `segment` passed: nothing recorded in it stands."""
        for key in [k for k, (_d, s) in self._found.items() if s is segment]:
            del self._found[key]


def why_not_write_over(segment: Segment, damage: Damage, good: bytes) -> str | None:
    """Why `good` cannot replace `damage` in `segment` (None: it can)."""
    if segment.base_offset != damage.segment_base or segment.size < damage.end_position:
        return "the segment changed since the damage was found"
    if len(good) != damage.end_position - damage.position:
        return (f"the healthy copy holds {len(good)} bytes for these offsets, the damaged "
                f"range {damage.end_position - damage.position}")
    return batches_span(good, damage.first_offset, damage.end_offset)


def write_over(segment: Segment, damage: Damage, good: bytes, fsync: bool) -> None:
    """Write `good` (checked by `why_not_write_over`) over the damaged bytes."""
    view = memoryview(good)
    written = 0
    with segment.pinned() as fd:
        while written < len(good):
            written += os.pwrite(fd, view[written:], damage.position + written)
        if fsync:
            os.fsync(fd)
    segment.verified.add(damage.position, damage.end_position)
