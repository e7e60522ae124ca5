"""What the Spark tests share: publishing known records and reading them back with the client,
the model a DataFrame is compared with."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, TypeVar

from pyspark.sql import DataFrame

from jetstream.client import Client
from jetstream.client.types import PublishMessage

T = TypeVar("T")
Row = tuple[Any, ...]
COLUMNS = ("stream", "partition", "offset", "timestamp", "subject", "key", "value", "headers",
           "leader_epoch")


def messages(stream: str, count: int, *, partitions: int = 1, keys: int = 0,
             headers: bool = True) -> list[PublishMessage]:
    """`count` messages on the stream's subject `<stream>.in` (with its partition subjects),
    keyed `k<i % keys>` when `keys`, some with headers, some with empty values."""
    out = []
    for i in range(count):
        key = f"k{i % keys}".encode() if keys else (f"key{i}".encode() if i % 3 else None)
        value = b"" if i % 17 == 5 else f"value-{i}-".encode() * (1 + i % 4)
        extra = {"n": str(i).encode(), "kind": b"even" if i % 2 == 0 else b"odd"}
        out.append(PublishMessage(f"{stream}.in", value, key,
                                  extra if headers and i % 2 else None,
                                  None if keys else i % partitions))
    return out


async def publish(js: Client, stream: str, count: int, **options: Any) -> None:
    await js.publish_batch(messages(stream, count, **options), window=200)


async def stored(js: Client, stream: str, partitions: int) -> list[Row]:
    """Every committed record of the stream as the client reads it, as DataFrame rows."""
    rows: list[Row] = []
    for partition in range(partitions):
        offset = 0
        while True:
            result = await js.fetch(stream, partition, offset, max_wait_ms=0)
            if not result.messages:
                break
            rows.extend((msg.stream, msg.partition, msg.offset, msg.timestamp_ms, msg.subject,
                         msg.key, msg.value, dict(msg.headers), msg.leader_epoch)
                        for msg in result.messages)
            offset = result.messages[-1].offset + 1
    return sorted(rows, key=lambda r: (r[1], r[2]))


def millis(value: datetime) -> int:
    """A timestamp Spark collected (naive, local time) as ms since the epoch."""
    return round(value.timestamp() * 1000)


def rows_of(df: DataFrame) -> list[Row]:
    """A DataFrame's rows as tuples ordered by partition and offset (binary as bytes)."""
    out = []
    for row in df.collect():
        values = [bytes(v) if isinstance(v, bytearray) else millis(v) if isinstance(v, datetime)
                  else v for v in row]
        if "headers" in df.columns:
            i = df.columns.index("headers")
            values[i] = {k: bytes(v) for k, v in (values[i] or {}).items()}
        out.append(tuple(values))
    if "partition" in df.columns and "offset" in df.columns:
        p, o = df.columns.index("partition"), df.columns.index("offset")
        out.sort(key=lambda r: (r[p], r[o]))
    return out


async def wait_until(probe: Callable[[], Awaitable[T]], accept: Callable[[T], bool],
                     deadline_s: float = 30.0) -> T:
    """The first value of `probe()` that `accept` takes, polled until the deadline."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + deadline_s
    while True:
        value = await probe()
        if accept(value):
            return value
        if loop.time() > deadline:
            raise AssertionError(f"not within {deadline_s} s: last {value!r}")
        await asyncio.sleep(0.05)
