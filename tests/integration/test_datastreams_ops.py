"""Operating datastreams: bytes in and out per task and the coordinator's rebalances in
/metrics and the diagnostics; a broker stopped with SIGTERM under load hands its task to
another broker within seconds, with nothing lost and nothing twice."""

from __future__ import annotations

import asyncio
import re
import time

import httpx
import pytest

import jetstream
from jetstream.server.process import BrokerProcess
from tests.integration.test_datastreams import (
    assert_mirrored,
    eventually,
    mirror_of,
    publish,
    read_all,
)
from tests.integration.test_datastreams import remote as remote  # a fixture
from tests.integration.test_datastreams_cluster import (
    _publish_slowly,
    _wait_written,
    brokers_of,
    mirror_into_cluster,
    task_brokers,
)
from tests.integration.test_datastreams_cluster import (
    destination_cluster as destination_cluster,  # a fixture
)


def metric_values(text: str, name: str) -> dict[str, int]:
    """The samples of one metric: labels text -> value."""
    pattern = re.compile(rf"^jetstream_datastream_{name}\{{(.*)\}} (\d+)$", re.M)
    return {labels: int(value) for labels, value in pattern.findall(text)}


async def test_bytes_and_rebalance_metrics(
        broker: BrokerProcess, remote: BrokerProcess) -> None:
    async with jetstream.connect(broker.address) as source, \
            jetstream.connect(remote.address) as destination:
        await source.create_stream("orders", "orders", partitions=2)
        await destination.create_stream("orders", "orders", partitions=2)
        await publish(source, 0, 300)
        definition = mirror_of(broker, max_tasks=2)
        await destination.create_datastream(definition["name"], definition["source"],
                                            definition["destination"], max_tasks=2)
        await assert_mirrored(source, destination, [150, 150])
        sizes = [sum(len(m.value or b"") + len(m.key or b"") + sum(
            len(k.encode()) + len(v) for k, v in m.headers.items())
            for m in await read_all(source, "orders", partition, 150)) for partition in (0, 1)]

        async def counted() -> str | None:
            async with httpx.AsyncClient(base_url=remote.http_url) as http:
                text = (await http.get("/metrics")).text
            out = metric_values(text, "bytes_out_total")
            return text if sum(out.values()) == sum(sizes) else None

        text = await eventually(counted, "bytes out of both tasks counted")
        for name in ("bytes_in_total", "bytes_out_total"):
            assert metric_values(text, name) == {
                f'datastream="orders-dr",task="{task}"': sizes[task] for task in (0, 1)}
        # One assignment made both tasks: one rebalance, on this (the metadata leader).
        assert metric_values(text, "rebalances_total") == {'datastream="orders-dr"': 1}
        diagnostics = await destination.datastream_diagnostics("orders-dr")
        progress = {p["partition"]: p for t in diagnostics["tasks"]
                    for p in t["partitions_progress"]}
        assert [progress[p]["bytes_out"] for p in (0, 1)] == sizes


#: How soon after SIGTERM the task must run elsewhere (the hand-off itself takes well under
#: a second; the margin is for a busy machine).
MOVED_WITHIN_S = 5.0


@pytest.mark.timeout(300)
async def test_sigterm_hands_the_task_off(broker: BrokerProcess,
                                          destination_cluster: list[BrokerProcess]) -> None:
    async with jetstream.connect(broker.address) as source:
        async with jetstream.connect(brokers_of(destination_cluster)) as destination:
            tasks = await mirror_into_cluster(broker, source, destination, 400)
            await _wait_written(destination, 300)
        publishing = asyncio.create_task(_publish_slowly(source, 400, 1600))
        victim = destination_cluster[tasks[0]]
        others = [b for b in destination_cluster if b is not victim]
        async with jetstream.connect(brokers_of(others)) as survivor:
            started = time.monotonic()
            stopping = asyncio.create_task(asyncio.to_thread(victim.stop))  # SIGTERM

            async def moved() -> dict[int, int] | None:
                found = await task_brokers(survivor)
                return found if len(found) == 2 and victim.broker_id not in found.values() \
                    else None

            await eventually(moved, "the stopping broker's task on another broker")
            moved_s = time.monotonic() - started
            assert await stopping == 0  # a clean stop
            await publishing
            await assert_mirrored(source, survivor, [1000, 1000])
    assert moved_s < MOVED_WITHIN_S, moved_s
    log = victim.log_path.read_text(errors="replace")
    handed = [line for line in log.splitlines() if "datastream tasks handed off" in line]
    assert handed and "still assigned" not in handed[-1], handed
    assert "stopped at a batch boundary, 0 cancelled" in log
