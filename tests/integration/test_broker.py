"""The broker seen from outside, without the client's help: plain NATS publishers, raw
socket API frames (well-formed, malformed and hostile), long polls, the high watermark
promise, and the HTTP API.

Every wait is bounded by a deadline; raw sockets are read until the broker closes them.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import nats
import pytest
from nats.aio.client import Client as Nats

import jetstream
from jetstream.client import BrokerConnection, Client
from jetstream.errors import (
    InvalidStreamConfig,
    OffsetOutOfRange,
    UnknownStream,
)
from jetstream.protocol import frames
from jetstream.protocol import messages as m
from jetstream.protocol.envelope import encode_envelope
from jetstream.server.process import BrokerProcess
from jetstream.stream.format import decode_batches

DEADLINE_S = 10.0


@pytest.fixture
async def nc(broker: BrokerProcess) -> AsyncIterator[Nats]:
    """A plain nats-py connection to the broker's NATS server."""
    client = await nats.connect(broker.nats_url, connect_timeout=DEADLINE_S)
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
async def conn(broker: BrokerProcess) -> AsyncIterator[BrokerConnection]:
    """A socket API connection to the broker, after HELLO."""
    connection = BrokerConnection(broker.address, client_id="raw-test")
    await connection.open()
    try:
        yield connection
    finally:
        await connection.close()


