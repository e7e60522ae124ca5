"""`spark.readStream.format("jetstream")`: a Structured Streaming source with Kafka's offsets.

Theory of operation: a micro-batch's offsets are Kafka's JSON form, {"orders": {"0": 42}}:
for every partition, the next offset to read. Spark checkpoints them, so a restarted query
resumes where it stopped. The initial offsets come from the consumer group's committed offsets
(option group) where it has some, else startingOffsets (default latest) or startingTimestamp.
Each trigger asks the leaders for their high watermarks (never reading past them); with
maxOffsetsPerTrigger, a trigger takes at most that many offsets, shared among the partitions
in proportion to their backlog, as Kafka's source does. Partitions added to a stream start at
their log start. A planned range whose start retention has removed fails the query with
DataLoss, or with failOnDataLoss=false goes on from the log start. With option group, each
finished micro-batch's end offsets are committed to the group at the next trigger (Spark asks
for the latest offsets from where the finished batch ended, and does so only once it is
done), so `jetstream groups describe` shows the query's lag; the checkpoint, not the group, is
what a restart resumes from.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import TypeVar

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows

import jetstream.spark.cluster_view as cluster_view
import jetstream.spark.planning as planning
from jetstream.client.client import Client, connect
from jetstream.protocol.messages import LATEST_TIMESTAMP
from jetstream.spark.cluster_view import run_sync
from jetstream.spark.options import EARLIEST, ReadOptions
from jetstream.spark.planning import OffsetBounds, Ranges, offsets_json
from jetstream.spark.task_reader import TaskPartition, read_task

log = logging.getLogger(__name__)
Positions = dict[tuple[str, int], int]
_T = TypeVar("_T")


def from_json(document: Mapping[str, Mapping[str, int]]) -> Positions:
    return {(stream, int(partition)): int(offset)
            for stream, partitions in document.items() for partition, offset in partitions.items()}


def cap(start: Positions, latest: Positions, max_rows: int) -> Positions:
    """At most `max_rows` offsets past `start`, shared in proportion to each partition's
    backlog (every partition with a backlog moves by at least one)."""
    backlog = {key: latest[key] - start.get(key, 0) for key in latest}
    total = sum(b for b in backlog.values() if b > 0)
    if total <= max_rows:
        return dict(latest)
    end = dict(latest)
    for key, lag in backlog.items():
        if lag > 0:
            end[key] = start.get(key, 0) + max(1, lag * max_rows // total)
    return end


class StreamReader(DataSourceStreamReader):
    def __init__(self, options: ReadOptions, columns: Sequence[str]) -> None:
        self.options = options
        self.columns = list(columns)
        self._committed: Positions = {}

    def _run(self, work: Callable[[Client], Awaitable[_T]]) -> _T:
        async def run() -> _T:
            tls = self.options.tls.connect_options()
            async with connect(self.options.brokers, **tls) as client:
                return await work(client)

        return run_sync(run())

    async def _keys(self, client: Client) -> list[tuple[str, int]]:
        streams = await cluster_view.resolve_streams(client, self.options)
        return [(info.name, p.partition) for info in streams for p in info.partitions]

    def initialOffset(self) -> dict[str, dict[str, int]]:
        async def work(client: Client) -> Positions:
            keys = await self._keys(client)
            committed = await cluster_view.committed_offsets(client, self.options.group, keys)
            out: Positions = {}
            for stream, partition in keys:
                key = (stream, partition)
                if key in committed:
                    out[key] = committed[key]
                    continue
                offset = self.options.starting.for_partition(stream, partition)
                if offset >= 0:
                    out[key] = offset
                elif self.options.starting_timestamp_ms is not None:
                    out[key] = await client.offset_for_timestamp(
                        stream, partition, self.options.starting_timestamp_ms)
                else:
                    out[key] = await client.offset_for_timestamp(
                        stream, partition, offset if offset == EARLIEST else LATEST_TIMESTAMP)
            return out

        return offsets_json(self._run(work))

    def latestOffset(self, start: dict[str, dict[str, int]], limit: ReadLimit
                     ) -> dict[str, dict[str, int]]:
        begin = from_json(start)

        async def work(client: Client) -> Positions:
            # `start` is where the last batch ended, and Spark plans a batch only once the
            # one before it is done: the group may have it now, not one trigger later.
            await self._commit(client, begin)
            keys = await self._keys(client)
            ends = await asyncio.gather(*(client.offset_for_timestamp(s, p, LATEST_TIMESTAMP)
                                          for s, p in keys))
            return dict(zip(keys, ends, strict=True))

        latest = self._run(work)
        if isinstance(limit, ReadMaxRows):
            latest = cap(begin, latest, limit.max_rows)
        # A partition never moves backwards (a restarted leader's HW may briefly lag).
        return offsets_json({key: max(offset, begin.get(key, 0)) for key, offset in latest.items()})

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_offsets_per_trigger is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.options.max_offsets_per_trigger)

    def partitions(self, start: dict[str, dict[str, int]], end: dict[str, dict[str, int]]
                   ) -> Sequence[InputPartition]:
        begin, finish = from_json(start), from_json(end)

        async def work(client: Client) -> list[TaskPartition]:
            wanted = [key for key in finish if finish[key] > begin.get(key, 0)]
            listings = await asyncio.gather(*(client.list_segments(s, p) for s, p in wanted))
            views = [cluster_view.partition_listing(listing, self.options)
                     for listing in listings]
            ranges: dict[tuple[str, int], tuple[int, int]] = {}
            for key, view in zip(wanted, views, strict=True):
                # A partition new since the last batch starts at its log start.
                first = planning.not_below_log_start(
                    view, begin.get(key, view.log_start_offset), self.options)
                ranges[key] = (first, max(first, finish[key]))
            tasks = planning.plan_tasks(views, Ranges(ranges), self.options, OffsetBounds())
            return [TaskPartition(task) for task in tasks]

        return self._run(work)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, TaskPartition):
            return  # a plan of no tasks: Spark runs one empty partition of its own
        yield from read_task(partition.task, self.columns, self.options.brokers,
                             verify=self.options.verify_crc, tls=self.options.tls,
                             skip_lost=not self.options.fail_on_data_loss)

    def commit(self, end: dict[str, dict[str, int]]) -> None:
        if self.options.group is None:
            return
        offsets = from_json(end)

        async def work(client: Client) -> None:
            await self._commit(client, offsets)

        self._run(work)

    async def _commit(self, client: Client, offsets: Positions) -> None:
        """Commit `offsets` to the group (option group) unless they were the last commit.
        Partitions the group refuses (it holds a later offset: a query restarted from an
        older checkpoint) are logged and left as they are."""
        group = self.options.group
        if group is None or not offsets or offsets == self._committed:
            return
        failed = await client.commit_offsets(group, offsets)
        for (stream, partition), exc in failed.items():
            log.warning("group %s: %s/%d not committed: %s", group, stream, partition, exc)
        self._committed = dict(offsets)
