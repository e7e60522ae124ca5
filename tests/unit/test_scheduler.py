"""The broker's scheduler task (jetstream.server.scheduler): batches of due work, one executor
call per batch, one batch of a kind at a time, failures kept apart, and a task that sleeps
while nothing is due. Steps run at times of a test clock; the task itself runs on the real
one, and every wait on it has a deadline."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest

from jetstream.server.scheduler import Outcome, Scheduler, Work

DEADLINE_S = 5.0


class CountingExecutor(ThreadPoolExecutor):
    def __init__(self) -> None:
        super().__init__(max_workers=2)
        self.calls = 0

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        self.calls += 1
        return super().submit(fn, *args, **kwargs)


class Job:
    """Work whose blocking part returns `result` (or raises it), recording what it saw."""

    def __init__(self, name: str, result: object = None, *, blocking: bool = True,
                 prepare_fails: bool = False) -> None:
        self.name = name
        self.result = result
        self.blocking = blocking
        self.prepare_fails = prepare_fails
        self.finished: list[tuple[Work, Outcome]] = []
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def prepare(self, work: Work, now_ms: int) -> Callable[[], Outcome] | None:
        if self.prepare_fails:
            raise RuntimeError(f"{self.name} cannot prepare")
        return self._run if self.blocking else None

    def _run(self) -> Outcome:
        if isinstance(self.result, Exception):
            raise self.result
        if isinstance(self.result, threading.Event):
            assert self.result.wait(DEADLINE_S)
        return self.result

    async def finish(self, work: Work, outcome: Outcome, now_ms: int) -> None:
        self.finished.append((work, outcome))
        if not self.done.done():
            self.done.set_result(None)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def executor() -> Iterator[CountingExecutor]:
    with CountingExecutor() as pool:
        yield pool


async def test_due_work_of_one_kind_runs_in_one_executor_call(
        executor: CountingExecutor) -> None:
    clock = Clock()
    scheduler = Scheduler(executor, clock=clock)
    jobs = [Job(f"p{i}", i) for i in range(200)]
    for job in jobs:
        scheduler.at(job, Work.CHECKPOINT, 1_100)
    assert scheduler.run_due(1_099) == []
    await asyncio.gather(*scheduler.run_due(1_100))
    assert executor.calls == 1
    assert scheduler.metrics.executor_calls == 1
    assert scheduler.metrics.runs[Work.CHECKPOINT] == 200
    assert [job.finished for job in jobs] == [[(Work.CHECKPOINT, i)] for i in range(200)]
    assert scheduler.entries()[Work.CHECKPOINT] == 0


async def test_a_kind_with_a_runner_hands_it_the_whole_batch(
        executor: CountingExecutor) -> None:
    scheduler = Scheduler(executor, clock=Clock())
    batches: list[int] = []

    def runner(parts: list[Callable[[], Outcome]]) -> list[Outcome]:
        batches.append(len(parts))
        return [f"ran {part()}" for part in parts]

    scheduler.run_with(Work.FSYNC, runner)
    fsyncs = [Job(f"f{i}", i) for i in range(5)]
    checkpoints = [Job(f"c{i}", i) for i in range(3)]
    for job in fsyncs:
        scheduler.at(job, Work.FSYNC, 1_000)
    for job in checkpoints:
        scheduler.at(job, Work.CHECKPOINT, 1_000)
    await asyncio.gather(*scheduler.run_due(1_000))
    assert batches == [5]  # the other kind ran its parts itself
    assert [job.finished for job in fsyncs] == [[(Work.FSYNC, f"ran {i}")] for i in range(5)]
    assert [job.finished for job in checkpoints] == [[(Work.CHECKPOINT, i)] for i in range(3)]


async def test_work_without_a_blocking_part_needs_no_executor(
        executor: CountingExecutor) -> None:
    scheduler = Scheduler(executor, clock=Clock())
    jobs = [Job(f"p{i}", blocking=False) for i in range(50)]
    for job in jobs:
        scheduler.at(job, Work.ISR_TICK, 1_000)
    await asyncio.gather(*scheduler.run_due(1_000))
    assert executor.calls == 0
    assert all(job.finished == [(Work.ISR_TICK, None)] for job in jobs)


async def test_a_kind_runs_one_batch_at_a_time(executor: CountingExecutor) -> None:
    scheduler = Scheduler(executor, clock=Clock())
    release = threading.Event()
    slow, tick = Job("slow", release), Job("tick", blocking=False)
    scheduler.at(slow, Work.FSYNC, 1_000)
    [batch] = scheduler.run_due(1_000)
    # Due again while its batch runs: it waits for that batch; other kinds do not.
    scheduler.at(slow, Work.FSYNC, 1_000)
    scheduler.at(tick, Work.ISR_TICK, 1_000)
    started = scheduler.run_due(1_000)
    assert len(started) == 1
    await asyncio.wait_for(asyncio.gather(*started), DEADLINE_S)
    assert tick.finished == [(Work.ISR_TICK, None)] and slow.finished == []
    release.set()
    await asyncio.wait_for(batch, DEADLINE_S)
    assert slow.finished == [(Work.FSYNC, release)]
    await asyncio.wait_for(asyncio.gather(*scheduler.run_due(1_000)), DEADLINE_S)
    assert slow.finished == [(Work.FSYNC, release)] * 2


async def test_failures_are_counted_and_the_others_run(executor: CountingExecutor) -> None:
    scheduler = Scheduler(executor, clock=Clock())
    error = OSError("disk on fire")
    raises, cannot, fine = Job("raises", error), Job("cannot", prepare_fails=True), Job("ok", 7)
    for job in (raises, cannot, fine):
        scheduler.at(job, Work.RETENTION, 1_000)
    await asyncio.gather(*scheduler.run_due(1_000))
    assert raises.finished == [(Work.RETENTION, error)]  # the job decides what to do
    assert cannot.finished == []
    assert fine.finished == [(Work.RETENTION, 7)]
    assert scheduler.metrics.failures[Work.RETENTION] == 2
    assert scheduler.metrics.runs[Work.RETENTION] == 3


async def test_the_task_sleeps_while_nothing_is_due_and_wakes_for_sooner_work(
        executor: CountingExecutor) -> None:
    scheduler = Scheduler(executor)
    scheduler.start()
    try:
        for _ in range(20):
            await asyncio.sleep(0)  # the task's turns: it went to sleep, with nothing due
        assert scheduler.metrics.wakeups == 0
        later, now = Job("later", blocking=False), Job("now", blocking=False)
        scheduler.at(later, Work.ISR_TICK, scheduler.now_ms() + 3_600_000)
        scheduler.at(now, Work.ISR_TICK, scheduler.now_ms())
        await asyncio.wait_for(now.done, DEADLINE_S)
        assert later.finished == []
        assert scheduler.due_at(later, Work.ISR_TICK) is not None
        scheduler.cancel(later)
        assert scheduler.entries() == dict.fromkeys(Work, 0)
    finally:
        await scheduler.stop()
    assert scheduler.metrics.runs[Work.ISR_TICK] == 1


async def test_metrics(executor: CountingExecutor) -> None:
    scheduler = Scheduler(executor, clock=Clock())
    job = Job("p0", 1)
    scheduler.at(job, Work.CHECKPOINT, 1_000)
    scheduler.at(job, Work.RETENTION, 5_000)
    await asyncio.gather(*scheduler.run_due(1_000))
    lines = scheduler.render_metrics()
    assert "jetstream_scheduler_executor_calls_total 1" in lines
    assert 'jetstream_scheduler_runs_total{work="checkpoint"} 1' in lines
    assert 'jetstream_scheduler_entries{work="retention"} 1' in lines
    assert "jetstream_scheduler_wakeups_total 0" in lines
