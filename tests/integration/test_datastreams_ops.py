"""Operating datastreams: bytes in and out per task and the coordinator's rebalances in
/metrics and the diagnostics."""

from __future__ import annotations

import re

import httpx

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
