"""Writing a DataFrame to a stream: `df.write.format("jetstream").option("stream", "out")`.

Theory of operation: each Spark task publishes its rows through one client: pipelined
batches (up to `window` messages awaiting acks), acked under the stream's ack policy. Columns:
`value` (required; binary or string), `key` (binary or string; else none), `headers`
(map<string, binary or string>), `partition` (int; else the key's hash, or round-robin for rows
without a key) and `subject` (string; else the stream's subject). A failure names the
stream and the partition (SparkWriteFailed); Spark retries the task. The driver's commit has
nothing to do: rows are stored when their task's acks arrive.

By default (option `idempotent`, true) each task attempt publishes through an idempotent
producer session (jetstream.client.idempotent), pipelined as above: producer id
`spark-<write>-<task partition>` (`spark-<write>-<micro-batch>-<task partition>` in a
streaming query), epoch the attempt number. Publishes retried inside an attempt (timeouts,
leader changes) are stored once, and a new attempt of the task fences the old one (a zombie
speculative copy stops with PRODUCER_FENCED): exactly once per task attempt. A retried task
still publishes its rows again under its new epoch, so across attempts delivery is at least
once. With `idempotent=false` the task publishes plain pipelined batches: an ack timeout or
a leader change fails the task, and Spark's retry of it stores again what was acked before.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from jetstream.client.client import connect
from jetstream.client.types import PublishMessage
from jetstream.errors import JetstreamError, SparkWriteFailed, UnwritableSchema
from jetstream.protocol.names import is_subject
from jetstream.spark.cluster_view import run_sync
from jetstream.spark.options import WriteOptions

#: The local property Spark sets on a streaming query's micro-batch tasks: the batch's id.
STREAMING_BATCH_ID = "streaming.sql.batchId"
_WRITABLE = {
    "value": ("binary", "string"),
    "key": ("binary", "string"),
    "headers": ("map<string,binary>", "map<string,string>"),
    "partition": ("int", "bigint"),
    "subject": ("string",),
}


def check_schema(schema: StructType) -> None:
    """Raise UnwritableSchema unless the DataFrame's columns map onto a message."""
    names = schema.fieldNames()
    if "value" not in names:
        raise UnwritableSchema(f"a DataFrame written to a stream needs a value column; it has "
                               f"{names}")
    for column in schema.fields:
        allowed = _WRITABLE.get(column.name)
        if allowed is None:
            raise UnwritableSchema(f"column {column.name!r} does not map onto a message: use "
                                   f"only {sorted(_WRITABLE)}")
        if column.dataType.simpleString() not in allowed:
            raise UnwritableSchema(f"column {column.name} must be {' or '.join(allowed)}, not "
                                   f"{column.dataType.simpleString()}")


@dataclass
class Written(WriterCommitMessage):
    """What one task appended: messages per partition of the stream."""

    counts: Mapping[int, int]


def _bytes(value: Any) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    return bytes(value)


def _messages(batch: pa.RecordBatch, subject: str | None) -> list[PublishMessage]:
    columns = {name: batch.column(name).to_pylist() for name in batch.schema.names}
    n = batch.num_rows
    values = columns["value"]
    keys = columns.get("key", [None] * n)
    headers = columns.get("headers", [None] * n)
    partitions = columns.get("partition", [None] * n)
    subjects = columns.get("subject", [subject] * n)
    out: list[PublishMessage] = []
    for i in range(n):
        row_subject = subjects[i] or subject
        if row_subject is None:
            raise UnwritableSchema("the stream reads a wildcard subject: give a subject column "
                                   "with literal subjects")
        pairs = headers[i]
        out.append(PublishMessage(row_subject, _bytes(values[i]), _bytes(keys[i]),
                                  {str(k): _bytes(v) or b"" for k, v in pairs} if pairs else None,
                                  partitions[i]))
    return out


async def _publish(options: WriteOptions, batches: Iterator[pa.RecordBatch],
                   session: tuple[str, int] | None = None) -> Written:
    """Publish a task's rows; `session`: (producer id, epoch) of an idempotent session."""
    counts: dict[int, int] = {}
    async with connect(options.brokers, **options.tls.connect_options()) as client:
        info = await client.stream_info(options.stream)
        subject = info.subject if is_subject(info.subject, wildcards=False) else None
        producer = client.idempotent_producer(*session) if session is not None else None
        for batch in batches:
            messages = _messages(batch, subject)
            try:
                if producer is None:
                    acks = await client.publish_batch(messages, window=options.window,
                                                      timeout=options.ack_timeout_s)
                else:
                    acks = await producer.publish_batch(messages, window=options.window,
                                                        timeout=options.ack_timeout_s)
            except JetstreamError as exc:
                partitions = {m.partition for m in messages}
                raise SparkWriteFailed(options.stream, partitions.pop() if len(partitions) == 1
                                       else None, f"[{exc.code}] {exc}") from exc
            for ack in acks:
                counts[ack.partition] = counts.get(ack.partition, 0) + 1
    return Written(counts)




class _Publishing:
    """A task's write (see the module docstring), shared by the batch and streaming writers."""

    def __init__(self, options: WriteOptions, schema: StructType) -> None:
        check_schema(schema)
        self.options = options
        #: Made on the driver, shared by every task of this write: names its sessions.
        self.write_id = uuid.uuid4().hex[:16]

    # pyspark's Arrow writers narrow write()'s argument from Rows to RecordBatches.
    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        session = None
        if self.options.idempotent:
            session = _session(self.write_id, TaskContext.get())
        return run_sync(_publish(self.options, iterator, session))


def _session(write_id: str, task: TaskContext | None) -> tuple[str, int]:
    """The idempotent producer session of a task attempt: (producer id, epoch). A streaming
    query's writer serves every micro-batch, whose tasks number their partitions from 0
    again: the batch id keeps their sessions apart."""
    if task is None:
        return f"spark-{write_id}-0", 0
    batch = task.getLocalProperty(STREAMING_BATCH_ID)
    scope = write_id if batch is None else f"{write_id}-{batch}"
    return f"spark-{scope}-{task.partitionId()}", task.attemptNumber()


class BatchWriter(_Publishing, DataSourceArrowWriter):  # type: ignore[misc]
    """df.write.format("jetstream")."""


class StreamWriter(_Publishing, DataSourceStreamArrowWriter):  # type: ignore[misc]
    """writeStream.format("jetstream")."""

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int
               ) -> None:
        """Rows are stored once acked; there is nothing to make visible."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int
              ) -> None:
        """Acked rows stay (at least once); Spark replays the batch."""
