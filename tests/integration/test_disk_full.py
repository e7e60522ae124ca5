"""A broker on a small filesystem (a tmpfs; the test skips where mounting one is not allowed)
filled to the last byte: it refuses appends with DISK_FULL, restarts and serves every acked
message on the full disk, deletes a stream through its disk reserve, and takes appends again
once that freed space. With a high watermark it refuses appends before the disk is full,
says so in /health, and resumes by itself once space is freed."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import jetstream
from jetstream.client.types import PublishMessage
from jetstream.errors import DiskFull, JetstreamError
from jetstream.server.process import BrokerProcess
from tests.disk_space import TmpfsUnavailable, tmpfs

SIZE = "24m"


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    try:
        with tmpfs(tmp_path / "disk", SIZE) as mount:
            yield mount
    except TmpfsUnavailable as exc:
        pytest.skip(str(exc))


async def test_a_full_disk_restarts_serves_and_frees_space(small_disk: Path, tmp_path: Path,
                                                           nats_url: str) -> None:
    # No watermark: this is about the last byte.
    broker = BrokerProcess(small_disk / "broker", nats_url,
                           extra_args=("--disk-high-watermark-percent", "100"))
    broker.log_path = tmp_path / "broker.log"  # not on the full disk
    broker.start()
    try:
        acked: dict[str, int] = {"a": 0, "b": 0}
        async with jetstream.connect(broker.address) as js:
            await js.create_stream("a", "a.in")
            await js.create_stream("b", "b.in")
            with pytest.raises(DiskFull):
                for _ in range(200):
                    batch = [PublishMessage(f"{s}.in", b"x" * 1024) for s in ("a", "b") * 100]
                    for ack in await js.publish_batch(batch, window=200):
                        acked[ack.stream] += 1
        assert acked["a"] > 1000

        broker.stop()
        broker.start()  # on the full disk
        async with jetstream.connect(broker.address) as js:
            read = [m async for m in js.subscribe("a", stop="latest")]
            assert len(read) >= acked["a"]
            assert [m.offset for m in read] == list(range(len(read)))
            await js.delete_stream("b")  # the metadata write goes into the reserve's room
            deadline = time.monotonic() + 10
            while True:  # appends resume once the deletion freed space
                try:
                    ack = await js.publish("a.in", b"after", timeout=2.0)
                    break
                except JetstreamError:
                    assert time.monotonic() < deadline, "appends did not resume"
                    await asyncio.sleep(0.2)
            assert ack is not None and ack.offset == len(read)
    finally:
        broker.stop()


async def test_appends_stop_at_the_high_watermark_and_resume_when_space_is_freed(
        small_disk: Path, tmp_path: Path, nats_url: str) -> None:
    broker = BrokerProcess(small_disk / "broker", nats_url, extra_args=(
        "--disk-high-watermark-percent", "60", "--disk-check-ms", "50"))
    broker.log_path = tmp_path / "broker.log"
    broker.start()
    try:
        async with jetstream.connect(broker.address) as js:
            await js.create_stream("a", "a.in")
            await js.create_stream("b", "b.in")
            with pytest.raises(DiskFull, match="disk_high_watermark_percent"):
                for _ in range(200):
                    batch = [PublishMessage(f"{s}.in", b"x" * 1024) for s in ("a", "b") * 100]
                    await js.publish_batch(batch, window=200)
            usage = os.statvfs(small_disk)
            assert usage.f_bavail / usage.f_blocks > 0.2  # refused well before truly full
            async with httpx.AsyncClient(base_url=broker.http_url) as http:
                disk = (await http.get("/health")).json()["disk"]
            assert disk["full"] and disk["used_percent"] >= 60
            await js.delete_stream("b")
            deadline = time.monotonic() + 5
            while True:  # the next disk check lets appends in again
                try:
                    await js.publish("a.in", b"after", timeout=2.0)
                    break
                except DiskFull:
                    assert time.monotonic() < deadline, "appends did not resume"
                    await asyncio.sleep(0.05)
    finally:
        broker.stop()
