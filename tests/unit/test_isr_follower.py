"""Follower truncation by leader epoch (jetstream.isr.follower): the classic KIP-101 and
KIP-279 divergence scenarios as tables, and a property over generated histories: after the
exchange the follower's log is a prefix of the leader's, and it kept every record it shares
with the leader unless the leader's log start no longer holds them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from jetstream.isr.follower import (
    Done,
    EntryLike,
    TruncateFully,
    TruncateTo,
    TruncationStep,
    end_offset_for_epoch,
    epoch_to_ask,
    plan_steps,
    plan_truncation,
    resolve,
    start_past_removed,
)
from jetstream.stream.epoch import UNDEFINED, EpochEndOffset, EpochEntry, LeaderEpochCache

Entries = list[tuple[int, int]]

# -- the scenarios ------------------------------------------------------------------------------
# Each row: local entries, local LEO, leader entries, leader LEO, leader log start, the steps.

SCENARIOS: dict[str, tuple[Entries, int, Entries, int, int, list[TruncationStep]]] = {
    # KIP-101 scenario 1: the follower restarts with HW 1 but holds offsets 0-1 of epoch 0,
    # as the leader does. Truncating to the HW would lose offset 1 (committed, perhaps, and
    # gone for good if this follower becomes leader). Asking the leader keeps it.
    "restart_keeps_what_the_leader_has": (
        [(0, 0)], 2, [(0, 0)], 2, 0, [Done(2)]),
    # KIP-101 scenario 2, leader and follower both crash: A (leader, epoch 0) has 0-1, B only
    # 0. Both crash; B comes back first, leads epoch 1 and writes offset 1. A must drop its
    # offset 1 (epoch 0), which B overwrote in epoch 1.
    "both_crash_and_the_new_leader_overwrote": (
        [(0, 0)], 2, [(0, 0), (1, 1)], 2, 0, [Done(1)]),
    # The follower was leader in epoch 2 and wrote 4-6 that nobody copied; the new leader has
    # epoch 3 from offset 4. The follower's epoch 2 was never the leader's.
    "follower_has_an_epoch_the_leader_never_had": (
        [(0, 0), (2, 4)], 7, [(0, 0), (3, 4)], 6, 0, [Done(4)]),
    # The follower is ahead, with a suffix of another epoch: it keeps its epoch 1 up to where
    # the leader's epoch 1 ended.
    "follower_ahead_with_a_different_epoch_suffix": (
        [(0, 0), (1, 3), (2, 6)], 10, [(0, 0), (1, 3), (3, 5)], 8, 0, [Done(5)]),
    # KIP-279: the follower never had epoch 1 (it was offline); it holds epoch 0 at offset 4
    # where the leader holds epoch 1. KIP-101 alone truncated to the leader's end of epoch 1
    # (6) and kept that divergent offset 4; asking again about epoch 0 finds it.
    "follower_missing_an_epoch": (
        [(0, 0), (2, 5)], 8, [(0, 0), (1, 4), (3, 6)], 9, 0,
        [TruncateTo(5, then_ask_epoch=0), Done(4)]),
    # Several epochs on each side that the other never had: one round per local epoch.
    "interleaved_epochs_take_several_rounds": (
        [(0, 0), (2, 3), (4, 6), (6, 9)], 12, [(0, 0), (1, 2), (3, 5), (5, 8), (7, 10)], 12, 0,
        [TruncateTo(9, 4), TruncateTo(6, 2), TruncateTo(3, 0), Done(2)]),
    # The leader's log starts after all the follower's epochs: it knows none of them. The
    # follower drops its log and starts at the leader's log start, never at its HW.
    "leader_log_starts_after_the_followers_epochs": (
        [(0, 0), (1, 5)], 8, [(4, 20)], 25, 20, [TruncateFully(20)]),
    # The leader's log start cut into epoch 0: it still knows epoch 0 (the covering entry).
    "leader_log_start_inside_a_shared_epoch": (
        [(0, 0)], 5, [(0, 3), (1, 5)], 9, 3, [Done(5)]),
    # A follower that is simply behind has nothing to truncate.
    "follower_is_a_prefix": ([(0, 0), (1, 4)], 6, [(0, 0), (1, 4), (2, 9)], 12, 0, [Done(6)]),
    # An empty log has nothing to confirm: fetch from its LEO.
    "empty_follower": ([], 7, [(0, 0)], 9, 0, [Done(7)]),
    # The leader became leader at epoch 1 and wrote nothing yet (an entry at its LEO).
    "leader_wrote_nothing_in_its_epoch": ([(0, 0)], 10, [(0, 0), (1, 10)], 10, 0, [Done(10)]),
    # The follower was leader at epoch 2 and wrote nothing; the leader had epoch 1 from 8.
    "follower_wrote_nothing_in_its_epoch": (
        [(0, 0), (2, 10)], 10, [(0, 0), (1, 8), (3, 12)], 12, 0,
        [TruncateTo(10, then_ask_epoch=0), Done(8)]),
    # No follower epoch is one the leader has (only after an unclean history): all of the
    # follower's log is divergent.
    "no_common_epoch": ([(3, 0)], 5, [(1, 0), (2, 2)], 6, 0, [TruncateFully(0)]),
    # The leader's epoch 1 ends below the follower's log start (unclean): nothing in common.
    "leader_epoch_ends_below_the_follower_log_start": (
        [(1, 10)], 15, [(1, 0), (2, 4)], 9, 0, [TruncateFully(0)]),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_scenarios(name: str) -> None:
    local, local_leo, leader, leader_leo, leader_start, expected = SCENARIOS[name]
    assert plan_steps(local, local_leo, leader, leader_leo, leader_start) == expected
    assert resolve(local, local_leo, leader, leader_leo, leader_start) == expected[-1]


def test_an_undefined_answer_truncates_fully_never_to_the_hw() -> None:
    step = plan_truncation([(0, 0), (1, 5)], 8, EpochEndOffset(UNDEFINED, UNDEFINED),
                           leader_log_start_offset=40)
    assert step == TruncateFully(40)


def test_plan_truncation_takes_epoch_entries_and_a_stale_entry_at_the_leo() -> None:
    # Log.truncate_to at the LEO is a no-op that leaves an empty epoch's entry behind: the
    # next round gives the same answer as with the entry dropped.
    answer = EpochEndOffset(0, 8)
    with_stale = plan_truncation([EpochEntry(0, 0), EpochEntry(2, 10)], 10, answer,
                                 leader_log_start_offset=0)
    assert with_stale == plan_truncation([(0, 0)], 10, answer, leader_log_start_offset=0)
    assert with_stale == Done(8)


def test_a_leader_answer_above_the_asked_epoch_is_a_bug() -> None:
    with pytest.raises(AssertionError):
        plan_truncation([(0, 0), (1, 5)], 8, EpochEndOffset(2, 8), leader_log_start_offset=0)


def test_epoch_to_ask() -> None:
    assert epoch_to_ask([]) is None
    assert epoch_to_ask([(0, 0)]) == 0
    assert epoch_to_ask([(0, 0), (3, 7)]) == 3


def test_entries_must_increase() -> None:
    with pytest.raises(AssertionError):
        epoch_to_ask([(1, 0), (1, 5)])
    with pytest.raises(AssertionError):
        epoch_to_ask([(1, 5), (2, 5)])


@given(
    starts=st.lists(st.integers(0, 5), min_size=0, max_size=6),
    gaps=st.lists(st.integers(1, 3), min_size=6, max_size=6),
    tail=st.integers(0, 5),
    requested=st.integers(-1, 25),
)
def test_end_offset_for_epoch_agrees_with_the_cache(
        starts: list[int], gaps: list[int], tail: int, requested: int) -> None:
    entries: Entries = []
    epoch, offset = 0, 0
    for gap, step in zip(gaps, starts, strict=False):
        epoch, offset = epoch + gap, offset + step + (1 if entries else 0)
        entries.append((epoch, offset))
    leo = (entries[-1][1] if entries else 0) + tail
    cache = LeaderEpochCache(Path("unused"), persist=False)
    for e, s in entries:
        cache.assign(e, s)
    assert end_offset_for_epoch(entries, requested, leo) == cache.end_offset_for_epoch(
        requested, leo)


# -- property: generated histories -------------------------------------------------------------


@dataclass(frozen=True)
class History:
    """Per-offset epochs of both full logs (before any log start), and each one's cache."""

    common: list[int]  # the shared prefix
    leader: list[int]
    follower: list[int]
    leader_entries: list[EpochEntry]
    follower_entries: list[EpochEntry]
    leader_start: int
    follower_start: int


