"""A compacted stream on a real broker: the cleaner runs on its own, readers see the latest
value of every key, tombstones delete keys, and stream info and metrics show the cleaner."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

import jetstream
from jetstream.client import Client, PublishMessage, Start
from jetstream.server.process import BrokerProcess

KEYS = 20
UPDATES = 1500


@pytest.fixture
def cleaning_broker(tmp_path: Path, nats_url: str) -> Iterator[BrokerProcess]:
    process = BrokerProcess(tmp_path / "broker", nats_url,
                            extra_args=("--cleaner-backoff-ms", "50"))
    try:
        yield process.start()
    finally:
        process.stop()


@pytest.fixture
async def kv(cleaning_broker: BrokerProcess) -> AsyncIterator[Client]:
    async with jetstream.connect(cleaning_broker.address) as client:
        yield client


async def partition_compaction(broker: BrokerProcess, stream: str) -> dict | None:
    """The broker's cleaner facts of partition 0 (from its stream description)."""
    async with httpx.AsyncClient(base_url=broker.http_url, timeout=30) as http:
        answer = await http.get(f"/streams/{stream}")
        answer.raise_for_status()
        found: dict | None = answer.json()["partitions"][0].get("compaction")
        return found


async def wait_for_passes(broker: BrokerProcess, stream: str, passes: int,
                          timeout_s: float = 30) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        stats = await partition_compaction(broker, stream)
        if stats is not None and stats["passes"] >= passes:
            return stats
        if time.monotonic() > deadline:
            raise AssertionError(f"no {passes} cleaning passes within {timeout_s} s: {stats}")
        await asyncio.sleep(0.05)


async def test_the_cleaner_keeps_the_latest_value_of_every_key(kv: Client,
                                                              cleaning_broker: BrokerProcess
                                                              ) -> None:
    await kv.create_stream("table", "table.in", cleanup_policy="compact",
                           segment_bytes_max=4096, min_cleanable_dirty_ratio=0.01,
                           delete_retention_ms=0)
    messages = [PublishMessage("table.in", b"v%05d" % i, key=b"k%02d" % (i % KEYS))
                for i in range(UPDATES)]
    await kv.publish_batch(messages, window=200)
    deleted = await kv.delete("table", b"k00")
    assert deleted is not None
    stats = await wait_for_passes(cleaning_broker, "table", 1)
    assert stats["records_removed"] > 0 and stats["failed"] is None
    assert 0.0 <= stats["dirty_ratio"] <= 1.0

    seen = [msg async for msg in kv.subscribe("table", start=Start.EARLIEST, stop="latest")]
    offsets = [msg.offset for msg in seen]
    assert offsets == sorted(set(offsets))
    assert len(seen) < UPDATES  # compacted
    latest: dict[bytes, bytes | None] = {}
    for msg in seen:
        assert msg.key is not None
        latest[msg.key] = msg.value
    expected = {b"k%02d" % k: b"v%05d" % (UPDATES - KEYS + k) for k in range(1, KEYS)}
    assert {k: v for k, v in latest.items() if v is not None} == expected
    assert latest.get(b"k00") is None  # deleted: its tombstone, or nothing at all

    async with httpx.AsyncClient(base_url=cleaning_broker.http_url, timeout=30) as http:
        metrics = (await http.get("/metrics")).text
        assert "jetstream_cleaner_passes_total" in metrics
        passes = next(float(line.split()[-1]) for line in metrics.splitlines()
                      if line.startswith("jetstream_cleaner_passes_total "))
        assert passes >= 1
        described = (await http.get("/streams/table")).json()
        assert described["partitions"][0]["compaction"]["records_removed"] > 0


async def test_a_delete_stream_is_not_compacted(kv: Client,
                                                cleaning_broker: BrokerProcess) -> None:
    await kv.create_stream("plain", "plain.in", segment_bytes_max=4096)
    await kv.publish_batch([PublishMessage("plain.in", b"x" * 50, key=b"same")
                            for _ in range(300)], window=100)
    assert await partition_compaction(cleaning_broker, "plain") is None
    seen = [msg async for msg in kv.subscribe("plain", start=Start.EARLIEST, stop="latest")]
    assert len(seen) == 300


