"""One task per broker runs the background work of every partition when it is due.

Theory of operation: work of a partition (a `Job`: its housekeeping,
jetstream.server.housekeeping) is scheduled by the events that make it due, at the time it
is due (`at`); the due times live in a pure schedule (jetstream.server.schedule). One task
sleeps until the earliest due time of the kinds of work not running now, or until woken: `at`
wakes it when it brings work forward past the time it sleeps until, and so does a batch
that ends. With nothing due it sleeps without a timeout: an idle broker costs nothing here.

Due work of one kind runs as one batch, in a task of its own: each job's `prepare` runs on
the loop and returns the blocking part of its work (or None); the blocking parts of the
batch run one after the other in one executor call (or as the kind's runner, `run_with`,
runs them: one syncfs for a batch of fsyncs); then each job's `finish` runs on the
loop, with what its blocking part returned or raised, and may schedule the job again. At most
one batch of a kind runs at a time: work of that kind due meanwhile waits for it (so one job's
work of one kind never runs twice at once, and a slow disk holds back only the kinds that
wait on it, never the ISR ticks). A job's work failing is logged and counted; it never stops
the scheduler.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Protocol

from jetstream.server.metrics import SchedulerMetrics, render_scheduler
from jetstream.server.schedule import Schedule
from jetstream.tasks import cancel_and_wait

log = logging.getLogger(__name__)

#: Most entries the schedule holds: a few per partition (one per kind of work).
ENTRIES_MAX = 1_000_000


class Work(enum.StrEnum):
    """The kinds of background work of a partition, in the order a wake-up starts them."""

    ISR_TICK = "isr_tick"
    FSYNC = "fsync"
    CHECKPOINT = "checkpoint"
    RETENTION = "retention"
    OFFLOAD = "offload"


#: What a job's blocking part returns, or the exception it raised.
Outcome = object
#: Runs a batch's blocking parts in an executor thread: each one's outcome, in order.
Runner = Callable[[list[Callable[[], Outcome]]], list[Outcome]]


class Job(Protocol):
    """The background work of one owner (a partition), run by the scheduler."""

    @property
    def name(self) -> str: ...

    def prepare(self, work: Work, now_ms: int) -> Callable[[], Outcome] | None:
        """On the loop: the blocking part of `work`, to run in the executor (None: none)."""
        ...

    async def finish(self, work: Work, outcome: Outcome, now_ms: int) -> None:
        """On the loop, after the blocking part (`outcome`: what it returned or raised; None
        without one): apply it, and schedule the next run if one is due."""
        ...


def monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


class Scheduler:
    """See the module docstring. `clock`: milliseconds of a monotonic clock (a test's own)."""

    def __init__(self, executor: Executor | None, *, clock: Callable[[], int] = monotonic_ms,
                 entries_max: int = ENTRIES_MAX) -> None:
        self._executor = executor
        self._clock = clock
        self._schedule: Schedule[Job, Work] = Schedule(Work, entries_max)
        self.metrics = SchedulerMetrics(runs=dict.fromkeys(Work, 0),
                                        failures=dict.fromkeys(Work, 0))
        self._running: dict[Work, asyncio.Task[None]] = {}
        self._runners: dict[Work, Runner] = {}
        self._wake = asyncio.Event()
        #: While the task sleeps: the due time it sleeps until (None: until woken).
        self._sleeping = False
        self._sleep_until: int | None = None
        self._task: asyncio.Task[None] | None = None

    def now_ms(self) -> int:
        return self._clock()

    # -- scheduling ---------------------------------------------------------------------------

    def at(self, job: Job, work: Work, due_ms: int) -> None:
        """Run `work` of `job` at `due_ms`, or sooner if it is due sooner already."""
        if self._schedule.add(job, work, due_ms) and self._sleeping and (
                self._sleep_until is None or due_ms < self._sleep_until):
            self._wake.set()

    def run_with(self, work: Work, runner: Runner) -> None:
        """Run the blocking parts of each batch of `work` with `runner` (instead of one after
        the other)."""
        self._runners[work] = runner

    def due_at(self, job: Job, work: Work) -> int | None:
        """When `work` of `job` is due (None: not scheduled, or running now)."""
        return self._schedule.due_at(job, work)

    def cancel(self, job: Job) -> None:
        """Forget the work scheduled for `job` (a batch running it still finishes it)."""
        self._schedule.cancel(job)

    def entries(self) -> dict[str, int]:
        """Work scheduled, per kind."""
        return {work.value: self._schedule.count(work) for work in Work}

    def render_metrics(self) -> list[str]:
        return render_scheduler(self.metrics, self.entries())

    # -- the task ---------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="scheduler")

    async def stop(self) -> None:
        await cancel_and_wait(self._task, *self._running.values())
        self._task = None
        self._running.clear()

    async def _loop(self) -> None:
        while True:
            waiting = [work for work in Work if work not in self._running]
            due = self._schedule.next_due_ms(waiting)
            self._sleeping, self._sleep_until = True, due
            try:
                if due is None:
                    await self._wake.wait()
                elif (delay_ms := due - self._clock()) > 0:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(delay_ms / 1000):
                            await self._wake.wait()
            finally:
                self._sleeping = False
            self._wake.clear()
            self.metrics.wakeups += 1
            self.run_due(self._clock())

    def run_due(self, now_ms: int) -> list[asyncio.Task[None]]:
        """Start a batch of each kind of work due at `now_ms` that is not running; returns
        the batches started (the task's step; a test with its own clock calls it)."""
        started = []
        for work in Work:
            if work in self._running:
                continue
            jobs = self._schedule.pop_due(work, now_ms)
            if jobs:
                task = asyncio.get_running_loop().create_task(
                    self._batch(work, jobs, now_ms), name=f"scheduler {work.value}")
                self._running[work] = task
                started.append(task)
        return started

    async def _batch(self, work: Work, jobs: list[Job], now_ms: int) -> None:
        try:
            prepared: list[tuple[Job, Callable[[], Outcome] | None]] = []
            for job in jobs:
                try:
                    prepared.append((job, job.prepare(work, now_ms)))
                except Exception as exc:
                    self._failed(work, job, exc)
            blocking = [part for _job, part in prepared if part is not None]
            outcomes: list[Outcome] = []
            if blocking:
                self.metrics.executor_calls += 1
                outcomes = await asyncio.get_running_loop().run_in_executor(
                    self._executor, self._runners.get(work, _run_all), blocking)
            returned = iter(outcomes)
            now_ms = self._clock()
            for job, part in prepared:
                outcome = next(returned) if part is not None else None
                if isinstance(outcome, Exception):
                    self.metrics.failures[work] += 1
                try:
                    await job.finish(work, outcome, now_ms)
                except Exception as exc:
                    self._failed(work, job, exc)
            self.metrics.runs[work] += len(jobs)
        finally:
            self._running.pop(work, None)
            self._wake.set()

    def _failed(self, work: Work, job: Job, exc: Exception) -> None:
        self.metrics.failures[work] += 1
        log.error("%s of %s failed", work.value, job.name, exc_info=exc)


def _run_all(parts: list[Callable[[], Outcome]]) -> list[Outcome]:
    """In the executor: each part in turn; what one raises is its outcome."""
    outcomes: list[Outcome] = []
    for part in parts:
        try:
            outcomes.append(part())
        except Exception as exc:
            outcomes.append(exc)
    return outcomes
