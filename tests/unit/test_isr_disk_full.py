"""A full disk's decisions: when a follower says it is full, when it appends, when it waits
before fetching; which partitions a full leader hands over, to whom, and how often."""

from __future__ import annotations

import pytest

from jetstream.isr.disk_full import (
    FollowerDisk,
    FullDiskHandOver,
    HandOver,
    LedPartition,
    successors,
)
from jetstream.isr.leader import LeaderState

ME = 1


def test_a_follower_is_unfit_while_its_disk_is_above_the_watermark() -> None:
    disk = FollowerDisk()
    assert (disk.unfit(False), disk.may_append(False)) == ("", True)
    assert (disk.unfit(True), disk.may_append(True)) == ("disk_full", False)
    disk.after_fetch(True, None)  # it appended nothing
    assert disk.unfit(True) == "disk_full"
    assert disk.unfit(False) == ""  # the monitor says there is room again


@pytest.mark.parametrize(("steps", "unfit"), [
    # (disk above the watermark, what the append did) per fetch round; then below it
    ([(False, False)], "disk_full"),  # an append found no room below the watermark
    ([(False, False), (False, True)], ""),  # the next one fit
    ([(False, False), (False, False)], "disk_full"),
    ([(False, False), (True, None)], "disk_full"),  # above the watermark: nothing tried
    ([(False, False), (False, None)], ""),  # nothing to append, and the monitor says room
    ([(False, True), (True, None), (False, True)], ""),
])
def test_a_failed_append_keeps_a_follower_unfit_until_one_succeeds(
        steps: list[tuple[bool, bool | None]], unfit: str) -> None:
    disk = FollowerDisk()
    for full, appended in steps:
        disk.after_fetch(full, appended)
    assert disk.unfit(False) == unfit


def test_successors_are_in_sync_fit_others_in_replica_order() -> None:
    assert successors((3, 1, 2), (1, 2, 3), ME) == [3, 2]
    assert successors((3, 1, 2), (1, 2), ME) == [2]
    assert successors((3, 1, 2), (1, 2, 3), ME, unfit=(3,)) == [2]
    assert successors((1, 2), (1,), ME) == []


def led(epoch: int = 4, isr: tuple[int, ...] = (1, 2, 3), unfit: frozenset[int] = frozenset(),
        stream: str = "s") -> LedPartition:
    return LedPartition(stream, 0, epoch, (1, 2, 3), isr, unfit)


def test_a_full_leader_hands_over_once_per_leader_epoch() -> None:
    hand_over = FullDiskHandOver(ME)
    assert hand_over.decide(False, [led()]) == []
    assert hand_over.decide(True, [led()]) == [HandOver("s", 0, 4, 2)]
    # Not again at that epoch, however long the disk stays full (the proposal may have
    # failed: the partition stays led here and refuses appends).
    assert hand_over.decide(True, [led()]) == []
    assert hand_over.decide(False, [led()]) == []
    assert hand_over.decide(True, [led()]) == []
    # Led here again at a later epoch: a new decision.
    assert hand_over.decide(True, [led(epoch=6)]) == [HandOver("s", 0, 6, 2)]


def test_a_full_leader_hands_over_only_to_an_in_sync_follower_with_room() -> None:
    hand_over = FullDiskHandOver(ME)
    assert hand_over.decide(True, [led(isr=(1,))]) == []  # nobody to hand it to: stays
    assert hand_over.decide(True, [led(unfit=frozenset({2, 3}))]) == []
    assert hand_over.decide(True, [led(unfit=frozenset({2}))]) == [HandOver("s", 0, 4, 3)]
    # One came back in sync later in the same epoch: decided then.
    again = FullDiskHandOver(ME)
    assert again.decide(True, [led(isr=(1,))]) == []
    assert again.decide(True, [led(isr=(1, 2))]) == [HandOver("s", 0, 4, 2)]


def test_each_led_partition_is_decided_on_its_own_and_forgotten_once_not_led() -> None:
    hand_over = FullDiskHandOver(ME)
    both = [led(stream="a"), led(stream="b", isr=(1,))]
    assert hand_over.decide(True, both) == [HandOver("a", 0, 4, 2)]
    assert hand_over.decide(True, [led(stream="b")]) == [HandOver("b", 0, 4, 2)]
    # "a" stopped being led here and is led again at the same epoch (its leader restarted
    # for a new fsync policy after a hand-over that did not commit): decided again, once.
    assert hand_over.decide(True, [led(stream="a")]) == [HandOver("a", 0, 4, 2)]


def test_what_a_full_follower_says_takes_it_out_of_the_leaders_isr_and_successors() -> None:
    leader = LeaderState(ME, 4, (1, 2, 3), (1, 2, 3), 0, 10, 0, 10_000, 2)
    leader.tick(0)
    disk = FollowerDisk()
    proposals = leader.on_follower_fetch(2, 10, 5, disk.unfit(True))
    assert [getattr(p, "isr", None) for p in proposals] == [(1, 3)]
    unfit = frozenset(r for r in (2, 3) if leader.follower_state(r).unfit)
    assert successors((1, 2, 3), (1, 2, 3), ME, unfit) == [3]
