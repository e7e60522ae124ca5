"""The datastream planner: every partition in one task, every task on a live broker, task
counts balanced within one, and sticky (a balanced plan over the same brokers moves nothing)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from jetstream.datastreams.model import TaskAssignment
from jetstream.datastreams.planner import PlanInput, changed, plan, split_partitions

brokers = st.lists(st.integers(0, 9), min_size=0, max_size=6, unique=True)
inputs = st.lists(st.tuples(st.integers(0, 12), st.integers(1, 5), st.lists(
    st.one_of(st.none(), st.integers(0, 12)), max_size=6)), min_size=0, max_size=5)


def _inputs(raw: list[tuple[int, int, list[int | None]]]) -> list[PlanInput]:
    out = []
    for i, (partitions, max_tasks, previous) in enumerate(raw):
        groups = split_partitions(partitions, max_tasks)
        current = tuple(TaskAssignment(t, groups[t], previous[t] if t < len(previous) else None,
                                       7) for t in range(len(groups)))
        out.append(PlanInput(f"ds{i}", partitions, max_tasks, current))
    return out


@given(st.integers(0, 200), st.integers(1, 64))
def test_split_covers_every_partition_once(partitions: int, max_tasks: int) -> None:
    groups = split_partitions(partitions, max_tasks)
    assert len(groups) == min(partitions, max_tasks)
    assert sorted(p for g in groups for p in g) == list(range(partitions))
    assert all(g for g in groups)


@settings(max_examples=300)
@given(inputs, brokers)
def test_plan_puts_tasks_on_live_brokers_balanced(raw: list[tuple[int, int, list[int | None]]],
                                                  live: list[int]) -> None:
    datastreams = _inputs(raw)
    planned = plan(datastreams, live)
    load = dict.fromkeys(live, 0)
    for ds in datastreams:
        tasks = planned[ds.name]
        assert [t.task for t in tasks] == list(range(len(tasks)))
        assert sorted(p for t in tasks for p in t.partitions) == list(range(ds.source_partitions))
        for t in tasks:
            if not live:
                assert t.broker is None
                continue
            assert t.broker in live
            load[t.broker] += 1
    if live:
        assert max(load.values()) - min(load.values()) <= 1


@settings(max_examples=300)
@given(inputs, brokers)
def test_plan_is_sticky_and_stable(raw: list[tuple[int, int, list[int | None]]],
                                   live: list[int]) -> None:
    datastreams = _inputs(raw)
    first = plan(datastreams, live)
    again = [PlanInput(d.name, d.source_partitions, d.max_tasks, first[d.name])
             for d in datastreams]
    second = plan(again, live)
    assert not any(changed(first[d.name], second[d.name]) for d in datastreams)
    # Tasks that were on a live broker and fit its share stayed there: at most the excess moved.
    for d in datastreams:
        for old, new in zip(d.current, first[d.name], strict=True):
            if old.broker in live and old.broker is not None:
                assert new.epoch == old.epoch  # the planner never stamps epochs itself


def test_dead_broker_tasks_move_and_others_stay() -> None:
    current = (TaskAssignment(0, (0, 2), 1, 5), TaskAssignment(1, (1, 3), 2, 5))
    planned = plan([PlanInput("m", 4, 2, current)], [1, 3])
    assert planned["m"][0].broker == 1  # sticky
    assert planned["m"][1].broker == 3  # broker 2 is gone


def test_sticky_keeps_a_balanced_assignment() -> None:
    current = (TaskAssignment(0, (0,), 3, 1), TaskAssignment(1, (1,), 1, 1),
               TaskAssignment(2, (2,), 2, 1))
    planned = plan([PlanInput("m", 3, 3, current)], [1, 2, 3])
    assert [t.broker for t in planned["m"]] == [3, 1, 2]
