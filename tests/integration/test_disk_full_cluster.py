"""A full disk in a 3-broker cluster, each broker on a small tmpfs of its own (the tests skip
where mounting one is not allowed): a full follower leaves the ISR at once and rejoins once
it has room, a full leader hands its partition to an in-sync follower, a stream is deleted
through a broker whose disk is full to the last byte, and the metadata journal grows into
the disk reserve instead of killing the broker."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

import jetstream
from jetstream.client.types import PublishMessage
from jetstream.server.process import BrokerProcess
from tests.disk_space import TmpfsUnavailable, fill, free, tmpfs
from tests.integration.test_cli import json_of as cli_json
from tests.integration.test_cluster import (
    DEADLINE_S,
    STREAM,
    TUNING,
    by_id,
    create_stream,
    eventually,
    partition_state,
    publish_acked,
    read_all,
    replica_bytes,
    running_cluster,
)

SIZE = "32m"
DISK_TUNING = (*TUNING, "--disk-check-ms", "100", "--disk-reserve-bytes", str(1 << 20))
#: Past the brokers' high watermark (95 %), short of the last byte.
FULL_PERCENT = 97.0
REPO = Path(__file__).parents[2]


@pytest.fixture
def disk_cluster(tmp_path: Path, nats_url: str) -> Iterator[list[BrokerProcess]]:
    """3 brokers, each with its data directory on a tmpfs of its own."""
    with ExitStack() as mounts:
        try:
            for i in range(3):
                mounts.enter_context(tmpfs(tmp_path / f"broker{i}", SIZE))
        except TmpfsUnavailable as exc:
            pytest.skip(str(exc))
        with running_cluster(tmp_path, nats_url, DISK_TUNING) as brokers:
            yield brokers


async def isr_without(broker: BrokerProcess, left: int) -> dict[str, Any] | None:
    state = await partition_state(broker)
    return state if left not in state["isr"] else None


async def isr_of(broker: BrokerProcess, size: int) -> dict[str, Any] | None:
    state = await partition_state(broker)
    return state if len(state["isr"]) == size else None


async def disk_of(broker: BrokerProcess) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=DEADLINE_S) as http:
        disk: dict[str, Any] = (await http.get(f"{broker.http_url}/health")).json()["disk"]
    return disk


async def replicated(brokers: list[BrokerProcess]
                     ) -> tuple[dict[str, Any], list[bytes], BrokerProcess]:
    """The stream, created with 20 values acked by every replica: its partition's state, the
    values, and its leader."""
    state = await create_stream(brokers[0])
    values = [f"a{i}".encode() for i in range(20)]
    await publish_acked(brokers, values)
    return state, values, by_id(brokers, state["leader"])


async def test_a_full_follower_leaves_the_isr_and_rejoins_once_it_has_room(
        disk_cluster: list[BrokerProcess]) -> None:
    _state, first, leader = await replicated(disk_cluster)
    follower = next(b for b in disk_cluster if b is not leader)

    fill(follower.data_dir, FULL_PERCENT)
    # Nothing is published meanwhile: the follower stays caught up and keeps fetching, so
    # lag cannot be what takes it out; it says it is full.
    await eventually(lambda: isr_without(leader, follower.broker_id),
                     "the full follower out of the ISR")
    # Acks `all` wait for the two in-sync replicas only, and the full one appends nothing.
    second = [f"b{i}".encode() for i in range(20)]
    await publish_acked(disk_cluster, second)
    seen = await partition_state(leader)
    assert (seen["high_watermark"], seen["log_end_offset"]) == (40, 40)
    assert seen["replica_end_offsets"][str(follower.broker_id)] == 20

    # Its disk, as it reports it: cluster status and metrics.
    status = cli_json(leader.address, "cluster", "status")
    disks = {b["id"]: (b["disk_full"], b["disk_used_percent"]) for b in status["brokers"]}
    assert disks[follower.broker_id][0] is True and disks[follower.broker_id][1] >= 95
    assert [full for b, (full, _used) in disks.items() if b != follower.broker_id] == [
        False, False]
    async with httpx.AsyncClient(timeout=DEADLINE_S) as http:
        metrics = (await http.get(f"{follower.http_url}/metrics")).text
    assert "jetstream_disk_full 1" in metrics.splitlines()
    assert any(line.startswith("jetstream_disk_free_bytes ") for line in metrics.splitlines())

    free(follower.data_dir)
    await eventually(lambda: isr_of(leader, 3), "the follower back in the ISR")
    await publish_acked(disk_cluster, [b"c"])
    await eventually(lambda: isr_of(leader, 3), "a full ISR after the last publish")
    assert await read_all(leader, 41) == [*first, *second, b"c"]
    for broker in disk_cluster:
        broker.stop()
    copies = {b.broker_id: replica_bytes(b, 41) for b in disk_cluster}
    assert len(set(copies.values())) == 1, "the follower did not catch up"


async def test_a_full_leader_hands_its_partition_to_an_in_sync_follower(
        disk_cluster: list[BrokerProcess]) -> None:
    state, first, old = await replicated(disk_cluster)

    fill(old.data_dir, FULL_PERCENT)

    async def moved() -> dict[str, Any] | None:
        s = await partition_state(next(b for b in disk_cluster if b is not old))
        return s if s["leader"] not in (old.broker_id, -1) else None

    new_state = await eventually(moved, "leadership handed over")
    assert new_state["leader_epoch"] == state["leader_epoch"] + 1
    assert old.broker_id not in new_state["isr"]
    new = by_id(disk_cluster, new_state["leader"])
    # Publishers reach the new leader (NATS delivers to whoever subscribes).
    second = [f"b{i}".encode() for i in range(20)]
    await publish_acked(disk_cluster, second)
    # While its disk is full the old leader stays out of the ISR: no leadership comes back.
    # It follows the new leader but appends nothing; the new leader learns its log end offset
    # from its first fetch, which may come after the acks above.
    after = await eventually(lambda: _if_reported(new, old.broker_id),
                             "the old leader's log end offset reported to the new one")
    assert (after["leader"], after["leader_epoch"]) == (new.broker_id, new_state["leader_epoch"])
    assert old.broker_id not in after["isr"]
    assert after["replica_end_offsets"][str(old.broker_id)] == 20

    free(old.data_dir)
    await eventually(lambda: isr_of(new, 3), "the old leader back in the ISR")
    assert (await partition_state(new))["leader_epoch"] == new_state["leader_epoch"]
    assert await read_all(new, 40) == [*first, *second]


async def test_a_stream_is_deleted_through_a_broker_whose_disk_is_full(
        disk_cluster: list[BrokerProcess]) -> None:
    await create_stream(disk_cluster[0])
    async with jetstream.connect(",".join(b.address for b in disk_cluster)) as js:
        await js.create_stream("big", "big.in")
        batch = [PublishMessage("big.in", b"x" * 1024) for _ in range(2000)]
        # Acked once its leader (maybe another broker than the one that created it) runs.
        await eventually(lambda: js.publish_batch(batch, ack_policy="all", timeout=2.0),
                         "2000 messages in the stream `big`")
    target = disk_cluster[0]
    fill(target.data_dir)  # to the last byte
    await eventually(lambda: _if_full(target), "the disk seen full")
    # The metadata changes that follow (ISR, leaders) need room in the Raft journal's meta
    # file the disk does not have: the reserve gives it, and the broker lives on.
    await eventually(lambda: _if_reserve(target, False), "the reserve released")
    assert "room freed, trying again" in target.log_path.read_text()

    async with jetstream.connect(target.address) as js:
        await js.delete_stream("big")
    assert target.running
    assert not (target.data_dir / "logs" / "big-0").exists()
    await eventually(lambda: _if_room(target), "room on the disk again")
    await eventually(lambda: _if_reserve(target, True), "the reserve taken back")
    await publish_acked(disk_cluster, [b"after"])
    await eventually(lambda: isr_of(target, 3), "every replica of the other stream in sync")
    leader = by_id(disk_cluster, (await partition_state(target))["leader"])
    assert await read_all(leader, 1) == [b"after"]
    assert [s.name for s in await _streams(target)] == [STREAM]


async def _if_reported(broker: BrokerProcess, replica: int) -> dict[str, Any] | None:
    state = await partition_state(broker)
    return state if state["replica_end_offsets"].get(str(replica)) is not None else None


async def _if_full(broker: BrokerProcess) -> dict[str, Any] | None:
    disk = await disk_of(broker)
    return disk if disk["full"] else None


async def _if_room(broker: BrokerProcess) -> dict[str, Any] | None:
    disk = await disk_of(broker)
    return None if disk["full"] else disk


async def _if_reserve(broker: BrokerProcess, held: bool) -> bool | None:
    return True if (broker.data_dir / "reserve").exists() == held else None


async def _streams(broker: BrokerProcess) -> list[Any]:
    async with jetstream.connect(broker.address) as js:
        return list(await js.list_streams())


def test_the_metadata_journal_grows_into_the_reserve_on_a_full_disk(tmp_path: Path) -> None:
    try:
        with tmpfs(tmp_path / "disk", "2m") as disk:
            done = subprocess.run(
                [sys.executable, "-m", "tests.integration.journal_on_full_disk", str(disk)],
                capture_output=True, text=True, timeout=60, cwd=REPO)
    except TmpfsUnavailable as exc:
        pytest.skip(str(exc))
    assert done.returncode == 0, done.stderr[-3000:]  # -7: SIGBUS
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["journal_after"] >= result["journal_before"] + 64 * 1024, result
    assert result["port"] == result["committed"] + 1, result  # every command applied
    assert not result["reserve_held"], result  # released for the journal
    assert "room freed, trying again" in done.stderr
