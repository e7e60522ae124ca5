"""One Spark task's read: offsets [start, end) of a partition as Arrow record batches.

Theory of operation: a task reads its segment files when planning gave it some
(jetstream.spark.segment_reader), or its fragments straight from the fragment store
(jetstream.spark.fragment_reader: offsets below the leader's local log start), and Fetches
from the partition's leader otherwise, or from the first offset its files or fragments no
longer hold (the log cleaner or retention replaced or removed a segment, or a fragment left
the store, after planning). Both paths hand the same record batch bytes to the same decoder
(jetstream.spark.arrow_decode), so a read from files and a read from brokers give identical
rows. Nothing at or past `end` is decoded: `end` was at or below the high watermark when the
read was planned. A Fetch that finds its offset below the log start raises DataLoss (retention
removed records the read needs), or, with `skip_lost`, goes on from the log start.

A compacted=latest task keeps every decoded row of its partition (with the key, the offset
and whether it is a tombstone), then keeps each key's latest row and drops tombstones:
compaction leaves older records of a key in the log's dirty part, and the reader must not
show them. Its memory is bounded by `compacted_rows_max`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

import jetstream.spark.arrow_decode as arrow_decode
from jetstream.client.client import Client, connect
from jetstream.errors import DataLoss, InvalidSparkOption, OffsetOutOfRange
from jetstream.spark.fragment_reader import FragmentGone, read_fragments
from jetstream.spark.options import NO_TLS, ClientTls
from jetstream.spark.planning import ReadTask
from jetstream.spark.segment_reader import SegmentGone, read_split

FETCH_BYTES = 8 << 20
#: Most rows a compacted=latest task holds before it keeps each key's latest.
COMPACTED_ROWS_MAX = 50_000_000


class TaskPartition(InputPartition):
    """A planned ReadTask, as Spark ships it to an executor."""

    def __init__(self, task: ReadTask) -> None:
        super().__init__(task)
        self.task = task


def read_task(task: ReadTask, columns: Sequence[str], brokers: str, *, verify: bool = True,
              skip_lost: bool = False, tls: ClientTls = NO_TLS
              ) -> Iterator[pa.RecordBatch]:
    """The task's rows with exactly `columns` (see the module docstring)."""
    if not task.compacted_latest:
        yield from _read_range(task, columns, brokers, verify=verify, skip_lost=skip_lost,
                               tls=tls)
        return
    wanted = list(dict.fromkeys([*columns, "key", "offset", arrow_decode.TOMBSTONE]))
    batches: list[pa.RecordBatch] = []
    rows = 0
    for batch in _read_range(task, wanted, brokers, verify=verify, skip_lost=skip_lost,
                             tls=tls):
        rows += batch.num_rows
        if rows > COMPACTED_ROWS_MAX:
            raise InvalidSparkOption(
                f"{task.stream}/{task.partition}: compacted=latest holds at most "
                f"{COMPACTED_ROWS_MAX} rows of one partition; compact it first or read "
                "without compacted", field="compacted")
        batches.append(batch)
    if batches:
        yield from arrow_decode.latest_per_key(batches, columns).to_batches()


def _read_range(task: ReadTask, columns: Sequence[str], brokers: str, *, verify: bool,
                skip_lost: bool, tls: ClientTls) -> Iterator[pa.RecordBatch]:
    position = task.start
    if task.fragments is not None:
        try:
            yield from read_fragments(task.fragments, columns,
                                      timestamp_min_ms=task.timestamp_min_ms,
                                      timestamp_max_ms=task.timestamp_max_ms, verify=verify)
            return
        except FragmentGone as gone:
            position = gone.offset
    elif task.files is not None:
        try:
            yield from read_split(task.files, columns, timestamp_min_ms=task.timestamp_min_ms,
                                  timestamp_max_ms=task.timestamp_max_ms, verify=verify)
            return
        except SegmentGone as gone:
            position = gone.offset
    if position < task.end:
        yield from _sync_iter(_fetch_range(task, position, columns, brokers, verify=verify,
                                           skip_lost=skip_lost, tls=tls))


def _sync_iter(batches: AsyncIterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Drive an async iterator from a synchronous generator on a loop of its own."""
    loop = asyncio.new_event_loop()
    try:
        while True:
            try:
                yield loop.run_until_complete(anext(batches))
            except StopAsyncIteration:
                return
    finally:
        loop.run_until_complete(batches.aclose())  # type: ignore[attr-defined]
        loop.close()


async def _fetch_range(task: ReadTask, position: int, columns: Sequence[str], brokers: str, *,
                       verify: bool, skip_lost: bool, tls: ClientTls
                       ) -> AsyncIterator[pa.RecordBatch]:
    client: Client = await connect(brokers, **tls.connect_options())
    try:
        while position < task.end:
            try:
                raw = await client.fetch_raw(task.stream, task.partition, position,
                                             FETCH_BYTES)
            except OffsetOutOfRange as exc:
                if position < exc.oldest and skip_lost:
                    position = exc.oldest
                    continue
                if position < exc.oldest:
                    raise DataLoss(task.stream, task.partition, position, exc.oldest) from None
                raise
            decoded = arrow_decode.decode(
                raw.payload, stream=task.stream, partition=task.partition, columns=columns,
                start=position, end=task.end, timestamp_min_ms=task.timestamp_min_ms,
                timestamp_max_ms=task.timestamp_max_ms, verify=verify)
            if decoded.next_offset is None or decoded.next_offset <= position:
                # Nothing below `end` came back although it was committed at planning.
                raise OffsetOutOfRange(position, raw.log_start_offset, raw.high_watermark)
            position = decoded.next_offset
            if decoded.batch.num_rows:
                yield decoded.batch
    finally:
        await client.close()
