"""The Raft-backed metadata on real pysyncobj nodes: three `RaftMetadata` in this process,
each with its own pysyncobj thread, data directory and ephemeral loopback port, all calling
back on the test's event loop. Every wait has a deadline; every node is closed."""

from __future__ import annotations

import asyncio
import socket
import statistics
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from jetstream.errors import MetadataUnavailable, StreamExists
from jetstream.natsd import free_ports
from jetstream.raft_meta.changes import StateRestored
from jetstream.raft_meta.codec import encode_command
from jetstream.raft_meta.fsm import (
    ChangeLeader,
    Command,
    Created,
    CreateStream,
    DeleteStream,
    RegisterBroker,
    StaleMetadataEpoch,
)
from jetstream.raft_meta.model import BrokerInfo, PartitionState, StreamConfig
from jetstream.raft_meta.raft import COMPACT_ENTRIES_MIN, DUMP_FILE, RaftMetadata

ELECTION_DEADLINE_S = 5.0
FAILOVER_DEADLINE_S = 8.0
CATCH_UP_DEADLINE_S = 10.0


async def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> float:
    """Poll `predicate` until it holds; the seconds it took. Fails the test at the deadline."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"not within {timeout} s: {what}")
        await asyncio.sleep(0.01)
    return time.monotonic() - start


async def holds(predicate: Callable[[], bool], seconds: float, what: str) -> None:
    """Check that `predicate` holds throughout an observation window of `seconds`."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        assert predicate(), what
        await asyncio.sleep(0.02)


class Cluster:
    """Three metadata nodes on loopback, broker ids 1..3; `seen[i]` records what node i's
    listener was told, in order."""

    def __init__(self, root: Path, size: int = 3) -> None:
        self.root = root
        self.addresses = [f"127.0.0.1:{port}" for port in free_ports(size)]
        self.ids = {address: i + 1 for i, address in enumerate(self.addresses)}
        self.nodes: list[RaftMetadata | None] = [None] * size
        self.seen: list[list[Command | StateRestored]] = [[] for _ in range(size)]

    def start(self, i: int, password: str | None = None) -> RaftMetadata:
        assert self.nodes[i] is None
        node = RaftMetadata(self.root / f"node{i + 1}", self.addresses[i], self.addresses,
                            broker_id=i + 1, broker_ids=self.ids, password=password)
        self.seen[i] = []
        node.add_listener(lambda command, _result: self.seen[i].append(command))
        self.nodes[i] = node
        return node

    async def stop(self, i: int) -> None:
        node = self.nodes[i]
        self.nodes[i] = None
        if node is not None:
            await node.close()

    async def close(self) -> None:
        for i in range(len(self.nodes)):
            await self.stop(i)

    @property
    def live(self) -> list[RaftMetadata]:
        return [n for n in self.nodes if n is not None]

    def node(self, i: int) -> RaftMetadata:
        node = self.nodes[i]
        assert node is not None
        return node

    async def leader(self, timeout: float = ELECTION_DEADLINE_S,
                     among: list[RaftMetadata] | None = None) -> RaftMetadata:
        """The one leader every live node (or every node of `among`) agrees on."""
        nodes = self.live if among is None else among

        def agreed() -> bool:
            leaders = [n for n in nodes if n.is_leader]
            return (len(leaders) == 1
                    and all(n.leader_address == leaders[0].address for n in nodes))

        await wait_for(agreed, timeout, "one leader that every node knows")
        return next(n for n in nodes if n.is_leader)

    def follower(self) -> RaftMetadata:
        return next(n for n in self.live if not n.is_leader)

    async def converged(self, timeout: float = CATCH_UP_DEADLINE_S) -> dict[str, Any]:
        """Wait until every live node holds the same state; that state as a dict."""

        def same() -> bool:
            states = [n.state.to_dict() for n in self.live]
            return all(s == states[0] for s in states)

        await wait_for(same, timeout, "identical states on every live node")
        return self.live[0].state.to_dict()

    async def register_brokers(self, via: RaftMetadata) -> None:
        for i in range(len(self.nodes)):
            await via.propose(RegisterBroker(BrokerInfo(i + 1, "127.0.0.1", 9000 + i)))


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    started = Cluster(tmp_path)
    try:
        for i in range(3):
            started.start(i)
        yield started
    finally:
        await started.close()


def report(capsys: pytest.CaptureFixture[str], line: str) -> None:
    with capsys.disabled():
        print(f"\n[raft_meta] {line}")


