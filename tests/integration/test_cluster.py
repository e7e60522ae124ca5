"""A 3-broker cluster of real `jetstream server` processes sharing the test's nats-server:
replication with ack `all`, byte-identical replicas, failover on SIGKILL of the leader, a
restarted broker rejoining the ISR, and min_isr refusing `all` publishes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

import jetstream
from jetstream.client import routing as client_module
from jetstream.client.connection import BrokerConnection
from jetstream.errors import FencedLeaderEpoch, JetstreamError, NotEnoughReplicas, NotLeader
from jetstream.isr import epoch_journal, highest_epochs
from jetstream.isr.highest_epochs import HighestEpochs
from jetstream.natsd import restartable_ports
from jetstream.protocol import messages as m
from jetstream.server.epoch_fence import load_epochs
from jetstream.server.process import BrokerProcess
from jetstream.stream.checkpoint import read_offset, write_atomic
from jetstream.stream.format import StoredRecord, decode_batches
from jetstream.stream.log import HIGH_WATERMARK_FILE, Log
from tests.integration.test_cli import jetstream as cli
from tests.integration.test_cli import json_of as cli_json

T = TypeVar("T")
STREAM = "orders"
SUBJECT = "cluster.orders"
DEADLINE_S = 30.0
#: Short timeouts so failover and ISR changes happen within a test's deadlines.
TUNING = ("--replica-lag-ms-max", "2000", "--replica-leader-timeout-ms", "1000",
          "--broker-timeout-ms", "2000", "--checkpoint-interval-ms", "200", "-v")


@contextmanager
def running_cluster(tmp_path: Path, nats_url: str, tuning: tuple[str, ...] = TUNING,
                    per_broker: tuple[tuple[str, ...], ...] = ((), (), ())
                    ) -> Iterator[list[BrokerProcess]]:
    """3 brokers in `tmp_path`/broker<i>, ready; killed afterwards. `per_broker[i]` are
    broker i's own flags (its certificate, say)."""
    raft_ports = restartable_ports(3)
    spec = ",".join(f"{i}@127.0.0.1:{port}" for i, port in enumerate(raft_ports))
    brokers = [BrokerProcess(tmp_path / f"broker{i}", nats_url, broker_id=i,
                             extra_args=("--cluster", spec, *tuning, *own))
               for i, own in enumerate(per_broker)]
    try:
        for broker in brokers:
            broker.start(wait=False)
        for broker in brokers:
            broker.wait_ready(DEADLINE_S)
        yield brokers
    finally:
        for broker in brokers:
            broker.kill()


@pytest.fixture
def cluster(tmp_path: Path, nats_url: str) -> Iterator[list[BrokerProcess]]:
    with running_cluster(tmp_path, nats_url) as brokers:
        yield brokers


async def eventually(probe: Callable[[], Awaitable[T | None]], what: str,
                     deadline_s: float = DEADLINE_S) -> T:
    """The first non-None result of `probe` (errors count as None) before the deadline."""
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            result = await probe()
        except (JetstreamError, OSError):
            result = None
        if result is not None:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {deadline_s} s: {what}")
        await asyncio.sleep(0.1)


async def stream_metadata(broker: BrokerProcess, stream: str = STREAM) -> dict[str, Any]:
    """The stream as `broker`'s metadata describes it (its partitions' leaders, ISRs...)."""
    conn = BrokerConnection(broker.address, client_id="test")
    await conn.open()
    try:
        response = await conn.request(m.MetadataRequest([stream]))
    finally:
        await conn.close()
    assert isinstance(response, m.MetadataResponse)
    found: dict[str, Any] = response.streams[0]
    return found


async def partition_state(broker: BrokerProcess) -> dict[str, Any]:
    partition: dict[str, Any] = (await stream_metadata(broker))["partitions"][0]
    return partition


