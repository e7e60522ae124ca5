"""The ingest NATS connection against a real nats-server, with nats-py on the other side.

Whatever waits does so on a condition with a deadline, never on a bare sleep.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client

from jetstream.natsd import NatsServer, free_ports
from jetstream.server.nats_errors import (
    NatsConnectFailed,
    NatsConnectionClosed,
    NatsPayloadTooLarge,
)
from jetstream.server.nats_ingest import IngestConfig, IngestConnection, connect
from jetstream.server.nats_subscription import IngestSubscription
from jetstream.server.nats_wire import NatsMsg

TIMEOUT_S = 5.0
POLL_S = 0.01
FAST_RECONNECT = IngestConfig(reconnect_wait_s=0.02, reconnect_wait_max_s=0.2)


async def eventually(condition: Callable[[], bool], what: str,
                     timeout_s: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout_s} s: {what}")
        await asyncio.sleep(POLL_S)


async def receive(sub: IngestSubscription, count: int,
                  timeout_s: float = TIMEOUT_S) -> list[NatsMsg]:
    deadline = time.monotonic() + timeout_s
    got: list[NatsMsg] = []
    while len(got) < count:
        left = deadline - time.monotonic()
        if left <= 0:
            pytest.fail(f"received {len(got)} of {count} messages in {timeout_s} s")
        got += await sub.next_batch(timeout_s=left)
    return got


@asynccontextmanager
async def ingest(url: str, config: IngestConfig | None = None) -> AsyncIterator[IngestConnection]:
    conn = await connect(url, name="test-ingest", config=config)
    try:
        yield conn
    finally:
        await conn.close()


@asynccontextmanager
async def nats_py(url: str) -> AsyncIterator[Client]:
    nc = await nats.connect(url, connect_timeout=TIMEOUT_S, max_reconnect_attempts=1)
    try:
        yield nc
    finally:
        await nc.close()


async def nats_py_subscription(nc: Client, subject: str) -> Any:
    sub = await nc.subscribe(subject)
    for _ in range(2):  # nats-py's first PING can overtake its SUB (see partition.py)
        await nc.flush(timeout=TIMEOUT_S)
    return sub


# -- messages in and out ---------------------------------------------------------------------------


async def test_round_trip_with_replies_and_headers(nats_url: str) -> None:
    async with ingest(nats_url) as conn, nats_py(nats_url) as nc:
        sub = conn.subscribe("in.>")
        await conn.flush()
        assert conn.is_connected and conn.server_info["max_payload"] == conn.max_payload
        big = bytes(range(256)) * 400
        sent: list[NatsMsg] = [
            ("in.plain", None, None, b"plain"),
            ("in.reply", "acks.1", None, b"with reply"),
            ("in.headers", "acks.2", {"K": "v", "X-Id": "7"}, b""),
            ("in.big", "acks.3", {"Big": "yes"}, big),
        ]
        for subject, reply, headers, data in sent:
            await nc.publish(subject, data, reply=reply or "", headers=headers)
        await nc.flush()
        got = await receive(sub, len(sent))
        assert got == sent
        assert sub.received == len(sent) and sub.dropped == 0

        acks = await nats_py_subscription(nc, "acks.*")
        with pytest.raises(NatsPayloadTooLarge):  # and nothing of that batch goes out
            conn.publish_many([("acks.0", b"ok"), ("acks.2", b"x" * (conn.max_payload + 1))])
        conn.publish_many([(reply, b"ack " + data[:10]) for _, reply, _, data in got if reply])
        await conn.drain()
        answers = [await acks.next_msg(timeout=TIMEOUT_S) for _ in range(3)]
        assert [(m.subject, m.data) for m in answers] == [
            ("acks.1", b"ack with reply"), ("acks.2", b"ack "), ("acks.3", b"ack " + big[:10])]


async def test_subscriptions_of_one_loop_turn_are_confirmed_by_one_ping(
        nats_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    async with ingest(nats_url) as conn, nats_py(nats_url) as nc:
        written: list[bytes] = []
        real = conn._write

        def spy(data: bytes) -> None:
            written.append(data)
            real(data)

        monkeypatch.setattr(conn, "_write", spy)

        async def subscribed(i: int) -> IngestSubscription:
            sub = conn.subscribe(f"many.{i}")
            await conn.confirm()
            return sub

        subs = await asyncio.gather(*(subscribed(i) for i in range(200)))
        assert written.count(b"PING\r\n") == 1
        assert written.index(b"PING\r\n") == 200  # after every SUB it confirms
        for i in range(200):  # each subscription was in place when confirm returned
            await nc.publish(f"many.{i}", str(i).encode())
        await nc.flush()
        for i, sub in enumerate(subs):
            assert [m[3] for m in await receive(sub, 1)] == [str(i).encode()]


async def test_queue_group_splits_messages_between_connections(nats_url: str) -> None:
    async with ingest(nats_url) as one, ingest(nats_url) as two, nats_py(nats_url) as nc:
        subs = [one.subscribe("work", queue="workers"), two.subscribe("work", queue="workers")]
        await one.flush()
        await two.flush()
        count = 400
        for i in range(count):
            await nc.publish("work", str(i).encode())
        await nc.flush()
        await eventually(lambda: sum(s.received for s in subs) == count, "all messages")
        batches = [await receive(sub, sub.received) for sub in subs]
        assert all(batches), "each member of the group got a share"
        numbers = sorted(int(m[3]) for batch in batches for m in batch)
        assert numbers == list(range(count))  # each message once


async def test_publish_many_arrives_in_order(nats_url: str) -> None:
    async with ingest(nats_url) as conn, nats_py(nats_url) as nc:
        out = await nats_py_subscription(nc, "out.>")
        count = 1000
        for start in range(0, count, 250):
            conn.publish_many([(f"out.{i % 7}", f"{i}".encode()) for i in range(start,
                                                                               start + 250)])
            await conn.drain()
        got = [await out.next_msg(timeout=TIMEOUT_S) for _ in range(count)]
        assert [(m.subject, m.data) for m in got] == [
            (f"out.{i % 7}", f"{i}".encode()) for i in range(count)]


async def test_writes_of_one_loop_turn_go_out_as_one(nats_url: str) -> None:
    async with ingest(nats_url) as conn, nats_py(nats_url) as nc:
        out = await nats_py_subscription(nc, "acks.>")
        transport = conn._transport
        assert transport is not None
        writes: list[bytes] = []
        write = transport.write

        def counted(data: bytes | bytearray | memoryview) -> None:
            writes.append(bytes(data))
            write(data)

        transport.write = counted  # type: ignore[method-assign]
        for i in range(30):  # e.g. a leader acking each partition one replica fetch advanced
            conn.publish_many([(f"acks.{i}", f"{i}".encode())])
        assert writes == []  # queued until the end of the turn
        await conn.drain()
        got = [await out.next_msg(timeout=TIMEOUT_S) for _ in range(30)]
        assert [(m.subject, m.data) for m in got] == [(f"acks.{i}", f"{i}".encode())
                                                      for i in range(30)]
        assert len(writes) == 1 and writes[0].count(b"PUB ") == 30


async def test_close_sends_what_this_loop_turn_queued(nats_url: str) -> None:
    async with nats_py(nats_url) as nc:
        out = await nats_py_subscription(nc, "last")
        conn = await connect(nats_url, name="test-ingest")
        conn.publish_many([("last", b"before close")])
        await conn.close()
        assert (await out.next_msg(timeout=TIMEOUT_S)).data == b"before close"


async def test_a_full_buffer_drops_and_counts(nats_url: str) -> None:
    async with ingest(nats_url) as conn, nats_py(nats_url) as nc:
        sub = conn.subscribe("in", pending_msgs_max=10)
        await conn.flush()
        for i in range(100):
            await nc.publish("in", str(i).encode())
        await nc.flush()
        await eventually(lambda: sub.received == 100, "100 messages received")
        assert (sub.dropped, sub.pending_msgs) == (90, 10)
        assert [m[3] for m in await sub.next_batch()] == [str(i).encode() for i in range(10)]
        await nc.publish("in", b"room again")
        await nc.flush()
        assert [m[3] for m in await receive(sub, 1)] == [b"room again"]


async def test_next_batch_times_out_empty_and_ends_with_close(nats_url: str) -> None:
    conn = await connect(nats_url)
    sub = conn.subscribe("quiet")
    assert await sub.next_batch(timeout_s=0.05) == []
    waiting = asyncio.create_task(sub.next_batch())
    await eventually(lambda: sub._waiter is not None, "next_batch waiting")
    await conn.close()
    with pytest.raises(NatsConnectionClosed):
        await asyncio.wait_for(waiting, TIMEOUT_S)
    with pytest.raises(NatsConnectionClosed):
        conn.publish_many([("x", b"y")])
    assert not conn.is_connected and conn.is_closed


# -- connection management -------------------------------------------------------------------------


async def test_the_servers_pings_get_pongs(tmp_path: Path) -> None:
    # Without PONGs, nats-server drops the client after ping_max unanswered PINGs.
    config = {"ping_interval": "100ms", "ping_max": 1}
    with NatsServer(tmp_path, config=config) as server:
        async with ingest(server.url) as conn:
            await eventually(lambda: conn.pings_answered >= 5, "5 PINGs answered")
            assert conn.is_connected and conn.reconnects == 0
            await conn.flush()
        assert "Stale" not in server.log_tail()


async def test_reconnects_after_a_server_restart_and_subscribes_again(tmp_path: Path) -> None:
    server = await NatsServer(tmp_path).astart()
    try:
        async with ingest(server.url, FAST_RECONNECT) as conn:
            sub = conn.subscribe("in")
            echo = conn.subscribe("echo")
            await conn.flush()
            async with nats_py(server.url) as nc:
                await nc.publish("in", b"before")
                await nc.flush()
            assert [m[3] for m in await receive(sub, 1)] == [b"before"]

            await server.astop()
            await eventually(lambda: not conn.is_connected, "the loss noticed")
            conn.publish_many([("echo", b"sent while down")])  # buffered for the reconnect
            await server.astart()  # same port
            await eventually(lambda: conn.is_connected, "reconnected")
            assert conn.reconnects == 1
            await conn.flush()  # its PONG proves the SUBs were processed

            async with nats_py(server.url) as nc:
                await nc.publish("in", b"after")
                await nc.flush()
            assert [m[3] for m in await receive(sub, 1)] == [b"after"]
            # Re-sent SUBs go out before the buffered publishes: our own echo arrives.
            assert [m[3] for m in await receive(echo, 1)] == [b"sent while down"]
    finally:
        server.stop()


async def test_credentials_from_the_url(tmp_path: Path) -> None:
    users = {"authorization": {"user": "alice", "password": "s3cret"}}
    token = {"authorization": {"token": "t0ken"}}
    with NatsServer(tmp_path / "users", config=users) as by_user, \
            NatsServer(tmp_path / "token", config=token) as by_token:
        good = [f"nats://alice:s3cret@127.0.0.1:{by_user.port}",
                f"nats://t0ken@127.0.0.1:{by_token.port}"]
        for url in good:
            async with ingest(url) as conn:
                conn.subscribe("x")
                await conn.flush()
        for url in (f"nats://alice:wrong@127.0.0.1:{by_user.port}", by_user.url,
                    f"nats://wrong@127.0.0.1:{by_token.port}"):
            with pytest.raises(NatsConnectFailed, match=r"(?i)authorization"):
                await connect(url)


async def test_refused_connection_fails_fast() -> None:
    [port] = free_ports(1)
    started = time.monotonic()
    with pytest.raises(NatsConnectFailed, match=str(port)):
        await connect([f"nats://127.0.0.1:{port}"])
    assert time.monotonic() - started < TIMEOUT_S


# -- a misbehaving server ----------------------------------------------------------------------


@asynccontextmanager
async def fake_server(garbage: bytes = b"", read_gate: asyncio.Event | None = None,
                      ) -> AsyncIterator[tuple[str, list[int]]]:
    """A TCP server that completes the NATS handshake and then never answers a PING. On its
    first connection it answers the first command after the handshake with `garbage`; after
    the handshake it reads nothing until `read_gate` is set. Yields its URL and its
    connection count."""
    connections = [0]

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections[0] += 1
        first = connections[0] == 1
        with suppress(ConnectionError, asyncio.IncompleteReadError):
            writer.write(b'INFO {"server_id":"fake","max_payload":1048576}\r\n')
            await reader.readuntil(b"PING\r\n")  # after CONNECT
            writer.write(b"PONG\r\n")
            if garbage and first:
                await reader.readuntil(b"\r\n")
                writer.write(garbage)
            if read_gate is not None:
                await read_gate.wait()
            while await reader.read(1 << 20):  # until the client goes away
                pass
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"nats://127.0.0.1:{port}", connections
    finally:
        server.close()


async def test_unanswered_pings_mean_a_stale_connection() -> None:
    config = IngestConfig(ping_interval_s=0.05, pings_outstanding_max=2,
                          reconnect_wait_s=0.02, reconnect_wait_max_s=0.1)
    async with fake_server() as (url, connections), ingest(url, config) as conn:
        await eventually(lambda: conn.reconnects >= 1, "a reconnect after unanswered PINGs")
        assert connections[0] >= 2


async def test_protocol_garbage_drops_the_connection_and_reconnects() -> None:
    async with fake_server(b"MSG a 1 nonsense\r\n") as (url, connections), \
            ingest(url, FAST_RECONNECT) as conn:
        conn.subscribe("x")  # the fake server's cue for garbage
        await eventually(lambda: conn.reconnects == 1 and conn.is_connected, "reconnected")
        assert conn.last_error is not None and "MSG a 1 nonsense" in conn.last_error
        assert connections[0] == 2


async def test_drain_waits_while_the_write_buffer_is_above_its_high_water_mark() -> None:
    gate = asyncio.Event()
    config = IngestConfig(write_buffer_high_bytes=1 << 16, write_buffer_low_bytes=1 << 14)
    async with fake_server(read_gate=gate) as (url, _), ingest(url, config) as conn:
        chunk = [("big", b"x" * (1 << 19))] * 8  # 4 MiB a call
        for _ in range(16):  # more than loopback socket buffers hold
            conn.publish_many(chunk)
        assert conn._write_paused
        draining = asyncio.create_task(conn.drain())
        await asyncio.sleep(0)
        assert not draining.done()
        gate.set()  # the peer reads again
        await asyncio.wait_for(draining, TIMEOUT_S)
        assert not conn._write_paused
