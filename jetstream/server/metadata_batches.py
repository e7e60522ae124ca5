"""Leader and ISR changes proposed in batches: one Raft entry for many partitions.

Theory of operation: a broker restart or a network cut makes hundreds of partitions change
their ISR or leader at once. One Raft proposal each would queue hundreds of entries at the
metadata leader (pysyncobj applies and acknowledges them one by one) and time out; Kafka
batches these (AlterPartition carries many partitions, the controller elects in batches),
and so do we. Callers `submit` one change and await its own outcome; the batcher proposes
everything queued as one batch command (`ChangeIsrs` or `ChangeLeaders`, at most
BATCH_ITEMS_MAX items), one proposal at a time: changes that arrive while a proposal is in
flight go together in the next (natural batching: no timer, no added latency when alone).
The state machine compares and sets each item on its own leader epoch, so each caller gets
what a proposal of its change alone would have given: the partition's new state, the error
that refused it (StaleMetadataEpoch, ...), or, when the batch as a whole was not committed,
the MetadataUnavailable of the proposal (outcome unknown).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from jetstream.errors import JetstreamError, MetadataUnavailable
from jetstream.raft_meta.fsm import (
    BATCH_ITEMS_MAX,
    ChangeIsr,
    ChangeIsrs,
    ChangeLeader,
    ChangeLeaders,
    ItemOutcome,
)
from jetstream.tasks import cancel_and_wait

log = logging.getLogger(__name__)

#: Changes queued at most; past it `submit` answers MetadataUnavailable("queue_full").
QUEUED_MAX = 100_000

Item = TypeVar("Item", ChangeLeader, ChangeIsr)
Batch = ChangeLeaders | ChangeIsrs
#: What a proposal of a batch returns: one outcome per item, in order.
Propose = Callable[[Batch], Awaitable[tuple[ItemOutcome, ...]]]


@dataclass(slots=True)
class BatchMetrics:
    proposals: int = 0
    items: int = 0
    largest: int = 0

    def value(self, metric: str) -> int:
        """The value of a /metrics name (jetstream_metadata_<metric>)."""
        return {"batches_total": self.proposals, "batch_items_total": self.items,
                "batch_items_max": self.largest}[metric]


class Batcher(Generic[Item]):
    """Batches changes of one kind (see the module docstring)."""

    def __init__(self, kind: str, make: Callable[[tuple[Item, ...]], Batch],
                 propose: Propose, items_max: int = BATCH_ITEMS_MAX) -> None:
        assert 0 < items_max <= BATCH_ITEMS_MAX
        self.kind = kind
        self._make: Callable[[tuple[Item, ...]], Batch] = make
        self._propose = propose
        self._items_max = items_max
        self._queue: list[tuple[Item, asyncio.Future[ItemOutcome]]] = []
        self._in_flight: list[tuple[Item, asyncio.Future[ItemOutcome]]] = []
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self.metrics = BatchMetrics()

    async def submit(self, item: Item) -> ItemOutcome:
        """Propose `item` with whatever else is queued; its own outcome (never raises a
        JetstreamError: it is returned)."""
        if self._closed:
            return MetadataUnavailable("closed")
        if len(self._queue) >= QUEUED_MAX:
            return MetadataUnavailable("queue_full")
        outcome: asyncio.Future[ItemOutcome] = asyncio.get_running_loop().create_future()
        self._queue.append((item, outcome))
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self._flush(), name=f"propose {self.kind}")
        return await outcome

    async def _flush(self) -> None:
        while self._queue:
            self._in_flight = batch = self._queue[:self._items_max]
            del self._queue[:self._items_max]
            items = tuple(item for item, _ in batch)
            self.metrics.proposals += 1
            self.metrics.items += len(items)
            self.metrics.largest = max(self.metrics.largest, len(items))
            try:
                outcomes = await self._propose(self._make(items))
                assert len(outcomes) == len(items), (len(outcomes), len(items))
            except JetstreamError as exc:  # the batch as a whole (MetadataUnavailable, ...)
                outcomes = (exc,) * len(items)
            except Exception as exc:  # a bug: fail the callers rather than leave them waiting
                log.exception("%s of %d partitions failed", self.kind, len(items))
                outcomes = (JetstreamError(f"{self.kind} failed: {exc!r}"),) * len(items)
            for (_, future), outcome in zip(batch, outcomes, strict=True):
                if not future.done():
                    future.set_result(outcome)
            self._in_flight = []

    async def close(self) -> None:
        """Stop proposing; every queued change gets MetadataUnavailable("closed")."""
        self._closed = True
        await cancel_and_wait(self._task)
        queued, self._queue = self._in_flight + self._queue, []
        self._in_flight = []
        for _, future in queued:
            if not future.done():
                future.set_result(MetadataUnavailable("closed"))
