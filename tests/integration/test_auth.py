"""Authentication and ACLs on a real broker: passwords right and wrong, tokens, client
certificates naming the principal, and every operation allowed and refused per ACL through
the socket API (client), the HTTP API and the CLI; per-principal in-flight limits."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from argon2 import PasswordHasher

import jetstream
from jetstream.client.connection import BrokerConnection
from jetstream.errors import BrokerUnavailable, NotAuthorized, TooManyInFlight, Unauthenticated
from jetstream.protocol import messages as m
from jetstream.security.tls import client_context
from jetstream.server.process import BrokerProcess
from tests.pki import Pki, broker_tls_args

#: Cheap argon2id parameters: the broker checks whatever the hash says.
HASHER = PasswordHasher(time_cost=1, memory_cost=1024, parallelism=1)
PASSWORDS = {"admin": "admin-secret", "alice": "alice-secret", "bob": "bob-secret"}
USERS = " ".join(f"{name}:{HASHER.hash(pw)}" for name, pw in PASSWORDS.items())


def secured_args(*, authorization: bool = True) -> tuple[str, ...]:
    args = ("--authentication", "--users", USERS, "--super-users", "admin")
    return (*args, "--authorization") if authorization else args


@pytest.fixture
def secured(tmp_path: Path, nats_url: str) -> Iterator[BrokerProcess]:
    process = BrokerProcess(tmp_path / "broker", nats_url,
                            extra_args=(*secured_args(), "--principal-requests-max", "4"))
    try:
        yield process.start()
    finally:
        process.stop()


def login(broker: BrokerProcess, user: str) -> jetstream.Client:
    return jetstream.connect(broker.address, user=user, password=PASSWORDS[user])


def basic(user: str, password: str | None = None) -> dict[str, str]:
    raw = f"{user}:{password or PASSWORDS[user]}".encode()
    return {"Authorization": "Basic " + base64.b64encode(raw).decode()}


def metric(broker: BrokerProcess, name: str) -> int:
    text = httpx.get(f"{broker.http_url}/metrics", headers=basic("admin")).text
    line = next(ln for ln in text.splitlines() if ln.startswith(f"jetstream_broker_{name} "))
    return int(line.split()[1])


async def test_passwords_right_and_wrong(secured: BrokerProcess) -> None:
    async with login(secured, "admin") as js:
        await js.create_stream("orders", "orders.in")
    with pytest.raises(Unauthenticated):
        await jetstream.connect(secured.address, user="alice", password="Gu3ss-x7").start()
    with pytest.raises(Unauthenticated):
        await jetstream.connect(secured.address, user="nobody", password="x").start()
    conn = BrokerConnection(secured.address, client_id="anonymous")
    await conn.open()
    try:
        with pytest.raises(Unauthenticated):  # only AUTHENTICATE before authenticating
            await conn.request(m.MetadataRequest(None))
        answer = await conn.request(m.AuthenticateRequest("bob", PASSWORDS["bob"]))
        assert answer == m.AuthenticateResponse("bob")
        listed = await conn.request(m.MetadataRequest(None))
        assert isinstance(listed, m.MetadataResponse) and listed.streams == []  # no describe
    finally:
        await conn.close()
    guesser = BrokerConnection(secured.address, client_id="guesser")
    await guesser.open()
    try:
        with pytest.raises(Unauthenticated):
            await guesser.request(m.AuthenticateRequest("bob", "Gu3ss-x7"))
        with pytest.raises(BrokerUnavailable):  # a refusal closes the connection
            await guesser.request(m.AuthenticateRequest("bob", "Gu3ss-x8"))
    finally:
        await guesser.close()
    async with jetstream.connect(secured.address, token=f"alice:{PASSWORDS['alice']}") as js:
        with pytest.raises(NotAuthorized):
            await js.create_stream("alices", "alices.in")
    assert metric(secured, "authentication_failures_total") >= 2
    log = secured.log_tail()
    assert "user 'alice'" in log  # the refusal is logged, its password never
    assert "Gu3ss-x7" not in log and PASSWORDS["alice"] not in log


async def test_every_operation_allowed_and_refused_per_acl(secured: BrokerProcess) -> None:
    async with login(secured, "admin") as admin, login(secured, "alice") as alice:
        await admin.create_stream("orders-eu", "orders.eu", partitions=1)
        await admin.create_stream("payroll", "payroll.in")
        await admin.publish("orders.eu", b"one", ack_policy="leader")
        # Nothing allowed yet: default deny.
        with pytest.raises(NotAuthorized) as refused:
            await alice.fetch("orders-eu", 0, 0)
        # (routing asks for the stream's metadata first: describe is refused)
        assert (refused.value.operation, refused.value.resource) == ("describe", "orders-eu")
        assert [s.name for s in await alice.list_streams()] == []
        entries = [
            {"principal": "alice", "permission": "allow", "operation": op,
             "resource_type": "stream", "pattern": "orders-*"}
            for op in ("read", "create", "alter", "delete")]
        entries.append({"principal": "alice", "permission": "allow", "operation": "group",
                        "resource_type": "group", "pattern": "billing"})
        entries.append({"principal": "alice", "permission": "deny", "operation": "delete",
                        "resource_type": "stream", "pattern": "orders-eu"})
        assert await admin.acl_add(entries) == 6
        assert await admin.acl_add(entries[:1]) == 0  # already there
        # Allowed: read, describe (implied), create, alter, delete (but deny wins on one).
        fetched = await alice.fetch("orders-eu", 0, 0, max_wait_ms=100)
        assert [x.value for x in fetched.messages] == [b"one"]
        assert [s.name for s in await alice.list_streams()] == ["orders-eu"]
        await alice.create_stream("orders-us", "orders.us")
        await alice.update_stream("orders-us", retention_ms=60_000)
        await alice.delete_stream("orders-us")
        with pytest.raises(NotAuthorized):
            await alice.delete_stream("orders-eu")
        await alice.commit_offset("billing", "orders-eu", 0, 1)
        # Refused: another stream, another group, cluster admin, internal streams.
        with pytest.raises(NotAuthorized):
            await alice.fetch("payroll", 0, 0)
        with pytest.raises(NotAuthorized):
            await alice.create_stream("payroll-2", "payroll.two")
        with pytest.raises(NotAuthorized):
            await alice.commit_offset("audit", "orders-eu", 0, 1)
        with pytest.raises(NotAuthorized):
            await alice.acl_add([{**entries[0], "pattern": "*"}])
        with pytest.raises(NotAuthorized):
            await alice.list_groups()
        with pytest.raises(NotAuthorized):  # internal streams: brokers only, super users too
            await admin.delete_stream("__offsets")
        # Removing an entry takes the right away again.
        assert await admin.acl_remove(entries[:1]) == 1
        with pytest.raises(NotAuthorized):
            await alice.fetch("orders-eu", 0, 0)
        listed = await admin.acl_list(principal="alice")
        assert len(listed) == 5 and all(e.principal == "alice" for e in listed)
    assert metric(secured, "authorization_refusals_total") >= 8


async def test_gets_answered_as_they_are_read_pass_the_gatekeeper_first(
        secured: BrokerProcess) -> None:
    """GET, which the socket API answers as it reads the frame when the key index covers
    it, is refused before authenticating and without `read`, like every other request."""
    async with login(secured, "admin") as admin:
        await admin.create_stream("table", "table.in", cleanup_policy="compact")
        ack = await admin.publish("table.in", b"v1", key=b"k", ack_policy="leader")
        assert ack is not None
        entry = await admin.get("table", b"k", min_offset=ack.offset, wait_ms=10_000)
        assert entry is not None and entry.value == b"v1"
        conn = BrokerConnection(secured.address, client_id="reader")
        await conn.open()
        try:
            with pytest.raises(Unauthenticated):
                await conn.request(m.GetRequest("table", 0, b"k"))
            await conn.request(m.AuthenticateRequest("bob", PASSWORDS["bob"]))
            with pytest.raises(NotAuthorized) as refused:
                await conn.request(m.GetRequest("table", 0, b"k"))
            assert (refused.value.operation, refused.value.resource) == ("read", "table")
            # Pipelined (taken from the buffer together): each refused, and counted, once.
            refusals = metric(secured, "authorization_refusals_total")
            outcomes = await asyncio.gather(
                *(conn.request(m.GetRequest("table", 0, b"k")) for _ in range(6)),
                return_exceptions=True)
            assert all(isinstance(o, NotAuthorized) for o in outcomes), outcomes
            assert metric(secured, "authorization_refusals_total") - refusals == 6
            assert await admin.acl_add([{"principal": "bob", "permission": "allow",
                                         "operation": "read", "resource_type": "stream",
                                         "pattern": "table"}]) == 1
            answer = m.expect_response(await conn.request(m.GetRequest("table", 0, b"k")),
                                       m.GetResponse)
            assert (answer.found, answer.value, answer.offset) == (True, b"v1", ack.offset)
            answers = await asyncio.gather(
                *(conn.request(m.GetRequest("table", 0, b"k")) for _ in range(6)))
            assert [(r.found, r.value) for r in (m.expect_response(a, m.GetResponse)
                                                 for a in answers)] == [(True, b"v1")] * 6
        finally:
            await conn.close()


async def test_http_api_answers_401_and_403(secured: BrokerProcess) -> None:
    url = secured.http_url
    async with httpx.AsyncClient(base_url=url) as http:
        assert (await http.get("/health")).status_code == 200  # open
        answer = await http.get("/streams")
        assert answer.status_code == 401 and answer.json()["error"]["code"] == "UNAUTHENTICATED"
        assert "Basic" in answer.headers["WWW-Authenticate"]
        wrong = await http.get("/streams", headers=basic("alice", "nope"))
        assert wrong.status_code == 401
        created = await http.post("/streams", headers=basic("admin"),
                                  json={"name": "logs", "subject": "logs.in"})
        assert created.status_code == 201
        refused = await http.post("/streams/logs/partitions/0/messages", headers=basic("bob"),
                                  json={"messages": [{"value": "aGk="}]})
        assert refused.status_code == 403
        error = refused.json()["error"]
        assert (error["code"], error["operation"], error["resource"]) == (
            "NOT_AUTHORIZED", "write", "logs")
        acl = {"principal": "bob", "permission": "allow", "operation": "write",
               "resource_type": "stream", "pattern": "logs"}
        assert (await http.post("/acls", headers=basic("bob"),
                                json={"acls": [acl]})).status_code == 403
        added = await http.post("/acls", headers=basic("admin"), json={"acls": [acl]})
        assert added.json() == {"added": 1}
        bearer = {"Authorization": f"Bearer bob:{PASSWORDS['bob']}"}
        written = await http.post("/streams/logs/partitions/0/messages", headers=bearer,
                                  json={"messages": [{"value": "aGk="}]})
        assert written.status_code == 200, written.text
        assert (await http.get("/streams/logs/partitions/0/messages",
                               headers=bearer)).status_code == 403  # write is not read
        listing = await http.get("/streams", headers=bearer)
        assert [s["name"] for s in listing.json()["streams"]] == ["logs"]  # describe implied
        assert (await http.delete("/streams/logs", headers=bearer)).status_code == 403
        acls = await http.get("/acls", headers=basic("admin"))
        assert acls.json()["acls"] == [acl]
        removed = await http.post("/acls/delete", headers=basic("admin"),
                                  json={"acls": [acl]})
        assert removed.json() == {"removed": 1}
        bad = await http.post("/acls", headers=basic("admin"),
                              json={"acls": [{**acl, "operation": "fly"}]})
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "INVALID_ACL"


def cli(broker: BrokerProcess, user: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "JETSTREAM_BROKERS": broker.address,
           "JETSTREAM_CLIENT_USER": user, "JETSTREAM_CLIENT_PASSWORD": PASSWORDS[user]}
    return subprocess.run([sys.executable, "-m", "jetstream.cli", *args], env=env,
                          capture_output=True, text=True, timeout=60)


def test_cli_acl_commands_and_refusals(secured: BrokerProcess) -> None:
    assert cli(secured, "admin", "stream", "create", "metrics", "--subject",
               "metrics.in").returncode == 0
    refused = cli(secured, "bob", "stream", "info", "metrics")
    assert refused.returncode == 1 and "NOT_AUTHORIZED" in refused.stderr
    added = cli(secured, "admin", "acl", "add", "--principal", "bob", "--operation",
                "describe", "--stream", "metric*", "--json")
    assert added.returncode == 0 and json.loads(added.stdout) == {"added": 1}
    assert cli(secured, "bob", "stream", "info", "metrics").returncode == 0
    listed = cli(secured, "admin", "acl", "list", "--json")
    assert json.loads(listed.stdout) == [{"principal": "bob", "permission": "allow",
                                          "operation": "describe", "resource_type": "stream",
                                          "pattern": "metric*"}]
    assert cli(secured, "bob", "acl", "list").returncode == 1  # describe cluster: not bob's
    assert cli(secured, "admin", "acl", "remove", "--principal", "bob", "--operation",
               "describe", "--stream", "metric*").returncode == 0
    assert cli(secured, "bob", "stream", "info", "metrics").returncode == 1
    status = cli(secured, "admin", "cluster", "status", "--json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["brokers"][0]["nats_url"]  # each broker's own report
    hashed = subprocess.run([sys.executable, "-m", "jetstream.cli", "user", "hash", "carol"],
                            input="pw\n", capture_output=True, text=True, timeout=60)
    name, _, encoded = hashed.stdout.strip().partition(":")
    assert name == "carol" and PasswordHasher().verify(encoded, "pw")


async def test_in_flight_limit_per_principal(secured: BrokerProcess) -> None:
    async with login(secured, "admin") as admin:
        await admin.create_stream("slow", "slow.in")
        await admin.acl_add([{"principal": "bob", "permission": "allow", "operation": "read",
                              "resource_type": "stream", "pattern": "slow"}])
    async with login(secured, "bob") as bob:
        # Long-polling fetches hold their slots: the fifth of bob's at once is refused.
        waits = [asyncio.create_task(bob.fetch("slow", 0, 0, max_wait_ms=3000))
                 for _ in range(4)]
        await asyncio.sleep(0.5)
        with pytest.raises(TooManyInFlight):
            await bob.fetch("slow", 0, 0, max_wait_ms=100)
        results = await asyncio.gather(*waits)
        assert all(r.messages == [] for r in results)
        assert (await bob.fetch("slow", 0, 0, max_wait_ms=10)).messages == []
    # The HTTP API holds the same slots: long-polling reads, then a fifth refused with 429.
    url = f"{secured.http_url}/streams/slow/partitions/0/messages"
    async with httpx.AsyncClient(timeout=30) as http:
        polls = [asyncio.create_task(http.get(url, params={"wait_ms": 3000},
                                              headers=basic("bob"))) for _ in range(4)]
        await asyncio.sleep(0.5)
        refused = await http.get(url, headers=basic("bob"))
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["code"] == "TOO_MANY_IN_FLIGHT"
        assert [p.status_code for p in await asyncio.gather(*polls)] == [200] * 4
        assert (await http.get(url, headers=basic("bob"))).status_code == 200
    assert metric(secured, "in_flight_refusals_total") == 2


async def test_client_certificate_names_the_principal(tmp_path: Path, nats_url: str,
                                                      pki: Pki) -> None:
    process = BrokerProcess(tmp_path / "mtls", nats_url, extra_args=(
        *broker_tls_args(pki, pki.leaf("broker")), "--authentication", "--authorization",
        "--super-users", "carol"))
    carol, dave = pki.leaf("carol"), pki.leaf("dave")
    try:
        process.start()
        async with jetstream.connect(process.address, tls_ca=pki.ca, tls_cert=carol.cert,
                                     tls_key=carol.key) as js:
            await js.create_stream("certified", "certified.in")  # carol: a super user
        async with jetstream.connect(process.address, tls_ca=pki.ca, tls_cert=dave.cert,
                                     tls_key=dave.key) as js:
            with pytest.raises(NotAuthorized) as refused:
                await js.delete_stream("certified")
            assert refused.value.principal == "dave"
        # The HTTP API takes the same principals from the certificates.
        for leaf, status in ((carol, 200), (dave, 403)):
            context = client_context(pki.ca, leaf.cert, leaf.key)
            async with httpx.AsyncClient(verify=context, base_url=process.http_url) as http:
                answer = await http.get("/streams/certified")
                assert answer.status_code == status, answer.text
        async with httpx.AsyncClient(verify=client_context(pki.ca, dave.cert, dave.key),
                                     base_url=process.http_url) as http:
            assert (await http.delete("/streams/certified")).json()["error"]["principal"] \
                == "dave"
    finally:
        process.stop()


def test_authentication_off_keeps_everything_open(tmp_path: Path, nats_url: str) -> None:
    """Without the settings, nothing asks for credentials (the default)."""
    process = BrokerProcess(tmp_path / "open", nats_url)
    try:
        process.start()
        answer: Any = httpx.get(f"{process.http_url}/streams").json()
        assert answer == {"streams": []}
    finally:
        process.stop()


async def test_a_single_broker_keeps_its_acls_across_a_restart(secured: BrokerProcess) -> None:
    entry = {"principal": "bob", "permission": "deny", "operation": "all",
             "resource_type": "group", "pattern": "x*"}
    async with login(secured, "admin") as admin:
        assert await admin.acl_add([entry]) == 1
    secured.stop()
    secured.start()
    async with login(secured, "admin") as admin:
        assert [e.to_dict() for e in await admin.acl_list()] == [entry]


async def test_datastream_updates_need_cluster_admin(secured: BrokerProcess) -> None:
    """Batch get describes the cluster; update and batch update administer it."""
    async with httpx.AsyncClient(base_url=secured.http_url) as http:
        names = {"names": ["nope"]}
        change = {"datastreams": [{"name": "nope", "max_tasks": 2}]}
        assert (await http.post("/datastreams/batch/get", json=names,
                                headers=basic("bob"))).status_code == 403
        describe = {"principal": "bob", "permission": "allow", "operation": "describe",
                    "resource_type": "cluster", "pattern": "cluster"}
        added = await http.post("/acls", headers=basic("admin"), json={"acls": [describe]})
        assert added.json() == {"added": 1}
        got = await http.post("/datastreams/batch/get", json=names, headers=basic("bob"))
        assert got.status_code == 200 and got.json()["errors"]["nope"]["code"] == \
            "UNKNOWN_DATASTREAM"
        for method, path, body in (("PATCH", "/datastreams/nope", {"max_tasks": 2}),
                                   ("POST", "/datastreams/batch/update", change)):
            refused = await http.request(method, path, json=body, headers=basic("bob"))
            assert refused.status_code == 403
            assert refused.json()["error"]["operation"] == "cluster_admin"
            allowed = await http.request(method, path, json=body, headers=basic("admin"))
            assert allowed.status_code == 404  # past authorization: no such datastream
    async with login(secured, "bob") as bob:
        with pytest.raises(NotAuthorized):
            await bob.update_datastream("nope", max_tasks=2)
        assert (await bob.batch_get_datastreams(["nope"]))["datastreams"] == []