async def publish_acked(brokers: list[BrokerProcess], values: list[bytes]) -> None:
    """Publish each value with ack `all` until it is acked (retrying through a failover)."""
    live = [b for b in brokers if b.running]
    async with jetstream.connect(",".join(b.address for b in live)) as js:
        for value in values:
            async def once(value: bytes = value) -> bool:
                ack = await js.publish(SUBJECT, value, ack_policy="all", timeout=2.0)
                return True if ack is not None else None  # type: ignore[return-value]
            await eventually(once, f"ack of {value!r}")


async def read_all(broker: BrokerProcess, count: int) -> list[bytes]:
    async with jetstream.connect(broker.address) as js:
        values: list[bytes] = []
        while len(values) < count:
            result = await js.fetch(STREAM, 0, len(values), max_wait_ms=1000)
            values.extend(msg.value for msg in result.messages)
        return values


async def read_through(broker: BrokerProcess, last: bytes) -> list[bytes]:
    """Every committed value up to and including `last`."""
    async with jetstream.connect(broker.address) as js:
        values: list[bytes] = []
        deadline = time.monotonic() + DEADLINE_S
        while last not in values:
            assert time.monotonic() < deadline, f"{last!r} not read"
            result = await js.fetch(STREAM, 0, len(values), max_wait_ms=1000)
            values.extend(msg.value for msg in result.messages)
        return values


def replica_bytes(broker: BrokerProcess, end_offset: int | None = None,
                  start_offset: int | None = None) -> bytes:
    """The raw record batches of the replica's log from `start_offset` (its log start) below
    `end_offset` (its log end) (broker stopped)."""
    log = Log(broker.data_dir / "logs" / f"{STREAM}-0")
    try:
        out = b""
        offset = log.log_start_offset if start_offset is None else start_offset
        end_offset = log.log_end_offset if end_offset is None else end_offset
        while offset < end_offset:
            data, offset = log.read_bytes(offset, 1 << 20, upper_bound=end_offset)
            assert data, f"{broker.data_dir} ends before {end_offset}"
            out += data
        return out
    finally:
        log.close()


def by_id(brokers: list[BrokerProcess], broker_id: int) -> BrokerProcess:
    return next(b for b in brokers if b.broker_id == broker_id)


async def create_stream(broker: BrokerProcess, **options: Any) -> dict[str, Any]:
    async with jetstream.connect(broker.address) as js:
        await js.create_stream(STREAM, SUBJECT, **options)
    return await eventually(lambda: _full_isr(broker), "a full ISR")


async def _full_isr(broker: BrokerProcess) -> dict[str, Any] | None:
    return await _isr_size(broker, 3)


async def _isr_size(broker: BrokerProcess, size: int) -> dict[str, Any] | None:
    state = await partition_state(broker)
    return state if len(state["isr"]) == size else None


async def test_replicate_fail_over_and_rejoin(cluster: list[BrokerProcess]) -> None:
    # Every broker knows the same elected metadata leader.
    async with httpx.AsyncClient(timeout=DEADLINE_S) as http:
        views = [(await http.get(f"{b.http_url}/cluster")).json() for b in cluster]
    leaders = {view["metadata_leader"] for view in views}
    assert len(leaders) == 1 and leaders <= {0, 1, 2}, views
    assert sum(view["raft"]["role"] == "leader" for view in views) == 1, views
    # Created through a broker that does not necessarily lead anything; defaults: 3 / 2.
    state = await create_stream(cluster[2])
    assert sorted(state["replicas"]) == [0, 1, 2]
    first = [f"v{i}".encode() for i in range(50)]
    await publish_acked(cluster, first)
    assert await read_all(cluster[0], len(first)) == first

    leader = by_id(cluster, state["leader"])
    leader.kill()
    survivor = next(b for b in cluster if b.running)

    async def new_leader() -> dict[str, Any] | None:
        s = await partition_state(survivor)
        return s if s["leader"] != leader.broker_id and s["leader"] >= 0 else None

    moved = await new_leader_within(new_leader)
    assert moved["leader"] in state["isr"] and moved["leader_epoch"] > state["leader_epoch"]
    second = [f"w{i}".encode() for i in range(50)]
    await publish_acked(cluster, second)
    new = by_id(cluster, moved["leader"])
    assert await read_all(new, 100) == first + second  # nothing acked was lost

    leader.start()  # rejoins as a follower, truncates, catches up, rejoins the ISR
    await eventually(lambda: _full_isr(new), "the restarted broker back in the ISR")
    third = [f"x{i}".encode() for i in range(20)]
    await publish_acked(cluster, third)
    await eventually(lambda: _full_isr(new), "a full ISR after the last publishes")

    for broker in cluster:
        broker.stop()
    copies = {b.broker_id: replica_bytes(b, 120) for b in cluster}
    assert len(set(copies.values())) == 1, "replicas differ below the HW"