async def test_three_nodes_elect_one_leader_and_apply_a_follower_proposal_everywhere(
        cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    start = time.monotonic()
    leader = await cluster.leader()
    report(capsys, f"3 nodes elected broker {leader.broker_id} in "
                   f"{time.monotonic() - start:.2f} s")
    follower = cluster.follower()
    await cluster.register_brokers(follower)
    created = await follower.propose(CreateStream(StreamConfig("orders", "orders.*",
                                                               replication_factor=3)))

    assert isinstance(created, Created) and not created.existed
    assert created.partitions[0].replicas == (1, 2, 3)
    # When propose returns, the proposer's own state and listeners already have it.
    assert "orders" in follower.state.streams
    state = await cluster.converged()
    assert state["version"] == 4 and [s["name"] for s in state["streams"]] == ["orders"]
    expected = [RegisterBroker(BrokerInfo(i, "127.0.0.1", 8999 + i)) for i in (1, 2, 3)]
    expected.append(CreateStream(StreamConfig("orders", "orders.*", replication_factor=3)))
    await wait_for(lambda: all(len(seen) == 4 for seen in cluster.seen), 5,
                   "every listener told of the four commands")
    assert cluster.seen == [expected] * 3  # in log order, on every node

    statuses = [n.status() for n in cluster.live]
    assert {s["leader_broker_id"] for s in statuses} == {leader.broker_id}
    assert [s["role"] for s in statuses].count("leader") == 1
    assert len({s["term"] for s in statuses}) == 1
    assert all(set(s["partners"].values()) == {"up"} and s["has_quorum"] for s in statuses)
    assert all(n.leader_broker_id == leader.broker_id for n in cluster.live)


async def test_a_refused_command_raises_the_same_error_and_changes_no_state(
        cluster: Cluster) -> None:
    leader = await cluster.leader()
    follower = cluster.follower()
    await cluster.register_brokers(leader)
    original = StreamConfig("orders", "orders.*")
    await follower.propose(CreateStream(original))
    before = await cluster.converged()
    seen_before = [len(seen) for seen in cluster.seen]

    other = StreamConfig("orders", "orders.>", partitions=1, replication_factor=2)
    errors = []
    for node in (follower, leader):
        with pytest.raises(StreamExists) as refused:
            await node.propose(CreateStream(other))
        errors.append(refused.value)
    assert [(e.code, e.fields) for e in errors] == [("STREAM_EXISTS", {"name": "orders"})] * 2
    with pytest.raises(StreamExists):  # idempotent for the same config, refused for another
        await follower.propose(CreateStream(other))
    assert (await follower.propose(CreateStream(original))).existed

    # A state change proposed after the refusals is applied after them on every node.
    await leader.propose(RegisterBroker(BrokerInfo(4, "127.0.0.1", 9004)))
    after = await cluster.converged()
    assert after["version"] == before["version"] + 2  # the idempotent create and the barrier
    assert after["streams"] == before["streams"] == [original.to_dict()]
    await wait_for(lambda: all(len(s) == n + 2 for s, n in zip(cluster.seen, seen_before,
                                                               strict=True)),
                   5, "listeners told of the two applied commands")
    for seen in cluster.seen:
        assert CreateStream(other) not in seen


async def test_leader_failure_elects_a_new_leader_and_the_old_node_catches_up(
        cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    old = await cluster.leader()
    await cluster.register_brokers(cluster.follower())
    await old.propose(CreateStream(StreamConfig("before", "before")))
    await cluster.converged()
    index = cluster.nodes.index(old)

    start = time.monotonic()
    await cluster.stop(index)
    # Proposed at once, while the others still follow the stopped leader: propose retries
    # (leader changed, then no leader) until the election is over.
    created = await cluster.live[0].propose(CreateStream(StreamConfig("after", "after")),
                                            timeout=FAILOVER_DEADLINE_S)
    committed_s = time.monotonic() - start
    assert not created.existed
    new = await cluster.leader(timeout=FAILOVER_DEADLINE_S)
    failover_s = time.monotonic() - start
    assert new.broker_id != old.broker_id
    other = next(n for n in cluster.live if n is not new)
    assert not (await other.propose(CreateStream(StreamConfig("next", "next")))).existed
    await cluster.converged()

    start = time.monotonic()
    back = cluster.start(index)  # same directory, journal and port
    await back.wait_ready(CATCH_UP_DEADLINE_S)
    state = await cluster.converged()
    catch_up_s = time.monotonic() - start
    report(capsys, f"failover: a proposal made as the leader stopped committed after "
                   f"{committed_s:.2f} s, new leader broker {new.broker_id} known to all after "
                   f"{failover_s:.2f} s; restarted node caught up in {catch_up_s:.2f} s")
    assert {s["name"] for s in state["streams"]} == {"before", "after", "next"}
    assert CreateStream(StreamConfig("after", "after")) in cluster.seen[index]
    assert (await back.propose(DeleteStream("before"))).name == "before"
    assert "before" not in (await cluster.converged())["streams"]


async def test_restarting_every_node_restores_the_state_from_dumps_and_journals(
        tmp_path: Path) -> None:
    cluster = Cluster(tmp_path)
    try:
        for i in range(3):
            cluster.start(i)
        leader = await cluster.leader()
        await cluster.register_brokers(leader)
        await leader.propose(CreateStream(StreamConfig("a", "a", replication_factor=3)))
        await cluster.converged()
        for node in cluster.live:  # a full dump on every node, the journal cut after it
            node.request_snapshot()
        dumps = [node.directory / DUMP_FILE for node in cluster.live]
        await wait_for(lambda: all(p.exists() for p in dumps), 5, "a dump on every node")
        # These only live in the journals.
        await cluster.follower().propose(CreateStream(StreamConfig("b", "b.*", partitions=2)))
        await leader.propose(ChangeLeader("a", 0, expected_epoch=0, leader=3))
        expected = await cluster.converged()
        await cluster.close()

        for i in range(3):
            cluster.start(i)
        restarted = await cluster.leader()
        await cluster.converged()
        for node in cluster.live:
            await wait_for(lambda node=node: node.state.to_dict() == expected, 5,
                           f"broker {node.broker_id} back at the state it had")
        for seen in cluster.seen:  # the dump is announced whole, then the journal replayed
            assert isinstance(seen[0], StateRestored) and seen[0].version == 4
        assert expected["version"] == 6
        # The version keeps growing across restarts.
        await restarted.propose(DeleteStream("b"))
        assert (await cluster.converged())["version"] == 7
    finally:
        await cluster.close()


async def test_a_node_behind_the_leaders_journal_gets_its_snapshot(cluster: Cluster) -> None:
    leader = await cluster.leader()
    await cluster.register_brokers(leader)
    behind = cluster.nodes.index(cluster.follower())
    await cluster.converged()
    await cluster.stop(behind)
    await leader.propose(CreateStream(StreamConfig("missed", "missed")))
    await leader.propose(DeleteStream("missed"))
    # A dump cuts a node's journal to the last two entries it applied: past what `behind`
    # holds, so a leader can only send it the dump. Both live nodes cut theirs: under load
    # the other one may take the leadership before `behind` is back.
    for node in cluster.live:
        await wait_for(lambda node=node: node.state.version == 5, 5, "both applied it all")
        before = node.status()["log_length"]
        node.request_snapshot()
        # The dump file appears before the journal is cut (at a later tick): until the cut,
        # the node could still send `behind` the entries instead of the dump.
        await wait_for(lambda node=node, before=before: (node.directory / DUMP_FILE).exists()
                       and node.status()["log_length"] < before, 5, "the dump and the cut")
    await leader.propose(CreateStream(StreamConfig("later", "later")))

    back = cluster.start(behind)
    state = await cluster.converged()
    assert [s["name"] for s in state["streams"]] == ["later"] and state["version"] == 6
    await wait_for(lambda: CreateStream(StreamConfig("later", "later")) in cluster.seen[behind],
                   5, "the listener told of what came after the dump")
    seen = cluster.seen[behind]  # its own journal replayed, the dump announced whole, then on
    restored = [i for i, c in enumerate(seen) if isinstance(c, StateRestored)]
    assert len(restored) == 1 and seen[restored[0]] == StateRestored(version=5)
    assert CreateStream(StreamConfig("missed", "missed")) not in seen
    assert back.state.to_dict() == state


async def test_change_leader_is_compare_and_set_on_the_leader_epoch(cluster: Cluster) -> None:
    leader = await cluster.leader()
    follower = cluster.follower()
    await cluster.register_brokers(leader)
    await leader.propose(CreateStream(StreamConfig("cas", "cas", replication_factor=3)))
    await cluster.converged()
    assert leader.state.partition("cas", 0).leader_epoch == 0

    results = await asyncio.gather(
        leader.propose(ChangeLeader("cas", 0, expected_epoch=0, leader=2)),
        follower.propose(ChangeLeader("cas", 0, expected_epoch=0, leader=3)),
        return_exceptions=True)

    won = [r for r in results if isinstance(r, PartitionState)]
    lost = [r for r in results if isinstance(r, StaleMetadataEpoch)]
    assert len(won) == 1 and len(lost) == 1, results
    assert won[0].leader_epoch == 1 and won[0].leader in (2, 3)
    assert lost[0].code == "STALE_METADATA_EPOCH" and lost[0].current_epoch == 1
    state = await cluster.converged()
    assert [p["leader"] for p in state["partitions"]] == [won[0].leader]


async def test_a_resent_proposal_is_applied_once(cluster: Cluster) -> None:
    # What propose does when it retries: send the same proposal id again (private API).
    await cluster.leader()
    follower = cluster.follower()
    await cluster.register_brokers(follower)
    before = (await cluster.converged())["version"]
    proposal_id = uuid.uuid4().hex
    encoded = encode_command(CreateStream(StreamConfig("once", "once")))
    attempts = [follower._submit(proposal_id, encoded) for _ in range(3)]
    await asyncio.wait_for(asyncio.gather(*attempts), 5)
    await follower.propose(DeleteStream("once"))  # a barrier, and proof it was created once
    assert (await cluster.converged())["version"] == before + 2
    for seen in cluster.seen:
        assert seen.count(CreateStream(StreamConfig("once", "once"))) == 1


async def test_without_a_majority_propose_fails_retriably_within_its_timeout(
        tmp_path: Path) -> None:
    cluster = Cluster(tmp_path)
    try:
        alone = cluster.start(0)
        start = time.monotonic()
        with pytest.raises(MetadataUnavailable) as unavailable:
            await alone.propose(DeleteStream("x"), timeout=0.5)
        assert time.monotonic() - start < 1.5
        assert unavailable.value.code == "METADATA_UNAVAILABLE" and unavailable.value.retriable
        assert unavailable.value.reason == "timeout"
        assert alone.leader_address is None and not alone.is_leader
        await alone.close()
        with pytest.raises(MetadataUnavailable, match="closed"):
            await alone.propose(DeleteStream("x"))
    finally:
        await cluster.close()


async def test_a_taken_port_fails_construction(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        with pytest.raises(OSError, match="cannot listen"):
            RaftMetadata(tmp_path, address, [], broker_id=1)


async def test_a_node_with_a_wrong_password_cannot_join(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path)
    try:
        cluster.start(0, password="right")
        cluster.start(1, password="right")
        intruder = cluster.start(2, password="wrong")
        good = [cluster.node(0), cluster.node(1)]
        leader = await cluster.leader(among=good)
        await cluster.register_brokers(leader)
        await leader.propose(CreateStream(StreamConfig("secret", "secret")))
        await wait_for(lambda: all("secret" in n.state.streams for n in good), 5,
                       "both nodes with the password apply the create")
        # Over several heartbeats and reconnection attempts, the intruder learns nothing.
        await holds(lambda: (intruder.state.version == 0 and intruder.leader_address is None
                             and set(intruder.status()["partners"].values()) == {"down"}),
                    2.0, "the node with the wrong password stays outside")
        assert all(n.status()["partners"][intruder.address] == "down" for n in good)
    finally:
        await cluster.close()


async def test_propose_latency(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    leader = await cluster.leader()
    follower = cluster.follower()
    await cluster.register_brokers(leader)
    for name, node in (("leader", leader), ("follower", follower)):
        latencies = []
        for i in range(200):
            command = RegisterBroker(BrokerInfo(1, "127.0.0.1", 9000 + i % 2))
            start = time.perf_counter()
            await node.propose(command)
            latencies.append((time.perf_counter() - start) * 1000)
        quantiles = statistics.quantiles(latencies, n=100)
        report(capsys, f"propose on the {name}, 200 sequential: p50 {quantiles[49]:.2f} ms, "
                       f"p99 {quantiles[98]:.2f} ms, max {max(latencies):.2f} ms")
        assert len(latencies) == 200
    assert (await cluster.converged())["version"] == 3 + 400


def test_importing_the_raft_store_leaves_socket_inet_ntop_working() -> None:
    # pysyncobj swaps in a Windows-only inet_ntop on import; jetstream puts the real one back.
    import socket

    import jetstream.raft_meta.raft  # noqa: F401

    assert socket.inet_ntop(socket.AF_INET, b"\x7f\x00\x00\x01") == "127.0.0.1"


async def test_compact_writes_the_dump_and_cuts_a_long_journal(cluster: Cluster) -> None:
    """What a clean stop calls: the next start loads the dump instead of replaying."""
    leader = await cluster.leader()
    await cluster.register_brokers(leader)
    assert await leader.compact()  # a short journal: nothing to do
    for i in range(COMPACT_ENTRIES_MIN + 6):
        await leader.propose(CreateStream(StreamConfig(f"s{i}", f"s.{i}")))
    before = leader.status()["log_length"]
    assert before > COMPACT_ENTRIES_MIN
    assert await leader.compact()
    assert (leader.directory / DUMP_FILE).exists()
    assert leader.status()["log_length"] < COMPACT_ENTRIES_MIN < before
