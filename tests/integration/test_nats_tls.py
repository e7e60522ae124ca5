"""NATS over TLS with credentials: the embedded nats-server started with TLS (client
certificates required) and a user and password; the broker's fast ingest connection upgrades
to TLS after INFO and authenticates; a broker ingests and acks through it; a connection
without a context, or with the wrong password, is refused."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import nats
import pytest

import jetstream
from jetstream.natsd import NatsServer, ServerTls
from jetstream.security.tls import client_context
from jetstream.server.nats_dial import NatsAuth
from jetstream.server.nats_errors import NatsConnectFailed, NatsUnsupported
from jetstream.server.nats_ingest import connect
from jetstream.server.nats_port import FastNats, connect_nats
from jetstream.server.process import BrokerProcess
from tests.pki import Pki

USER, PASSWORD = "broker", "s3cret-pass"


@pytest.fixture
def tls_nats(tmp_path: Path, pki: Pki) -> Iterator[NatsServer]:
    leaf = pki.leaf("nats")
    server = NatsServer(tmp_path / "nats-tls", name="nats-tls",
                        tls=ServerTls(leaf.cert, leaf.key, pki.ca, verify=True),
                        config={"authorization": {"user": USER, "password": PASSWORD}})
    with server:
        yield server


async def test_fast_ingest_upgrades_to_tls_and_authenticates(tls_nats: NatsServer,
                                                             pki: Pki) -> None:
    assert tls_nats.url.startswith("tls://")
    client = pki.leaf("ingest-client")
    tls = client_context(pki.ca, client.cert, client.key)
    conn = await connect(tls_nats.url, name="tls-ingest", tls=tls,
                         auth=NatsAuth(USER, PASSWORD))
    publisher = await nats.connect(tls_nats.url, tls=tls, user=USER, password=PASSWORD)
    try:
        sub = conn.subscribe("secure.>")
        await conn.flush()
        for i in range(100):
            await publisher.publish(f"secure.{i}", b"x" * i)
        await publisher.flush()
        got: list[bytes] = []
        deadline = time.monotonic() + 10
        while len(got) < 100:
            assert time.monotonic() < deadline, f"received {len(got)} of 100"
            got += [msg[3] for msg in await sub.next_batch(timeout_s=1.0)]
        assert got == [b"x" * i for i in range(100)]
    finally:
        await publisher.close()
        await conn.close()
    with pytest.raises(NatsUnsupported):  # TLS required and no context given
        await connect(tls_nats.url.replace("tls://", "nats://"), name="plain")
    with pytest.raises(NatsConnectFailed, match=r"[Aa]uthorization"):
        await connect(tls_nats.url, name="bad", tls=tls, auth=NatsAuth(USER, "wrong"))
    port = await connect_nats([tls_nats.url], "port", tls=tls, auth=NatsAuth(USER, PASSWORD))
    try:
        assert isinstance(port, FastNats) and port.state == "connected"
    finally:
        await port.close()


async def test_a_broker_ingests_and_acks_through_nats_with_tls(
        tmp_path: Path, tls_nats: NatsServer, pki: Pki) -> None:
    client = pki.leaf("client")
    process = BrokerProcess(tmp_path / "broker", tls_nats.url, extra_args=(
        "--nats-tls-ca", pki.ca, "--nats-tls-cert", client.cert, "--nats-tls-key", client.key,
        "--nats-user", USER, "--nats-password", PASSWORD))
    try:
        process.start()
        tls = client_context(pki.ca, client.cert, client.key)
        async with jetstream.connect(process.address, nats_options={
                "tls": tls, "user": USER, "password": PASSWORD}) as js:
            await js.create_stream("nt", "nt.in")
            acks = [await js.publish("nt.in", f"m{i}".encode(), ack_policy="all")
                    for i in range(20)]
            assert [a.offset for a in acks if a is not None] == list(range(20))
        async with httpx.AsyncClient() as http:
            health = (await http.get(f"{process.http_url}/health")).json()
        assert health["tls"]["nats"] is True
    finally:
        process.stop()
    # The broker never prints the password (the harness's own "--- start" line has argv).
    output = [line for line in process.log_tail().splitlines() if not line.startswith("---")]
    assert output and not any(PASSWORD in line for line in output)
