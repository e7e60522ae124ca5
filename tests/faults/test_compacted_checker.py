"""The compacted-stream checker: each of its counts goes up when its promise is broken."""

from __future__ import annotations

from typing import Any

from tests.faults.checker import Record, Replica
from tests.faults.compacted import check_compacted


def rec(offset: int, key: str, write: str, value: bytes | None = b"x") -> Record:
    return (offset, 0, 0, key.encode(), value, (("w", write.encode()),), "s")


def history(*writes: tuple[str, str, int | None, bool]) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for write, key, offset, delete in writes:
        events.append({"e": "i", "v": write, "k": key, **({"d": 1} if delete else {})})
        if offset is not None:
            events.append({"e": "a", "v": write, "p": 0, "o": offset})
    return events


HISTORY = history(("v0", "a", 0, False), ("v1", "b", 1, False), ("v2", "a", 2, False),
                  ("v3", "b", 3, True), ("v4", "c", None, False))


def copies(*logs: list[Record]) -> dict[int, list[Replica]]:
    return {0: [Replica(b, 10, records) for b, records in enumerate(logs)]}


GOOD = [rec(2, "a", "v2"), rec(3, "b", "v3", None)]


def test_a_correctly_compacted_log_is_safe() -> None:
    report = check_compacted(HISTORY, copies(GOOD, [rec(2, "a", "v2")]))
    assert report.safe, report
    assert (report.acked, report.deletes_acked, report.keys) == (4, 1, 2)


def test_a_lost_latest_value_is_counted() -> None:
    report = check_compacted(HISTORY, copies([rec(0, "a", "v0"), rec(3, "b", "v3", None)]))
    assert report.latest_lost == 1


def test_a_deleted_key_coming_back_is_counted() -> None:
    report = check_compacted(HISTORY, copies([rec(1, "b", "v1"), rec(2, "a", "v2")]))
    assert report.deleted_returned == 1


def test_phantoms_and_divergence_are_counted() -> None:
    report = check_compacted(HISTORY, copies([*GOOD, rec(5, "z", "nobody")]))
    assert report.phantoms == 1
    newer = [*GOOD, rec(4, "c", "v4")]  # an unacked write of the workload: not a phantom
    report = check_compacted(HISTORY, copies(GOOD, newer))
    assert (report.phantoms, report.divergent_replicas) == (0, 1)
