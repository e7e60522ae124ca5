"""A datastream into a cluster with mutual TLS, authentication and ACLs on (and a NATS that
wants a password): with a wrong
password its task is faulty with a clear error (and no secret shows in the API, diagnostics,
/health or the log); recreated with the right one, the destination equals the source. A
NATS JetStream source that requires TLS client certificates and a password."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

import jetstream
from jetstream.client import Client
from jetstream.natsd import NatsServer, ServerTls
from jetstream.security.tls import client_context
from jetstream.server.process import BrokerProcess
from tests.integration.test_auth import PASSWORDS, secured_args
from tests.integration.test_datastreams import assert_mirrored, eventually, publish, read_all
from tests.pki import Leaf, Pki, broker_tls_args

WRONG = "Wr0ng-pa55word"
MIRROR_USER = "alice"
#: The second cluster's nats-server wants a user too: its broker's, and the mirror's.
NATS_USERS = {"broker": "nats-broker-s3cret", "mirror": "nats-mirror-s3cret"}


@dataclass(frozen=True)
class Secured:
    broker: BrokerProcess
    pki: Pki
    client: Leaf

    def admin(self) -> Client:
        return jetstream.connect(f"jetstreams://{self.broker.address}", tls_ca=self.pki.ca,
                                 tls_cert=self.client.cert, tls_key=self.client.key,
                                 user="admin", password=PASSWORDS["admin"])

    def destination(self, password: str) -> dict[str, Any]:
        return {"type": "jetstream", "settings": {
            "brokers": f"jetstreams://{self.broker.address}", "stream": "orders",
            "tls_ca": self.pki.ca, "tls_cert": self.client.cert, "tls_key": self.client.key,
            "user": MIRROR_USER, "password": password,
            "nats_user": "mirror", "nats_password": NATS_USERS["mirror"]}}


@pytest.fixture
def secured_remote(tmp_path: Path, pki: Pki) -> Iterator[Secured]:
    """A second cluster with mutual TLS, authentication and ACLs, and its own nats-server
    that wants a user and password."""
    leaf = pki.leaf("broker-b")
    users = [{"user": name, "password": password} for name, password in NATS_USERS.items()]
    with NatsServer(tmp_path / "nats-b", config={"authorization": {"users": users}}) as nats:
        process = BrokerProcess(tmp_path / "broker-b", nats.url, extra_args=(
            *broker_tls_args(pki, leaf), *secured_args(), "--nats-user", "broker",
            "--nats-password", NATS_USERS["broker"]))
        try:
            yield Secured(process.start(), pki, pki.leaf("mirror"))
        finally:
            process.stop()


async def test_mirror_into_a_secured_cluster(broker: BrokerProcess,
                                             secured_remote: Secured) -> None:
    source_spec = {"type": "jetstream", "settings": {"stream": "orders"}}
    async with jetstream.connect(broker.address) as source, secured_remote.admin() as admin:
        await source.create_stream("orders", "orders", partitions=2)
        await admin.create_stream("orders", "orders", partitions=2)
        await admin.acl_add([{"principal": MIRROR_USER, "permission": "allow",
                              "operation": "write", "resource_type": "stream",
                              "pattern": "orders"}])
        await publish(source, 0, 200)

        await source.create_datastream("orders-dr", source_spec,
                                       secured_remote.destination(WRONG), max_tasks=2)

        async def faulty() -> dict[str, Any] | None:
            found = await source.datastream_diagnostics("orders-dr")
            return found if found["tasks"] and all(
                t["status"] == "faulty" for t in found["tasks"]) else None

        diagnostics = await eventually(faulty, "the tasks faulty")
        errors = {t["last_error"] for t in diagnostics["tasks"]}
        assert all("Unauthenticated" in e and "wrong password" in e for e in errors), errors
        async with httpx.AsyncClient(base_url=broker.http_url) as http:
            shown = [(await http.get(path)).text for path in (
                "/datastreams", "/datastreams/orders-dr", "/diagnostics/datastreams/orders-dr",
                "/health", "/metrics")]
        assert all(WRONG not in text and NATS_USERS["mirror"] not in text for text in shown)
        assert '"password":"<redacted>"' in shown[1].replace(" ", "")
        assert 'jetstream_datastream_errors_total{datastream="orders-dr"}' in shown[4]
        assert (await admin.fetch("orders", 0, 0, max_wait_ms=0)).messages == []

        # Fixed by recreating it with the right password: everything arrives once, in order,
        # also what is published meanwhile.
        await source.delete_datastream("orders-dr")
        more = asyncio.create_task(publish(source, 200, 400))
        await source.create_datastream("orders-dr", source_spec,
                                       secured_remote.destination(PASSWORDS[MIRROR_USER]),
                                       max_tasks=2)
        await more
        await assert_mirrored(source, admin, [300, 300])

        async def running() -> dict[str, Any] | None:
            found = await source.datastream_diagnostics("orders-dr")
            return found if found["tasks"] and all(
                t["status"] == "running" for t in found["tasks"]) else None

        assert "last_error" not in str(await eventually(running, "the tasks running"))
    log = broker.log_path.read_text(errors="replace")
    assert "faulty" in log and WRONG not in log and PASSWORDS[MIRROR_USER] not in log
    assert NATS_USERS["mirror"] not in log


async def test_nats_source_with_tls_and_a_password(tmp_path: Path, pki: Pki,
                                                   broker: BrokerProcess) -> None:
    import nats

    leaf, client = pki.leaf("nats"), pki.leaf("nats-client")
    secret = "nats-s3cret"
    server = NatsServer(tmp_path / "nats-tls", jetstream=True,
                        tls=ServerTls(leaf.cert, leaf.key, pki.ca, verify=True),
                        config={"authorization": {"user": "legacy", "password": secret}})
    with server:
        tls = {"tls_ca": pki.ca, "tls_cert": client.cert, "tls_key": client.key}
        nc = await nats.connect(server.url, tls=client_context(pki.ca, client.cert,
                                                               client.key),
                                user="legacy", password=secret)
        try:
            njs = nc.jetstream()
            await njs.add_stream(name="LEGACY", subjects=["legacy.>"])
            for i in range(50):
                await njs.publish(f"legacy.{i % 2}", b"old %d" % i)
        finally:
            await nc.close()
        async with jetstream.connect(broker.address) as js:
            await js.create_stream("migrated", "migrated")
            created = await js.create_datastream(
                "legacy-in", {"type": "nats_jetstream", "settings": {
                    "url": server.url, "stream": "LEGACY", **tls, "user": "legacy",
                    "password": secret}},
                {"type": "jetstream", "settings": {"stream": "migrated"}})
            assert created["source"]["settings"]["password"] == "<redacted>"
            copied = await read_all(js, "migrated", 0, 50)
            assert [m.value for m in copied] == [b"old %d" % i for i in range(50)]
            assert secret not in str(await js.list_datastreams())
