"""The compiled load generator (bench/loadgen) against a real nats-server: requests answered
by its no-op responder, by nobody, and by a real broker; paced requests whose payload carries
their send time on the clock Python reads; a list of messages, each sent once with its own
subject, headers and payload; requests over TLS with a client certificate, and the
handshakes it refuses; socket-API frames to its frames responder and to a broker, whose
error frames it counts; and its histogram buckets against histogram.py's."""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import time
from pathlib import Path

import nats
import pytest

from bench.loadgen import (
    Load,
    LoadgenFailed,
    LoadTls,
    ensure_built,
    frames_responder,
    request_frames,
    responder,
    run_load,
    write_messages,
)
from bench.loadgen.histogram import bucket_of
from jetstream.client import Client, PublishMessage
from jetstream.natsd import NatsServer, ServerTls
from jetstream.protocol.codec import encode_request
from jetstream.protocol.frames import Kind, Op, encode_frame, hello_request
from jetstream.protocol.kv import GetRequest
from jetstream.server.process import BrokerProcess
from tests.pki import Pki


async def test_requests_to_the_no_op_responder_are_all_answered_and_timed(
        nats_url: str) -> None:
    with responder(nats_url, "lg.noop", conns=2):
        result = await run_load(nats_url, Load("lg.noop", size=128, inflight=8, conns=2,
                                               processes=2, count=2000))
    assert result.messages == result.acked == result.sent == 2000
    assert result.errors == result.no_responders == 0 and not result.timed_out
    assert result.histogram.total == 2000
    assert 0 < result.histogram.value_at(50) <= result.histogram.value_at(99) < 5 * 10**9
    assert result.msgs_per_s > 0 and result.mb_per_s == pytest.approx(
        result.msgs_per_s * 128 / 1e6)


async def test_requests_nobody_answers_come_back_as_no_responders(nats_url: str) -> None:
    result = await run_load(nats_url, Load("lg.nobody", inflight=4, count=40))
    assert result.acked == result.no_responders == 40
    assert result.errors == 0


async def test_a_broker_acks_every_request_of_a_fixed_duration(
        broker: BrokerProcess, js: Client) -> None:
    await js.create_stream("lg", "lg.stream", ack_policy="leader")
    result = await run_load(broker.nats_url, Load("lg.stream", size=256, inflight=16,
                                                  duration_s=0.5, warmup_s=0.2))
    assert result.messages > 0 and result.acked == result.sent
    assert result.errors == result.no_responders == 0 and not result.timed_out
    info = await js.stream_info("lg")
    assert info.partitions[0].high_watermark == result.acked


