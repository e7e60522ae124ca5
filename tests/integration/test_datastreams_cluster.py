"""Datastreams under faults, on real processes: a mirror from a single-broker cluster into a
3-broker cluster whose broker running a task is SIGKILLed mid-mirror (0 lost, 0 duplicates);
an unreachable destination (its broker killed) that marks the task `faulty`, is retried and
loses nothing; a whole-cluster restart that keeps definitions and checkpoints; a paused
partition that stays paused across a metadata-leader failover; and a rolling restart of the
destination cluster under load (0 lost, 0 duplicates)."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import jetstream
from jetstream.client import Client
from jetstream.natsd import NatsServer
from jetstream.server.process import BrokerProcess
from tests.integration.test_cluster import running_cluster
from tests.integration.test_datastreams import (
    DEADLINE_S,
    assert_mirrored,
    eventually,
    mirror_of,
    publish,
    read_all,
)


@pytest.fixture
def destination_cluster(tmp_path: Path) -> Iterator[list[BrokerProcess]]:
    """A second cluster of 3 brokers with its own nats-server."""
    (tmp_path / "b").mkdir()
    with NatsServer(tmp_path / "nats-b") as nats, \
            running_cluster(tmp_path / "b", nats.url) as brokers:
        yield brokers


def brokers_of(cluster: list[BrokerProcess]) -> str:
    return ",".join(b.address for b in cluster if b.running)


async def task_brokers(js: Client) -> dict[int, int]:
    described = await js.describe_datastream("orders-dr")
    return {t["task"]: t["broker"] for t in described["tasks"] if t["broker"] is not None}


async def start_mirror(source: BrokerProcess, destination: Client, partitions: int
                       ) -> dict[int, int]:
    definition = mirror_of(source, max_tasks=partitions, batch_records_max=100)
    await destination.create_datastream(definition["name"], definition["source"],
                                        definition["destination"], max_tasks=partitions,
                                        batch_records_max=100)

    async def assigned() -> dict[int, int] | None:
        found = await task_brokers(destination)
        return found if len(found) == partitions else None

    return await eventually(assigned, "tasks assigned")


async def mirror_into_cluster(broker: BrokerProcess, source: Client, destination: Client,
                              records: int) -> dict[int, int]:
    """Streams of 2 partitions (the copy replicated 3 times), `records` published, the
    mirror started: its tasks' brokers."""
    await source.create_stream("orders", "orders", partitions=2)
    await destination.create_stream("orders", "orders", partitions=2, replication_factor=3,
                                    min_isr=2)
    await publish(source, 0, records)
    return await start_mirror(broker, destination, 2)


@pytest.mark.timeout(300)
async def test_task_broker_killed_mid_mirror(tmp_path: Path, broker: BrokerProcess,
                                             destination_cluster: list[BrokerProcess]) -> None:
    async with jetstream.connect(broker.address) as source, \
            jetstream.connect(brokers_of(destination_cluster)) as destination:
        tasks = await mirror_into_cluster(broker, source, destination, 400)
        publishing = asyncio.create_task(_publish_slowly(source, 400, 1600))
        await _wait_written(destination, 300)
        victim = destination_cluster[tasks[0]]
        victim.kill()
        await publishing
        async with jetstream.connect(brokers_of(destination_cluster)) as survivor:
            async def moved() -> dict[int, int] | None:
                found = await task_brokers(survivor)
                return found if len(found) == 2 and victim.broker_id not in found.values() \
                    else None

            await eventually(moved, "the killed broker's task on another broker")
            await assert_mirrored(source, survivor, [1000, 1000])


async def _publish_slowly(js: Client, first: int, count: int) -> None:
    for start in range(first, first + count, 100):
        await publish(js, start, 100)
        await asyncio.sleep(0.05)


async def _wait_written(js: Client, records: int) -> None:
    async def enough() -> bool | None:
        total = 0
        for p in (0, 1):
            total += (await js.partition_status("orders", p)).high_watermark or 0
        return True if total >= records else None

    await eventually(enough, f"{records} records mirrored")


@pytest.mark.timeout(300)
async def test_unreachable_destination_is_faulty_then_catches_up(
        tmp_path: Path, broker: BrokerProcess) -> None:
    with NatsServer(tmp_path / "nats-b") as nats:
        remote = BrokerProcess(tmp_path / "broker-b", nats.url).start()
        try:
            await _faulty_then_caught_up(broker, remote)
        finally:
            remote.stop()