def cache_of(per_offset: list[int], empty_epoch: int | None, log_start: int) -> list[EpochEntry]:
    """The epoch cache a log with these records has: the first offset of each epoch, an
    entry at the LEO for an epoch led without writing, then cut at the log start."""
    cache = LeaderEpochCache(Path("unused"), persist=False)
    for offset, epoch in enumerate(per_offset):
        if epoch > cache.latest_epoch:
            cache.assign(epoch, offset)
    if empty_epoch is not None:
        cache.assign(empty_epoch, len(per_offset))
    cache.truncate_from_start(log_start)
    return cache.entries


@st.composite
def histories(draw: st.DrawFn) -> History:
    """Two logs that share a prefix, then diverge. Each epoch's records are written by that
    epoch's leader only, so after the prefix the two sides hold disjoint epochs, except that
    one side (never both) may continue the prefix's last epoch: it received more of that
    leader's records than the other before the other moved on."""
    next_epoch = draw(st.integers(0, 2))

    def fresh() -> int:
        nonlocal next_epoch
        next_epoch += draw(st.integers(1, 2))
        return next_epoch

    common: list[int] = []
    for _ in range(draw(st.integers(0, 4))):
        common += [fresh()] * draw(st.integers(1, 4))
    sides: dict[str, list[int]] = {"leader": [], "follower": []}
    if common:
        continuing = draw(st.sampled_from([None, "leader", "follower"]))
        if continuing is not None:
            sides[continuing] += [common[-1]] * draw(st.integers(1, 3))
    for _ in range(draw(st.integers(0, 5))):
        side = draw(st.sampled_from(["leader", "follower"]))
        sides[side] += [fresh()] * draw(st.integers(1, 3))
    # A replica that became leader and wrote nothing has an entry at its LEO; the current
    # leader always has one for its epoch, the newest of all.
    follower_empty = fresh() if draw(st.booleans()) else None
    leader_empty = fresh() if draw(st.booleans()) else None
    leader = common + sides["leader"]
    follower = common + sides["follower"]
    # Retention removes committed records only, which the follower shares with the leader.
    follower_start = draw(st.integers(0, len(common)))
    leader_start = draw(st.integers(0, len(leader)))
    return History(common, leader, follower,
                   cache_of(leader, leader_empty, leader_start),
                   cache_of(follower, follower_empty, follower_start),
                   leader_start, follower_start)


