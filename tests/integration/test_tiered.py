"""Tiered storage against real brokers and real stores (moto's S3 server and `file://`):
offloaded history read back byte for byte after local deletion, over Fetch and HTTP; a
broker on an empty disk serving old offsets from the store and continuing after them; a
store outage under load (nothing lost, the backlog drains, health says so); the CLI's
`fragments list|prune` and `stream info` extents; settings changed by `stream update`."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import jetstream
from jetstream.cli import main as cli_main
from jetstream.client import Client
from jetstream.errors import InvalidStreamConfig
from jetstream.server.process import BrokerProcess
from jetstream.tiered.local_s3 import LocalS3
from jetstream.tiered.store import FragmentStore

DEADLINE_S = 60.0
SEGMENT_BYTES = 4096
STREAM, SUBJECT = "tiered", "tiered.in"
#: Brokers list the store often, and back off briefly, so tests see changes quickly.
BROKER_ARGS = ("--fragment-list-interval-ms", "500", "--fragment-backoff-ms-max", "1000",
               "--retention-check-ms", "100")


@pytest.fixture(params=["s3", "file"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "file":
        return f"file://{tmp_path / 'store'}"
    bucket: str = request.getfixturevalue("s3_bucket")
    return f"{bucket}/tier"


@pytest.fixture
def tiered_broker(tmp_path: Path, nats_url: str, store_url: str) -> Iterator[BrokerProcess]:
    process = BrokerProcess(tmp_path / "broker", nats_url, extra_args=BROKER_ARGS)
    try:
        yield process.start()
    finally:
        process.stop()


def values(count: int, start: int = 0) -> list[bytes]:
    return [b"value-%05d-" % i + b"x" * 150 for i in range(start, start + count)]


async def http_get(url: str) -> Any:
    async with httpx.AsyncClient() as http:
        answer = await http.get(url)
        answer.raise_for_status()
        return answer.json()


async def wait_for(what: str, check: Callable[[], Awaitable[bool]],
                   deadline_s: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + deadline_s
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {deadline_s} s: {what}")
        await asyncio.sleep(0.1)


async def create(js: Client, store_url: str, **tiered: object) -> None:
    await js.create_stream(STREAM, SUBJECT, segment_bytes_max=SEGMENT_BYTES,
                           tiered={"fragment_store": store_url,
                                   "local_retention_bytes": 2 * SEGMENT_BYTES, **tiered})


async def publish(js: Client, sent: list[bytes]) -> None:
    """In batches of 20 (one ingest batch each, about one 4 KiB segment each)."""
    for i in range(0, len(sent), 20):
        await js.publish_batch([(SUBJECT, v) for v in sent[i:i + 20]])


async def extents(js: Client) -> dict[str, Any]:
    return (await js.fragments(STREAM, 0))[0]


async def read_values(js: Client, start: int, end: int) -> list[bytes]:
    out: list[bytes] = []
    offset = start
    while offset < end:
        result = await js.fetch(STREAM, 0, offset, max_bytes=64 * 1024)
        assert result.messages, (offset, end)
        out += [m.value for m in result.messages if m.offset < end]
        offset = result.messages[-1].offset + 1
    return out


async def offloaded(js: Client, below: int) -> bool:
    e = await extents(js)
    return e["local_log_start_offset"] >= below and e["stored_start_offset"] == 0


async def test_offloaded_history_reads_back_and_a_new_broker_serves_it(
        tiered_broker: BrokerProcess, store_url: str, nats_url: str, tmp_path: Path) -> None:
    sent = values(400)
    async with jetstream.connect(tiered_broker.address) as js:
        await create(js, store_url, fragment_compression="zstd")
        await publish(js, sent)
        await wait_for("history offloaded and local segments deleted",
                       lambda: offloaded(js, 200))
        assert await read_values(js, 0, 400) == sent
        e = await extents(js)
        assert e["log_start_offset"] == 0 and e["stored_fragments"] > 0
        # Timestamp lookups reach into the store: the first record at least that recent.
        stamps: dict[int, int] = {}
        while len(stamps) < 60:
            result = await js.fetch(STREAM, 0, len(stamps), max_wait_ms=0)
            stamps.update((m.offset, m.timestamp_ms) for m in result.messages)
        wanted = stamps[37]
        found = await js.offset_for_timestamp(STREAM, 0, wanted)
        assert found < e["local_log_start_offset"] and found <= 37
        assert stamps[found] >= wanted and (found == 0 or stamps[found - 1] < wanted)
        assert all(f["compression"] == "zstd" for f in (await js.fragments(STREAM))[0][
            "fragments"])
    body = await http_get(f"{tiered_broker.http_url}/streams/{STREAM}/partitions/0/"
                          "messages?offset=0&max=5")
    assert [m["offset"] for m in body["messages"]] == [0, 1, 2, 3, 4]
    # A broker with an empty disk: the stream is created again with the same store.
    tiered_broker.stop()
    shutil.rmtree(tiered_broker.data_dir)
    stored_end = max(f.end for f in FragmentStore(store_url).list_partition(STREAM, 0))
    assert stored_end >= e["stored_end_offset"]
    fresh = BrokerProcess(tmp_path / "fresh", nats_url, extra_args=BROKER_ARGS).start()
    try:
        async with jetstream.connect(fresh.address) as js:
            await create(js, store_url, fragment_compression="zstd")
            await wait_for("the empty log starts after the stored history",
                           lambda: _log_end_at_least(js, stored_end))
            more = values(50, 400)
            await publish(js, more)
            e = await extents(js)
            assert e["log_start_offset"] == 0 and e["log_end_offset"] == stored_end + 50
            assert await read_values(js, 0, stored_end) == sent[:stored_end]
            assert await read_values(js, stored_end, stored_end + 50) == more
    finally:
        fresh.stop()


async def _log_end_at_least(js: Client, offset: int) -> bool:
    return int((await extents(js))["log_end_offset"]) >= offset


async def test_a_store_outage_under_load_loses_nothing(
        local_s3: LocalS3, s3_bucket: str, nats_url: str, tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "broker", nats_url, extra_args=BROKER_ARGS).start()
    try:
        async with jetstream.connect(broker.address) as js:
            await create(js, f"{s3_bucket}/outage")
            sent = values(300)
            # The first messages wait for the store's first listing (a leader on an empty
            # log starts after what the store holds); then the store goes away.
            await publish(js, sent[:20])
            local_s3.pause()
            try:
                for i in range(20, 300, 20):  # under load for a while
                    await publish(js, sent[i:i + 20])
                    await asyncio.sleep(0.3)

                async def warned() -> bool:
                    health = await http_get(f"{broker.http_url}/health")
                    found = health.get("fragment_store_warnings", [])
                    return any(w["code"] == "FRAGMENT_STORE_UNAVAILABLE" and
                               w["backlog_bytes"] > 0 for w in found)

                await wait_for("a health warning with a backlog", warned, 90.0)
                e = await extents(js)
                assert e["local_log_start_offset"] == 0  # nothing deleted while down
            finally:
                local_s3.resume()
            async def drained() -> bool:
                return await offloaded(js, 150) and (await extents(js))["backlog_bytes"] == 0

            await wait_for("the backlog drained", drained, 120.0)
            assert await read_values(js, 0, 300) == sent
            async with httpx.AsyncClient() as http:
                metrics = (await http.get(f"{broker.http_url}/metrics")).text
            assert 'jetstream_partition_fragment_backlog_bytes{stream="tiered",partition="0"} 0' \
                in metrics
    finally:
        broker.stop()


async def test_cli_lists_and_prunes_fragments(tiered_broker: BrokerProcess, store_url: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    sent = values(300)
    async with jetstream.connect(tiered_broker.address) as js:
        await create(js, store_url)
        await publish(js, sent)
        await wait_for("history offloaded", lambda: offloaded(js, 100))
        # Every sealed segment uploaded: the listing below is all the store will hold.
        await wait_for("no offload backlog", lambda: _no_backlog(js))
    brokers = ["--brokers", tiered_broker.address, "--json"]
    assert await asyncio.to_thread(cli_main, ["fragments", "list", STREAM, *brokers]) == 0
    listing = json.loads(capsys.readouterr().out)["partitions"][0]
    ends = sorted(f["end"] for f in listing["fragments"])
    assert ends and all(f["url"].startswith(store_url) for f in listing["fragments"])
    cut = ends[len(ends) // 2]
    assert await asyncio.to_thread(
        cli_main, ["fragments", "prune", STREAM, "--before", str(cut), *brokers]) == 0
    pruned = json.loads(capsys.readouterr().out)["partitions"][0]
    assert pruned["pruned"] and all(f["end"] <= cut for f in pruned["pruned"])
    assert pruned["log_start_offset"] == cut
    assert await asyncio.to_thread(cli_main, ["stream", "info", STREAM, *brokers]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["extents"][0]["stored_start_offset"] == cut
    # What is left in the store is what the listing says.
    store = FragmentStore(store_url)
    left = store.list_partition(STREAM, 0)
    assert sorted(f.end for f in left) == [e for e in ends if e > cut]
    async with jetstream.connect(tiered_broker.address) as js:
        assert await read_values(js, cut, 300) == sent[cut:]


async def _no_backlog(js: Client) -> bool:
    return bool((await extents(js))["backlog_bytes"] == 0)


async def test_settings_are_updated_and_checked(tiered_broker: BrokerProcess,
                                                store_url: str) -> None:
    async with jetstream.connect(tiered_broker.address) as js:
        await js.create_stream(STREAM, SUBJECT, segment_bytes_max=SEGMENT_BYTES)
        await publish(js, values(200))
        assert (await extents(js))["fragments"] == []
        with pytest.raises(InvalidStreamConfig) as info:
            await js.update_stream(STREAM, fragment_store="ftp://nowhere")
        assert info.value.fields["field"] == "fragment_store"
        await js.update_stream(STREAM, fragment_store=store_url,
                               local_retention_bytes=SEGMENT_BYTES)
        await wait_for("offload after the update", lambda: offloaded(js, 100))
