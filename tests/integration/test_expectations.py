"""Expectations and idempotent publishing against a real broker and nats-server: message ids
from the client, from plain NATS headers and over HTTP; expected offsets; raced check-and-set
writers on one key; registers, also after a restart.

Waits are conditions with deadlines; nothing sleeps and hopes.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import nats
import pytest

from jetstream.client import Client
from jetstream.errors import (
    KeyOffsetMismatch,
    OffsetMismatch,
    OutOfOrderSequence,
    ProducerFenced,
    ProtocolError,
    RegisterMismatch,
)
from jetstream.protocol.ack import ErrorAck, parse_ack
from jetstream.server.process import BrokerProcess

DEADLINE_S = 10.0


async def stored(js: Client, stream: str, partition: int = 0) -> list[bytes | None]:
    async def collect() -> list[bytes | None]:
        return [msg.value async for msg in js.subscribe(stream, partition, stop="latest")]

    return await asyncio.wait_for(collect(), DEADLINE_S)


async def test_a_retried_msg_id_is_acked_with_the_original_offset(js: Client) -> None:
    await js.create_stream("orders", "orders.in")
    await js.publish("orders.in", b"first")
    ack = await js.publish("orders.in", b"pay", msg_id="order-17")
    again = await js.publish("orders.in", b"pay", msg_id="order-17")
    other = await js.publish("orders.in", b"ship", msg_id="order-18")
    assert ack is not None and again is not None and other is not None
    assert (ack.offset, ack.duplicate) == (1, False)
    assert (again.offset, again.duplicate) == (1, True)
    assert other.offset == 2
    assert await stored(js, "orders") == [b"first", b"pay", b"ship"]


async def test_plain_nats_publishers_use_headers(js: Client, nats_url: str) -> None:
    await js.create_stream("plain", "plain.in")
    nc = await nats.connect(nats_url)
    try:
        async def request(value: bytes, headers: dict[str, str]) -> dict[str, object]:
            reply = await nc.request("plain.in", value, timeout=DEADLINE_S, headers=headers)
            answer: dict[str, object] = json.loads(reply.data)
            return answer

        first = await request(b"a", {"Nats-Msg-Id": "m1"})
        retry = await request(b"a", {"Nats-Msg-Id": "m1"})
        assert (first["offset"], "duplicate" in first) == (0, False)
        assert (retry["offset"], retry["duplicate"]) == (0, True)
        # JetStream's spelling: its last sequence N is our log end offset N.
        assert (await request(b"b", {"Nats-Expected-Last-Sequence": "1"}))["offset"] == 1
        reply = await nc.request("plain.in", b"c", timeout=DEADLINE_S,
                                 headers={"Jetstream-Expected-Offset": "1"})
        refused = parse_ack(reply.data)
        assert isinstance(refused, ErrorAck) and isinstance(refused.error, OffsetMismatch)
        assert refused.error.log_end_offset == 2
        reply = await nc.request("plain.in", b"d", timeout=DEADLINE_S,
                                 headers={"Jetstream-Registers": "{}"})
        forged = parse_ack(reply.data)
        assert isinstance(forged, ErrorAck) and isinstance(forged.error, ProtocolError)
    finally:
        await nc.close()
    assert await stored(js, "plain") == [b"a", b"b"]


async def test_expected_offset_from_the_client(js: Client) -> None:
    await js.create_stream("single", "single.in")
    assert (await js.publish("single.in", b"0", expected_offset=0)) is not None
    with pytest.raises(OffsetMismatch) as refused:
        await js.publish("single.in", b"x", expected_offset=0)
    assert refused.value.log_end_offset == 1
    assert await stored(js, "single") == [b"0"]


async def test_raced_cas_writers_on_one_key_one_wins_per_round(js: Client) -> None:
    await js.create_stream("kv", "kv.in", cleanup_policy="compact")
    async def write(value: bytes, expected: int) -> int | None:
        try:
            ack = await js.publish("kv.in", value, key=b"k",
                                   expected_last_offset_for_key=expected)
        except KeyOffsetMismatch:
            return None
        assert ack is not None
        return ack.offset

    last = -1  # the key has no record yet
    for round_number in range(8):
        offsets = await asyncio.gather(*(write(b"%d-%d" % (round_number, w), last)
                                         for w in range(4)))
        winners = [o for o in offsets if o is not None]
        assert len(winners) == 1, offsets
        last = winners[0]
    assert len(await stored(js, "kv")) == 8


async def test_registers_check_and_survive_a_restart(broker: BrokerProcess,
                                                     js: Client) -> None:
    await js.create_stream("jobs", "jobs.in")
    await js.publish("jobs.in", b"take", check_registers="!owner",
                     union_registers={"owner": "a"})
    with pytest.raises(RegisterMismatch) as lost:
        await js.publish("jobs.in", b"take", check_registers="!owner",
                         union_registers={"owner": "b"})
    assert lost.value.registers == {"owner": "a"}
    await js.publish("jobs.in", b"done", msg_id="done-1", check_registers="owner=a",
                     subtract_registers={"owner": "a"}, union_registers={"state": "done"})
    broker.restart()
    async with httpx.AsyncClient(base_url=broker.http_url) as http:
        async def registers() -> object:
            answer = await http.get("/streams/jobs/partitions/0/registers")
            return answer.json().get("registers") if answer.status_code == 200 else None

        deadline = asyncio.get_running_loop().time() + DEADLINE_S
        while (found := await registers()) != {"state": "done"}:
            assert asyncio.get_running_loop().time() < deadline, found
            await asyncio.sleep(0.05)
        # The id window came back from the log too: over HTTP, the retry is a duplicate.
        answer = await http.post("/streams/jobs/partitions/0/messages",
                                 json={"messages": [{"value": "done"}]},
                                 headers={"Nats-Msg-Id": "done-1"})
        assert answer.status_code == 200, answer.text
        assert answer.json()["duplicate"] is True and answer.json()["offsets"] == [1]
        answer = await http.post("/streams/jobs/partitions/0/messages",
                                 json={"messages": [{"value": "eA=="}], "expected_offset": 0})
        assert answer.status_code == 412, answer.text
        assert answer.json()["error"]["code"] == "OFFSET_MISMATCH"


async def test_idempotent_producer_sequences_and_fencing(js: Client) -> None:
    await js.create_stream("tasks", "tasks.in", partitions=2)
    old = js.idempotent_producer("task-7", epoch=0)
    acks = await asyncio.gather(*(old.publish("tasks.in", b"%d" % i, partition=i % 2)
                                  for i in range(20)))
    assert sorted(a.offset for a in acks if a.partition == 0) == list(range(10))
    # A retry of a stored sequence (the envelope sent again) is not stored again.
    retry = await js.publish_to("tasks.in.1", b"1", None, None, None, 5.0,
                                producer=("task-7", 0, 0))
    assert retry is not None and (retry.offset, retry.duplicate) == (0, True)
    with pytest.raises(OutOfOrderSequence) as gap:
        await js.publish_to("tasks.in", b"x", None, None, None, 5.0,
                            producer=("task-7", 0, 12))
    assert gap.value.expected_sequence == 10
    new = js.idempotent_producer("task-7", epoch=1)
    await new.publish("tasks.in", b"new", partition=0)
    with pytest.raises(ProducerFenced):
        await old.publish("tasks.in", b"zombie", partition=0)
    values = await stored(js, "tasks", 0)
    assert values == [b"%d" % i for i in range(0, 20, 2)] + [b"new"]


async def test_a_producer_is_taken_up_after_its_first_sequence_or_with_resume(
        js: Client) -> None:
    """A leader takes a producer it does not know at sequence 0 only (the earlier ones may
    still be on their way, or lost), or at any sequence whose sender says every earlier one
    was acked: an idle session goes on after the leader forgot it."""
    await js.create_stream("tasks", "tasks.in", duplicate_window_ms=300)
    target = js.target_subject("tasks.in", None, 0)
    with pytest.raises(OutOfOrderSequence) as gap:
        await js.publish_to(target, b"early", None, None, None, 5.0,
                            producer=("task-8", 0, 3))
    assert gap.value.expected_sequence == 0
    resumed = await js.publish_to(target, b"resumed", None, None, None, 5.0,
                                  producer=("task-8", 0, 3, True))
    assert resumed is not None and not resumed.duplicate
    session = js.idempotent_producer("task-9", epoch=0)
    await session.publish("tasks.in", b"before", partition=0)
    first_probe = await js.publish_to(target, b"probe", None, None, None, 5.0,
                                      producer=("probe", 0, 0))
    assert first_probe is not None
    # Until the leader forgot the probe (a retry of its sequence 0 is stored again), and so
    # task-9, idle since before it.
    deadline = asyncio.get_running_loop().time() + DEADLINE_S
    while True:
        probe = await js.publish_to(target, b"probe", None, None, None, 5.0,
                                    producer=("probe", 0, 0))
        assert probe is not None
        if not probe.duplicate:
            break
        assert asyncio.get_running_loop().time() < deadline, "the probe never forgotten"
        await asyncio.sleep(0.05)
    with pytest.raises(OutOfOrderSequence):  # without resume, sequence 0 is expected
        await js.publish_to(target, b"lost-before", None, None, None, 5.0,
                            producer=("task-9", 0, 1))
    await session.publish("tasks.in", b"after", partition=0)  # sequence 1, with resume
    assert await stored(js, "tasks", 0) == [b"resumed", b"before", b"probe", b"probe", b"after"]


async def test_registers_from_the_client_and_the_cli(broker: BrokerProcess,
                                                     js: Client) -> None:
    import os
    import subprocess
    import sys

    await js.create_stream("locks", "locks.in")
    assert await js.registers("locks") == {}
    env = {**os.environ, "JETSTREAM_BROKERS": broker.address}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "jetstream", *args], env=env,
                              capture_output=True, text=True, timeout=60)

    taken = cli("pub", "locks.in", "take", "--check-registers", "!holder",
                "--union-register", "holder=w1")
    assert taken.returncode == 0, taken.stderr
    assert await js.registers("locks") == {"holder": "w1"}
    shown = cli("registers", "locks")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.split() == ["REGISTER", "VALUE", "holder", "w1"]
    document = json.loads(cli("registers", "locks", "--json").stdout)
    assert document == {"stream": "locks", "partition": 0, "registers": {"holder": "w1"}}
    unknown = cli("registers", "nope")
    assert unknown.returncode != 0 and "UNKNOWN_STREAM" in unknown.stderr + unknown.stdout


async def test_key_expectations_right_after_a_restart_of_a_compacted_stream(
        broker: BrokerProcess, js: Client) -> None:
    """A leader starts once it read its log's tail (the duplicate window); it learns the
    keys of the older records in the background, and a key expectation waits for them."""
    from jetstream.client.types import PublishMessage

    await js.create_stream("cas", "cas.in", cleanup_policy="compact", duplicate_window_ms=200)
    acks = await js.publish_batch(
        [PublishMessage("cas.in", b"v%d" % i, b"k%d" % (i % 50)) for i in range(1000)])
    latest = {b"k%d" % (i % 50): ack.offset for i, ack in enumerate(acks)}
    loop = asyncio.get_running_loop()
    acked_at = loop.time()
    while loop.time() - acked_at < 0.4:  # every record now lies outside the 200 ms window
        await asyncio.sleep(0.05)
    broker.extra_args = (*broker.extra_args, "--verbose")  # INFO lines: what it learned
    broker.restart()
    ack = await js.publish("cas.in", b"new", key=b"k7", expected_last_offset_for_key=latest[b"k7"])
    assert ack is not None and ack.offset > latest[b"k7"]
    with pytest.raises(KeyOffsetMismatch):
        await js.publish("cas.in", b"stale", key=b"k8", expected_last_offset_for_key=0)
    assert await js.publish("cas.in", b"first", key=b"fresh",
                            expected_last_offset_for_key=-1) is not None
    assert "keys of offsets [0, " in broker.log_tail()  # learned after the leader started
