"""Stopping and starting brokers on real processes: a stop on SIGTERM right after a broker
said it is ready is clean, and leaves the mark of a clean stop; a leader that stopped
cleanly keeps its leaderships at new epochs when it starts again, while one that crashed
hands them to an in-sync replica (test_cluster.py's divergent suffix covers what follows)."""

from __future__ import annotations

from pathlib import Path

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
)


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
