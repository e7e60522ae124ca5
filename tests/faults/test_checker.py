"""The checker on hand-made histories and logs: each safety count goes up exactly when its
violation is present, and stays 0 on a clean run."""

from __future__ import annotations

from typing import Any

from tests.faults.checker import Record, Replica, check, percentile


def rec(offset: int, value: str, epoch: int = 0) -> Record:
    return (offset, 1000 + offset, epoch, value.encode(), value.encode(), (), "s")


def history(*events: tuple[str, str, dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"e": e, "v": v, "t": 10.0 + i, **extra} for i, (e, v, extra) in enumerate(events)]


def replicas(records: list[Record], hw: int, *others: list[Record]) -> dict[int, list[Replica]]:
    copies = [Replica(0, hw, records)] + [Replica(i + 1, hw, r) for i, r in enumerate(others)]
    return {0: copies}


CLEAN = history(("i", "a", {}), ("i", "b", {}), ("a", "a", {"p": 0, "o": 0}),
                ("a", "b", {"p": 0, "o": 1}), ("r", "a", {"p": 0, "o": 0}))
LOG = [rec(0, "a"), rec(1, "b")]


def test_clean_run() -> None:
    report = check(CLEAN, replicas(LOG, 2, list(LOG), list(LOG)))
    assert report.safe
    assert (report.acked, report.committed, report.consumer_reads) == (2, 2, 1)
    assert report.to_dict()["safe"] is True


def test_acked_lost() -> None:
    report = check(CLEAN, replicas([rec(0, "a")], 1))
    assert report.acked_lost == 1 and not report.safe
    assert "b acked at 0/1" in report.examples["acked_lost"][0]


def test_acked_but_above_the_high_watermark_is_lost() -> None:
    assert check(CLEAN, replicas(LOG, 1)).acked_lost == 1


def test_offset_conflicts() -> None:
    moved = check(CLEAN, replicas([rec(0, "b"), rec(1, "a")], 2))
    assert moved.offset_conflicts == 2
    twice = history(("i", "a", {}), ("i", "b", {}), ("a", "a", {"p": 0, "o": 0}),
                    ("a", "b", {"p": 0, "o": 0}))
    assert check(twice, replicas([rec(0, "a"), rec(1, "b")], 2)).offset_conflicts == 2


def test_phantoms_in_any_replica_or_read() -> None:
    report = check(CLEAN, replicas([*LOG, rec(2, "ghost")], 2))
    assert report.phantom_reads == 1
    read = history(("i", "a", {}), ("a", "a", {"p": 0, "o": 0}), ("r", "zz", {"p": 0, "o": 0}))
    assert check(read, replicas([rec(0, "a")], 1)).phantom_reads == 1


def test_divergent_replicas_compare_every_field_below_the_hw() -> None:
    other_epoch = [rec(0, "a"), rec(1, "b", epoch=3)]
    report = check(CLEAN, replicas(LOG, 2, list(LOG), other_epoch))
    assert report.divergent_replicas == 1
    assert "broker 2 0/1" in report.examples["divergent_replicas"][0]
    short = check(CLEAN, replicas(LOG, 2, [rec(0, "a")]))
    assert short.divergent_replicas == 1
    # Above the HW replicas may differ (uncommitted suffixes are truncated later).
    assert check(CLEAN, replicas(LOG, 1, [rec(0, "a"), rec(1, "x")])).divergent_replicas == 0


def test_truncated_reads() -> None:
    saw = CLEAN + history(("r", "b", {"p": 0, "o": 2}))
    report = check(saw, replicas(LOG, 2))
    assert report.truncated_reads == 1 and not report.safe


def test_duplicates_are_counted_but_not_unsafe() -> None:
    report = check(CLEAN, replicas([*LOG, rec(2, "b")], 3))
    assert report.duplicates == 1


def test_failover_from_first_ack_after_the_kill() -> None:
    events = history(("i", "a", {}), ("a", "a", {"p": 0, "o": 0}), ("i", "b", {}),
                     ("a", "b", {"p": 0, "o": 1}))  # acks at t=11 and t=13
    report = check(events, replicas(LOG, 2), [("kill_leader", 11.5), ("kill_all", 12.0)])
    assert report.failovers == [1.5]
    assert report.failover_by_fault == {"kill_leader": [1.5], "kill_all": [1.0]}


def test_percentile() -> None:
    assert percentile([], 99) == 0.0
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([float(i) for i in range(1, 101)], 99) == 99.0
    assert percentile([1.0, 5.0], 99) == 5.0
