"""The consumer-group checker finds each kind of violation in a made-up history, and passes a
clean one (with the duplicates it allows counted)."""

from __future__ import annotations

from typing import Any

from tests.faults.groups import check_group


def ack(v: str, p: int, o: int, t: float) -> dict[str, Any]:
    return {"e": "a", "v": v, "p": p, "o": o, "t": t}


def got(v: str, p: int, o: int, t: float, m: str = "m0") -> dict[str, Any]:
    return {"e": "g", "v": v, "p": p, "o": o, "t": t, "m": m}


def commit(p: int, o: int, t: float) -> dict[str, Any]:
    return {"e": "c", "v": "", "p": p, "o": o, "t": t, "m": "m0"}


def seen(p: int, o: int, sent: float) -> dict[str, Any]:
    return {"e": "o", "v": "", "p": p, "o": o, "ts": sent, "t": sent + 0.01}


CLEAN = [ack("v0", 0, 0, 1.0), ack("v1", 0, 1, 1.1), got("v0", 0, 0, 2.0),
         got("v1", 0, 1, 2.1), commit(0, 1, 2.2),
         # m0 lost the partition before its commit of 2; m1 reads offset 1 again: allowed
         got("v1", 0, 1, 3.0, "m1"), commit(0, 2, 3.1), seen(0, 2, 3.5)]


def test_a_clean_history_passes_with_its_redelivery_counted() -> None:
    report = check_group(CLEAN)
    assert report.safe, report
    assert (report.acked, report.consumed, report.duplicates, report.members) == (2, 3, 1, 2)
    assert (report.commits_acked, report.observations) == (2, 1)


def test_an_acked_message_nobody_consumed_is_missing() -> None:
    report = check_group([*CLEAN, ack("v2", 0, 2, 4.0)])
    assert not report.safe and report.missing == 1


def test_an_observation_below_an_acknowledged_commit_is_a_lost_commit() -> None:
    report = check_group([*CLEAN, seen(0, 1, 4.0)])
    assert not report.safe and report.commits_lost == 1 and report.offsets_backwards == 1


def test_an_observation_sent_before_the_commit_was_acknowledged_may_be_older() -> None:
    report = check_group([*CLEAN[:4], seen(0, 0, 2.15), commit(0, 1, 2.2)])
    assert report.commits_lost == 0 and report.offsets_backwards == 0


def test_consuming_below_an_acknowledged_commit_is_out_of_the_window() -> None:
    report = check_group([*CLEAN, got("v0", 0, 0, 4.0, "m2")])
    assert not report.safe and report.out_of_window == 1
