"""The cleaner checkpoint of one partition replica: where its dirty part starts, and when the
cleaner first passed each tombstone.

Theory of operation: after a pass over the dirty range [first_dirty, end), the checkpoint's
`first_dirty_offset` becomes `end`, and a *mark* (end, cleaned_at_ms) records that every
tombstone below `end` and at or above the previous mark's end was first passed at
`cleaned_at_ms`. A tombstone is kept for `delete_retention_ms` after that time (so slow
consumers still see the deletion: Kafka's delete horizon, KIP-534) and removed by the first
pass after it. Marks are bounded: past MARKS_MAX, neighbours merge and keep the later time,
so a tombstone may be kept longer than asked, never shorter. Marks whose tombstones are all
past their horizon are dropped after the pass that removed them.

The file is a CRC-guarded checkpoint (jetstream.stream.checkpoint): written whole to a temp
file, fsynced and renamed. A missing or damaged file reads as "nothing cleaned yet": the
next pass treats the whole log as dirty and gives every tombstone a fresh horizon, which is
slower but never removes a tombstone early.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, replace
from pathlib import Path

from jetstream.stream import checkpoint

CHECKPOINT_FILE = "cleaner-checkpoint"
KIND = "cleaner"
#: Most tombstone marks kept per partition.
MARKS_MAX = 64


@dataclass(frozen=True, slots=True)
class Mark:
    #: Tombstones below this offset (and at or above the previous mark's) ...
    end_offset: int
    #: ... were first passed by the cleaner at this time (ms).
    cleaned_at_ms: int


@dataclass(frozen=True, slots=True)
class CleanerCheckpoint:
    first_dirty_offset: int = 0
    marks: tuple[Mark, ...] = ()

    def __post_init__(self) -> None:
        ends = [m.end_offset for m in self.marks]
        assert ends == sorted(set(ends)), ends
        assert not ends or ends[-1] <= self.first_dirty_offset, (ends, self.first_dirty_offset)

    def first_passed_ms(self, offset: int) -> int | None:
        """When the cleaner first passed `offset` (None: not yet, it is dirty)."""
        i = bisect.bisect_right([m.end_offset for m in self.marks], offset)
        return self.marks[i].cleaned_at_ms if i < len(self.marks) else None

    def tombstones_due_ms(self, delete_retention_ms: int) -> int | None:
        """When the oldest kept tombstone's horizon passes (None: no tombstone is kept)."""
        if not self.marks:
            return None
        return min(m.cleaned_at_ms for m in self.marks) + delete_retention_ms

    def after_pass(self, end_offset: int, now_ms: int, delete_retention_ms: int,
                   new_tombstones: bool = True) -> CleanerCheckpoint:
        """The checkpoint after a pass that cleaned up to `end_offset` at `now_ms`, having
        removed every tombstone whose horizon had passed; `new_tombstones` when it kept
        tombstones it was the first to pass (they get a mark)."""
        if end_offset < self.first_dirty_offset:
            return self
        # Tombstones of expired marks were removed by this pass: their marks go, and the
        # range they covered joins the next mark (harmless: nothing there is a tombstone
        # any more that is older than that mark's own tombstones).
        live = [m for m in self.marks if m.cleaned_at_ms + delete_retention_ms > now_ms]
        marks = [*live, Mark(end_offset, now_ms)] if new_tombstones and (
            not live or live[-1].end_offset < end_offset) else live
        while len(marks) > MARKS_MAX:
            # Merge the pair closest in time; the merged mark keeps the later time.
            i = min(range(len(marks) - 1),
                    key=lambda j: marks[j + 1].cleaned_at_ms - marks[j].cleaned_at_ms)
            marks[i:i + 2] = [Mark(marks[i + 1].end_offset,
                                   max(marks[i].cleaned_at_ms, marks[i + 1].cleaned_at_ms))]
        return CleanerCheckpoint(end_offset, tuple(marks))

    def reset_to(self, log_start_offset: int) -> CleanerCheckpoint:
        """The checkpoint for a log whose records below `log_start_offset` are gone."""
        if self.first_dirty_offset >= log_start_offset:
            return self
        return replace(self, first_dirty_offset=log_start_offset)


def read(directory: Path) -> CleanerCheckpoint:
    entries = checkpoint.read_entries(directory / CHECKPOINT_FILE, KIND)
    if not entries or len(entries[0]) != 1 or entries[0][0] < 0:
        return CleanerCheckpoint()
    marks = []
    for entry in entries[1:]:
        if len(entry) != 2:
            return CleanerCheckpoint()
        marks.append(Mark(entry[0], entry[1]))
    ends = [m.end_offset for m in marks]
    if ends != sorted(set(ends)) or (ends and ends[-1] > entries[0][0]):
        return CleanerCheckpoint()
    return CleanerCheckpoint(entries[0][0], tuple(marks))


def write(directory: Path, value: CleanerCheckpoint) -> None:
    checkpoint.write_entries(
        directory / CHECKPOINT_FILE, KIND,
        [(value.first_dirty_offset,), *((m.end_offset, m.cleaned_at_ms) for m in value.marks)])
