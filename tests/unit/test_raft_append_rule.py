"""Raft's AppendEntries rule on a follower (jetstream.raft_meta.append_rule): pysyncobj's
handling of the planned message ends where the Raft paper's rule ends, for any follower log,
leader log and message cut from it — in particular, a stale message deletes nothing that
matches."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from jetstream.raft_meta.append_rule import AppendPlan, Entry, plan_append

Log = list[int]  # terms; the entry at list position i has index i (index 0: term 0, always)


def entry(log: Log, index: int) -> Entry:
    return (b"c%d" % index, index, log[index])


def term_of(log: Log, index: int) -> int | None:
    return log[index] if 0 <= index < len(log) else None


def raft(log: Log, prev: int, prev_term: int, entries: list[Entry]) -> tuple[Log, int | None]:
    """The paper's rule: (the log after, the index the follower matches through, or None
    when it refuses)."""
    if term_of(log, prev) != prev_term:
        return log, None
    out = list(log)
    for _, index, term in entries:
        if term_of(out, index) != term:
            out = [*out[:index], term]
    return out, prev + len(entries)


def pysyncobj(log: Log, prev: int, prev_term: int, entries: list[Entry] | tuple[Entry, ...],
              keep_tail: bool = False) -> tuple[Log, int | None]:
    """What pysyncobj does with a message: everything after `prev` deleted, `entries`
    appended; with `keep_tail` (bookkeeping only), nothing changes."""
    if keep_tail:
        return list(log), prev
    if term_of(log, prev) != prev_term:
        return log, None
    return log[:prev + 1] + [e[2] for e in entries], prev + len(entries)


def planned(log: Log, prev: int, prev_term: int,
            entries: list[Entry]) -> tuple[Log, int | None]:
    plan = plan_append(prev, prev_term, entries, lambda i: term_of(log, i), len(log) - 1)
    if plan is None:
        return pysyncobj(log, prev, prev_term, entries)
    return pysyncobj(log, plan.prev_index, plan.prev_term, plan.entries, plan.keep_tail)


terms = st.lists(st.integers(0, 3), max_size=12).map(lambda t: [0, *sorted(t)])


@settings(max_examples=500, deadline=None)
@given(follower=terms, leader=terms, data=st.data())
def test_the_planned_message_ends_where_raft_does(follower: Log, leader: Log,
                                                   data: st.DataObject) -> None:
    prev = data.draw(st.integers(0, len(leader) - 1))
    count = data.draw(st.integers(0, len(leader) - 1 - prev))
    entries = [entry(leader, i) for i in range(prev + 1, prev + 1 + count)]
    assert planned(follower, prev, leader[prev], entries) == \
        raft(follower, prev, leader[prev], entries)


def test_a_stale_message_deletes_nothing_that_matches() -> None:
    log = [0, 1, 1, 1, 2, 2]
    # A repeat of an old message carrying entries 2 and 3: the follower already holds 4 and 5.
    old = [entry(log, 2), entry(log, 3)]
    plan = plan_append(1, 1, old, lambda i: term_of(log, i), 5)
    assert plan == AppendPlan(3, 1, (), True)
    assert pysyncobj(log, 1, 1, old) == ([0, 1, 1, 1], 3)  # pysyncobj alone drops 4 and 5
    assert planned(log, 1, 1, old) == (log, 3)


def test_a_conflict_deletes_from_the_conflicting_entry_on() -> None:
    follower = [0, 1, 1, 1]
    leader = [0, 1, 1, 2, 2]
    plan = plan_append(1, 1, [entry(leader, i) for i in (2, 3, 4)],
                       lambda i: term_of(follower, i), 3)
    assert plan == AppendPlan(2, 1, [entry(leader, 3), entry(leader, 4)], False)
    assert planned(follower, 1, 1, [entry(leader, i) for i in (2, 3, 4)]) == (leader, 4)
