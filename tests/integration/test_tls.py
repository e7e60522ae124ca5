"""TLS on a real broker (trustme certificates): the socket API and the HTTP API refuse plain
text, certificates of another CA, expired ones and ones for another host; mutual TLS admits
only clients with a certificate of the cluster's CA; certificates reload on SIGHUP; stalled
frames and handshakes are closed; the connection limit answers TOO_MANY_CONNECTIONS; a broker
bound off loopback without protection refuses to start."""

from __future__ import annotations

import asyncio
import datetime
import os
import shutil
import signal
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from cryptography import x509

import jetstream
from jetstream.client.connection import BrokerConnection
from jetstream.errors import BrokerUnavailable, TooManyConnections
from jetstream.protocol import frames
from jetstream.protocol import messages as m
from jetstream.security.tls import client_context
from jetstream.server.process import BrokerProcess, BrokerStartFailed
from tests.pki import Leaf, Pki, broker_tls_args

DEADLINE_S = 20.0


@pytest.fixture
def leaf(pki: Pki) -> Leaf:
    return pki.leaf("broker")


@pytest.fixture
def tls_broker(tmp_path: Path, nats_url: str, pki: Pki, leaf: Leaf
               ) -> Iterator[BrokerProcess]:
    """A broker whose socket and HTTP APIs speak mutual TLS only."""
    process = BrokerProcess(tmp_path / "broker", nats_url,
                            extra_args=broker_tls_args(pki, leaf))
    try:
        yield process.start()
    finally:
        process.stop()


async def open_with(broker: BrokerProcess, tls: ssl.SSLContext | None) -> BrokerConnection:
    conn = BrokerConnection(broker.address, client_id="test", tls=tls, connect_timeout_s=5)
    await conn.open()
    return conn


async def test_mutual_tls_serves_clients_of_the_ca_and_refuses_the_rest(
        tls_broker: BrokerProcess, pki: Pki, tmp_path: Path) -> None:
    client = pki.leaf("client")
    async with jetstream.connect(tls_broker.address, tls_ca=pki.ca, tls_cert=client.cert,
                                 tls_key=client.key) as js:
        await js.create_stream("secure", "secure.in")
        ack = await js.publish("secure.in", b"over tls", ack_policy="leader")
        assert ack is not None and ack.offset == 0
        fetched = await js.fetch("secure", 0, 0, max_wait_ms=1000)
        assert [m.value for m in fetched.messages] == [b"over tls"]
    with pytest.raises(BrokerUnavailable):  # plain text on a TLS port
        await open_with(tls_broker, None)
    with pytest.raises(BrokerUnavailable):  # no client certificate (the alert may come late)
        conn = await open_with(tls_broker, client_context(pki.ca))
        await conn.request(m.MetadataRequest([]))
    stranger = Pki(tmp_path / "other-ca")
    foreign = stranger.leaf("foreign")
    with pytest.raises(BrokerUnavailable, match="CERTIFICATE_VERIFY_FAILED"):  # broker's CA
        await open_with(tls_broker, client_context(stranger.ca, foreign.cert, foreign.key))
    with pytest.raises(BrokerUnavailable):  # a client certificate of another CA
        conn = await open_with(tls_broker, client_context(pki.ca, foreign.cert, foreign.key))
        await conn.request(m.MetadataRequest([]))


async def test_certificates_for_another_host_and_expired_ones_are_refused(
        tmp_path: Path, nats_url: str, pki: Pki) -> None:
    elsewhere = pki.leaf("elsewhere", "broker.example.net")
    process = BrokerProcess(tmp_path / "b1", nats_url,
                            extra_args=broker_tls_args(pki, elsewhere, verify_client=False))
    try:
        process.start()
        with pytest.raises(BrokerUnavailable, match="CERTIFICATE_VERIFY_FAILED"):
            await open_with(process, client_context(pki.ca))  # 127.0.0.1 is not its name
    finally:
        process.stop()
    now = datetime.datetime.now(datetime.UTC)
    expired = pki.leaf("expired", not_before=now - datetime.timedelta(days=3),
                       not_after=now - datetime.timedelta(days=1))
    dead = BrokerProcess(tmp_path / "b2", nats_url,
                         extra_args=broker_tls_args(pki, expired, verify_client=False))
    with pytest.raises(BrokerStartFailed) as caught:
        dead.start()
    tail = caught.value.fields["log_tail"]
    assert "TLS_CERT_EXPIRED" in tail and "tls_cert" in tail


