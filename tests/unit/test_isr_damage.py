"""What a replica does about damage in its copy (jetstream.isr.damage): table tests of each
rule, and the safety rules checked over every combination of answers."""

from __future__ import annotations

import itertools

import pytest

from jetstream.isr.damage import Action, CopyAnswer, Verdict, decide, peers_to_ask

H, D, U = CopyAnswer.HEALTHY, CopyAnswer.DAMAGED, CopyAnswer.UNREACHABLE
REPLICAS = (1, 2, 3)


def test_the_leader_first_then_the_isr_then_the_rest() -> None:
    assert peers_to_ask(2, 1, (1, 2, 3), REPLICAS) == [1, 3]
    assert peers_to_ask(1, 1, (1, 2, 3), REPLICAS) == [2, 3]
    assert peers_to_ask(3, 1, (1, 2), REPLICAS) == [1, 2]  # out of the ISR itself, it asks
    assert peers_to_ask(1, 1, (1, 3), REPLICAS) == [3, 2]
    assert peers_to_ask(1, 1, (1,), (1, 2, 3, 4)) == [2, 3, 4]


@pytest.mark.parametrize(
    ("me", "isr", "answers", "fits", "expected"),
    [
        # A healthy copy of the same length: written over the damage.
        (1, (1, 2, 3), {2: H, 3: H}, {2: True, 3: True}, Verdict(Action.WRITE_OVER, 2)),
        (1, (1, 2, 3), {2: D, 3: H}, {3: True}, Verdict(Action.WRITE_OVER, 3)),
        (2, (1, 2, 3), {1: U, 3: H}, {3: True}, Verdict(Action.WRITE_OVER, 3)),
        # Of another length: a leader hands over to a healthy replica, a follower truncates.
        (1, (1, 2, 3), {2: D, 3: H}, {3: False}, Verdict(Action.HAND_OVER, 3, (3,))),
        (1, (1, 2, 3), {2: H, 3: H}, {}, Verdict(Action.HAND_OVER, 2, (2, 3))),
        (2, (1, 2, 3), {1: H, 3: D}, {1: False}, Verdict(Action.TRUNCATE, 1)),
        # Every other replica is in sync and damaged there: lost.
        (1, (1, 2, 3), {2: D, 3: D}, {}, Verdict(Action.LOST)),
        (2, (1, 2, 3), {1: D, 3: D}, {}, Verdict(Action.LOST)),
        # Replicas out of the ISR (damaged ones left it) count: all damaged is lost.
        (1, (1,), {2: D, 3: D}, {}, Verdict(Action.LOST)),
        (1, (1, 2), {2: D, 3: D}, {}, Verdict(Action.LOST)),
        # A copy from outside the ISR is used only when its length proves it the same.
        (1, (1,), {2: D, 3: H}, {3: True}, Verdict(Action.WRITE_OVER, 3)),
        (1, (1,), {2: D, 3: H}, {3: False}, Verdict(Action.RETRY)),
        (2, (1, 2), {1: D, 3: H}, {3: False}, Verdict(Action.RETRY)),
        # One could not be reached (or was not asked): not known to be lost.
        (1, (1, 2, 3), {2: D, 3: U}, {}, Verdict(Action.RETRY)),
        (1, (1, 2), {2: D}, {}, Verdict(Action.RETRY)),
        (1, (1,), {}, {}, Verdict(Action.RETRY)),
    ],
)
def test_the_rules(me: int, isr: tuple[int, ...], answers: dict[int, CopyAnswer],
                   fits: dict[int, bool], expected: Verdict) -> None:
    assert decide(me=me, leader=1, replicas=REPLICAS, isr=isr, answers=answers,
                  fits=fits) == expected


def test_a_single_replica_loses_what_it_cannot_read() -> None:
    assert decide(me=1, leader=1, replicas=(1,), isr=(1,), answers={},
                  fits={}).action is Action.LOST


def test_safety_over_every_combination() -> None:
    """Leadership goes only to a replica that answered with a healthy copy; a copy used is a
    healthy one; nothing is declared lost while a replica might hold a healthy copy."""
    for me, leader in itertools.product(REPLICAS, REPLICAS):
        for isr_rest in itertools.chain.from_iterable(
                itertools.combinations([r for r in REPLICAS if r != leader], k)
                for k in range(3)):
            isr = tuple(sorted((leader, *isr_rest)))
            asked = peers_to_ask(me, leader, isr, REPLICAS)
            for answer_set in itertools.product((H, D, U), repeat=len(asked)):
                answers = dict(zip(asked, answer_set, strict=True))
                for fit_set in itertools.product((True, False), repeat=len(asked)):
                    fits = dict(zip(asked, fit_set, strict=True))
                    verdict = decide(me=me, leader=leader, replicas=REPLICAS, isr=isr,
                                     answers=answers, fits=fits)
                    if verdict.source != -1:
                        assert answers[verdict.source] is H
                        assert verdict.source in isr or fits[verdict.source]
                    assert all(answers[s] is H and s in isr for s in verdict.successors)
                    if verdict.action is Action.HAND_OVER:
                        assert me == leader and verdict.successors
                    if verdict.action is Action.TRUNCATE:
                        assert me != leader
                    if verdict.action is Action.LOST:
                        assert all(a is D for a in answers.values())
                        assert set(asked) == {r for r in REPLICAS if r != me}
