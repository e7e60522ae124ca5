"""A partition leader's background work (jetstream.server.housekeeping) on a real log and the
real scheduler, stepped at the times of a test clock: each kind of work is scheduled by the
event that makes it due, and nothing is scheduled while nothing happens."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from jetstream.isr.leader import LeaderState
from jetstream.server.config import BrokerConfig
from jetstream.server.housekeeping import ISR_TICK_MS_MIN, Housekeeping, expires_in_ms
from jetstream.server.scheduler import Scheduler, Work
from jetstream.stream.config import FsyncPolicy
from jetstream.stream.log import Log
from tests.unit.log_helpers import T0, Clock, append_n, make

CHECKPOINT_MS = 5_000
RETENTION_CHECK_MS = 30_000
LAG_MS = 10_000


@dataclass
class Leader:
    """What housekeeping reads of a partition leader; `ticks` records the ISR ticks."""

    log: Log
    high_watermark: int = 0
    isr: LeaderState | None = None
    name: str = "s/0"
    ticks: list[int] = field(default_factory=list)
    log_starts_moved: int = 0

    async def tick(self, now_ms: int) -> None:
        self.ticks.append(now_ms)

    def log_start_moved(self) -> None:
        self.log_starts_moved += 1


class Broker:
    """A scheduler on a test clock, stepped by hand."""

    def __init__(self, executor: ThreadPoolExecutor) -> None:
        self.now = 0
        self.scheduler = Scheduler(executor, clock=lambda: self.now)

    def lead(self, log: Log, wall_clock: Clock | None = None, *, start: bool = True,
             high_watermark: int = 0, isr: LeaderState | None = None
             ) -> tuple[Leader, Housekeeping]:
        """A leader of `log` and its housekeeping (started), record time on `wall_clock`."""
        leader = Leader(log, high_watermark, isr)
        config = BrokerConfig(checkpoint_interval_ms=CHECKPOINT_MS,
                              retention_check_ms=RETENTION_CHECK_MS)
        housekeeping = Housekeeping(leader, self.scheduler, config, leader.tick,
                                    wall_clock=wall_clock or Clock())
        if start:
            housekeeping.start()
        return leader, housekeeping

    async def run_until(self, end: int, step: int = 100) -> int:
        """Step the clock to `end`, running what is due; returns the steps that ran work."""
        steps = 0
        while self.now < end:
            self.now = min(end, self.now + step)
            batches = self.scheduler.run_due(self.now)
            for batch in batches:
                await batch
            steps += bool(batches)
        return steps


@pytest.fixture
def log(tmp_path: Path, clock: Clock) -> Iterator[Log]:
    """A log of 10 records in one segment."""
    made = make(tmp_path, clock)
    append_n(made, 10)
    yield made
    made.close()


@pytest.fixture
def broker() -> Iterator[Broker]:
    with ThreadPoolExecutor(2) as pool:
        yield Broker(pool)


async def test_an_idle_partition_schedules_nothing(tmp_path: Path, clock: Clock,
                                                   broker: Broker) -> None:
    log = make(tmp_path, clock, retention_ms=60_000)
    append_n(log, 10)
    broker.lead(log, high_watermark=log.read_high_watermark())
    assert await broker.run_until(3_600_000) == 0
    assert broker.scheduler.metrics.executor_calls == 0
    log.close()


async def test_a_checkpoint_at_most_once_an_interval_after_the_hw_moved(
        log: Log, broker: Broker) -> None:
    leader, housekeeping = broker.lead(log)
    for hw in range(1, 11):  # ten moves in a second: one checkpoint
        broker.now += 100
        leader.high_watermark = hw
        housekeeping.high_watermark_moved()
    assert broker.scheduler.due_at(housekeeping, Work.CHECKPOINT) == 100 + CHECKPOINT_MS
    assert await broker.run_until(100 + CHECKPOINT_MS - 1) == 0
    assert log.read_high_watermark() == 0
    assert await broker.run_until(60_000) == 1
    assert log.read_high_watermark() == 10
    assert broker.scheduler.metrics.executor_calls == 1
    housekeeping.high_watermark_moved()  # it did not move: nothing to write
    await broker.run_until(120_000)
    assert broker.scheduler.metrics.executor_calls == 1


async def test_a_stopped_leader_writes_its_checkpoint_itself(log: Log, broker: Broker) -> None:
    leader, housekeeping = broker.lead(log)
    leader.high_watermark = 5
    housekeeping.high_watermark_moved()
    housekeeping.stop()
    assert broker.scheduler.entries() == dict.fromkeys(Work, 0)
    housekeeping.appended()  # a stopped leader flushing what it had taken
    assert len(broker.scheduler._schedule) == 0
    housekeeping.checkpoint()
    assert log.read_high_watermark() == 5


async def test_interval_fsync_after_an_append_only(tmp_path: Path, clock: Clock,
                                                   broker: Broker) -> None:
    log = make(tmp_path, clock, fsync=FsyncPolicy.INTERVAL, fsync_interval_ms=1_000)
    _leader, housekeeping = broker.lead(log)
    assert await broker.run_until(10_000) == 0
    append_n(log, 3)
    housekeeping.appended()
    assert log.durable_offset < log.log_end_offset
    assert broker.scheduler.due_at(housekeeping, Work.FSYNC) == 11_000
    await broker.run_until(11_000)
    assert log.durable_offset == log.log_end_offset == 3
    assert await broker.run_until(60_000) == 0
    assert broker.scheduler.metrics.runs[Work.FSYNC] == 1
    log.close()


def retained_log(tmp_path: Path, clock: Clock, **config: object) -> Log:
    """4 segments of 8 records, a second of record time apart."""
    log = make(tmp_path, clock, segment_bytes_max=4096, **config)
    for i in range(32):
        if i % 8 == 0:
            clock.now += 1_000
        append_n(log, 1, size=400)
    assert log.segment_base_offsets == [0, 8, 16, 24]
    return log


async def test_retention_by_size_is_checked_after_the_log_grew(
        tmp_path: Path, clock: Clock, broker: Broker) -> None:
    log = retained_log(tmp_path, clock, retention_bytes=3 * 4096)
    _leader, housekeeping = broker.lead(log, clock, high_watermark=32)
    assert broker.scheduler.due_at(housekeeping, Work.RETENTION) == RETENTION_CHECK_MS
    await broker.run_until(RETENTION_CHECK_MS)
    assert log.segment_base_offsets == [8, 16, 24]
    # Nothing more to delete until the log grows: no more checks.
    assert await broker.run_until(10 * RETENTION_CHECK_MS) == 0
    assert broker.scheduler.metrics.runs[Work.RETENTION] == 1
    log.close()


async def test_retention_by_age_is_checked_when_the_oldest_segment_expires(
        tmp_path: Path, clock: Clock, broker: Broker) -> None:
    log = retained_log(tmp_path, clock, retention_ms=3_600_000)
    # Records of T0+1s .. T0+4s; the clock at T0+4s.
    _leader, housekeeping = broker.lead(log, clock, high_watermark=32)
    await broker.run_until(RETENTION_CHECK_MS)  # nothing has expired yet
    assert log.segment_base_offsets == [0, 8, 16, 24]
    due = broker.scheduler.due_at(housekeeping, Work.RETENTION)
    # The oldest segment's newest record (T0+1s) is an hour old at T0+1s+1h+1ms.
    assert due == RETENTION_CHECK_MS + (T0 + 1_000 + 3_600_000 + 1 - clock.now)
    clock.now += due - broker.now
    await broker.run_until(due, step=1_000)
    assert log.segment_base_offsets == [8, 16, 24]
    assert broker.scheduler.metrics.runs[Work.RETENTION] == 2
    log.close()


async def test_a_single_segment_needs_no_retention_check(
        tmp_path: Path, clock: Clock, broker: Broker) -> None:
    log = make(tmp_path, clock, retention_ms=1_000, retention_bytes=100)
    _leader, housekeeping = broker.lead(log, clock)
    for _ in range(5):
        append_n(log, 1)
        housekeeping.appended()
    assert broker.scheduler.due_at(housekeeping, Work.RETENTION) is None
    log.close()


@pytest.mark.parametrize(("timestamps", "retention_ms", "now", "expected"), [
    ([100, 200], 1_000, 500, 601),  # the oldest expires once older than 1 s
    ([100, 200], 1_000, 1_101, 0),  # expired already
    ([100], None, 500, None),  # no age limit
    ([], 1_000, 500, None),  # no sealed segment
    ([-1, 200], 1_000, 500, None),  # an empty oldest segment: no time to go by
])
def test_expires_in(timestamps: list[int], retention_ms: int | None, now: int,
                    expected: int | None) -> None:
    @dataclass
    class Segment:
        max_timestamp: int
        base_offset: int = 0
        next_offset: int = 0
        size: int = 0

    assert expires_in_ms([Segment(t) for t in timestamps], retention_ms, now) == expected


async def test_the_isr_is_ticked_when_its_core_says(log: Log, broker: Broker) -> None:
    isr = LeaderState(1, 0, (1, 2, 3), (1, 2, 3), 0, 10, broker.now, LAG_MS, 2)
    leader, housekeeping = broker.lead(log, isr=isr)
    await broker.run_until(100)
    assert leader.ticks == [100]  # at once on start
    housekeeping.isr_changed()
    assert broker.scheduler.due_at(housekeeping, Work.ISR_TICK) == LAG_MS + 1
    assert await broker.run_until(LAG_MS) == 0
    # The followers fetched meanwhile: the tick comes early and schedules the next.
    isr.on_follower_fetch(2, 10, 5_000)
    isr.on_follower_fetch(3, 10, 5_000)
    await broker.run_until(LAG_MS + 100)
    assert leader.ticks == [100, LAG_MS + 100]
    housekeeping.isr_changed()
    assert broker.scheduler.due_at(housekeeping, Work.ISR_TICK) == 5_000 + LAG_MS + 1


async def test_a_held_proposal_is_ticked_again_after_the_least_spacing(
        log: Log, broker: Broker) -> None:
    isr = LeaderState(1, 0, (1, 2), (1, 2), 0, 10, broker.now, LAG_MS, 1)
    _leader, housekeeping = broker.lead(log, start=False, isr=isr)
    broker.now = 50_000
    isr.tick(broker.now)  # 2 lags: a shrink is proposed ...
    isr.on_proposal_failed()  # ... and refused: held until the next tick, due at once
    housekeeping.isr_changed()
    assert broker.scheduler.due_at(housekeeping, Work.ISR_TICK) == 50_000 + ISR_TICK_MS_MIN
