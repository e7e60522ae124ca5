"""Metadata work proportional to what changed: on a real 3-broker cluster, creating a stream
or changing an ISR costs the same whether 20 or 60 streams exist. Structural counters
(/metrics), not timings: partitions the reconciles looked at, bytes written to the epoch
fence, partitions the failover controller examined, connections opened to other brokers,
and Raft proposals per ISR burst."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import jetstream
from jetstream.client import Client
from jetstream.server.process import BrokerProcess
from tests.integration.test_cluster import TUNING, eventually, running_cluster
from tests.integration.test_fetch_sessions import create, metrics

FEW = 20
#: Streams created while measuring, after FEW and after 3 x FEW existed.
WINDOW = 10
COUNTERS = ("jetstream_roles_reconcile_partitions_examined_total",
            "jetstream_epoch_fence_bytes_written_total",
            "jetstream_epoch_fence_compactions_total",
            "jetstream_failover_partitions_examined_total",
            "jetstream_failover_partitions_indexed_total",
            "jetstream_failover_ticks_total",
            "jetstream_cluster_peer_links_opened_total")


@pytest.fixture
def cluster(tmp_path: Path, nats_url: str) -> Iterator[list[BrokerProcess]]:
    with running_cluster(tmp_path, nats_url, TUNING) as brokers:
        yield brokers


async def totals(brokers: list[BrokerProcess]) -> dict[str, float]:
    """Each sample summed over the brokers."""
    out: dict[str, float] = {}
    for broker in brokers:
        for name, value in (await metrics(broker)).items():
            out[name] = out.get(name, 0.0) + value
    return out


async def all_in_sync(js: Client, streams: int) -> None:
    async def full() -> bool | None:
        for i in range(streams):
            info = await js.stream_info(f"idle-{i}")
            if len(info.partitions[0].isr) != 3:
                return None
        return True
    await eventually(full, f"{streams} streams fully in sync", 120.0)


async def per_create(js: Client, brokers: list[BrokerProcess], first: int
                     ) -> dict[str, float]:
    """What WINDOW creates cost, per create, all brokers together."""
    before = await totals(brokers)
    await create(js, first, WINDOW)
    await all_in_sync(js, first + WINDOW)
    after = await totals(brokers)
    return {name: (after[name] - before[name]) / WINDOW for name in COUNTERS}


async def test_a_create_costs_the_same_whatever_the_streams(
        cluster: list[BrokerProcess]) -> None:
    brokers = cluster
    async with jetstream.connect(",".join(b.address for b in brokers)) as js:
        await create(js, 0, FEW)
        await all_in_sync(js, FEW)
        few = await per_create(js, brokers, FEW)
        await create(js, FEW + WINDOW, 3 * FEW - FEW - WINDOW)
        await all_in_sync(js, 3 * FEW)
        many = await per_create(js, brokers, 3 * FEW)
        ran = (await totals(brokers))["jetstream_failover_ticks_total"]
    # The controller ran all along (a round every 200 ms on the metadata leader), so its
    # zero partitions examined below is not a controller that never looked.
    assert ran > 0
    print(f"\n[metadata scale] per create with {FEW} streams: {few}")
    print(f"[metadata scale] per create with {3 * FEW} streams: {many}")
    for cost in (few, many):
        # Each broker looks at the new partition (the admin's reconcile and the listener's
        # find it dirty once between them) and appends one record to its epoch journal; the
        # failover controller examines nothing while every broker is alive.
        assert cost["jetstream_roles_reconcile_partitions_examined_total"] <= 3 * 2, cost
        assert cost["jetstream_epoch_fence_compactions_total"] == 0, cost
        assert cost["jetstream_epoch_fence_bytes_written_total"] <= 3 * 2 * 40, cost
        assert cost["jetstream_failover_partitions_examined_total"] == 0, cost
        assert cost["jetstream_failover_partitions_indexed_total"] == 0, cost
        # Asking the partition's leader broker whether it serves it yet reuses a kept
        # connection (opened by the first creates): none is opened per create.
        assert cost["jetstream_cluster_peer_links_opened_total"] == 0, cost
    for name in COUNTERS[:2]:
        assert many[name] <= few[name] * 1.25 + 1, (name, few[name], many[name])


async def test_an_isr_burst_is_a_few_proposals_and_reconciles_what_changed(
        cluster: list[BrokerProcess]) -> None:
    brokers = cluster
    streams = 3 * FEW
    async with jetstream.connect(",".join(b.address for b in brokers)) as js:
        await create(js, 0, streams)
        await all_in_sync(js, streams)
        gone = brokers[2]
        survivors = [b for b in brokers if b is not gone]
        before = await totals(survivors)
        # A crash: the leaders drop the broker from their ISRs, its leaderships fail over;
        # back, it catches up every partition at once and rejoins every ISR.
        gone.kill()

        async def shrunk() -> bool | None:
            for i in range(streams):
                if gone.broker_id in (await js.stream_info(f"idle-{i}")).partitions[0].isr:
                    return None
            return True
        await eventually(shrunk, "the crashed broker out of every ISR", 60.0)
        gone.start()
        await all_in_sync(js, streams)
        after = await totals(survivors)
    isr_items = (after['jetstream_metadata_batch_items_total{kind="isr"}']
                 - before['jetstream_metadata_batch_items_total{kind="isr"}'])
    isr_batches = (after['jetstream_metadata_batches_total{kind="isr"}']
                   - before['jetstream_metadata_batches_total{kind="isr"}'])
    examined = (after["jetstream_roles_reconcile_partitions_examined_total"]
                - before["jetstream_roles_reconcile_partitions_examined_total"])
    full = (after["jetstream_roles_full_reconciles_total"]
            - before["jetstream_roles_full_reconciles_total"])
    print(f"\n[metadata scale] ISR burst over {streams} streams: {isr_items:.0f} ISR changes "
          f"in {isr_batches:.0f} proposals; the two survivors' reconciles examined "
          f"{examined:.0f} partitions ({full:.0f} full reconciles)")
    # Every partition shrinks and expands once (the restarted broker's counters started over).
    assert isr_items >= 2 * streams * 2 / 3, isr_items
    assert isr_batches <= isr_items / 2, (isr_batches, isr_items)
    # The survivors reconcile what changed: each ISR or leader change once per broker, and
    # one full reconcile when the crashed broker registered again.
    assert full <= 2, full
    changes = isr_items + streams  # ISR changes, and at most a leader change each
    assert examined <= 2 * (streams + 2 * changes), (examined, changes)
