"""Stopping and starting brokers on real processes: a stop on SIGTERM right after a broker
said it is ready is clean, and leaves the mark of a clean stop; a leader that stopped
cleanly keeps its leaderships at new epochs when it starts again, while one that crashed
hands them to an in-sync replica (test_cluster.py's divergent suffix covers what follows);
brokers stopped together (controlled shutdown) hand nothing to one another."""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path

import jetstream
from jetstream.natsd import NatsServer
from jetstream.server.broker import CLEAN_STOP_FILE
from jetstream.server.process import BrokerProcess
from tests.integration.test_cluster import (
    TUNING,
    by_id,
    create_stream,
    eventually,
    partition_state,
    publish_acked,
    read_through,
    running_cluster,
    stream_metadata,
)


async def _follows_after_ready(broker: BrokerProcess) -> bool | None:
    """This start's log has follower starts, and none before the broker said it is ready."""
    start = broker.log_path.read_text().rsplit("--- start", 1)[1]
    ready = start.find(f"broker {broker.broker_id} ready:")
    following = start.find("following broker ")
    if ready < 0 or following < 0:
        return None
    assert ready < following, "a follower role started before the broker was ready"
    return True


def test_a_stop_right_after_ready_is_clean_and_marked(tmp_path: Path) -> None:
    with NatsServer(tmp_path / "nats") as nats:
        broker = BrokerProcess(tmp_path / "broker", nats.url, broker_id=0)
        broker.start()
        assert broker.stop() == 0  # SIGTERM the moment broker.json appeared
        assert (broker.data_dir / CLEAN_STOP_FILE).exists()
        broker.start()
        assert not (broker.data_dir / CLEAN_STOP_FILE).exists()  # gone while it runs
        broker.kill()
        assert not (broker.data_dir / CLEAN_STOP_FILE).exists()


#: Failover waits 15 s for a leader that is not back (its broker unseen, its followers
#: unanswered): the old leader, started with the others, is back by then even on a loaded
#: machine. (A leader slower than the failover timeouts loses its leaderships, as it should.)
SLOW_START = (*TUNING, "--broker-timeout-ms", "15000", "--replica-leader-timeout-ms", "15000")


async def test_a_leader_stopped_cleanly_keeps_its_leadership_at_a_new_epoch(
        tmp_path: Path, nats_url: str) -> None:
    with running_cluster(tmp_path, nats_url, SLOW_START) as cluster:
        await _keeps_its_leadership(cluster)


async def _keeps_its_leadership(cluster: list[BrokerProcess]) -> None:
    state = await create_stream(cluster[0])
    await publish_acked(cluster, [b"a", b"b"])
    leader = by_id(cluster, state["leader"])
    followers = [b for b in cluster if b is not leader]
    for follower in followers:  # nothing to hand over: they lead nothing
        assert follower.stop() == 0
    # With no quorum left the leader cannot hand its leadership over: it stays the leader
    # in the metadata, and stops cleanly.
    assert leader.stop() == 0
    # Its followers are gone: it proposed no hand-over (one made without a quorum could sit
    # in the Raft log and commit after the restart, to a broker that may not be back).
    assert "hand-over of" not in leader.log_path.read_text()
    assert all((b.data_dir / CLEAN_STOP_FILE).exists() for b in cluster)
    for broker in cluster:
        broker.start(wait=False)
    for broker in cluster:
        broker.wait_ready()

    async def renewed() -> dict[str, object] | None:
        now = await partition_state(leader)
        return now if now["leader_epoch"] > state["leader_epoch"] else None

    now = await eventually(renewed, "the leadership renewed")
    assert now["leader"] == leader.broker_id  # not handed to a follower that came up
    await publish_acked(cluster, [b"c"])
    assert await read_through(leader, b"c") == [b"a", b"b", b"c"]


#: Streams of the whole-cluster stop: enough that each broker leads some.
TOGETHER_STREAMS = 9


async def _leaders(broker: BrokerProcess) -> dict[str, tuple[int, int]]:
    """Each stream's partition 0 as `broker` sees it: (leader, leader epoch)."""
    out = {}
    for i in range(TOGETHER_STREAMS):
        p = (await stream_metadata(broker, f"t{i}"))["partitions"][0]
        out[f"t{i}"] = (p["leader"], p["leader_epoch"])
    return out


async def test_brokers_stopped_together_keep_their_leaderships(
        tmp_path: Path, nats_url: str) -> None:
    """SIGTERM to all three at once: each marks itself shutting down in the metadata and
    waits for the others' marks, so none hands a leadership to a broker that is stopping
    too. They start again leading what they led, at new epochs, with their marks off: a
    broker stopped alone afterwards hands its leaderships over."""
    # A wait for the others' marks longer than the default: on a loaded machine a broker
    # may take more than 300 ms to act on its SIGTERM (then the others would hand it what
    # they lead, as they should).
    tuning = (*SLOW_START, "--controlled-shutdown-wait-ms", "3000")
    with running_cluster(tmp_path, nats_url, tuning) as cluster:
        async with jetstream.connect(",".join(b.address for b in cluster)) as js:
            for i in range(TOGETHER_STREAMS):
                await js.create_stream(f"t{i}", f"together.{i}", replication_factor=3,
                                       min_isr=2)
        before = await _leaders(cluster[0])
        assert len({leader for leader, _ in before.values()}) == 3
        codes = await asyncio.gather(*(asyncio.to_thread(b.stop) for b in cluster))
        assert codes == [0, 0, 0]
        for broker in cluster:
            text = broker.log_path.read_text()
            assert "hand-over of" not in text and "leaderships kept" not in text
            assert "controlled shutdown not marked" not in text
        for broker in cluster:
            broker.start(wait=False)
        for broker in cluster:
            broker.wait_ready()

        async def renewed() -> dict[str, tuple[int, int]] | None:
            now = await _leaders(cluster[0])
            return now if all(now[s][1] > before[s][1] for s in before) else None

        after = await eventually(renewed, "every leadership renewed")
        assert {s: leader for s, (leader, _) in after.items()} == \
            {s: leader for s, (leader, _) in before.items()}
        for broker in cluster:  # its followers start once it is ready, not before
            await eventually(functools.partial(_follows_after_ready, broker),
                             "followers started")
        alone = by_id(cluster, after["t0"][0])
        led_alone = [s for s, (leader, _) in after.items() if leader == alone.broker_id]
        assert alone.stop() == 0
        survivor = next(b for b in cluster if b is not alone)

        async def handed() -> bool | None:
            now = await _leaders(survivor)
            return True if all(now[s][0] != alone.broker_id for s in led_alone) else None

        await eventually(handed, "the leaderships of a broker stopped alone handed over")
