"""Raft's rule for a follower taking AppendEntries whose previous entry it holds. Pure: no IO.

Raft (§5.3): if an existing entry conflicts with a new one (same index, other term), delete it
and every entry after it; append the new entries not already in the log. Entries that match
are never deleted: a stale or repeated AppendEntries can arrive after a newer one, and a
follower dropping entries it already acknowledged could let a committed entry vanish from a
majority. pysyncobj instead deletes everything after the previous entry and appends the new
entries again, whatever they hold; `plan_append` turns its message into one it handles
rightly (see `jetstream.raft_meta._pysyncobj.SafeSyncObj`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

#: A pysyncobj log entry: (command, index, term).
Entry = tuple[Any, int, int]


@dataclass(frozen=True)
class AppendPlan:
    """What to hand pysyncobj instead. `keep_tail`: every entry of the message is already in
    the log and the log goes on past them; nothing may be deleted, the follower answers that
    it matches through `prev_index`, and commits no further than that."""

    prev_index: int
    prev_term: int
    entries: Sequence[Entry]
    keep_tail: bool


def plan_append(prev_index: int, prev_term: int, entries: Sequence[Entry],
                term_at: Callable[[int], int | None], last_index: int) -> AppendPlan | None:
    """The message's matching head taken off (its previous entry moved to the last entry
    already held); None when pysyncobj's own handling is right (the previous entry is
    missing or conflicts, or nothing in the message matches and the log ends with it)."""
    if term_at(prev_index) != prev_term:
        return None
    held = 0
    while held < len(entries) and term_at(entries[held][1]) == entries[held][2]:
        held += 1
    if held:
        prev_index, prev_term = entries[held - 1][1], entries[held - 1][2]
    rest = entries[held:]
    if not rest and last_index > prev_index:
        return AppendPlan(prev_index, prev_term, (), True)
    if not held:
        return None
    return AppendPlan(prev_index, prev_term, rest, False)
