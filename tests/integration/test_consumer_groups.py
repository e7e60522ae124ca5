"""Consumer groups and committed offsets against a real broker: commits and fetches without a
member, members sharing a stream's partitions, rebalances on join and leave, resuming from
the committed offset, reset policies, the refusals (backwards commits, resets while members
are in, a member that lost its partitions), and `__offsets` kept from users."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import httpx
import pytest

from jetstream.client import Client, PublishMessage
from jetstream.client.group_subscription import GroupSubscription
from jetstream.errors import (
    GroupNotEmpty,
    NoCommittedOffset,
    OffsetBehindCommitted,
    PartitionNotAssigned,
    ProtectedStream,
    UnknownMemberId,
    UnknownStream,
)
from jetstream.server.process import BrokerProcess

DEADLINE_S = 20.0


async def until(check: Callable[[], bool] | Callable[[], Awaitable[bool]],
                what: str, deadline_s: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + deadline_s
    while True:
        result = check()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def publish(js: Client, stream: str, partitions: int, count: int) -> None:
    await js.publish_batch([PublishMessage(stream, b"%d" % i, partition=i % partitions)
                            for i in range(count)])


async def test_commit_and_fetch_without_members(js: Client) -> None:
    await js.create_stream("orders", "orders", partitions=2)
    assert await js.fetch_offset("spark-job", "orders", 0) is None
    await js.commit_offset("spark-job", "orders", 0, 42, metadata="run 7")
    await js.commit_offset("spark-job", "orders", 0, 42, metadata="run 7")  # idempotent
    await js.commit_offset("spark-job", "orders", 1, 5)
    assert await js.fetch_offset("spark-job", "orders", 0) == 42
    committed = await js.fetch_offsets("spark-job")
    assert {k: (v.offset, v.metadata) for k, v in committed.items()} == {
        ("orders", 0): (42, "run 7"), ("orders", 1): (5, "")}
    with pytest.raises(OffsetBehindCommitted):
        await js.commit_offset("spark-job", "orders", 0, 41)
    with pytest.raises(UnknownStream):
        await js.commit_offset("spark-job", "nope", 0, 1)
    # `__offsets` exists now, but is the system's
    assert "__offsets" not in [s.name for s in await js.list_streams()]
    with pytest.raises(ProtectedStream):
        await js.delete_stream("__offsets")
    with pytest.raises(ProtectedStream):
        await js.create_stream("__mine", "mine")


async def test_members_share_partitions_and_rebalance_on_join_and_leave(js: Client) -> None:
    await js.create_stream("jobs", "jobs", partitions=4)
    await publish(js, "jobs", 4, 40)
    seen: dict[str, list[tuple[int, int]]] = {"a": [], "b": []}

    async def consume(name: str, sub: GroupSubscription, stop: asyncio.Event) -> None:
        async for msg in sub:
            seen[name].append((msg.partition, msg.offset))
            if stop.is_set():
                return

    a = js.subscribe("jobs", group="workers", auto_commit_interval_ms=200)
    await a.start()
    await until(lambda: len(a.assignment) == 4, "a holds all four partitions")
    stop_a = asyncio.Event()
    task_a = asyncio.create_task(consume("a", a, stop_a))
    await until(lambda: len(seen["a"]) == 40, "a read everything")
    b = js.subscribe("jobs", group="workers", auto_commit_interval_ms=200)
    await b.start()
    await until(lambda: len(a.assignment) == 2 and len(b.assignment) == 2,
                "the partitions split two and two")
    assert not a.assignment & b.assignment
    task_b = asyncio.create_task(consume("b", b, asyncio.Event()))
    await publish(js, "jobs", 4, 40)
    await until(lambda: len(seen["a"]) + len(seen["b"]) >= 80, "both read the new ones")
    for partition, _offset in seen["b"]:
        assert ("jobs", partition) in b.assignment
    description = await js.describe_group("workers")
    assert description["state"] == "stable" and len(description["members"]) == 2
    await a.close()
    task_a.cancel()
    await until(lambda: len(b.assignment) == 4, "b takes a's partitions after a leaves")
    task_b.cancel()
    await b.close()
    # everything was read, and what was read is committed
    assert sorted(set(seen["a"]) | set(seen["b"])) == sorted(
        (p, o) for p in range(4) for o in range(20))
    committed = await js.fetch_offsets("workers")
    assert {k: v.offset for k, v in committed.items()} == {("jobs", p): 20 for p in range(4)}
    listed = {g.group: g for g in await js.list_groups()}
    assert listed["workers"].state == "empty" and listed["workers"].members == 0


async def test_a_new_member_resumes_from_the_committed_offset(js: Client) -> None:
    await js.create_stream("events", "events")
    await publish(js, "events", 1, 10)
    async with js.subscribe("events", group="g", auto_commit=False) as sub:
        got = []
        async for msg in sub:
            got.append(msg.offset)
            if msg.offset == 5:
                await msg.commit()  # position 6
            if msg.offset == 9:
                break
    async with js.subscribe("events", group="g") as sub:
        first = await sub.__anext__()
        assert first.offset == 6
    with pytest.raises(GroupNotEmpty):
        async with js.subscribe("events", group="g"):
            await js.reset_offsets("g", "events", to="earliest")
    await until(lambda: _no_members(js, "g"), "the group is empty")
    assert await js.reset_offsets("g", "events", to="earliest") == {0: 0}
    assert await js.fetch_offset("g", "events", 0) == 0  # a reset may go backwards
    assert await js.reset_offsets("g", "events", to="latest") == {0: 10}
    assert await js.delete_group("g") == 1
    assert await js.fetch_offset("g", "events", 0) is None


async def _no_members(js: Client, group: str) -> bool:
    return not (await js.describe_group(group))["members"]


async def test_reset_policies_apply_where_nothing_is_committed(js: Client) -> None:
    await js.create_stream("feed", "feed")
    await publish(js, "feed", 1, 3)
    async with js.subscribe("feed", group="late", reset="latest") as sub:
        await until(lambda: bool(sub.assignment), "the member holds the partition")
        await asyncio.sleep(0.3)  # its reader has started at the high watermark
        await js.publish("feed", b"new")
        message = await asyncio.wait_for(sub.__anext__(), DEADLINE_S)
        assert (message.offset, message.value) == (3, b"new")
    with pytest.raises(NoCommittedOffset):
        async with js.subscribe("feed", group="strict", reset="error") as sub:
            await asyncio.wait_for(sub.__anext__(), DEADLINE_S)


async def test_a_member_cannot_commit_a_partition_it_gave_up(js: Client) -> None:
    await js.create_stream("pay", "pay", partitions=2)
    a = await js.subscribe("pay", group="billing").start()
    await until(lambda: len(a.assignment) == 2, "a holds both")
    b = await js.subscribe("pay", group="billing").start()
    await until(lambda: len(a.assignment) == 1 and len(b.assignment) == 1, "one each")
    (given_up,) = {("pay", 0), ("pay", 1)} - a.assignment
    with pytest.raises(PartitionNotAssigned):
        await a.commit({given_up: 1})
    with pytest.raises(UnknownMemberId):  # a plain commit while the group has members
        await js.commit_offset("billing", "pay", 0, 1)
    await a.close()
    await b.close()


async def test_groups_over_http_and_their_metrics(js: Client, broker: BrokerProcess) -> None:
    await js.create_stream("clicks", "clicks", partitions=2)
    await publish(js, "clicks", 2, 10)
    async with httpx.AsyncClient(base_url=broker.http_url, timeout=20) as http:
        committed = await http.post("/groups/etl/offsets", json={
            "offsets": [{"stream": "clicks", "partition": 0, "offset": 3},
                        {"stream": "clicks", "partition": 1, "offset": 5}]})
        assert committed.status_code == 200, committed.text
        backwards = await http.post("/groups/etl/offsets", json={
            "offsets": [{"stream": "clicks", "partition": 0, "offset": 1}]})
        assert backwards.status_code == 409
        assert backwards.json()["error"]["code"] == "OFFSET_BEHIND_COMMITTED"
        offsets = (await http.get("/groups/etl/offsets")).json()["offsets"]
        assert [(o["partition"], o["offset"]) for o in offsets] == [(0, 3), (1, 5)]
        described = (await http.get("/groups/etl")).json()
        assert [(o["partition"], o["lag"]) for o in described["offsets"]] == [(0, 2), (1, 0)]
        listed = (await http.get("/groups")).json()["groups"]
        assert [g["group"] for g in listed] == ["etl"]

        metrics = (await http.get("/metrics")).text
        assert 'jetstream_group_lag{group="etl",stream="clicks",partition="0"} 2' in metrics
        assert 'jetstream_group_commits_total{group="etl"} 2' in metrics

        reset = await http.post("/groups/etl/offsets/reset",
                                json={"stream": "clicks", "to": "earliest"})
        assert reset.json()["offsets"] == {"0": 0, "1": 0}
        bad = await http.post("/groups/etl/offsets/reset", json={"stream": "clicks",
                                                                "to": "soon"})
        assert bad.status_code == 400 and bad.json()["error"]["field"] == "to"
        deleted = await http.delete("/groups/etl/offsets")
        assert deleted.json()["deleted_offsets"] == 2

        names = [s["name"] for s in (await http.get("/streams?all=true")).json()["streams"]]
        assert "__offsets" in names
        assert "__offsets" not in [s["name"] for s in
                                   (await http.get("/streams")).json()["streams"]]
        protected = await http.delete("/streams/__offsets")
        assert protected.status_code == 403
        assert protected.json()["error"]["code"] == "STREAM_PROTECTED"


async def test_a_member_of_several_streams_by_name_or_selector(js: Client) -> None:
    await js.create_stream("shop-a", "shop.a", partitions=2, labels={"app": "shop"})
    await js.create_stream("shop-b", "shop.b", labels={"app": "shop"})
    await js.create_stream("other", "other")
    expected = {("shop-a", 0), ("shop-a", 1), ("shop-b", 0)}
    async with js.subscribe(["shop-a", "shop-b"], group="by-name") as named:
        await until(lambda: named.assignment == expected, "both streams' partitions")
    async with js.subscribe(group="by-label", selector="app=shop") as labelled:
        await until(lambda: labelled.assignment == expected, "the selected streams' partitions")
        await js.publish("shop.b", b"hello")
        message = await asyncio.wait_for(labelled.__anext__(), DEADLINE_S)
        assert (message.stream, message.value) == ("shop-b", b"hello")
