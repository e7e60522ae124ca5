"""Idempotent publishing and registers across a failover: a 3-broker cluster of real
processes, its partition leader killed with SIGKILL while a plain NATS publisher retries
every unacknowledged message with its `Nats-Msg-Id`."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest

import jetstream
from jetstream.errors import RegisterMismatch
from jetstream.server.process import BrokerProcess
from tests.integration.test_cluster import (
    STREAM,
    SUBJECT,
    by_id,
    create_stream,
    eventually,
    partition_state,
    running_cluster,
)

MESSAGES = 400
IN_FLIGHT = 16
DEADLINE_S = 60.0


@pytest.fixture
def cluster(tmp_path: Path, nats_url: str) -> Iterator[list[BrokerProcess]]:
    with running_cluster(tmp_path, nats_url) as brokers:
        yield brokers


async def test_nats_msg_id_retries_across_a_leader_kill_store_each_message_once(
        cluster: list[BrokerProcess], nats_url: str) -> None:
    state = await create_stream(cluster[0])
    async with jetstream.connect(",".join(b.address for b in cluster)) as js:
        await js.publish(SUBJECT, b"reg", union_registers={"owner": "a"})
    leader = by_id(cluster, state["leader"])
    acked: dict[int, tuple[int, bool]] = {}  # message number -> (offset, duplicate)
    nc = await nats.connect(nats_url)
    killed = asyncio.Event()

    async def send(number: int) -> None:
        deadline = time.monotonic() + DEADLINE_S
        while True:  # what every NATS client does: retry until acked, with the same id
            assert time.monotonic() < deadline, f"message {number} never acked"
            try:
                reply = await nc.request(SUBJECT, b"m%d" % number, timeout=1.0,
                                         headers={"Nats-Msg-Id": f"id-{number}"})
            except Exception:  # timeout, no responders while the leader moves
                await asyncio.sleep(0.05)
                continue
            answer: dict[str, Any] = json.loads(reply.data)
            if "error" not in answer:
                acked[number] = (answer["offset"], bool(answer.get("duplicate")))
                return
            await asyncio.sleep(0.05)

    async def worker(first: int) -> None:
        for number in range(first, MESSAGES, IN_FLIGHT):
            if number == MESSAGES // 3 and not killed.is_set():
                leader.kill()
                killed.set()
            await send(number)

    try:
        await asyncio.gather(*(worker(i) for i in range(IN_FLIGHT)))
        assert killed.is_set()
        first_acks = dict(acked)
        # A publisher that lost every ack sends everything again: the new leader rebuilt the
        # window from its log, so each is a duplicate answered with its original offset.
        acked.clear()
        await asyncio.gather(*(send(n) for n in range(MESSAGES)))
        assert all(acked[n] == (first_acks[n][0], True) for n in range(MESSAGES))
    finally:
        await nc.close()
    survivor = next(b for b in cluster if b.running)
    moved = await eventually(lambda: _moved(survivor, leader.broker_id), "a new leader")
    new = by_id(cluster, moved["leader"])
    async with jetstream.connect(new.address) as js:
        messages = []
        deadline = time.monotonic() + DEADLINE_S
        while len(messages) < MESSAGES + 1:
            assert time.monotonic() < deadline, f"read {len(messages)} messages"
            result = await js.fetch(STREAM, 0, len(messages), max_wait_ms=1000)
            messages.extend(result.messages)
        values = [msg.value for msg in messages[1:]]
        assert len(values) == len(set(values)) == MESSAGES, "a message was stored twice"
        offsets = {msg.value: msg.offset for msg in messages}
        # Every ack, duplicate or not, names the offset the message is stored at.
        assert all(offsets[b"m%d" % n] == offset for n, (offset, _dup) in acked.items())
        # The registers came over with the log.
        with pytest.raises(RegisterMismatch):
            await js.publish(SUBJECT, b"x", check_registers="!owner")
    async with httpx.AsyncClient(timeout=DEADLINE_S) as http:
        answer = await http.get(f"{new.http_url}/streams/{STREAM}/partitions/0/registers")
    assert answer.json()["registers"] == {"owner": "a"}


async def _moved(broker: BrokerProcess, old_leader: int) -> dict[str, Any] | None:
    state = await partition_state(broker)
    return state if state["leader"] not in (old_leader, -1) else None


async def test_idempotent_producer_across_a_leader_kill_no_duplicates_no_gaps(
        cluster: list[BrokerProcess]) -> None:
    state = await create_stream(cluster[0])
    leader = by_id(cluster, state["leader"])
    async with jetstream.connect(",".join(b.address for b in cluster)) as js:
        producer = js.idempotent_producer("writer-1")
        sent = 0

        async def publish(number: int) -> int:
            nonlocal sent
            ack = await producer.publish(SUBJECT, b"p%d" % number, timeout=DEADLINE_S,
                                         attempt_timeout=1.0)
            sent += 1
            if sent == MESSAGES // 3:
                leader.kill()
            return ack.offset

        offsets = await asyncio.gather(*(publish(n) for n in range(MESSAGES)))
        assert not leader.running
        survivor = next(b for b in cluster if b.running)
        await eventually(lambda: _moved(survivor, leader.broker_id), "a new leader")
        result = []
        deadline = time.monotonic() + DEADLINE_S
        while len(result) < MESSAGES:
            assert time.monotonic() < deadline, f"read {len(result)} messages"
            result.extend((await js.fetch(STREAM, 0, len(result), max_wait_ms=1000)).messages)
    values = [msg.value for msg in result]
    assert sorted(values) == sorted(b"p%d" % n for n in range(MESSAGES))  # once each
    assert sorted(offsets) == list(range(MESSAGES))


async def test_an_idempotent_batch_across_a_leader_kill_no_duplicates_no_gaps(
        cluster: list[BrokerProcess]) -> None:
    """IdempotentProducer.publish_batch (what the Spark writer uses): the leader is killed
    while a pipelined batch is in flight; what was not acked is sent again with the same
    sequences, so the log holds each message once, in the batch's order."""
    from jetstream.client.types import PublishMessage

    state = await create_stream(cluster[0])
    leader = by_id(cluster, state["leader"])
    async with jetstream.connect(",".join(b.address for b in cluster)) as js:
        producer = js.idempotent_producer("batch-writer")
        first = await producer.publish_batch(
            [PublishMessage(SUBJECT, b"b%d" % n) for n in range(MESSAGES // 4)], window=50)
        assert [a.offset for a in first] == list(range(MESSAGES // 4))
        rounds = 0
        send = js.publish_expecting

        async def counted(*args: Any, **kwargs: Any) -> Any:
            nonlocal rounds
            rounds += 1
            return await send(*args, **kwargs)

        js.publish_expecting = counted  # type: ignore[method-assign]
        rest = [PublishMessage(SUBJECT, b"b%d" % n) for n in range(MESSAGES // 4, MESSAGES)]
        batch = asyncio.create_task(producer.publish_batch(
            rest, window=50, timeout=DEADLINE_S, attempt_timeout=1.0))
        await asyncio.sleep(0)  # the batch is on its way
        leader.kill()
        acks = await batch
        assert not leader.running and rounds >= 2  # what the kill left unacked went again
        result = []
        deadline = time.monotonic() + DEADLINE_S
        while len(result) < MESSAGES:
            assert time.monotonic() < deadline, f"read {len(result)} messages"
            result.extend((await js.fetch(STREAM, 0, len(result), max_wait_ms=1000)).messages)
    assert [msg.value for msg in result] == [b"b%d" % n for n in range(MESSAGES)]
    assert [a.offset for a in acks] == list(range(MESSAGES // 4, MESSAGES))