async def new_leader_within(probe: Callable[[], Awaitable[dict[str, Any] | None]]
                            ) -> dict[str, Any]:
    return await eventually(probe, "a new leader from the ISR", 20.0)


async def test_min_isr_refuses_all_acks(cluster: list[BrokerProcess]) -> None:
    state = await create_stream(cluster[0], replication_factor=3, min_isr=2)
    await publish_acked(cluster, [b"before"])
    followers = [b for b in cluster if b.broker_id != state["leader"]]
    leader = by_id(cluster, state["leader"])
    followers[0].stop()
    await eventually(lambda: _isr_size(leader, 2), "the stopped broker out of the ISR")
    followers[1].stop()  # the metadata loses its majority: no ISR change commits now

    outcomes: list[object] = []

    async def refused() -> bool | None:
        async with jetstream.connect(leader.address) as js:
            try:
                outcomes.append(await js.publish(SUBJECT, b"after", ack_policy="all",
                                                 timeout=2.0))
            except NotEnoughReplicas:
                return True
            except JetstreamError as exc:
                outcomes.append(exc)
        return None

    assert await eventually(refused, "NOT_ENOUGH_REPLICAS for an `all` publish"), outcomes


async def test_restarted_leader_truncates_its_divergent_suffix(
        cluster: list[BrokerProcess]) -> None:
    state = await create_stream(cluster[1])
    committed = [f"c{i}".encode() for i in range(30)]
    await publish_acked(cluster, committed)
    old = by_id(cluster, state["leader"])
    followers = [b for b in cluster if b is not old]
    # Followers paused: what the leader appends now (acked by it alone) reaches no replica.
    for follower in followers:
        os.kill(follower.pid, signal.SIGSTOP)
    try:
        async with jetstream.connect(old.address) as js:
            for i in range(10):
                await js.publish(SUBJECT, f"lost{i}".encode(), ack_policy="leader")
        old.kill()
    finally:
        for follower in followers:
            os.kill(follower.pid, signal.SIGCONT)

    async def new_leader() -> dict[str, Any] | None:
        s = await partition_state(followers[0])
        return s if s["leader"] not in (old.broker_id, -1) else None

    moved = await new_leader_within(new_leader)
    after = [f"n{i}".encode() for i in range(20)]
    await publish_acked(cluster, after)
    old.start()  # its epoch-0 suffix (the 10 "lost" records) is not on the new leader
    new = by_id(cluster, moved["leader"])
    await eventually(lambda: _full_isr(new), "the old leader back in the ISR")
    # A fetch answered before the pause may have carried the first "lost" records to the
    # new leader: those are kept; the rest exist only in the old leader's suffix.
    values = await read_through(new, after[-1])
    kept = len(values) - 50
    assert 0 <= kept < 10
    assert values == committed + [f"lost{i}".encode() for i in range(kept)] + after
    for broker in cluster:
        broker.stop()
    copies = {b.broker_id: replica_bytes(b, len(values)) for b in cluster}
    assert len(set(copies.values())) == 1, "the old leader kept a divergent suffix"


async def assert_fenced(leader: BrokerProcess, state: dict[str, Any]) -> None:
    """A replica fetch under another leader epoch is refused with FENCED_LEADER_EPOCH."""
    follower = next(r for r in state["replicas"] if r != leader.broker_id)
    conn = BrokerConnection(leader.address, client_id="test")
    await conn.open()
    try:
        with pytest.raises(FencedLeaderEpoch):
            await conn.fetch(m.FetchRequest(STREAM, 0, 0, 1024, 0,
                                            leader_epoch=state["leader_epoch"] + 1,
                                            replica_id=follower, isolation="uncommitted"))
    finally:
        await conn.close()