async def test_http_api_speaks_tls_and_verifies_clients(tls_broker: BrokerProcess,
                                                        pki: Pki) -> None:
    client = pki.leaf("client")
    url = tls_broker.http_url
    assert url.startswith("https://")
    async with httpx.AsyncClient(verify=client_context(pki.ca, client.cert, client.key)) as http:
        health = (await http.get(f"{url}/health")).json()
    assert health["tls"] == {"socket": True, "http": True, "nats": False}
    assert "insecure" not in health
    plain_url = url.replace("https://", "http://")
    async with httpx.AsyncClient() as http:
        with pytest.raises(httpx.HTTPError):
            await http.get(f"{plain_url}/health")
    async with httpx.AsyncClient(verify=client_context(pki.ca)) as http:
        with pytest.raises(httpx.HTTPError):  # no client certificate
            await http.get(f"{url}/health")


def peer_serial(address: str, ca: str, leaf: Leaf) -> int:
    """The serial number of the certificate the broker presents to a new connection."""
    host, port = address.rsplit(":", 1)
    context = client_context(ca, leaf.cert, leaf.key)
    with socket.create_connection((host, int(port)), timeout=5) as raw, \
            context.wrap_socket(raw, server_hostname=host) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


async def test_sighup_reloads_certificates_for_new_connections(
        tmp_path: Path, nats_url: str, pki: Pki) -> None:
    first, second, client = pki.leaf("first"), pki.leaf("second"), pki.leaf("client")
    live = Leaf(str(tmp_path / "live.pem"), str(tmp_path / "live.key"))
    shutil.copy(first.cert, live.cert)
    shutil.copy(first.key, live.key)
    process = BrokerProcess(tmp_path / "broker", nats_url,
                            extra_args=broker_tls_args(pki, live))
    try:
        process.start()
        before = peer_serial(process.address, pki.ca, client)
        open_conn = await open_with(process, client_context(pki.ca, client.cert, client.key))
        shutil.copy(second.cert, live.cert)
        shutil.copy(second.key, live.key)
        os.kill(process.pid, signal.SIGHUP)
        deadline = time.monotonic() + DEADLINE_S
        while peer_serial(process.address, pki.ca, client) == before:
            assert time.monotonic() < deadline, "the new certificate was not served"
            await asyncio.sleep(0.05)
        # The connection opened before the reload carries on.
        answer = await open_conn.request(m.MetadataRequest([]))
        assert isinstance(answer, m.MetadataResponse)
        await open_conn.close()
        assert process.running
    finally:
        process.stop()


async def test_stalled_frames_and_handshakes_are_closed(tmp_path: Path, nats_url: str,
                                                        pki: Pki, leaf: Leaf) -> None:
    plain = BrokerProcess(tmp_path / "plain", nats_url,
                          extra_args=("--request-timeout-ms", "500"))
    secure = BrokerProcess(tmp_path / "secure", nats_url, extra_args=(
        *broker_tls_args(pki, leaf, verify_client=False), "--tls-handshake-timeout-ms", "500"))
    try:
        plain.start()
        secure.start()
        loop = asyncio.get_running_loop()
        hello = frames.encode_frame(0, frames.Kind.REQUEST, frames.Op.HELLO,
                                    frames.hello_request("slow"))
        started = time.monotonic()
        # A HELLO, then the first bytes of a frame, then nothing.
        closed = await loop.run_in_executor(None, _held_open_s, plain.address, hello + b"\0\0")
        assert 0.4 < closed < 5.0, closed
        # A TCP connection to a TLS port that never starts its handshake.
        closed = await loop.run_in_executor(None, _held_open_s, secure.address, b"")
        assert 0.4 < closed < 5.0, closed
        assert time.monotonic() - started < 15
    finally:
        plain.stop()
        secure.stop()


