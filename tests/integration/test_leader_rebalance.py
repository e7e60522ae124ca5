"""Preferred-leader rebalancing on a real 3-broker cluster: leaderships a stopped broker
handed over come back to it once it is in sync again, with nothing acked lost; and they stay
where they are with `auto_leader_rebalance` off."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

import jetstream
from jetstream.server.process import BrokerProcess
from tests.integration.test_cluster import (
    DEADLINE_S,
    TUNING,
    eventually,
    running_cluster,
    stream_metadata,
)

STREAM = "spread"
SUBJECT = "rebalance.spread"
PARTITIONS = 6
#: Rounds every half second here (300 s by default).
REBALANCE = ("--leader-imbalance-check-interval-ms", "500")


async def partitions(broker: BrokerProcess) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = (await stream_metadata(broker, STREAM))["partitions"]
    return sorted(found, key=lambda p: int(p["partition"]))


async def create_spread(brokers: list[BrokerProcess]) -> list[dict[str, Any]]:
    """The stream, R3 over the three brokers; its partitions once every ISR is full."""
    async with jetstream.connect(brokers[0].address) as js:
        await js.create_stream(STREAM, SUBJECT, partitions=PARTITIONS, replication_factor=3)

    async def full() -> list[dict[str, Any]] | None:
        state = await partitions(brokers[0])
        return state if all(len(p["isr"]) == 3 for p in state) else None
    return await eventually(full, "every ISR full")


async def publish(brokers: list[BrokerProcess], values: list[bytes]) -> None:
    """Each value to its own partition, ack `all`, retried until acked."""
    live = ",".join(b.address for b in brokers if b.running)
    async with jetstream.connect(live) as js:
        for i, value in enumerate(values):
            async def once(value: bytes = value, i: int = i) -> bool | None:
                ack = await js.publish(SUBJECT, value, partition=i % PARTITIONS,
                                       ack_policy="all", timeout=2.0)
                return True if ack is not None else None
            await eventually(once, f"ack of {value!r}")


async def read_all(broker: BrokerProcess) -> list[bytes]:
    async with jetstream.connect(broker.address) as js:
        values = []
        for p in range(PARTITIONS):
            result = await js.fetch(STREAM, p, 0, max_wait_ms=100)
            values += [msg.value for msg in result.messages]
        return sorted(values)


async def stop_and_restart(brokers: list[BrokerProcess], victim: BrokerProcess
                           ) -> list[dict[str, Any]]:
    """SIGTERM `victim` (it hands its leaderships over), start it again, and wait until it
    is back in every ISR; the partitions then."""
    survivor = next(b for b in brokers if b is not victim)
    assert victim.stop() == 0

    async def handed_over() -> list[dict[str, Any]] | None:
        state = await partitions(survivor)
        return state if all(p["leader"] != victim.broker_id for p in state) else None
    await eventually(handed_over, "the stopped broker's leaderships handed over")
    victim.start()

    async def in_sync() -> list[dict[str, Any]] | None:
        state = await partitions(survivor)
        return state if all(victim.broker_id in p["isr"] for p in state) else None
    return await eventually(in_sync, "the restarted broker back in every ISR")


async def metric(brokers: list[BrokerProcess], name: str) -> int:
    """`name` summed over the brokers' /metrics (each counts what it did as the metadata
    leader)."""
    total = 0
    async with httpx.AsyncClient(timeout=DEADLINE_S) as http:
        for broker in brokers:
            text = (await http.get(f"{broker.http_url}/metrics")).text
            total += sum(int(float(line.split()[-1])) for line in text.splitlines()
                         if line.startswith(name + " "))
    return total


async def test_leaderships_come_back_to_their_first_replica(tmp_path: Path,
                                                            nats_url: str) -> None:
    with running_cluster(tmp_path, nats_url, (*TUNING, *REBALANCE)) as brokers:
        before = await create_spread(brokers)
        assert all(p["leader"] == p["replicas"][0] for p in before)
        first = [f"a{i}".encode() for i in range(30)]
        await publish(brokers, first)
        victim = next(b for b in brokers if b.broker_id == before[0]["leader"])
        preferred = [p["partition"] for p in before if p["replicas"][0] == victim.broker_id]
        await stop_and_restart(brokers, victim)

        async def given_back() -> list[dict[str, Any]] | None:
            state = await partitions(brokers[0] if brokers[0] is not victim else brokers[1])
            return state if all(p["leader"] == p["replicas"][0] for p in state) else None
        after = await eventually(given_back, "every leadership back on its first replica")
        for p, old in zip(after, before, strict=True):
            if p["partition"] in preferred:
                assert p["leader_epoch"] >= old["leader_epoch"] + 2  # away, and back
        assert await metric(brokers, "jetstream_leader_rebalance_changes_total") >= len(
            preferred)
        second = [f"b{i}".encode() for i in range(30)]
        await publish(brokers, second)
        assert await read_all(victim) == sorted(first + second)  # nothing acked was lost


async def test_with_auto_rebalance_off_leaderships_stay(tmp_path: Path, nats_url: str) -> None:
    off = (*TUNING, *REBALANCE, "--no-auto-leader-rebalance")
    with running_cluster(tmp_path, nats_url, off) as brokers:
        before = await create_spread(brokers)
        victim = next(b for b in brokers if b.broker_id == before[0]["leader"])
        back = await stop_and_restart(brokers, victim)
        assert all(p["leader"] != victim.broker_id for p in back)
        # Six check intervals later (15 failover rounds of 200 ms), still where they were.
        ticks = await metric(brokers, "jetstream_failover_ticks_total")
        await eventually(lambda: _when(metric(brokers, "jetstream_failover_ticks_total"),
                                       lambda n: n >= ticks + 15), "15 failover rounds")
        assert await metric(brokers, "jetstream_leader_rebalance_rounds_total") == 0
        survivor = next(b for b in brokers if b is not victim)
        assert all(p["leader"] != victim.broker_id for p in await partitions(survivor))


async def _when(probe: Any, condition: Any) -> Any:
    value = await probe
    return value if condition(value) else None
