"""A compacted stream with a fragment store (`fragment_format=both`), on a real broker whose
cleaner runs: its sealed segments are offloaded, and its Parquet fragments are written only
once the cleaner has passed them, so they hold the cleaned records — what a read through the
broker returns for those offsets."""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import jetstream
from jetstream.client import Client, PublishMessage
from jetstream.server.process import BrokerProcess
from jetstream.tiered.names import FragmentKind
from jetstream.tiered.store import FragmentStore
from tests.integration.test_compaction import partition_compaction

KEYS, UPDATES = 20, 1500
STREAM = "table"


@pytest.fixture
def broker(tmp_path: Path, nats_url: str) -> Iterator[BrokerProcess]:
    process = BrokerProcess(tmp_path / "broker", nats_url, extra_args=(
        "--cleaner-backoff-ms", "50", "--fragment-list-interval-ms", "500"))
    try:
        yield process.start()
    finally:
        process.stop()


async def settled(js: Client, deadline_s: float = 60) -> dict[str, Any]:
    """The partition's extents once Parquet covers something, nothing waits for the store
    and the fragments stayed the same for a second (the cleaner is done)."""
    deadline = time.monotonic() + deadline_s
    last: tuple[Any, ...] | None = None
    since = time.monotonic()
    while True:
        entry = (await js.fragments(STREAM, 0))[0]
        state = tuple((f["begin"], f["end"], f["format"]) for f in entry["fragments"])
        if state != last:
            last, since = state, time.monotonic()
        parquet = [f for f in entry["fragments"] if f["format"] == "parquet"]
        if parquet and entry["backlog_bytes"] == 0 and time.monotonic() - since > 1.0:
            return entry
        if time.monotonic() > deadline:
            raise AssertionError(f"fragments not settled in {deadline_s} s: {entry}")
        await asyncio.sleep(0.1)


async def cleaner_quiet(broker: BrokerProcess, deadline_s: float = 60) -> None:
    """Return once the cleaner has passed over the stream and made no pass for a second."""
    deadline = time.monotonic() + deadline_s
    last: int | None = None
    since = time.monotonic()
    while True:
        passes = (await partition_compaction(broker, STREAM) or {}).get("passes", 0)
        if passes != last:
            last, since = passes, time.monotonic()
        if passes and time.monotonic() - since > 1.0:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"the cleaner did not settle in {deadline_s} s")
        await asyncio.sleep(0.1)


async def test_compacted_stream_offloads_and_parquet_holds_cleaned_records(
        broker: BrokerProcess, tmp_path: Path) -> None:
    store_url = f"file://{tmp_path / 'store'}"
    async with jetstream.connect(broker.address) as js:
        await js.create_stream(STREAM, f"{STREAM}.in", cleanup_policy="compact",
                               segment_bytes_max=4096, min_cleanable_dirty_ratio=0.01,
                               delete_retention_ms=0)
        await js.publish_batch([PublishMessage(f"{STREAM}.in", b"v%05d" % i,
                                               key=b"k%02d" % (i % KEYS))
                                for i in range(UPDATES)], window=200)
        # The store comes once the cleaner is done: a segment cleaned again after its
        # Parquet was written keeps that Parquet (README), so a store present while the
        # records still came could hold records a later pass removed from the log.
        await cleaner_quiet(broker)
        await js.update_stream(STREAM, fragment_store=store_url, fragment_format="both")
        entry = await settled(js)
        store = FragmentStore(store_url)
        listed = store.list_partition(STREAM, 0)
        parquet = sorted((f for f in listed if f.name.kind is FragmentKind.PARQUET),
                         key=lambda f: f.begin)
        segments = [f for f in listed if f.name.kind is FragmentKind.SEGMENT]
        assert segments and entry["stored_end_offset"] >= parquet[-1].end
        table = pa.concat_tables([pq.read_table(io.BytesIO(store.get(store.key(f.name))))
                                  for f in parquet])
        rows = [(r["offset"], r["key"], r["value"]) for r in table.to_pylist()]
        begin, end = parquet[0].begin, parquet[-1].end
        # Cleaned: far fewer rows than offsets, each key at most once per cleaned run.
        assert len(rows) < (end - begin) // 2
        offsets = [r[0] for r in rows]
        assert offsets == sorted(set(offsets)) and begin <= offsets[0] and offsets[-1] < end
        # The same records the broker serves for those offsets.
        served: list[tuple[int, bytes | None, bytes | None]] = []
        offset = begin
        while offset < end:
            result = await js.fetch(STREAM, 0, offset, max_wait_ms=0)
            served += [(m.offset, m.key, m.value) for m in result.messages if m.offset < end]
            offset = result.messages[-1].offset + 1
        assert rows == served
