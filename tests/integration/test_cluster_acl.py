"""ACLs in a 3-broker cluster with authentication and authorization on: brokers replicate
to each other as the broker principal; an ACL change is enforced by every broker within a
second, and survives the metadata leader's failover and a restart of the whole cluster."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx

import jetstream
from jetstream.client.connection import BrokerConnection
from jetstream.errors import NotAuthorized
from jetstream.protocol import messages as m
from jetstream.server.process import BrokerProcess
from tests.integration.test_auth import PASSWORDS, basic, secured_args
from tests.integration.test_cluster import DEADLINE_S, TUNING, eventually, running_cluster

STREAM = "ledger"
ENTRY = {"principal": "alice", "permission": "allow", "operation": "read",
         "resource_type": "stream", "pattern": "ledger*"}
ENFORCED_WITHIN_S = 1.0


async def may_describe(broker: BrokerProcess) -> bool:
    """Whether `broker` lets alice describe the stream (each broker decides from its own
    copy of the metadata)."""
    conn = BrokerConnection(broker.address, client_id="probe",
                            credentials=m.Credentials("alice", PASSWORDS["alice"]))
    await conn.open()
    try:
        await conn.request(m.MetadataRequest([STREAM]))
        return True
    except NotAuthorized:
        return False
    finally:
        await conn.close()


async def all_brokers(brokers: list[BrokerProcess], allowed: bool, within_s: float) -> float:
    """Seconds until every broker answers `allowed`; fails past `within_s`."""
    start = time.monotonic()
    while True:
        answers = await asyncio.gather(*(may_describe(b) for b in brokers))
        if all(a is allowed for a in answers):
            return time.monotonic() - start
        assert time.monotonic() - start < within_s, (answers, allowed)
        await asyncio.sleep(0.02)


async def metadata_leader(brokers: list[BrokerProcess]) -> int:
    async def probe() -> int | None:
        async with httpx.AsyncClient(timeout=5) as http:
            view = (await http.get(f"{brokers[0].http_url}/cluster",
                                   headers=basic("admin"))).json()
        leader = view.get("metadata_leader")
        return leader if isinstance(leader, int) and leader >= 0 else None

    return await eventually(probe, "a metadata leader")


async def test_acl_changes_reach_every_broker_and_survive_failover_and_restart(
        tmp_path: Path, nats_url: str) -> None:
    tuning = (*TUNING, "--raft-password", "cluster-secret", *secured_args())
    with running_cluster(tmp_path, nats_url, tuning) as brokers:
        addresses = ",".join(b.address for b in brokers)
        async with jetstream.connect(addresses, user="admin",
                                     password=PASSWORDS["admin"]) as admin:
            await admin.create_stream(STREAM, "ledger.in", replication_factor=3)
            ack = await admin.publish("ledger.in", b"entry", ack_policy="all")
            assert ack is not None and ack.offset == 0  # followers fetched as brokers

            assert await all_brokers(brokers, False, 0.1) >= 0
            await admin.acl_add([ENTRY])
            assert await all_brokers(brokers, True, ENFORCED_WITHIN_S) < ENFORCED_WITHIN_S

            leader = await metadata_leader(brokers)
            brokers[leader].kill()
            alive = [b for i, b in enumerate(brokers) if i != leader]

            async def removed() -> bool | None:
                async with jetstream.connect(",".join(b.address for b in alive), user="admin",
                                             password=PASSWORDS["admin"]) as js:
                    return await js.acl_remove([ENTRY]) == 1 or None

            await eventually(removed, "the entry removed after the metadata leader died")
            assert await all_brokers(alive, False, ENFORCED_WITHIN_S) < ENFORCED_WITHIN_S
            brokers[leader].start(wait=False)
            brokers[leader].wait_ready(DEADLINE_S)
            await all_brokers(brokers, False, DEADLINE_S)  # the returning one caught up

        async with jetstream.connect(addresses, user="admin",
                                     password=PASSWORDS["admin"]) as admin:
            await admin.acl_add([ENTRY])
        for broker in brokers:
            broker.kill()
        for broker in brokers:
            broker.start(wait=False)
        for broker in brokers:
            broker.wait_ready(DEADLINE_S)
        await all_brokers(brokers, True, DEADLINE_S)
        async with jetstream.connect(addresses, user="alice",
                                     password=PASSWORDS["alice"]) as alice:
            # Readable once the restarted leader knows its HW again (its followers fetched).
            async def entry() -> list[bytes] | None:
                fetched = await alice.fetch(STREAM, 0, 0, max_wait_ms=1000)
                return [x.value for x in fetched.messages] or None
            assert await eventually(entry, "the entry readable after the restart") == [
                b"entry"]
        async with jetstream.connect(addresses, user="admin",
                                     password=PASSWORDS["admin"]) as admin:
            assert [e.to_dict() for e in await admin.acl_list()] == [ENTRY]
