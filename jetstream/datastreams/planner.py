"""Splitting datastreams into tasks and spreading the tasks over live brokers (pure).

Theory of operation (Brooklin's coordinator with a sticky, load-balancing strategy):
- **Split**: a datastream with P source partitions and `max_tasks` M has min(P, M) tasks;
  task i owns the partitions p with p % tasks == i (every partition in exactly one task).
- **Assign**: over all datastreams at once, so the brokers' task counts are balanced across
  the cluster. With T tasks and L live brokers, r = T % L brokers run ceil(T/L) tasks and the
  others floor(T/L): the counts differ by at most one. A task stays on the broker it ran on
  (sticky: no restart, no lost warm state) while that broker is live and within its share;
  the others go, one by one, to the live broker running the fewest (ties: lowest id). A dead
  broker's tasks are therefore moved, and nothing else is unless balance requires it.
- No live broker: every task is unassigned (broker None).

Deterministic: the same inputs give the same plan on any broker. No IO, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from jetstream.datastreams.model import TaskAssignment


@dataclass(frozen=True, slots=True)
class PlanInput:
    """What the planner needs of one datastream: its source partition count, its
    `max_tasks`, and its current tasks (their brokers are the sticky preference)."""

    name: str
    source_partitions: int
    max_tasks: int
    current: tuple[TaskAssignment, ...] = ()


def split_partitions(partitions: int, max_tasks: int) -> tuple[tuple[int, ...], ...]:
    """Each task's source partitions (see the module docstring)."""
    assert partitions >= 0 and max_tasks >= 1, (partitions, max_tasks)
    tasks = min(partitions, max_tasks)
    return tuple(tuple(range(i, partitions, tasks)) for i in range(tasks))


def plan(datastreams: Sequence[PlanInput], live: Sequence[int]
         ) -> dict[str, tuple[TaskAssignment, ...]]:
    """Every datastream's tasks with their brokers (epochs are left as they were: the
    metadata stamps new ones when it commits the plan)."""
    keys = []  # (name, task index) in a fixed order
    split: dict[str, tuple[tuple[int, ...], ...]] = {}
    for ds in sorted(datastreams, key=lambda d: d.name):
        split[ds.name] = split_partitions(ds.source_partitions, ds.max_tasks)
        keys += [(ds.name, i) for i in range(len(split[ds.name]))]
    previous = {(ds.name, t.task): t for ds in datastreams for t in ds.current}
    brokers = _balance(keys, {k: t.broker for k, t in previous.items()}, sorted(set(live)))
    out: dict[str, tuple[TaskAssignment, ...]] = {}
    for name, groups in split.items():
        tasks = []
        for i, partitions in enumerate(groups):
            old = previous.get((name, i))
            tasks.append(TaskAssignment(i, partitions, brokers.get((name, i)),
                                        old.epoch if old is not None else 0))
        out[name] = tuple(tasks)
    return out


def _balance(keys: Sequence[tuple[str, int]], preferred: Mapping[tuple[str, int], int | None],
             live: list[int]) -> dict[tuple[str, int], int]:
    if not live:
        return {}
    share, extra = divmod(len(keys), len(live))
    load = dict.fromkeys(live, 0)
    out: dict[tuple[str, int], int] = {}
    rest = []
    for key in keys:
        broker = preferred.get(key)
        if broker in load and _room(load, broker, share, extra):
            load[broker] += 1
            out[key] = broker
        else:
            rest.append(key)
    for key in rest:
        broker = min(live, key=lambda b: (load[b], b))
        load[broker] += 1
        out[key] = broker
    return out


def _room(load: Mapping[int, int], broker: int, share: int, extra: int) -> bool:
    """Whether `broker` may keep one more task: below its share, or at it while fewer than
    `extra` brokers run one over the share."""
    if load[broker] < share:
        return True
    return load[broker] == share and sum(1 for v in load.values() if v > share) < extra


def changed(current: Sequence[TaskAssignment], planned: Sequence[TaskAssignment]) -> bool:
    """Whether a plan differs from the tasks as they are (epochs aside)."""
    return [(t.task, t.partitions, t.broker) for t in current] != \
        [(t.task, t.partitions, t.broker) for t in planned]
