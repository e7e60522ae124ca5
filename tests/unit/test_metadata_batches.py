"""Leader and ISR changes batched into one proposal while the previous one is in flight, each
caller getting its own item's outcome (the proposals here are a function, no Raft)."""

from __future__ import annotations

import asyncio

from jetstream.errors import MetadataUnavailable
from jetstream.raft_meta.fsm import (
    ChangeIsr,
    ChangeIsrs,
    CreateStream,
    ItemOutcome,
    MetadataState,
    RegisterBroker,
    StaleMetadataEpoch,
)
from jetstream.raft_meta.model import BrokerInfo, PartitionState, StreamConfig
from jetstream.server.metadata_batches import Batch, Batcher


class Metadata:
    """Applies each batch to a real MetadataState once `release` is set."""

    def __init__(self, streams: int) -> None:
        self.state = MetadataState()
        for b in range(3):
            self.state.apply(RegisterBroker(BrokerInfo(b, "127.0.0.1", 7000 + b)))
        for i in range(streams):
            self.state.apply(CreateStream(StreamConfig(f"s{i}", f"s.{i}", replication_factor=3,
                                                       min_isr=2)))
        self.batches: list[int] = []
        self.proposed = asyncio.Event()
        self.release = asyncio.Event()
        self.fail: MetadataUnavailable | None = None

    async def propose(self, batch: Batch) -> tuple[ItemOutcome, ...]:
        self.batches.append(len(batch.items))
        self.proposed.set()
        await self.release.wait()
        if self.fail is not None:
            raise self.fail
        outcomes: tuple[ItemOutcome, ...] = self.state.apply(batch)
        return outcomes

    def shrink(self, stream: int, epoch: int = 0) -> ChangeIsr:
        p = self.state.partition(f"s{stream}", 0)
        return ChangeIsr(p.stream, 0, epoch, (p.leader,))


async def test_changes_queued_while_a_proposal_is_in_flight_go_in_the_next_one() -> None:
    metadata = Metadata(201)
    batcher = Batcher[ChangeIsr]("isr", ChangeIsrs, metadata.propose)
    first = asyncio.create_task(batcher.submit(metadata.shrink(0)))
    await asyncio.wait_for(metadata.proposed.wait(), 5)  # the first proposal leaves alone
    rest = [asyncio.create_task(batcher.submit(metadata.shrink(i, epoch=i % 2)))
            for i in range(1, 201)]
    metadata.release.set()
    outcomes = await asyncio.gather(first, *rest)
    assert metadata.batches == [1, 200]
    assert batcher.metrics.proposals == 2 and batcher.metrics.items == 201
    for i, outcome in enumerate(outcomes):
        if i % 2 == 0:  # its own outcome: the new state
            assert isinstance(outcome, PartitionState) and len(outcome.isr) == 1
        else:  # or the refusal of its own item (a stale epoch)
            assert isinstance(outcome, StaleMetadataEpoch)


async def test_a_batch_is_bounded() -> None:
    metadata = Metadata(10)
    metadata.release.set()
    batcher = Batcher[ChangeIsr]("isr", ChangeIsrs, metadata.propose, items_max=3)
    outcomes = await asyncio.gather(*(batcher.submit(metadata.shrink(i)) for i in range(10)))
    assert metadata.batches == [3, 3, 3, 1]
    assert all(isinstance(o, PartitionState) for o in outcomes)


async def test_a_batch_not_committed_is_an_unknown_outcome_for_each_item() -> None:
    metadata = Metadata(3)
    metadata.fail = MetadataUnavailable("timeout")
    metadata.release.set()
    batcher = Batcher[ChangeIsr]("isr", ChangeIsrs, metadata.propose)
    outcomes = await asyncio.gather(*(batcher.submit(metadata.shrink(i)) for i in range(3)))
    assert outcomes == [metadata.fail] * 3


async def test_closing_answers_every_waiting_change() -> None:
    metadata = Metadata(3)
    batcher = Batcher[ChangeIsr]("isr", ChangeIsrs, metadata.propose)
    waiting = [asyncio.create_task(batcher.submit(metadata.shrink(i))) for i in range(3)]
    await asyncio.wait_for(metadata.proposed.wait(), 5)
    await batcher.close()
    for outcome in await asyncio.gather(*waiting):
        assert isinstance(outcome, MetadataUnavailable) and outcome.fields["reason"] == "closed"
    after = await batcher.submit(metadata.shrink(0))
    assert isinstance(after, MetadataUnavailable)