async def _faulty_then_caught_up(broker: BrokerProcess, remote: BrokerProcess) -> None:
    async with jetstream.connect(broker.address) as source:
        async with jetstream.connect(remote.address) as destination:
            await destination.create_stream("orders", "orders", partitions=1)
        await source.create_stream("orders", "orders", partitions=1)
        await source.create_datastream(
            "orders-dr", {"type": "jetstream", "settings": {"stream": "orders"}},
            {"type": "jetstream", "settings": {"stream": "orders",
                                               "brokers": remote.address}})
        await publish(source, 0, 50, partitions=1)
        async with jetstream.connect(remote.address) as destination:
            await assert_mirrored(source, destination, [50])
        remote.kill()
        await publish(source, 50, 50, partitions=1)
        async with httpx.AsyncClient(base_url=broker.http_url) as http:
            async def faulty() -> dict[str, Any] | None:
                tasks = (await http.get("/health")).json()["datastreams"]["tasks"]
                return tasks[0] if tasks and tasks[0]["status"] == "faulty" else None

            found = await eventually(faulty, "the task faulty", deadline_s=DEADLINE_S)
            assert found["last_error"] and found["errors"] >= 1
            metrics = (await http.get("/metrics")).text
            assert 'jetstream_datastream_errors_total{datastream="orders-dr"}' in metrics
        remote.start()
        async with jetstream.connect(remote.address) as destination:
            await assert_mirrored(source, destination, [100])

            async def running() -> bool | None:
                tasks = (await source.datastream_diagnostics("orders-dr"))["tasks"]
                return True if tasks[0]["status"] == "running" else None

            await eventually(running, "the task running again")


@pytest.mark.timeout(300)
async def test_definitions_and_checkpoints_survive_a_whole_cluster_restart(
        tmp_path: Path, broker: BrokerProcess,
        destination_cluster: list[BrokerProcess]) -> None:
    async with jetstream.connect(broker.address) as source, \
            jetstream.connect(brokers_of(destination_cluster)) as destination:
        await mirror_into_cluster(broker, source, destination, 200)
        await assert_mirrored(source, destination, [100, 100])
        before = await destination.describe_datastream("orders-dr")
    for b in destination_cluster:
        b.stop(signal.SIGKILL)
    broker.restart()
    for b in destination_cluster:
        b.start(wait=False)
    for b in destination_cluster:
        b.wait_ready(DEADLINE_S)
    async with jetstream.connect(broker.address) as source, \
            jetstream.connect(brokers_of(destination_cluster)) as destination:
        after = await destination.describe_datastream("orders-dr")
        assert {k: v for k, v in after.items() if k not in ("tasks", "status")} == \
            {k: v for k, v in before.items() if k not in ("tasks", "status")}
        for p in (0, 1):
            assert await source.fetch_offset("__datastream_orders-dr", "orders", p) == 100
        await publish(source, 200, 100)
        await assert_mirrored(source, destination, [150, 150])

        async def resumed_from_checkpoints() -> list[int] | None:
            found = await destination.datastream_diagnostics("orders-dr")
            progress = [p for t in found["tasks"] for p in t["partitions_progress"]]
            return [p["records_in"] for p in progress] if len(progress) == 2 and all(
                p["source_position"] == 150 for p in progress) else None

        # Each task read from its checkpoint (100) on: 50 records, not all 150 from 0. (A
        # write that failed while the cluster came back is read again from the checkpoint,
        # and a task that moved counts only since it moved, so a loaded restart may count
        # some more or fewer; a read from 0 counts at least 150.)
        read = await eventually(resumed_from_checkpoints, "tasks resumed")
        assert read is not None and all(n < 150 for n in read), read


@pytest.mark.timeout(300)
async def test_pause_survives_a_metadata_leader_failover(
        broker: BrokerProcess, destination_cluster: list[BrokerProcess]) -> None:
    async with jetstream.connect(broker.address) as source:
        async with jetstream.connect(brokers_of(destination_cluster)) as destination:
            await mirror_into_cluster(broker, source, destination, 100)
            await assert_mirrored(source, destination, [50, 50])
            await destination.pause_datastream("orders-dr", [1])
            await destination.refresh_metadata()
            leader = destination.metadata_leader
            assert leader is not None
        destination_cluster[leader].kill()
        async with jetstream.connect(brokers_of(destination_cluster)) as destination:
            async def new_leader() -> int | None:
                await destination.refresh_metadata()
                found = destination.metadata_leader
                return found if found is not None and found != leader else None

            await eventually(new_leader, "a new metadata leader")
            described = await destination.describe_datastream("orders-dr")
            assert described["paused_partitions"] == [1]
            await publish(source, 100, 100)
            await read_all(destination, "orders", 0, 100)  # fetches follow the failover
            assert (await destination.fetch("orders", 1, 50, max_wait_ms=500)).messages == []
            await destination.resume_datastream("orders-dr", [1])
            await assert_mirrored(source, destination, [100, 100])


@pytest.mark.timeout(600)
async def test_mirror_through_a_rolling_restart(
        broker: BrokerProcess, destination_cluster: list[BrokerProcess]) -> None:
    async with jetstream.connect(broker.address) as source:
        async with jetstream.connect(brokers_of(destination_cluster)) as destination:
            await mirror_into_cluster(broker, source, destination, 200)
        stop = asyncio.Event()
        publishing = asyncio.create_task(_publish_until(source, 200, stop))
        for restarted in destination_cluster:
            await asyncio.to_thread(restarted.restart)  # SIGTERM, then start again
        stop.set()
        total = await publishing
        assert total > 200 + 100  # it published while the brokers restarted
        async with jetstream.connect(brokers_of(destination_cluster)) as destination:
            await assert_mirrored(source, destination, [total // 2, total // 2])


async def _publish_until(js: Client, first: int, stop: asyncio.Event) -> int:
    """Batches of 20 records every 50 ms from `first` until `stop`; the total published."""
    end = first
    while not stop.is_set():
        await publish(js, end, 20)
        end += 20
        await asyncio.sleep(0.05)
    return end