async def test_http_requests_whose_headers_stall_are_closed(tmp_path: Path,
                                                            nats_url: str) -> None:
    """The HTTP API closes a connection whose request headers are not all in within
    `request_timeout_ms` (a slowloris client), one that sends nothing at all, and one whose
    request body stops short; a client that sends its headers or its body in pieces inside
    the time, or keeps its connection for a second request, is served."""
    process = BrokerProcess(tmp_path / "broker", nats_url,
                            extra_args=("--request-timeout-ms", "500"))
    try:
        process.start()
        http = f"127.0.0.1:{process.http_port}"
        loop = asyncio.get_running_loop()
        partial = b"GET /health HTTP/1.1\r\nHost: x\r\n"  # no blank line: never complete
        closed = await loop.run_in_executor(None, _held_open_s, http, partial)
        assert 0.4 < closed < 5.0, closed
        closed = await loop.run_in_executor(None, _held_open_s, http, b"")
        assert 0.4 < closed < 5.0, closed
        body = b'{"name": "pieces", "subject": "pieces"}'
        short = (b"POST /streams HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(body)) + body[:10]
        closed = await loop.run_in_executor(None, _held_open_s, http, short)
        assert 0.4 < closed < 5.0, closed
        served = await loop.run_in_executor(None, _two_requests_in_pieces, http)
        assert served == [200, 200]
        status = await loop.run_in_executor(None, _post_in_pieces, http, "/streams", body)
        assert status == 201, status
        async with httpx.AsyncClient() as client:
            metrics = (await client.get(f"http://{http}/metrics")).text
        assert "jetstream_broker_stalled_requests_total 3" in metrics
    finally:
        process.stop()


def _two_requests_in_pieces(address: str) -> list[int]:
    """Two requests on one connection, the first one's headers in two writes 0.3 s apart
    (inside the 0.5 s), the second in two writes too, sent 0.4 s after the first answer
    (its time starts at its first byte): the status of each."""
    host, port = address.rsplit(":", 1)
    statuses = []
    with socket.create_connection((host, int(port)), timeout=DEADLINE_S) as sock:
        reader = sock.makefile("rb")
        for pause_s in (0.0, 0.4):
            time.sleep(pause_s)
            sock.sendall(b"GET /health HTTP/1.1\r\n")
            time.sleep(0.3)
            sock.sendall(b"Host: x\r\n\r\n")
            status = reader.readline()
            statuses.append(int(status.split()[1]))
            length = 0
            while (line := reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode().partition(":")
                if name.lower() == "content-length":
                    length = int(value)
            reader.read(length)
    return statuses


def _post_in_pieces(address: str, path: str, body: bytes) -> int:
    """A POST whose body comes in two writes 0.3 s apart (inside the 0.5 s): its status."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=DEADLINE_S) as sock:
        sock.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % (path.encode(), len(body)) + body[:10])
        time.sleep(0.3)
        sock.sendall(body[10:])
        return int(sock.makefile("rb").readline().split()[1])


def _held_open_s(address: str, send: bytes) -> float:
    """Send `send` and read until the broker closes the connection: how long that took."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=DEADLINE_S) as sock:
        started = time.monotonic()
        sock.sendall(send)
        while sock.recv(65536):
            pass
        return time.monotonic() - started


async def test_connections_past_the_limit_answer_too_many_connections(
        tmp_path: Path, nats_url: str) -> None:
    process = BrokerProcess(tmp_path / "broker", nats_url,
                            extra_args=("--connections-max", "1"))
    try:
        process.start()
        first = await open_with(process, None)
        with pytest.raises(TooManyConnections) as caught:
            await open_with(process, None)
        assert caught.value.code == "TOO_MANY_CONNECTIONS" and caught.value.retriable
        await first.close()
    finally:
        process.stop()


async def test_a_broker_bound_off_loopback_without_protection_refuses_to_start(
        tmp_path: Path, nats_url: str) -> None:
    # Refused before anything binds: nothing listens on 0.0.0.0 during this test.
    process = BrokerProcess(tmp_path / "broker", nats_url, extra_args=("--host", "0.0.0.0"))
    with pytest.raises(BrokerStartFailed) as caught:
        process.start()
    tail = caught.value.fields["log_tail"]
    assert "INSECURE_LISTENER" in tail and "tls_verify_client" in tail and "--insecure" in tail