async def test_graceful_stop_hands_leadership_over(cluster: list[BrokerProcess]) -> None:
    state = await create_stream(cluster[0])
    await publish_acked(cluster, [b"a"])
    old = by_id(cluster, state["leader"])
    await assert_fenced(old, state)
    assert old.stop() == 0  # SIGTERM: hands over, then leaves
    survivor = next(b for b in cluster if b.running)

    async def handed_over() -> dict[str, Any] | None:
        s = await partition_state(survivor)
        return s if s["leader"] not in (old.broker_id, -1) else None

    # Faster than a failover, which waits broker_timeout_ms (2 s here) to notice a loss.
    moved = await eventually(handed_over, "leadership handed over on SIGTERM", 1.5)
    assert moved["leader"] == next(r for r in state["replicas"] if r != old.broker_id)
    await publish_acked(cluster, [b"b"])
    assert await read_through(by_id(cluster, moved["leader"]), b"b") == [b"a", b"b"]


async def roles(broker: BrokerProcess) -> dict[str, Any]:
    """This broker's own role for the stream's partition 0 (GET /cluster)."""
    async with httpx.AsyncClient(timeout=DEADLINE_S) as http:
        view = (await http.get(f"{broker.http_url}/cluster")).json()
    found: dict[str, Any] = next(
        (r for r in view["roles"] if (r["stream"], r["partition"]) == (STREAM, 0)),
        {"role": None})
    return found


async def test_no_role_below_the_highest_epoch_recorded(cluster: list[BrokerProcess]) -> None:
    state = await create_stream(cluster[0])
    await publish_acked(cluster, [b"a"])
    first = by_id(cluster, state["leader"])
    fenced, second = [b for b in cluster if b is not first]
    assert (await roles(fenced))["role"] == "follower"
    assert fenced.stop() == 0
    # As if its metadata journal lost entries it had acted on: it saw epoch 2 already.
    recorded = load_epochs(fenced.data_dir).table.highest((STREAM, 0))
    assert recorded is not None and recorded.leader_epoch == 0
    write_atomic(fenced.data_dir / highest_epochs.FILE_NAME,
                 HighestEpochs({(STREAM, 0): replace(recorded, leader_epoch=2)}).serialize())
    (fenced.data_dir / epoch_journal.FILE_NAME).unlink()
    fenced.start()
    # Ready means it has reconciled with the caught-up metadata (epoch 0): no role.
    assert await roles(fenced) == {"stream": STREAM, "partition": 0, "role": "fenced",
                                   "leader_epoch": 0, "recorded_leader_epoch": 2}
    assert "no role until the metadata catches up" in fenced.log_tail()
    # It fetches nothing, so the leader drops it from the ISR (it would be a leader that
    # refuses to lead, if chosen: the failover controller would then move on).
    isr = sorted([first.broker_id, second.broker_id])
    await eventually(lambda: _isr_is(first, isr), "the fenced broker out of the ISR")

    assert first.stop() == 0  # hands over to `second`: epoch 1, still below 2
    first.start()
    at_1 = await eventually(lambda: _isr_is(second, isr), f"ISR {isr} at epoch 1")
    assert (at_1["leader"], at_1["leader_epoch"]) == (second.broker_id, 1)
    assert (await roles(fenced))["leader_epoch"] == 1
    assert (await roles(fenced))["role"] == "fenced"
    await publish_acked(cluster, [b"b"])

    assert second.stop() == 0  # hands over to `first`: epoch 2, the recorded one
    second.start()
    at_2 = await eventually(lambda: _full_isr(first), "every broker in the ISR at epoch 2")
    assert (at_2["leader"], at_2["leader_epoch"]) == (first.broker_id, 2)
    assert await roles(fenced) == {"stream": STREAM, "partition": 0, "role": "follower",
                                   "leader_epoch": 2}
    assert load_epochs(fenced.data_dir).table.highest((STREAM, 0)) == replace(
        recorded, leader_epoch=2)
    await publish_acked(cluster, [b"c"])
    await eventually(lambda: _full_isr(first), "a full ISR after the last publish")
    for broker in cluster:
        broker.stop()
    copies = {b.broker_id: replica_bytes(b, 3) for b in cluster}
    assert len(set(copies.values())) == 1, "the fenced broker did not catch up"


