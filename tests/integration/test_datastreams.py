"""Datastreams on real brokers: management through the client, HTTP and the CLI with their
stable error codes, and a mirror from one single-broker cluster to another (each with its
own nats-server) that equals its source, with pause and resume of the whole datastream and
of one partition, and checkpoints in the source's `__offsets`."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

import jetstream
from jetstream.client import Client, PublishMessage
from jetstream.errors import (
    DatastreamExists,
    InvalidDatastreamConfig,
    UnknownConnector,
    UnknownDatastream,
)
from jetstream.natsd import NatsServer
from jetstream.server.process import BrokerProcess
from tests.integration.test_cli import json_of as cli_json
from tests.integration.test_cluster import eventually as cluster_eventually

T = TypeVar("T")
DEADLINE_S = 60.0
LEADER_HEADERS = {"Nats-Msg-Id", "Jetstream-Producer", "Jetstream-Registers"}


def eventually(probe: Callable[[], Awaitable[T | None]], what: str,
               deadline_s: float = DEADLINE_S) -> Awaitable[T]:
    """The first non-None result of `probe` before the deadline (test_cluster's)."""
    return cluster_eventually(probe, what, deadline_s)


@pytest.fixture
def remote(tmp_path: Path) -> Iterator[BrokerProcess]:
    """A second cluster: its own nats-server and broker."""
    with NatsServer(tmp_path / "nats-b") as nats:
        process = BrokerProcess(tmp_path / "broker-b", nats.url)
        try:
            yield process.start()
        finally:
            process.stop()


def mirror_of(source: BrokerProcess, **options: Any) -> dict[str, Any]:
    return {"name": "orders-dr",
            "source": {"type": "jetstream", "settings": {"brokers": source.address,
                                                         "stream": "orders"}},
            "destination": {"type": "jetstream", "settings": {"stream": "orders"}}, **options}


async def test_management_and_errors(broker: BrokerProcess, js: Client) -> None:
    definition = mirror_of(broker)
    described = await js.create_datastream(definition["name"], definition["source"],
                                           definition["destination"], max_tasks=2)
    assert described["created"] and described["max_tasks"] == 2
    again = await js.create_datastream(definition["name"], definition["source"],
                                       definition["destination"], max_tasks=2)
    assert not again["created"]
    with pytest.raises(DatastreamExists):
        await js.create_datastream(definition["name"], definition["source"],
                                   definition["destination"], max_tasks=3)
    with pytest.raises(UnknownConnector) as unknown:
        await js.create_datastream("x", {"type": "kafka"}, definition["destination"])
    assert unknown.value.code == "UNKNOWN_CONNECTOR"
    with pytest.raises(InvalidDatastreamConfig) as bad:
        await js.create_datastream("x", {"type": "jetstream", "settings": {"stream": "a",
                                                                           "colour": "red"}},
                                   definition["destination"])
    assert bad.value.fields["field"] == "source.settings.colour"
    with pytest.raises(UnknownDatastream):
        await js.describe_datastream("nope")
    assert [d["name"] for d in await js.list_datastreams()] == ["orders-dr"]
    paused = await js.pause_datastream("orders-dr", [0, 3])
    assert paused["paused_partitions"] == [0, 3]

    async with httpx.AsyncClient(base_url=broker.http_url) as http:
        answer = await http.get("/datastreams/orders-dr")
        assert answer.status_code == 200 and answer.json()["paused_partitions"] == [0, 3]
        answer = await http.post("/datastreams/orders-dr/resume", params={"partitions": "0"})
        assert answer.json()["paused_partitions"] == [3]
        answer = await http.post("/datastreams/orders-dr/pause")
        assert answer.json()["status"] == "paused"
        answer = await http.get("/datastreams/nope")
        assert answer.status_code == 404
        assert answer.json()["error"]["code"] == "UNKNOWN_DATASTREAM"
        answer = await http.post("/datastreams", json={**definition, "name": "y",
                                                        "max_tasks": 0})
        assert answer.status_code == 400
        assert answer.json()["error"]["code"] == "INVALID_DATASTREAM_CONFIG"
        answer = await http.post("/datastreams", json={**definition, "name": "z"})
        assert answer.status_code == 201
        assert (await http.delete("/datastreams/z")).status_code == 204
        health = (await http.get("/health")).json()
        assert health["datastreams"]["connectors"] == {
            "sources": ["jetstream", "nats_jetstream"],
            "destinations": ["jetstream", "nats_subject", "parquet"]}

    listed = await asyncio.to_thread(cli_json, broker.address, "datastreams", "list")
    assert [d["name"] for d in listed["datastreams"]] == ["orders-dr"]
    resumed = await asyncio.to_thread(cli_json, broker.address, "datastreams", "resume",
                                      "orders-dr")
    assert resumed["status"] != "paused"
    created = await asyncio.to_thread(
        cli_json, broker.address, "datastreams", "create", "cli-made", "--source",
        "stream=orders", "--source", f"brokers={broker.address}", "--destination",
        "stream=copy", "--max-tasks", "4")
    assert created["created"] and created["max_tasks"] == 4
    await asyncio.to_thread(cli_json, broker.address, "datastreams", "delete", "cli-made")
    await js.delete_datastream("orders-dr")
    assert await js.list_datastreams() == []


async def read_all(js: Client, stream: str, partition: int, count: int
                    ) -> list[jetstream.client.Message]:
    out: list[jetstream.client.Message] = []
    deadline = time.monotonic() + DEADLINE_S
    while len(out) < count:
        assert time.monotonic() < deadline, f"{stream}/{partition}: {len(out)} of {count}"
        result = await js.fetch(stream, partition, len(out), max_wait_ms=500)
        out.extend(result.messages)
    return out


def user_headers(headers: Any) -> dict[str, bytes]:
    return {k: v for k, v in headers.items() if k not in LEADER_HEADERS
            and not k.startswith("Jetstream-Source")}


async def assert_mirrored(source: Client, destination: Client, counts: list[int]) -> None:
    for partition, count in enumerate(counts):
        original = await read_all(source, "orders", partition, count)
        copied = await read_all(destination, "orders", partition, count)
        more = await destination.fetch("orders", partition, count, max_wait_ms=200)
        assert more.messages == [], "duplicates in the destination"
        assert [(m.key, m.value, user_headers(m.headers)) for m in copied] == \
            [(m.key, m.value, user_headers(m.headers)) for m in original]
        assert [int(m.headers["Jetstream-Source-Offset"]) for m in copied] == \
            [m.offset for m in original]
        assert {m.headers["Jetstream-Source"] for m in copied} <= {f"orders/{partition}".encode()}


async def publish(js: Client, first: int, count: int, partitions: int = 2) -> None:
    await js.publish_batch([PublishMessage(
        "orders", b"value %d" % i, key=b"k%d" % (i % 7), headers={"n": str(i).encode()},
        partition=i % partitions) for i in range(first, first + count)])


@contextlib.asynccontextmanager
async def orders_on_both(source_broker: BrokerProcess, destination_broker: BrokerProcess
                         ) -> AsyncIterator[tuple[Client, Client]]:
    """Clients of both clusters, each holding the stream `orders` of 2 partitions."""
    async with jetstream.connect(source_broker.address) as source, \
            jetstream.connect(destination_broker.address) as destination:
        await source.create_stream("orders", "orders", partitions=2)
        await destination.create_stream("orders", "orders", partitions=2)
        yield source, destination


async def test_mirror_pause_resume(broker: BrokerProcess, remote: BrokerProcess) -> None:
    async with orders_on_both(broker, remote) as (source, destination):
        await publish(source, 0, 200)
        definition = mirror_of(broker, max_tasks=2, batch_records_max=50)
        await destination.create_datastream(definition["name"], definition["source"],
                                            definition["destination"], max_tasks=2,
                                            batch_records_max=50)
        await assert_mirrored(source, destination, [100, 100])

        async def caught_up() -> dict[str, Any] | None:
            found = await destination.datastream_diagnostics("orders-dr")
            progress = [p for t in found["tasks"] for p in t["partitions_progress"]]
            return found if len(progress) == 2 and found["lag_records"] == 0 and all(
                p["source_position"] == 100 for p in progress) else None

        diagnostics = await eventually(caught_up, "diagnostics at the source's end")
        assert {t["status"] for t in diagnostics["tasks"]} == {"running"}
        assert [p["lag_ms"] for t in diagnostics["tasks"] for p in t["partitions_progress"]] \
            == [0, 0]  # caught up
        assert await source.fetch_offset("__datastream_orders-dr", "orders", 0) == 100

        # Pause one partition: the other goes on.
        await destination.pause_datastream("orders-dr", [1])

        async def paused_reported() -> bool | None:
            found = await destination.datastream_diagnostics("orders-dr")
            return True if any(p["paused"] for t in found["tasks"]
                               for p in t["partitions_progress"]) else None

        await eventually(paused_reported, "partition 1 paused")
        await publish(source, 200, 100)
        await read_all(destination, "orders", 0, 150)
        await asyncio.sleep(1.0)  # give a wrongly running partition 1 the time to show
        assert (await destination.fetch("orders", 1, 100, max_wait_ms=0)).messages == []
        await destination.resume_datastream("orders-dr", [1])
        await assert_mirrored(source, destination, [150, 150])

        # Pause the whole datastream, publish, nothing moves; resume, all of it arrives.
        await destination.pause_datastream("orders-dr")

        async def all_paused() -> bool | None:
            found = await destination.datastream_diagnostics("orders-dr")
            return True if found["tasks"] and all(t["status"] == "paused"
                                                  for t in found["tasks"]) else None

        await eventually(all_paused, "every task paused")
        await publish(source, 300, 100)
        await asyncio.sleep(1.0)
        for partition in (0, 1):
            assert (await destination.fetch("orders", partition, 150,
                                            max_wait_ms=0)).messages == []
        await destination.resume_datastream("orders-dr")
        await assert_mirrored(source, destination, [200, 200])
        async with httpx.AsyncClient(base_url=remote.http_url) as http:
            metrics = (await http.get("/metrics")).text
            assert 'jetstream_datastream_records_out_total{datastream="orders-dr"} 400' in metrics
            diag = (await http.get("/diagnostics/datastreams/orders-dr")).json()
            assert diag["lag_records"] == 0 or diag["tasks"]
            health = (await http.get("/health")).json()
            assert len(health["datastreams"]["tasks"]) == 2


async def test_a_rate_limited_mirror_keeps_its_pace(broker: BrokerProcess,
                                                     remote: BrokerProcess) -> None:
    """300 records under a limit of 100 a second (a second's burst, then the pace): the
    mirror takes two seconds at least, and is whole and exactly once."""
    async with orders_on_both(broker, remote) as (source, destination):
        await publish(source, 0, 300)
        definition = mirror_of(broker, rate_limit_records_per_s=100, batch_records_max=10)
        started = time.monotonic()
        created = await destination.create_datastream(
            definition["name"], definition["source"], definition["destination"],
            rate_limit_records_per_s=100, batch_records_max=10)
        assert created["rate_limit_records_per_s"] == 100
        await assert_mirrored(source, destination, [150, 150])
        assert time.monotonic() - started >= 1.9


async def test_update_rotates_settings_and_batches(broker: BrokerProcess,
                                                   remote: BrokerProcess) -> None:
    """A datastream created with a wrong source broker list runs once an update rotates it;
    updates restart its tasks (new epochs) and it goes on mirroring exactly once; fixed
    fields are refused; batch get reports unknown names; batch update is all or none."""
    async with orders_on_both(broker, remote) as (source, destination):
        await publish(source, 0, 100)
        wrong = {"type": "jetstream", "settings": {"brokers": "127.0.0.1:1",
                                                   "stream": "orders"}}
        definition = mirror_of(broker)
        await destination.create_datastream("orders-dr", wrong, definition["destination"],
                                            max_tasks=2)
        await destination.create_datastream("idle", wrong, {"type": "jetstream", "settings": {
            "stream": "idle"}})
        updated = await destination.update_datastream(
            "orders-dr", source={"settings": {"brokers": broker.address}})
        assert updated["source"]["settings"] == definition["source"]["settings"]
        await assert_mirrored(source, destination, [50, 50])

        async with httpx.AsyncClient(base_url=remote.http_url) as http:
            before = (await http.get("/datastreams/orders-dr")).json()["tasks"]
            answer = await http.patch("/datastreams/orders-dr", json={
                "batch_records_max": 7, "labels": {"env": "prod"}})
            assert answer.status_code == 200, answer.text
            patched = answer.json()
            assert (patched["batch_records_max"], patched["labels"]) == (7, {"env": "prod"})
            assert [t["epoch"] for t in patched["tasks"]] > [t["epoch"] for t in before]
            refused = await http.patch("/datastreams/orders-dr", json={
                "destination": {"settings": {"stream": "elsewhere"}}})
            assert refused.status_code == 400
            assert refused.json()["error"]["code"] == "INVALID_DATASTREAM_CONFIG"
            assert refused.json()["error"]["field"] == "destination.settings.stream"
            renamed = await http.patch("/datastreams/orders-dr", json={"name": "other"})
            assert renamed.status_code == 400 and renamed.json()["error"]["field"] == "name"
            missing = await http.patch("/datastreams/nope", json={"max_tasks": 2})
            assert missing.status_code == 404
            got = (await http.post("/datastreams/batch/get",
                                   json={"names": ["orders-dr", "nope"]})).json()
            assert [d["name"] for d in got["datastreams"]] == ["orders-dr"]
            assert got["errors"]["nope"]["code"] == "UNKNOWN_DATASTREAM"
            all_or_none = await http.post("/datastreams/batch/update", json={"datastreams": [
                {"name": "idle", "max_tasks": 3}, {"name": "nope", "max_tasks": 3}]})
            assert all_or_none.status_code == 404
            assert (await destination.describe_datastream("idle"))["max_tasks"] == 1
            answer = await http.post("/datastreams/batch/update", json={"datastreams": [
                {"name": "idle", "max_tasks": 3}, {"name": "orders-dr", "in_flight_max": 5}]})
            assert answer.status_code == 200, answer.text
            assert [(d["name"], d["max_tasks"], d["in_flight_max"])
                    for d in answer.json()["datastreams"]] == [("idle", 3, 1000),
                                                               ("orders-dr", 2, 5)]

        # The restarted tasks go on from their checkpoints: nothing lost, nothing twice.
        await publish(source, 100, 100)
        await assert_mirrored(source, destination, [100, 100])
        updated = await asyncio.to_thread(
            cli_json, remote.address, "datastreams", "update", "orders-dr", "--max-tasks", "1",
            "--source", "start=latest", "--remove-source", "start", "--label", "tier=dr")
        assert (updated["max_tasks"], updated["labels"]) == (1, {"tier": "dr"})
        assert updated["source"]["settings"] == definition["source"]["settings"]
        with pytest.raises(InvalidDatastreamConfig) as fixed:
            await destination.update_datastream("orders-dr", partition_mapping="key_hash")
        assert fixed.value.fields["field"] == "partition_mapping"

        async def one_task() -> bool | None:
            found = await destination.datastream_diagnostics("orders-dr")
            return True if len(found["tasks"]) == 1 and found["tasks"][0]["status"] == \
                "running" else None

        await eventually(one_task, "one task after max_tasks=1")
        await publish(source, 200, 100)
        await assert_mirrored(source, destination, [150, 150])


async def land_in_parquet(broker: BrokerProcess, path: str) -> None:
    """300 records of `orders` (2 partitions) land in Parquet files at `path`; the broker is
    SIGKILLed once 150 per partition are in complete files, 100 more are published after its
    restart and land too."""
    from jetstream.datastreams.parquet_sink import read_manifest

    async with jetstream.connect(broker.address) as js:
        await js.create_stream("orders", "orders", partitions=2)
        await publish(js, 0, 300)
        await js.create_datastream(
            "orders-lake", {"type": "jetstream", "settings": {"stream": "orders"}},
            {"type": "parquet", "settings": {"path": path, "file_rows_max": 40,
                                             "roll_ms": 300}}, max_tasks=2,
            batch_records_max=25)

        async def filed(count: int) -> bool | None:
            ends = [read_manifest(path, p) for p in (0, 1)]
            return True if all(e and e[-1]["end_offset"] == count for e in ends) else None

        await eventually(lambda: filed(150), "150 rows per partition in complete files")
    broker.restart(sig=9)  # SIGKILL
    async with jetstream.connect(broker.address) as js:
        await publish(js, 300, 100)
        await eventually(lambda: filed(200), "200 rows per partition after the restart")


async def test_parquet_sink_equals_the_stream_across_a_crash(tmp_path: Path,
                                                              broker: BrokerProcess) -> None:
    import pyarrow.parquet as pq

    from jetstream.datastreams.parquet_sink import read_manifest

    out = tmp_path / "lake"
    await land_in_parquet(broker, str(out))
    async with jetstream.connect(broker.address) as js:
        table = pq.read_table(str(out))
        rows = sorted(table.to_pylist(), key=lambda r: (r["partition"], r["offset"]))
        assert [(r["partition"], r["offset"]) for r in rows] == \
            [(p, o) for p in (0, 1) for o in range(200)]  # none lost, none twice
        for p in (0, 1):
            original = await read_all(js, "orders", p, 200)
            assert [(r["key"], r["value"], dict(r["headers"])["n"]) for r in rows
                    if r["partition"] == p] == [(m.key, m.value, m.headers["n"])
                                                for m in original]
            files = read_manifest(out, p)
            assert all(f["rows"] <= 40 for f in files)
            assert sum(f["rows"] for f in files) == 200


async def test_nats_jetstream_migration_equals_the_source(tmp_path: Path,
                                                          broker: BrokerProcess) -> None:
    import nats

    with NatsServer(tmp_path / "nats-js", jetstream=True) as source_server:
        nc = await nats.connect(source_server.url)
        try:
            njs = nc.jetstream()
            await njs.add_stream(name="LEGACY", subjects=["legacy.>"])

            async def publish_legacy(first: int, count: int) -> None:
                for i in range(first, first + count):
                    await njs.publish(f"legacy.{i % 3}", b"old %d" % i,
                                      headers={"n": str(i)})

            await publish_legacy(0, 100)
            async with jetstream.connect(broker.address) as js:
                await js.create_stream("migrated", "migrated")
                await js.create_datastream(
                    "legacy-in", {"type": "nats_jetstream", "settings": {
                        "url": source_server.url, "stream": "LEGACY"}},
                    {"type": "jetstream", "settings": {"stream": "migrated"}},
                    batch_records_max=30)
                copied = await read_all(js, "migrated", 0, 100)
            broker.restart(sig=9)
            await publish_legacy(100, 50)
            async with jetstream.connect(broker.address) as js:
                copied = await read_all(js, "migrated", 0, 150)
                assert (await js.fetch("migrated", 0, 150, max_wait_ms=300)).messages == []
            assert [(m.value, m.headers["n"], m.headers["Nats-Subject"]) for m in copied] == \
                [(b"old %d" % i, str(i).encode(), f"legacy.{i % 3}".encode())
                 for i in range(150)]
            assert [int(m.headers["Jetstream-Source-Offset"]) for m in copied] == \
                list(range(1, 151))  # NATS JetStream sequences start at 1
            kv = await njs.key_value("jetstream_datastreams")

            async def checkpointed() -> bool | None:
                entry = await kv.get("__datastream_legacy-in.0")
                return True if entry.value == b"151" else None

            await eventually(checkpointed, "the checkpoint in the source's key-value bucket")
        finally:
            await nc.close()


async def test_nats_subject_republishes_at_least_once(tmp_path: Path,
                                                      broker: BrokerProcess) -> None:
    """Every record is republished to its subject with its headers and source; across a
    SIGKILL of the broker none is lost, and a NATS JetStream stream capturing the subjects
    drops the repeats (Nats-Msg-Id)."""
    import nats

    with NatsServer(tmp_path / "nats-out", jetstream=True) as out_server:
        nc = await nats.connect(out_server.url)
        try:
            njs = nc.jetstream()
            await njs.add_stream(name="REPUB", subjects=["repub.>"])
            seen: set[tuple[int, int]] = set()

            async def received(msg: Any) -> None:
                seen.add((int(msg.headers["Jetstream-Source"].split("/")[1]),
                          int(msg.headers["Jetstream-Source-Offset"])))

            await nc.subscribe("repub.>", cb=received)
            async with jetstream.connect(broker.address) as js:
                await js.create_stream("orders", "orders", partitions=2)
                await publish(js, 0, 200)
                await js.create_datastream(
                    "orders-out", {"type": "jetstream", "settings": {"stream": "orders"}},
                    {"type": "nats_subject", "settings": {
                        "url": out_server.url, "subject": "repub.{stream}.{partition}.{key}"}},
                    max_tasks=2, batch_records_max=30)

                async def stored(count: int) -> bool | None:
                    info = await njs.stream_info("REPUB")
                    return True if info.state.messages >= count else None

                await eventually(lambda: stored(200), "200 records republished")
            broker.restart(sig=9)  # SIGKILL
            async with jetstream.connect(broker.address) as js:
                await publish(js, 200, 100)
                await eventually(lambda: stored(300), "300 records republished")

                async def checkpointed() -> bool | None:
                    offsets = [await js.fetch_offset("__datastream_orders-out", "orders", p)
                               for p in (0, 1)]
                    return True if offsets == [150, 150] else None

                await eventually(checkpointed, "checkpoints after the server's flush")
                await eventually(lambda: stored(300), "nothing more")
                assert (await njs.stream_info("REPUB")).state.messages == 300  # no repeats
                copies = [await njs.get_msg("REPUB", seq) for seq in range(1, 301)]
                by_source = {(int(c.headers["Jetstream-Source"].split("/")[1]),
                              int(c.headers["Jetstream-Source-Offset"])): c for c in copies}
                for p in (0, 1):
                    original = await read_all(js, "orders", p, 150)
                    for m in original:
                        copy = by_source[(p, m.offset)]
                        assert copy.subject == f"repub.orders.{p}.{m.key.decode()}"
                        assert (copy.data, copy.headers["n"], copy.headers["Jetstream-Key"]) \
                            == (m.value, m.headers["n"].decode(), m.key.decode())
                        assert copy.headers["Nats-Msg-Id"] == f"orders-out/{p}/{m.offset}"
            assert seen >= {(p, o) for p in (0, 1) for o in range(150)}  # core: at least once
        finally:
            await nc.close()


async def test_selector_mirrors_every_matching_stream(broker: BrokerProcess,
                                                      remote: BrokerProcess) -> None:
    """Two matching streams and one that does not match, then a third matching stream
    created later: each matching one lands in its own `mirror-<stream>`, the other nowhere;
    a deleted stream leaves the layout."""
    shop = {"app": "shop", "env": "prod"}

    async def fill(js: Client, name: str, partitions: int, first: int, count: int) -> None:
        await js.publish_batch([PublishMessage(
            name, b"%s %d" % (name.encode(), i), key=b"k%d" % i, headers={"n": str(i).encode()},
            partition=i % partitions) for i in range(first, first + count)])

    async def mirrored(source: Client, destination: Client, name: str, partitions: int,
                       per_partition: int) -> None:
        for p in range(partitions):
            original = await read_all(source, name, p, per_partition)
            copied = await read_all(destination, f"mirror-{name}", p, per_partition)
            assert [(m.key, m.value, m.headers["n"]) for m in copied] == \
                [(m.key, m.value, m.headers["n"]) for m in original]
            assert {m.headers["Jetstream-Source"] for m in copied} == {f"{name}/{p}".encode()}

    async with jetstream.connect(broker.address) as source, \
            jetstream.connect(remote.address) as destination:
        for name, partitions, labels in (("orders", 2, shop), ("carts", 1, shop),
                                         ("audit", 1, {"app": "shop", "env": "dev"})):
            await source.create_stream(name, name, partitions=partitions, labels=labels)
            await destination.create_stream(f"mirror-{name}", f"mirror.{name}",
                                            partitions=partitions)
            await fill(source, name, partitions, 0, 40)
        await destination.create_stream("mirror-payments", "mirror.payments", partitions=2)
        await destination.create_datastream(
            "shop-dr", {"type": "jetstream", "settings": {
                "brokers": broker.address, "selector": "app=shop,env in (prod)"}},
            {"type": "jetstream", "settings": {"stream": "mirror-{stream}"}}, max_tasks=2,
            batch_records_max=15)
        await mirrored(source, destination, "orders", 2, 20)
        await mirrored(source, destination, "carts", 1, 40)
        described = await destination.describe_datastream("shop-dr")
        assert described["source_streams"] == [["carts", 1], ["orders", 2]]
        assert len(described["tasks"]) == 2

        await source.create_stream("payments", "payments", partitions=2, labels=shop)
        await fill(source, "payments", 2, 0, 30)
        await fill(source, "orders", 2, 40, 20)
        await mirrored(source, destination, "payments", 2, 15)
        await mirrored(source, destination, "orders", 2, 30)
        await mirrored(source, destination, "carts", 1, 40)
        for name, count in (("orders", 30), ("carts", 40), ("payments", 15)):
            more = await destination.fetch(f"mirror-{name}", 0, count, max_wait_ms=200)
            assert more.messages == [], f"duplicates in mirror-{name}"
        assert (await destination.fetch("mirror-audit", 0, 0, max_wait_ms=200)).messages == []

        await source.delete_stream("carts")

        async def without_carts() -> list[list[Any]] | None:
            found = (await destination.describe_datastream("shop-dr"))["source_streams"]
            return found if found == [["orders", 2], ["payments", 2]] else None

        await eventually(without_carts, "the deleted stream leaves the layout")
        await fill(source, "payments", 2, 30, 10)
        await mirrored(source, destination, "payments", 2, 20)


async def test_parquet_sink_on_s3_equals_the_stream_across_a_crash(
        tmp_path: Path, s3_bucket: str, nats_url: str) -> None:
    """The Parquet sink through the object store layer into S3 (moto): files and manifest
    objects, none lost and none twice across a SIGKILL, every object listed once."""
    import io

    import pyarrow.parquet as pq

    from jetstream.datastreams.parquet_sink import read_manifest
    from jetstream.tiered.store import FragmentStore

    lake = f"{s3_bucket}/lake"
    process = BrokerProcess(tmp_path / "broker", nats_url)  # with the bucket's environment
    try:
        await land_in_parquet(process.start(), lake)
        async with jetstream.connect(process.address) as js:
            store = FragmentStore(lake)
            for p in (0, 1):
                files = read_manifest(lake, p)
                tables = [pq.read_table(io.BytesIO(store.get(f"lake/{f['file']}")))
                          for f in files]
                rows = [r for t in tables for r in t.to_pylist()]
                original = await read_all(js, "orders", p, 200)
                assert [(r["offset"], r["key"], r["value"], dict(r["headers"])["n"])
                        for r in rows] == [(m.offset, m.key, m.value, m.headers["n"])
                                           for m in original]  # none lost, none twice
                assert all(f["rows"] <= 40 for f in files)
            listed = sorted(o.key for o in store.list_keys("lake/")
                            if o.key.endswith(".parquet"))
            assert listed == sorted(f"lake/{f['file']}" for p in (0, 1)
                                    for f in read_manifest(lake, p))
    finally:
        process.stop()