def shared_length(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@settings(max_examples=2_000, deadline=None)
@given(histories())
def test_the_follower_ends_as_a_prefix_of_the_leader(history: History) -> None:
    local: list[EntryLike] = list(history.follower_entries)
    shared = shared_length(history.leader, history.follower)
    assert shared >= len(history.common)
    steps = plan_steps(local, len(history.follower), list(history.leader_entries),
                       len(history.leader), history.leader_start)
    assert len(steps) <= max(1, len(local))
    final = steps[-1]
    event(f"{type(final).__name__} after {len(steps)} round(s)")
    if isinstance(final, TruncateFully):
        assert final.start_at == history.leader_start
        # Only when the leader no longer holds any record the follower shares with it.
        assert shared <= max(history.leader_start, history.follower_start)
        return
    assert isinstance(final, Done)
    kept = range(history.follower_start, final.truncate_to)
    assert final.truncate_to <= len(history.follower)
    # Same epoch, hence the same record, at every offset the follower keeps...
    assert all(o < len(history.leader) and history.follower[o] == history.leader[o]
               for o in kept)
    # ...and nothing it shared with the leader was dropped.
    assert final.truncate_to >= shared
    for step in steps:
        if isinstance(step, TruncateTo):
            assert step.offset >= shared


def test_a_log_ending_below_the_leaders_log_start_restarts_there() -> None:
    # An empty replica of a leader whose retention (or offload) removed its first segments.
    assert start_past_removed(0, 120) == TruncateFully(120)
    assert start_past_removed(80, 120) == TruncateFully(120)
    # At or past the leader's log start: fetching from the log end works, or (ahead of the
    # leader) truncation decides.
    assert start_past_removed(120, 120) is None
    assert start_past_removed(500, 120) is None