async def _isr_is(broker: BrokerProcess, isr: list[int]) -> dict[str, Any] | None:
    state = await partition_state(broker)
    return state if sorted(state["isr"]) == isr else None


async def follower_reads(conn: BrokerConnection, offset: int, max_wait_ms: int = 1000
                         ) -> tuple[m.FetchResponse, list[StoredRecord]]:
    response, payload = await conn.fetch(m.FetchRequest(STREAM, 0, offset, 1 << 20,
                                                        max_wait_ms, read_replica=True))
    return response, decode_batches(payload, min_offset=offset)


async def test_consumers_read_committed_records_from_in_sync_followers(
        cluster: list[BrokerProcess]) -> None:
    state = await create_stream(cluster[0])
    values = [f"r{i}".encode() for i in range(40)]
    await publish_acked(cluster, values)
    followers = [b for b in cluster if b.broker_id != state["leader"]]
    for follower in followers:
        conn = BrokerConnection(follower.address, client_id="test")
        await conn.open()
        try:
            with pytest.raises(NotLeader):  # not without the opt-in
                await conn.fetch(m.FetchRequest(STREAM, 0, 0, 1 << 20, 0))
            read: list[StoredRecord] = []
            deadline = time.monotonic() + DEADLINE_S
            while len(read) < len(values):
                assert time.monotonic() < deadline, f"broker {follower.broker_id}: {read}"
                response, records = await follower_reads(conn, len(read))
                # Never at or past the HW it answers with, which is its own.
                assert all(r.offset < response.high_watermark for r in records)
                assert response.high_watermark <= response.log_end_offset
                read += records
            assert [r.offset for r in read] == list(range(len(values)))
            assert [r.value for r in read] == values

            # A reader at the follower's HW waits until the HW moves, and no longer.
            waiting = asyncio.ensure_future(follower_reads(conn, len(values), 20_000))
            started = time.monotonic()
            await publish_acked(cluster, [f"late{follower.broker_id}".encode()])
            response, records = await waiting
            assert [r.value for r in records] == [f"late{follower.broker_id}".encode()]
            assert time.monotonic() - started < 10, "the long poll did not wake on the HW"
            values.append(records[0].value)
        finally:
            await conn.close()


async def test_client_reads_from_a_chosen_isr_replica_and_falls_back_to_the_leader(
        cluster: list[BrokerProcess], monkeypatch: pytest.MonkeyPatch) -> None:
    state = await create_stream(cluster[0])
    values = [f"s{i}".encode() for i in range(30)]
    await publish_acked(cluster, values)
    follower = next(b for b in cluster if b.broker_id != state["leader"])

    class PickFollower:
        @staticmethod
        def choice(isr: list[int]) -> int:
            assert follower.broker_id in isr
            return follower.broker_id

    monkeypatch.setattr(client_module, "random", PickFollower)
    leader = by_id(cluster, state["leader"])
    async with jetstream.connect(leader.address) as js:
        async with js.subscribe(STREAM, stop="latest", read_isr_replica=True) as sub:
            assert [msg.value async for msg in sub] == values
        assert js._router.read_replicas == {(STREAM, 0): follower.broker_id}
        assert follower.stop() == 0  # a follower: nothing to hand over
        result = await js.fetch(STREAM, 0, 0, read_isr_replica=True)  # at the leader now
        assert [msg.value for msg in result.messages] == values
        assert js._router.read_replicas == {}


