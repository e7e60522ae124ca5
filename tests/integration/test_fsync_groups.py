"""A publish to each of many streams under `fsync=always`: the followers' appends and the
leaders' fsyncs of one turn are made durable by one syncfs (jetstream.stream.fs_sync), every
acked record is there after every broker is SIGKILLed and started again; under
`fsync=interval` the fsyncs that come due together share syncfs calls too; and
`fsync_group_min 0` fsyncs each log as before."""

from __future__ import annotations

import asyncio
from pathlib import Path

import jetstream
from jetstream.errors import JetstreamError
from jetstream.server.process import BrokerProcess
from tests.integration.test_cluster import TUNING, eventually, running_cluster
from tests.integration.test_fetch_sessions import all_in_sync, create, total

STREAMS = 24
GROUPS = "jetstream_roles_fsync_groups_total"
SYNCFS = "jetstream_roles_fsync_group_syncfs_total"


async def publish_each(brokers: list[BrokerProcess], value: bytes) -> None:
    async with jetstream.connect(",".join(b.address for b in brokers)) as js:
        await asyncio.gather(*(js.publish(f"idle.{i}", value, ack_policy="all")
                               for i in range(STREAMS)))


async def read_each(brokers: list[BrokerProcess]) -> list[list[bytes]]:
    async with jetstream.connect(",".join(b.address for b in brokers)) as js:
        out = []
        for i in range(STREAMS):
            result = await js.fetch(f"idle-{i}", 0, 0, max_wait_ms=1000)
            out.append([m.value for m in result.messages])
        return out


async def test_a_publish_to_each_stream_is_made_durable_by_shared_syncs(
        tmp_path: Path, nats_url: str) -> None:
    with running_cluster(tmp_path, nats_url, TUNING) as brokers:
        async with jetstream.connect(",".join(b.address for b in brokers)) as js:
            await create(js, 0, STREAMS)
            await all_in_sync(js, STREAMS, brokers)
        before = (await total(brokers, GROUPS), await total(brokers, SYNCFS))
        for value in (b"a", b"b", b"c"):
            await publish_each(brokers, value)
        after = (await total(brokers, GROUPS), await total(brokers, SYNCFS))
        assert after[0] > before[0] and after[1] > before[1], (before, after)
        for broker in brokers:
            broker.kill()
        for broker in brokers:
            broker.start(wait=False)
        for broker in brokers:
            broker.wait_ready()

        async def everything_back() -> list[list[bytes]] | None:
            try:
                read = await read_each(brokers)
            except JetstreamError:
                return None
            return read if all(len(values) == 3 for values in read) else None

        read = await eventually(everything_back, "every acked record after the restart", 60.0)
        assert read == [[b"a", b"b", b"c"]] * STREAMS


async def test_interval_fsyncs_due_together_share_syncs(tmp_path: Path,
                                                        nats_url: str) -> None:
    """Under `fsync=interval`, the fsyncs a burst over many partitions makes due at once
    (the leaders' scheduled ones, the followers' after their appends) are grouped into
    syncfs calls, as `always` appends are."""
    with running_cluster(tmp_path, nats_url, TUNING) as brokers:
        async with jetstream.connect(",".join(b.address for b in brokers)) as js:
            await create(js, 0, STREAMS)
            await all_in_sync(js, STREAMS, brokers)
            for i in range(STREAMS):
                await js.update_stream(f"idle-{i}", fsync="interval", fsync_interval_ms=200)
        before = await total(brokers, SYNCFS)
        for value in (b"a", b"b"):
            await publish_each(brokers, value)

        async def synced() -> float | None:
            now = await total(brokers, SYNCFS)
            return now if now > before else None

        await eventually(synced, "a syncfs for the interval fsyncs", 10.0)
        assert await read_each(brokers) == [[b"a", b"b"]] * STREAMS


async def test_fsync_group_min_zero_fsyncs_each_log(tmp_path: Path, nats_url: str) -> None:
    with running_cluster(tmp_path, nats_url, (*TUNING, "--fsync-group-min", "0")) as brokers:
        async with jetstream.connect(",".join(b.address for b in brokers)) as js:
            await create(js, 0, STREAMS)
            await all_in_sync(js, STREAMS, brokers)
        await publish_each(brokers, b"a")
        assert await total(brokers, GROUPS) == 0
        assert await read_each(brokers) == [[b"a"]] * STREAMS


async def test_an_fsync_change_applies_in_place_and_keeps_every_isr(
        tmp_path: Path, nats_url: str) -> None:
    """`update_stream(fsync=...)` changes the running leaders' policy without restarting
    them: no leader role starts, and an `all` publish right after the change is taken (a
    restarted leader refused them until its followers fetched from it again)."""
    started = "jetstream_roles_leaders_started_total"
    with running_cluster(tmp_path, nats_url, TUNING) as brokers:
        async with jetstream.connect(",".join(b.address for b in brokers)) as js:
            await create(js, 0, STREAMS)
            await all_in_sync(js, STREAMS, brokers)
            leaders = await total(brokers, started)
            for i in range(STREAMS):  # no interval passes during the test
                await js.update_stream(f"idle-{i}", fsync="interval",
                                       fsync_interval_ms=60_000)
            groups = await total(brokers, GROUPS)
            await publish_each(brokers, b"a")
            assert await total(brokers, GROUPS) == groups  # nothing waited for an fsync
            for i in range(STREAMS):
                await js.update_stream(f"idle-{i}", fsync="always")
            await publish_each(brokers, b"b")
            assert await total(brokers, GROUPS) > groups  # the sync loops run again
            assert await total(brokers, started) == leaders
        assert await read_each(brokers) == [[b"a", b"b"]] * STREAMS
