"""The scheduler's timer heap (jetstream.server.schedule): table tests of each rule, and a
stateful property test against a plain dict of due times."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from jetstream.server.schedule import Schedule

KINDS = ("tick", "checkpoint")


def make(entries_max: int = 100) -> Schedule[str, str]:
    return Schedule(KINDS, entries_max)


def test_the_earlier_due_time_wins() -> None:
    schedule = make()
    assert schedule.add("p1", "tick", 500)
    assert not schedule.add("p1", "tick", 700)  # later: the earlier stays
    assert schedule.due_at("p1", "tick") == 500
    assert schedule.add("p1", "tick", 200)  # sooner: brought forward
    assert schedule.due_at("p1", "tick") == 200
    assert len(schedule) == 1 and schedule.count("tick") == 1
    assert schedule.pop_due("tick", 199) == []
    assert schedule.pop_due("tick", 200) == ["p1"]
    assert schedule.pop_due("tick", 10_000) == []  # the entry it replaced went with it
    assert schedule.due_at("p1", "tick") is None and len(schedule) == 0


def test_kinds_are_apart() -> None:
    schedule = make()
    schedule.add("p1", "tick", 300)
    schedule.add("p1", "checkpoint", 100)
    schedule.add("p2", "tick", 200)
    assert schedule.next_due_ms() == 100
    assert schedule.next_due_ms(["tick"]) == 200
    assert schedule.next_due_ms([]) is None
    assert schedule.pop_due("tick", 1_000) == ["p2", "p1"]  # earliest first
    assert schedule.pop_due("checkpoint", 1_000) == ["p1"]
    assert schedule.next_due_ms() is None


def test_cancel_forgets_every_kind_of_a_key() -> None:
    schedule = make()
    schedule.add("p1", "tick", 100)
    schedule.add("p1", "checkpoint", 100)
    schedule.add("p2", "tick", 150)
    schedule.cancel("p1")
    schedule.cancel("p3")  # nothing scheduled: nothing happens
    assert len(schedule) == 1
    assert schedule.next_due_ms() == 150
    assert schedule.pop_due("tick", 1_000) == ["p2"]
    assert schedule.pop_due("checkpoint", 1_000) == []


def test_entries_are_bounded() -> None:
    schedule = make(entries_max=2)
    schedule.add("p1", "tick", 1)
    schedule.add("p2", "tick", 1)
    schedule.add("p2", "tick", 0)  # an entry brought forward is no new entry
    with pytest.raises(OverflowError):
        schedule.add("p3", "tick", 1)
    schedule.pop_due("tick", 0)
    schedule.add("p3", "tick", 1)  # room again
    assert len(schedule) == 2


def test_entries_brought_forward_again_and_again_do_not_grow_the_heap() -> None:
    schedule = make()
    for due in range(100_000, 0, -1):
        schedule.add("p1", "tick", due)
    assert len(schedule) == 1
    assert len(schedule._heaps["tick"]) <= 2 * 1 + 64 + 1
    assert schedule.pop_due("tick", 1) == ["p1"]


class ScheduleMachine(RuleBasedStateMachine):
    """Random adds, cancels and pops, checked against a dict of (key, kind) -> due time."""

    def __init__(self) -> None:
        super().__init__()
        self.schedule: Schedule[int, str] = Schedule(KINDS, 1_000)
        self.model: dict[tuple[int, str], int] = {}

    @rule(key=st.integers(0, 9), kind=st.sampled_from(KINDS), due=st.integers(0, 1_000))
    def add(self, key: int, kind: str, due: int) -> None:
        current = self.model.get((key, kind))
        taken = self.schedule.add(key, kind, due)
        assert taken == (current is None or due < current)
        if taken:
            self.model[(key, kind)] = due

    @rule(key=st.integers(0, 9))
    def cancel(self, key: int) -> None:
        self.schedule.cancel(key)
        self.model = {k: v for k, v in self.model.items() if k[0] != key}

    @rule(kind=st.sampled_from(KINDS), now=st.integers(0, 1_000))
    def pop(self, kind: str, now: int) -> None:
        due = sorted((v, k[0]) for k, v in self.model.items() if k[1] == kind and v <= now)
        popped = self.schedule.pop_due(kind, now)
        assert sorted(popped) == sorted(key for _v, key in due)
        assert [self.model[(key, kind)] for key in popped] == sorted(v for v, _k in due)
        for key in popped:
            del self.model[(key, kind)]

    @invariant()
    def agrees_with_the_model(self) -> None:
        assert len(self.schedule) == len(self.model)
        for kind in KINDS:
            dues = [v for k, v in self.model.items() if k[1] == kind]
            assert self.schedule.next_due_ms([kind]) == (min(dues) if dues else None)
            assert self.schedule.count(kind) == len(dues)
            assert len(self.schedule._heaps[kind]) <= 2 * len(dues) + 64 + 1
        assert self.schedule.next_due_ms() == min(self.model.values(), default=None)
        for (key, kind), due in self.model.items():
            assert self.schedule.due_at(key, kind) == due


ScheduleMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=60,
                                             deadline=None)
test_schedule_machine = ScheduleMachine.TestCase