def test_cluster_status_shows_offsets_of_every_partition_and_replica(
        cluster: list[BrokerProcess]) -> None:
    state = asyncio.run(create_stream(cluster[0]))
    asyncio.run(publish_acked(cluster, [f"v{i}".encode() for i in range(7)]))
    leader = state["leader"]
    # Asked through a broker that does not lead the partition: it asks the leader.
    other = next(b for b in cluster if b.broker_id != leader)
    brokers = ",".join([other.address])

    def caught_up() -> dict[str, Any] | None:
        status = cli_json(brokers, "cluster", "status")
        leos = status["partitions"][0]["replica_end_offsets"]
        return status if sorted(leos.values()) == [7, 7, 7] else None

    status = asyncio.run(eventually_sync(caught_up, "every replica's LEO at 7"))
    views = [httpx.get(f"{b.http_url}/cluster", timeout=DEADLINE_S).json() for b in cluster]
    assert status["metadata_leader"] == views[0]["metadata_leader"]
    assert [b["id"] for b in status["brokers"]] == [0, 1, 2]
    # Each broker's own NATS connection, though one broker was asked.
    assert [(b["nats_url"], b["nats_state"]) for b in status["brokers"]] == [
        (broker.nats_url, "connected") for broker in cluster]
    [row] = status["partitions"]
    assert (row["stream"], row["partition"], row["leader"], row["leader_epoch"]) == (
        STREAM, 0, leader, 0)
    assert sorted(row["isr"]) == [0, 1, 2]
    assert (row["high_watermark"], row["log_end_offset"]) == (7, 7)
    assert row["replica_end_offsets"] == {"0": 7, "1": 7, "2": 7}

    human = cli(brokers, "cluster", "status").stdout
    assert f"metadata leader: broker {status['metadata_leader']}" in human
    rows = [line.split() for line in human.splitlines()]
    for broker in cluster:
        assert [str(broker.broker_id), broker.address, str(broker.http_port), broker.nats_url,
                "connected"] in [row[:5] for row in rows]
    assert [b["disk_full"] for b in status["brokers"]] == [False, False, False]
    cells = next(line.split() for line in human.splitlines() if line.startswith(STREAM))
    assert cells[0:4] == [STREAM, "0", str(leader), "0"] and cells[-2:] == ["7", "7"]

    # A follower read through the CLI: the same committed values.
    read = cli(other.address, "sub", STREAM, "--read-replica", "--format", "json").stdout
    assert [json.loads(line)["value"] for line in read.splitlines()] == [
        f"v{i}" for i in range(7)]


async def eventually_sync(probe: Callable[[], T | None], what: str) -> T:
    async def once() -> T | None:
        return await asyncio.to_thread(probe)
    return await eventually(once, what)


async def test_recreated_stream_does_not_reuse_old_data(cluster: list[BrokerProcess]) -> None:
    """A broker that learns of a stream's deletion and its re-creation under the same name
    only together (paused meanwhile, so still counted live and given a replica) drops its
    old copy instead of serving the old records as the new stream's."""
    await create_stream(cluster[0])
    await publish_acked(cluster, [f"old{i}".encode() for i in range(30)])
    away = cluster[2]
    live = [b for b in cluster if b is not away]
    os.kill(away.pid, signal.SIGSTOP)
    try:
        async with jetstream.connect(",".join(b.address for b in live)) as js:
            await js.delete_stream(STREAM)
            await js.create_stream(STREAM, SUBJECT, replication_factor=3, min_isr=1)
    finally:
        os.kill(away.pid, signal.SIGCONT)
    new = [f"new{i}".encode() for i in range(10)]
    await publish_acked(cluster, new)
    await eventually(lambda: _full_isr(cluster[0]), "the returning broker in the new ISR")
    for broker in cluster:
        broker.stop()
    copies = {b.broker_id: replica_bytes(b, len(new)) for b in cluster}
    assert len(set(copies.values())) == 1, "replicas of the new stream differ"
    values = {b.broker_id: all_values(b) for b in cluster}
    assert values[away.broker_id] == values[cluster[0].broker_id]
    assert set(new) <= set(values[away.broker_id])
    assert not [v for v in values[away.broker_id] if v.startswith(b"old")]