async def raw_exchange(broker: BrokerProcess, data: bytes) -> list[frames.Frame]:
    """Send `data` on a fresh socket API connection and return every frame the broker sends
    until it closes the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", broker.port)
    decoder = frames.FrameDecoder()
    received: list[frames.Frame] = []

    async def until_closed() -> None:
        while chunk := await reader.read(65536):
            decoder.feed(chunk)
            received.extend(decoder)

    try:
        writer.write(data)
        await writer.drain()
        await asyncio.wait_for(until_closed(), DEADLINE_S)
    finally:
        writer.close()
    return received


def hello_frame() -> bytes:
    return frames.encode_frame(0, frames.Kind.REQUEST, frames.Op.HELLO,
                               frames.hello_request("raw"))


# -- NATS publishers ---------------------------------------------------------------------------


async def test_plain_nats_request_is_stored_as_is_and_acked(js: Client, nc: Nats) -> None:
    await js.create_stream("plain", "plain.*")

    reply = await nc.request("plain.in", b"raw bytes", headers={"X-Trace": "abc"},
                             timeout=DEADLINE_S)
    not_an_envelope = await nc.request("plain.in", b"JSEV\x01\xc1 not msgpack",
                                       timeout=DEADLINE_S)

    assert json.loads(reply.data) == {
        "stream": "plain", "partition": 0, "offset": 0, "subject": "plain.in",
        "correlation_id": None, "ack_policy": "all"}
    assert json.loads(not_an_envelope.data)["offset"] == 1
    first, second = (await js.fetch("plain")).messages
    assert (first.value, first.key, dict(first.headers), first.subject) == (
        b"raw bytes", None, {"X-Trace": b"abc"}, "plain.in")
    assert second.value == b"JSEV\x01\xc1 not msgpack"


async def test_envelope_over_plain_nats_is_unpacked_and_acked(js: Client, nc: Nats) -> None:
    await js.create_stream("wrapped", "wrapped")
    payload = encode_envelope(b"inner", key=b"k", headers={"a": b"1"}, correlation_id="c-1",
                              ack_policy="leader")

    reply = await nc.request("wrapped", payload, timeout=DEADLINE_S)

    assert json.loads(reply.data) == {
        "stream": "wrapped", "partition": 0, "offset": 0, "subject": "wrapped",
        "correlation_id": "c-1", "ack_policy": "leader"}
    (msg,) = (await js.fetch("wrapped")).messages
    assert (msg.value, msg.key, dict(msg.headers)) == (b"inner", b"k", {"a": b"1"})


async def test_the_nats_py_ingest_path_stores_and_acks_the_same(
        tmp_path: Path, nats_url: str, nc: Nats) -> None:
    # The fallback for NATS setups the fast client does not speak (TLS, creds).
    broker = BrokerProcess(tmp_path / "nats-py-broker", nats_url,
                           extra_args=("--nats-client", "nats-py")).start()
    try:
        async with jetstream.connect(broker.address) as client:
            await client.create_stream("viapy", "viapy")
            plain = await nc.request("viapy", b"raw", headers={"X-Trace": "t"},
                                     timeout=DEADLINE_S)
            wrapped = await nc.request("viapy", encode_envelope(b"inner", key=b"k",
                                                                correlation_id="c-9"),
                                       timeout=DEADLINE_S)
            acks = await client.publish_batch([("viapy", b"b%d" % i) for i in range(50)])
            assert json.loads(plain.data)["offset"] == 0
            assert json.loads(wrapped.data)["correlation_id"] == "c-9"
            assert [a.offset for a in acks] == list(range(2, 52))
            messages = (await client.fetch("viapy")).messages
            assert (messages[0].value, dict(messages[0].headers)) == (b"raw", {"X-Trace": b"t"})
            assert (messages[1].value, messages[1].key) == (b"inner", b"k")
            assert len(messages) == 52
    finally:
        broker.stop()


async def test_oversize_plain_message_gets_an_error_ack(js: Client, nc: Nats) -> None:
    await js.create_stream("tiny", "tiny", max_message_bytes=64)

    reply = await nc.request("tiny", b"x" * 65, timeout=DEADLINE_S)
    ok = await nc.request("tiny", b"x" * 64, timeout=DEADLINE_S)

    error = json.loads(reply.data)["error"]
    assert (error["code"], error["size"], error["limit"]) == ("MESSAGE_TOO_LARGE", 65, 64)
    assert json.loads(ok.data)["offset"] == 0


# -- the socket API under bad input -------------------------------------------------------------


async def test_garbage_gets_an_error_frame_and_the_broker_keeps_serving(
        broker: BrokerProcess) -> None:
    received = await raw_exchange(broker, b"GET / HTTP/1.1\r\nHost: jetstream\r\n\r\n")

    assert [(f.kind, f.header["code"]) for f in received] == [(frames.Kind.ERROR,
                                                                "BAD_REQUEST")]
    connection = BrokerConnection(broker.address, client_id="after-garbage")
    await connection.open()
    try:
        assert await connection.request(m.ListStreamsRequest()) == m.ListStreamsResponse([])
    finally:
        await connection.close()


async def test_a_frame_claiming_a_huge_length_is_refused_at_once(broker: BrokerProcess) -> None:
    huge = frames.PREFIX.pack(2**31, 1, frames.Kind.REQUEST, frames.Op.METADATA, 0)

    before_hello = await raw_exchange(broker, huge)
    after_hello = await raw_exchange(broker, hello_frame() + huge)

    assert [f.header["code"] for f in before_hello] == ["BAD_REQUEST"]
    assert "length" in before_hello[0].header["message"]
    hello, error = after_hello
    assert frames.parse_hello_response(hello.header).broker_id == 0
    assert (error.kind, error.header["code"], error.header["field"]) == (
        frames.Kind.ERROR, "BAD_REQUEST", "length")


async def test_a_request_before_hello_is_refused(broker: BrokerProcess) -> None:
    request = m.encode_request(7, m.ListStreamsRequest())

    (error,) = await raw_exchange(broker, request)

    assert (error.kind, error.header["code"]) == (frames.Kind.ERROR, "BAD_REQUEST")


async def test_bad_requests_in_good_frames_keep_the_connection(
        broker: BrokerProcess) -> None:
    unknown_op = frames.encode_frame(1, frames.Kind.REQUEST, 99, {})
    bad_field = frames.encode_frame(2, frames.Kind.REQUEST, frames.Op.FETCH,
                                    {"stream": "s", "partition": 0, "offset": 0,
                                     "max_bytes": 0, "max_wait_ms": 0})
    fine = m.encode_request(3, m.ListStreamsRequest())
    reader, writer = await asyncio.open_connection("127.0.0.1", broker.port)
    decoder = frames.FrameDecoder()
    try:
        writer.write(hello_frame() + unknown_op + bad_field + fine)
        answers: dict[int, frames.Frame] = {}
        while len(answers) < 4:
            decoder.feed(await asyncio.wait_for(reader.read(65536), DEADLINE_S))
            answers.update((f.correlation_id, f) for f in decoder)
    finally:
        writer.close()

    assert (answers[1].kind, answers[1].header["code"]) == (frames.Kind.ERROR, "BAD_REQUEST")
    assert (answers[2].header["code"], answers[2].header["field"]) == ("BAD_REQUEST",
                                                                       "max_bytes")
    assert m.decode_response(answers[3]) == m.ListStreamsResponse([])


async def test_errors_cross_the_wire_with_their_codes_and_fields(
        conn: BrokerConnection) -> None:
    await conn.request(m.CreateStreamRequest({"name": "coded", "subject": "coded"}))

    with pytest.raises(UnknownStream) as unknown:
        await conn.fetch(m.FetchRequest("missing", 0, 0, 1024, 0))
    with pytest.raises(OffsetOutOfRange) as out_of_range:
        await conn.fetch(m.FetchRequest("coded", 0, 5, 1024, 0))
    with pytest.raises(InvalidStreamConfig) as invalid:
        await conn.request(m.CreateStreamRequest({"name": "coded2", "subject": "a..b"}))
    with pytest.raises(InvalidStreamConfig) as unknown_field:
        await conn.request(m.CreateStreamRequest({"name": "x", "subject": "x", "colour": 1}))
    with pytest.raises(UnknownStream):
        await conn.request(m.DeleteStreamRequest("missing"))

    assert unknown.value.stream == "missing"
    assert (out_of_range.value.oldest, out_of_range.value.newest) == (0, 0)
    assert (invalid.value.code, invalid.value.field) == ("INVALID_STREAM_CONFIG", "subject")
    assert unknown_field.value.field == "colour"
    assert isinstance(await conn.request(m.MetadataRequest()), m.MetadataResponse)


# -- reads ----------------------------------------------------------------------------------


async def test_a_long_poll_returns_as_soon_as_a_message_is_committed(
        broker: BrokerProcess, conn: BrokerConnection, nc: Nats) -> None:
    await conn.request(m.CreateStreamRequest({"name": "poll", "subject": "poll"}))
    async with httpx.AsyncClient(base_url=broker.http_url, timeout=DEADLINE_S) as http:
        served = await _requests_total(http)
        fetch = asyncio.ensure_future(conn.fetch(m.FetchRequest("poll", 0, 0, 1024, 30_000)))
        await asyncio.wait_for(_until_requests_total(http, served + 1), DEADLINE_S)
        loop = asyncio.get_running_loop()
        published = loop.time()
        await nc.request("poll", b"wake up", timeout=DEADLINE_S)
        response, payload = await asyncio.wait_for(fetch, DEADLINE_S)
    assert loop.time() - published < DEADLINE_S  # not the 30 s it may wait
    assert response.high_watermark == 1
    assert [r.value for r in decode_batches(payload)] == [b"wake up"]


async def _requests_total(http: httpx.AsyncClient) -> int:
    text = (await http.get("/metrics")).text
    match = re.search(r"^jetstream_broker_requests_total (\d+)$", text, re.M)
    assert match is not None, text
    return int(match.group(1))


async def _until_requests_total(http: httpx.AsyncClient, total: int) -> None:
    while await _requests_total(http) < total:
        await asyncio.sleep(0.01)


async def test_fetch_never_returns_records_at_or_above_the_high_watermark(
        js: Client, conn: BrokerConnection) -> None:
    await js.create_stream("committed", "committed")
    publishing = asyncio.ensure_future(js.publish_batch([("committed", b"y" * 100)] * 5000))

    async def read_raw() -> int:
        offset = 0
        while offset < 5000:
            response, payload = await conn.fetch(
                m.FetchRequest("committed", 0, offset, 32 * 1024, 100))
            records = decode_batches(payload, min_offset=offset)
            assert all(r.offset < response.high_watermark for r in records)
            assert response.high_watermark <= response.log_end_offset
            if records:
                offset = records[-1].offset + 1
        return offset

    assert await asyncio.wait_for(read_raw(), DEADLINE_S * 3) == 5000
    assert len(await publishing) == 5000


# -- HTTP API -------------------------------------------------------------------------------


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def test_http_api(broker: BrokerProcess, js: Client) -> None:
    async with httpx.AsyncClient(base_url=broker.http_url, timeout=DEADLINE_S) as http:
        config = {"name": "web", "subject": "web.in", "labels": {"app": "shop"}}
        assert (await http.post("/streams", json=config)).status_code == 201
        assert (await http.post("/streams", json=config)).status_code == 200
        exists = await http.post("/streams", json={**config, "subject": "elsewhere"})
        assert (exists.status_code, exists.json()["error"]["code"]) == (409, "STREAM_EXISTS")
        bad = await http.post("/streams", json={"name": "bad name", "subject": "x"})
        assert (bad.status_code, bad.json()["error"]["code"]) == (400, "INVALID_STREAM_CONFIG")
        assert [s["name"] for s in (await http.get("/streams")).json()["streams"]] == ["web"]
        info = (await http.get("/streams/web")).json()
        assert (info["subject"], info["labels"], len(info["partitions"])) == (
            "web.in", {"app": "shop"}, 1)

        appended = await http.post("/streams/web/partitions/0/messages", json={"messages": [
            {"value": b64(b"a"), "key": b64(b"k"), "headers": {"h": b64(b"v")}},
            {"value": b64(b"b")}]})
        assert appended.json()["offsets"] == [0, 1]
        assert (await js.publish("web.in", b"c")).offset == 2
        not_base64 = await http.post("/streams/web/partitions/0/messages",
                                     json={"messages": [{"value": "%%%"}]})
        assert (not_base64.status_code, not_base64.json()["error"]["code"]) == (
            400, "BAD_REQUEST")

        read = (await http.get("/streams/web/partitions/0/messages",
                               params={"offset": 0})).json()
        assert [base64.b64decode(msg["value"]) for msg in read["messages"]] == [b"a", b"b", b"c"]
        assert read["messages"][0]["headers"] == {"h": b64(b"v")}
        assert read["messages"][2]["subject"] == "web.in"
        assert (read["next_offset"], read["high_watermark"]) == (3, 3)
        ndjson = await http.get("/streams/web/partitions/0/messages",
                                params={"offset": 1, "format": "ndjson"})
        lines = [json.loads(line) for line in ndjson.text.splitlines()]
        assert [line["offset"] for line in lines] == [1, 2]
        assert ndjson.headers["Jetstream-Next-Offset"] == "3"

        assert (await http.get("/health")).json()["status"] == "ok"
        metrics = (await http.get("/metrics")).text
        labels = '{stream="web",partition="0"}'
        assert f"jetstream_partition_appended_records_total{labels} 3" in metrics
        assert f"jetstream_partition_acked_total{labels} 1" in metrics
        docs = await http.get("/docs")
        assert docs.status_code == 200 and "swagger" in docs.text.lower()
        assert "/streams" in (await http.get("/openapi.json")).json()["paths"]

        assert (await http.delete("/streams/web")).status_code == 204
        missing = await http.get("/streams/web")
        assert (missing.status_code, missing.json()["error"]["code"]) == (404,
                                                                          "UNKNOWN_STREAM")
    with pytest.raises(UnknownStream):
        await js.stream_info("web")



def _scheduler_counters(metrics: str) -> dict[str, int]:
    """The scheduler's counters in /metrics text: wakeups, executor_calls, runs by kind."""
    counters: dict[str, int] = {}
    for line in metrics.splitlines():
        match = re.match(r'^jetstream_scheduler_(\w+)_total(?:\{work="(\w+)"\})? (\d+)$', line)
        if match is not None:
            name, work, value = match.groups()
            counters[f"{name}:{work}" if work else name] = int(value)
    assert {"wakeups", "executor_calls", "runs:checkpoint"} <= counters.keys(), metrics
    return counters