async def test_paced_requests_carry_their_send_time(nats_url: str) -> None:
    nc = await nats.connect(nats_url)
    stamps: list[tuple[int, int]] = []

    async def on_message(msg: nats.aio.msg.Msg) -> None:
        stamps.append((int(msg.data[:20]), time.monotonic_ns()))
        await msg.respond(b"+OK")

    await nc.subscribe("lg.paced", cb=on_message)
    await nc.flush()
    try:
        result = await run_load(nats_url, Load("lg.paced", size=64, inflight=10, rate=200.0,
                                               duration_s=0.5, stamp=True))
    finally:
        await nc.close()
    assert 80 <= result.messages <= 120  # 200/s for 0.5 s
    assert len(stamps) == result.sent
    assert all(0 < received - sent < 2 * 10**9 for sent, received in stamps)
    sent_times = [sent for sent, _ in stamps]
    assert sent_times == sorted(sent_times)
    gaps = [b - a for a, b in itertools.pairwise(sent_times)]
    assert sorted(gaps)[len(gaps) // 2] == pytest.approx(5_000_000, rel=0.2)  # 1/200 s


async def test_listed_messages_are_each_sent_once_as_written(nats_url: str,
                                                            tmp_path: Path) -> None:
    listed = [(f"lg.list.{i % 3}", b"payload-%d" % i,
               {"Kind": "odd", "N": str(i)} if i % 2 else None) for i in range(60)]
    path = tmp_path / "messages"
    assert write_messages(path, listed) == 60
    nc = await nats.connect(nats_url)
    seen: list[tuple[str, bytes, dict[str, str] | None]] = []

    async def on_message(msg: nats.aio.msg.Msg) -> None:
        seen.append((msg.subject, msg.data, msg.headers))
        await msg.respond(b"+OK")

    await nc.subscribe("lg.list.*", cb=on_message)
    await nc.flush()
    try:
        result = await run_load(nats_url, Load("unused", inflight=4, conns=2, processes=2,
                                               count=60, messages=path))
    finally:
        await nc.close()
    assert result.acked == result.sent == 60 and result.errors == 0
    assert sorted(seen, key=lambda m: m[1]) == sorted(listed, key=lambda m: m[1])


HELLO = encode_frame(0, Kind.REQUEST, Op.HELLO, hello_request("loadgen-test"))


async def test_frames_to_the_frames_responder_are_all_answered(tmp_path: Path) -> None:
    requests = [encode_request(0, GetRequest("s", 0, b"k%d" % i)) for i in range(500)]
    with frames_responder() as address:
        result = await request_frames(address, HELLO, requests, 32, tmp_path)
    assert result.messages == result.acked == result.sent == 500
    assert result.errors == 0 and result.histogram.total == 500


async def test_gets_to_a_broker_are_answered_and_its_refusals_counted(
        broker: BrokerProcess, js: Client, tmp_path: Path) -> None:
    await js.create_stream("lgkv", "lgkv.in", cleanup_policy="compact")
    acks = await js.publish_batch([PublishMessage("lgkv.in", b"v", key=b"k%d" % i)
                                   for i in range(20)])
    await js.get("lgkv", b"k0", min_offset=max(a.offset for a in acks), wait_ms=10_000)
    gets = [encode_request(0, GetRequest("lgkv", 0, b"k%d" % (i % 40))) for i in range(400)]
    refused = [encode_request(0, GetRequest("no-such-stream", 0, b"k"))] * 100
    result = await request_frames(broker.address, HELLO, gets + refused, 16, tmp_path)
    assert result.acked == 500 and result.errors == 100  # UNKNOWN_STREAM error frames


def test_the_generator_buckets_values_as_histogram_py_does() -> None:
    binary = ensure_built()
    for value in (0, 1, 127, 128, 129, 255, 256, 1000, 999_999, 10**9, 2**40 + 12345):
        out = subprocess.run([str(binary), "--bucket-of", str(value)], capture_output=True,
                             text=True, check=True).stdout
        assert int(out) == bucket_of(value), value


async def test_a_bad_url_fails_with_the_generators_message() -> None:
    with pytest.raises(LoadgenFailed, match="cannot connect"):
        await asyncio.wait_for(run_load("127.0.0.1:1", Load("x", count=1)), 30)


def loadgen_speaks_tls() -> bool:
    built = subprocess.run([str(ensure_built()), "--url", "127.0.0.1:1", "--subject", "x",
                            "--count", "1", "--tls-ca", "/nonexistent"],
                           capture_output=True, text=True, check=False)
    return "built without TLS" not in built.stderr


@pytest.mark.skipif(not loadgen_speaks_tls(), reason="loadgen built without OpenSSL")
async def test_requests_over_tls_with_a_client_certificate(tmp_path: Path, pki: Pki) -> None:
    leaf, client = pki.leaf("nats"), pki.leaf("loadgen-client")
    tls = LoadTls(pki.ca, client.cert, client.key)
    with NatsServer(tmp_path / "nats-tls", tls=ServerTls(leaf.cert, leaf.key, pki.ca,
                                                         verify=True)) as server:
        assert server.url.startswith("tls://")
        with responder(server.url, "lg.tls", conns=2, tls=tls):
            result = await run_load(server.url, Load("lg.tls", size=300, inflight=8, conns=2,
                                                     count=1000, tls=tls))
        assert result.messages == result.acked == result.sent == 1000
        assert result.errors == result.no_responders == 0 and not result.timed_out
        other = Pki(tmp_path / "other-pki")
        with pytest.raises(LoadgenFailed, match="TLS handshake failed"):
            await run_load(server.url, Load("lg.tls", count=1, timeout_s=5,
                                            tls=LoadTls(other.ca, client.cert, client.key)))
        with pytest.raises(LoadgenFailed, match="closed"):  # no client certificate
            await run_load(server.url, Load("lg.tls", count=1, timeout_s=5,
                                            tls=LoadTls(pki.ca)))
