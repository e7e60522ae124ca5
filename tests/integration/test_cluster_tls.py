"""A 3-broker cluster with every link secured: mutual TLS on the socket and HTTP APIs (so
replication between brokers is TLS with each broker's own certificate) and an encrypted,
authenticated metadata Raft group. Replication works; a broker whose certificate is not of
the cluster's CA cannot replicate and leaves the ISR, while the others go on committing."""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest

import jetstream
from jetstream.client import Client
from jetstream.server.process import BrokerProcess
from tests.integration.test_cluster import TUNING, eventually, running_cluster
from tests.pki import Leaf, Pki, broker_tls_args


def secured_cluster(tmp_path: Path, nats_url: str, pki: Pki, leaves: list[Leaf]
                    ) -> AbstractContextManager[list[BrokerProcess]]:
    """test_cluster's 3 brokers, each with mutual TLS and its own certificate."""
    return running_cluster(tmp_path, nats_url, (*TUNING, "--raft-password", "cluster-secret"),
                           tuple(broker_tls_args(pki, leaf) for leaf in leaves))


def connect(broker: BrokerProcess, pki: Pki, client: Leaf) -> Client:
    return jetstream.connect(f"jetstreams://{broker.address}", tls_ca=pki.ca,
                             tls_cert=client.cert, tls_key=client.key)


async def isr_of(js: Client, stream: str) -> list[int]:
    await js.refresh_metadata()
    return sorted((await js.stream_info(stream)).partitions[0].isr)


async def test_replication_over_mutual_tls(tmp_path: Path, nats_url: str, pki: Pki) -> None:
    client = pki.leaf("client")
    leaves = [pki.leaf(f"broker{i}") for i in range(3)]
    with secured_cluster(tmp_path, nats_url, pki, leaves) as brokers:
        async with connect(brokers[0], pki, client) as js:
            await js.create_stream("sec", "sec.in", replication_factor=3, min_isr=3)
            acks = []
            for i in range(30):
                async def once(i: int = i) -> Any:
                    return await js.publish("sec.in", f"v{i}".encode(), ack_policy="all",
                                            timeout=2.0)
                acks.append(await eventually(once, f"ack of v{i}"))
            assert [a.offset for a in acks] == list(range(30))
            assert await isr_of(js, "sec") == [0, 1, 2]
        # Every replica holds the records: read each through its own broker as an ISR read.
        for broker in brokers:
            async with connect(broker, pki, client) as js:
                got = await js.fetch("sec", 0, 0, max_wait_ms=1000, read_isr_replica=True)
                assert [m.value for m in got.messages][:1] == [b"v0"]


async def test_a_broker_with_a_certificate_of_another_ca_cannot_replicate(
        tmp_path: Path, nats_url: str, pki: Pki) -> None:
    client = pki.leaf("client")
    stranger = Pki(tmp_path / "stranger-ca").leaf("broker2")
    leaves = [pki.leaf("broker0"), pki.leaf("broker1"), stranger]
    with secured_cluster(tmp_path, nats_url, pki, leaves) as brokers:
        async with connect(brokers[0], pki, client) as js:
            await js.create_stream("sec", "sec.in", replication_factor=3, min_isr=2)

            async def out_of_isr() -> bool | None:
                return True if 2 not in await isr_of(js, "sec") else None
            await eventually(out_of_isr, "broker 2 out of the ISR")

            async def acked() -> Any:
                return await js.publish("sec.in", b"still committing", ack_policy="all",
                                        timeout=2.0)
            ack = await eventually(acked, "an ack from brokers 0 and 1")
            assert ack.offset >= 0
        assert brokers[2].running  # refused links, not a crash
        # The refused links are reported: a follower's failed fetch session, or a TLS
        # verification failure of broker 2's certificate where it leads.
        logs = "".join(b.log_path.read_text() for b in brokers)
        assert "may not trust this side's certificate" in logs \
            or "CERTIFICATE_VERIFY_FAILED" in logs


pytestmark = pytest.mark.timeout(180)