async def test_idle_partitions_cost_the_scheduler_nothing(tmp_path: Path, nats_url: str) -> None:
    """200 partitions, one of them written to: over the checkpoint interval that follows, the
    broker's scheduler does that partition's checkpoint and nothing for the idle others."""
    broker = BrokerProcess(tmp_path / "idle", nats_url,
                           extra_args=("--checkpoint-interval-ms", "1000")).start()
    try:
        async with jetstream.connect(broker.address) as js, \
                httpx.AsyncClient(base_url=broker.http_url, timeout=DEADLINE_S) as http:
            await js.create_stream("idle", "idle", partitions=200)
            before = _scheduler_counters((await http.get("/metrics")).text)
            await js.publish("idle", b"x", partition=7, timeout=DEADLINE_S)
            after = before
            async with asyncio.timeout(DEADLINE_S):
                while after["runs:checkpoint"] == before["runs:checkpoint"]:
                    await asyncio.sleep(0.05)
                    after = _scheduler_counters((await http.get("/metrics")).text)
    finally:
        broker.stop()
    assert {key: after[key] - before[key] for key in after if key.startswith("runs:")} == {
        "runs:isr_tick": 0, "runs:fsync": 0, "runs:checkpoint": 1, "runs:retention": 0,
        "runs:offload": 0}
    assert after["executor_calls"] - before["executor_calls"] == 1
    # Woken when the checkpoint was scheduled, when it was due, and when its batch ended.
    assert after["wakeups"] - before["wakeups"] <= 3
