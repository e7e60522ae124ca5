"""Idle partitions cost nothing: hundreds of partition leaders (real logs, a real nats-server)
share one scheduler, and while nothing happens it runs nothing for them, however many they
are. The scheduler is stepped at the times of a test clock, so the counts are exact: no
timing is measured, and ten idle minutes take a moment."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from jetstream.isr.leader import ProposeIsr
from jetstream.protocol.envelope import AckPolicy
from jetstream.raft_meta.model import PartitionState, StreamConfig
from jetstream.server.config import BrokerConfig
from jetstream.server.leader_isr import Replication, SessionWatch, now_ms
from jetstream.server.metrics import PartitionMetrics
from jetstream.server.nats_port import NatsPort, connect_nats
from jetstream.server.partition import PartitionLeader
from jetstream.server.scheduler import Scheduler, Work
from jetstream.stream.format import Record
from jetstream.stream.log import Log

MINUTE_MS = 60_000
LAG_MS = 10_000
STEP_MS = 100


class Broker:
    """Partition leaders of one broker and their scheduler, on a test clock."""

    def __init__(self, root: Path, nats: NatsPort, executor: ThreadPoolExecutor) -> None:
        self.root = root
        self.nats = nats
        self.executor = executor
        self.now = 1_000_000
        self.scheduler = Scheduler(executor, clock=lambda: self.now)
        self.leaders: list[PartitionLeader] = []
        self.proposals: list[ProposeIsr] = []

    async def lead(self, partitions: int, *, replicas: tuple[int, ...] = (0,),
                   sessions: SessionWatch | None = None) -> None:
        config = BrokerConfig(replica_lag_ms_max=LAG_MS)
        stream = StreamConfig(name="idle", subject="idle", partitions=partitions,
                              replication_factor=len(replicas), retention_ms=MINUTE_MS,
                              retention_bytes=1 << 20)

        async def propose_isr(decision: ProposeIsr) -> bool:
            self.proposals.append(decision)
            return True  # committed

        replication = (Replication(0, LAG_MS, propose_isr) if len(replicas) > 1 else None)
        for p in range(partitions):
            state = PartitionState("idle", p, replicas, 0, replicas, 0)
            log = Log(self.root / f"idle-{p}", stream.log_config())
            leader = PartitionLeader(stream, state, log, self.nats, config, self.executor,
                                     PartitionMetrics(), self.scheduler, replication,
                                     sessions=sessions)
            await leader.start()
            self.leaders.append(leader)

    async def run_for(self, duration_ms: int) -> int:
        """Step the clock `duration_ms` on, running what is due; the steps that ran work."""
        steps, end = 0, self.now + duration_ms
        while self.now < end:
            self.now += STEP_MS
            batches = self.scheduler.run_due(self.now)
            await asyncio.gather(*batches)
            for _ in range(3):
                await asyncio.sleep(0)  # proposals (tasks of their own) run
            steps += bool(batches)
        return steps

    def runs(self) -> dict[Work, int]:
        return dict(self.scheduler.metrics.runs)

    async def stop(self) -> None:
        for leader in self.leaders:
            await leader.stop()
            leader.log.close()


@pytest.fixture
def executor() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(4) as pool:
        yield pool


@pytest.fixture
async def broker(tmp_path: Path, nats_url: str,
                 executor: ThreadPoolExecutor) -> AsyncIterator[Broker]:
    nats = await connect_nats([nats_url], "idle-partitions")
    made = Broker(tmp_path, nats, executor)
    try:
        yield made
    finally:
        await made.stop()
        await nats.close()


def background_tasks() -> list[str]:
    return [t.get_name() for t in asyncio.all_tasks()
            if "housekeeping" in t.get_name() or "tick" in t.get_name()]


@pytest.mark.parametrize("partitions", [30, 300])
async def test_idle_partitions_run_nothing(broker: Broker, partitions: int) -> None:
    await broker.lead(partitions)
    assert await broker.run_for(10 * MINUTE_MS) == 0
    assert broker.scheduler.metrics.executor_calls == 0
    assert broker.runs() == dict.fromkeys(Work, 0)
    assert len(broker.scheduler._schedule) == 0
    assert background_tasks() == []
    # What runs per partition waits on an event: its NATS ingest and its fsync.
    names = [t.get_name() for t in asyncio.all_tasks()]
    assert sum(name.startswith(("ingest ", "sync ")) for name in names) == 2 * partitions


@pytest.mark.parametrize("partitions", [30, 300])
async def test_idle_replicated_partitions_tick_once_to_shrink_then_never(
        broker: Broker, partitions: int) -> None:
    # Followers in the ISR that never fetch: each leader ticks at start, ticks once more
    # when they lag, proposes their removal, and from then on ticks no more.
    await broker.lead(partitions, replicas=(0, 1, 2))
    await broker.run_for(LAG_MS + 2 * STEP_MS)
    assert broker.runs()[Work.ISR_TICK] == 2 * partitions
    assert {p.isr for p in broker.proposals} == {(0,)} and len(broker.proposals) == partitions
    assert await broker.run_for(10 * MINUTE_MS) == 0
    assert broker.runs() == {**dict.fromkeys(Work, 0), Work.ISR_TICK: 2 * partitions}
    assert broker.scheduler.metrics.executor_calls == 0
    assert background_tasks() == []


async def test_only_the_partition_that_changed_does_work(broker: Broker) -> None:
    await broker.lead(300)
    busy = broker.leaders[7]
    await busy.append_direct([Record(b"a"), Record(b"b")], AckPolicy.LEADER)
    assert busy.high_watermark == 2
    assert await broker.run_for(10 * MINUTE_MS) == 1
    assert broker.runs() == {**dict.fromkeys(Work, 0), Work.CHECKPOINT: 1}
    assert broker.scheduler.metrics.executor_calls == 1
    assert busy.log.read_high_watermark() == 2


class ParkedFollowers:
    """Fetch sessions whose followers (1 and 2) stand at offset 0 of each partition, parked in
    their long poll now (what idle followers' sessions say of an empty, idle partition)."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    def changed(self, key: tuple[str, int]) -> None:
        pass

    def standing(self, key: tuple[str, int]) -> list[tuple[int, int, int]]:
        return [(1, 0, self.broker.now), (2, 0, self.broker.now)]


async def test_the_first_publish_after_a_long_idle_keeps_the_isr(broker: Broker) -> None:
    """Followers of an idle partition say nothing of it in their sessions: the leader hears
    where they stand before its log end moves, so a publish after longer than
    replica_lag_ms_max of quiet does not find them lagging."""
    broker.now = now_ms()  # the clock a follower's fetch is timed with
    await broker.lead(3, replicas=(0, 1, 2), sessions=ParkedFollowers(broker))
    for leader in broker.leaders:  # each follower's first fetch, then only its session
        for replica in (1, 2):
            await leader.follower_fetched(replica, 0, 0)
    await broker.run_for(3 * LAG_MS)
    assert broker.proposals == []
    # Not awaited: an `all` publish waits for followers that do not fetch in this test.
    publish = asyncio.create_task(broker.leaders[1].append_direct([Record(b"a")],
                                                                  AckPolicy.ALL))
    await broker.run_for(LAG_MS // 2)
    assert broker.proposals == []
    publish.cancel()