def all_values(broker: BrokerProcess) -> list[bytes]:
    """Every record's value in the replica's log (broker stopped)."""
    log = Log(broker.data_dir / "logs" / f"{STREAM}-0")
    try:
        return [r.value for r in log.read_records(log.log_start_offset)]
    finally:
        log.close()


async def test_create_places_replicas_on_live_brokers(cluster: list[BrokerProcess]) -> None:
    """With a broker down, a replication factor of 3 is refused (NOT_ENOUGH_REPLICAS) and a
    factor of 2 lands on the two live brokers."""
    down = cluster[2]
    down.stop()
    live = [b for b in cluster if b.running]

    async def refused() -> bool | None:
        async with jetstream.connect(live[0].address) as js:
            try:
                await js.create_stream("three", "three.in", replication_factor=3, min_isr=2)
            except NotEnoughReplicas:
                return True
            await js.delete_stream("three")  # placed before the broker was seen gone
        return None

    await eventually(refused, "NOT_ENOUGH_REPLICAS for 3 replicas on 2 live brokers")
    async with jetstream.connect(live[1].address) as js:
        await js.create_stream("two", "two.in", partitions=4, replication_factor=2, min_isr=1)
        info = await js.stream_info("two")
    replicas = {r for p in info.partitions for r in p.replicas}
    assert replicas == {b.broker_id for b in live}, info


async def test_every_replica_checkpoints_its_high_watermark(
        cluster: list[BrokerProcess]) -> None:
    """Leader and followers each write the HW checkpoint of their copy once
    `checkpoint_interval_ms` passed after it moved (not in the path of the acks)."""
    await create_stream(cluster[0])
    await publish_acked(cluster, [b"v%d" % i for i in range(5)])

    async def checkpointed() -> bool | None:
        held = [read_offset(b.data_dir / "logs" / f"{STREAM}-0" / HIGH_WATERMARK_FILE,
                            "high-watermark") for b in cluster]
        return True if held == [5, 5, 5] else None

    await eventually(checkpointed, "every replica's checkpoint at HW 5")


async def test_an_empty_replica_starts_at_the_leaders_log_start(
        tmp_path: Path, nats_url: str) -> None:
    """A replica whose log was lost (a replaced disk) rejoins a leader whose retention
    deleted its first segments: it cannot fetch from offset 0, so it starts empty at the
    leader's log start and catches up from there."""
    with running_cluster(tmp_path, nats_url,
                         (*TUNING, "--retention-check-ms", "100")) as cluster:
        state = await create_stream(cluster[0], segment_bytes_max=4096, retention_bytes=8192)
        await publish_acked(cluster, [b"%04d" % i + b"." * 96 for i in range(200)])

        async def leader_start() -> int | None:
            async with jetstream.connect(cluster[0].address) as js:
                start = (await js.stream_info(STREAM)).partitions[0].log_start_offset
            return start if start > 0 else None

        start = await eventually(leader_start, "retention deleting the first segments")
        follower = next(b for b in cluster if b.broker_id != state["leader"])
        follower.kill()
        for path in sorted((follower.data_dir / "logs" / f"{STREAM}-0").rglob("*"),
                           reverse=True):
            path.rmdir() if path.is_dir() else path.unlink()
        follower.start()
        leader = by_id(cluster, state["leader"])
        await eventually(lambda: _full_isr(leader), "the emptied replica back in the ISR")
        await publish_acked(cluster, [b"last"])
        await eventually(lambda: _full_isr(leader), "a full ISR after the last publish")
        for broker in cluster:
            broker.stop()
        starts = []
        for broker in (follower, leader):
            copy = Log(broker.data_dir / "logs" / f"{STREAM}-0")
            starts.append((copy.log_start_offset, copy.log_end_offset))
            copy.close()
        (follower_start, follower_end), (leader_start, leader_end) = starts
        assert follower_start >= start and follower_end == leader_end == 201
        # The same batches from where both logs hold them.
        common = max(follower_start, leader_start)
        assert replica_bytes(follower, start_offset=common) == \
            replica_bytes(leader, start_offset=common)