async def test_get_and_keys_read_the_latest_committed_values(kv: Client) -> None:
    from jetstream.errors import NotCompacted

    await kv.create_stream("users", "users.in", partitions=3, cleanup_policy="compact",
                           segment_bytes_max=4096, min_cleanable_dirty_ratio=0.01)
    acks = await kv.publish_batch(
        [PublishMessage("users.in", b"name-%d-%d" % (k, v), key=b"user-%02d" % k)
         for v in range(5) for k in range(30)], window=100)
    assert len(acks) == 150
    # Read-your-writes: a get at least as new as the last ack of its key.
    last = await kv.publish("users.in", b"renamed", key=b"user-07",
                            headers={"by": b"admin"})
    assert last is not None
    entry = await kv.get("users", b"user-07", min_offset=last.offset)
    assert entry is not None
    assert (entry.value, entry.offset, entry.partition) == (b"renamed", last.offset,
                                                           last.partition)
    assert dict(entry.headers) == {"by": b"admin"}
    for k in (0, 13, 29):
        got = await kv.get("users", b"user-%02d" % k, min_offset=0)
        assert got is not None and got.value == b"name-%d-4" % k
    deleted = await kv.delete("users", b"user-13")
    assert deleted is not None
    assert await kv.get("users", b"user-13", min_offset=deleted.offset) is None
    assert await kv.get("users", b"nobody") is None
    everyone = await kv.keys("users", prefix=b"user-")
    assert everyone == sorted(b"user-%02d" % k for k in range(30) if k != 13)
    first = await kv.keys("users", limit=10)
    rest = await kv.keys("users", after=first[-1], limit=100)
    assert first + rest == everyone
    await kv.create_stream("log", "log.in")
    with pytest.raises(NotCompacted):
        await kv.get("log", b"k")


def test_get_and_keys_from_the_cli_and_http(cleaning_broker: BrokerProcess) -> None:
    import base64
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "JETSTREAM_BROKERS": cleaning_broker.address}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "jetstream", *args], env=env,
                              capture_output=True, text=True, timeout=60)

    assert cli("stream", "create", "conf", "--subject", "conf.in",
               "--cleanup-policy", "compact").returncode == 0
    for key, value in (("color", "red"), ("size", "xl"), ("color", "blue")):
        published = cli("pub", "conf.in", value, "--key", key, "--json")
        assert published.returncode == 0, published.stderr
    offset = json.loads(published.stdout.strip().splitlines()[-1])["offset"]
    got = cli("get", "conf", "color", "--min-offset", str(offset))
    assert (got.returncode, got.stdout.strip()) == (0, "blue"), got.stderr
    document = json.loads(cli("get", "conf", "size", "--json").stdout)
    assert (document["value"], document["found"]) == ("xl", True)
    missing = cli("get", "conf", "weight")
    assert missing.returncode == 1 and "not found" in missing.stdout
    assert cli("keys", "conf").stdout.split() == ["color", "size"]
    assert cli("keys", "conf", "--prefix", "si").stdout.split() == ["size"]
    assert cli("get", "conf", "%%%", "--base64").returncode == 2

    with httpx.Client(base_url=cleaning_broker.http_url, timeout=30) as http:
        answer = http.get("/streams/conf/keys/color", params={"min_offset": offset})
        assert answer.status_code == 200, answer.text
        assert base64.b64decode(answer.json()["value"]) == b"blue"
        assert http.get("/streams/conf/keys").json() == {"keys": ["color", "size"]}
        encoded = base64.b64encode(b"size").decode()  # "c2l6ZQ==": safe in a path
        answer = http.get(f"/streams/conf/keys/{encoded}", params={"base64": "true"})
        assert answer.status_code == 200, answer.text
        assert base64.b64decode(answer.json()["value"]) == b"xl"
        gone = http.get("/streams/conf/keys/weight")
        assert gone.status_code == 404 and gone.json()["error"]["code"] == "KEY_NOT_FOUND"
        deleted = http.post("/streams/conf/partitions/0/messages",
                            json={"messages": [{"key": base64.b64encode(b"size").decode(),
                                                "value": None}]})
        assert deleted.status_code == 200, deleted.text
        tombstone = deleted.json()["offsets"][-1]
        gone = http.get("/streams/conf/keys/size",
                        params={"min_offset": tombstone, "wait_ms": 5000})
        assert gone.status_code == 404 and gone.json()["error"]["code"] == "KEY_NOT_FOUND"


async def test_gets_and_fetches_in_flight_together_are_each_answered(kv: Client) -> None:
    # Many requests at once on one connection: answers queued together go out in one
    # write, a fetch's answer (sent from the segment file) in its turn.
    await kv.create_stream("mixed", "mixed.in", cleanup_policy="compact")
    acks = await kv.publish_batch([PublishMessage("mixed.in", b"v%d" % k, key=b"k%d" % k)
                                   for k in range(40)], window=40)
    newest = max(a.offset for a in acks)
    await kv.get("mixed", b"k0", min_offset=newest)
    gets = [kv.get("mixed", b"k%d" % (k % 45)) for k in range(200)]
    fetches = [kv.fetch("mixed", 0, offset) for offset in range(0, 40, 4)]
    results = await asyncio.gather(*gets, *fetches)
    for k, got in zip(range(200), results[:200], strict=True):
        if k % 45 < 40:
            assert got is not None and got.value == b"v%d" % (k % 45)
        else:
            assert got is None
    for offset, fetched in zip(range(0, 40, 4), results[200:], strict=True):
        assert fetched.messages and fetched.messages[0].offset == offset
        assert [m.value for m in fetched.messages] == [b"v%d" % m.offset
                                                      for m in fetched.messages]
