"""Bits flipped in stored segments of an R3 stream on a 3-broker cluster (Jepsen's "bitflip"):
a damaged follower is found by the scrubber, leaves the ISR, heals from a healthy copy and
rejoins; a damaged leader serves every record right (read repair) and heals; damage in every
replica's copy of one batch is reported as a lost range with its exact offsets, and
everything else stays readable. Nothing wrong is ever served."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import jetstream
from jetstream.client import Client, PublishMessage
from jetstream.errors import RangeLost
from jetstream.natsd import restartable_ports
from jetstream.server.process import BrokerProcess
from jetstream.stream import format as fmt
from tests.integration.test_cli import jetstream as cli
from tests.integration.test_cluster import TUNING, eventually

DEADLINE_S = 30.0
STREAM, SUBJECT, COUNT = "ledger", "ledger.in", 3000


def start_cluster(tmp_path: Path, nats_url: str, *extra: str) -> list[BrokerProcess]:
    raft_ports = restartable_ports(3)
    spec = ",".join(f"{i}@127.0.0.1:{port}" for i, port in enumerate(raft_ports))
    brokers = [BrokerProcess(tmp_path / f"broker{i}", nats_url, broker_id=i,
                             extra_args=("--cluster", spec, *TUNING, *extra))
               for i in range(3)]
    for broker in brokers:
        broker.start(wait=False)
    for broker in brokers:
        broker.wait_ready(DEADLINE_S)
    return brokers


@pytest.fixture
def scrubbing(tmp_path: Path, nats_url: str) -> Iterator[list[BrokerProcess]]:
    brokers = start_cluster(tmp_path, nats_url, "--scrub-bytes-per-s", str(64 << 20),
                            "--scrub-interval-ms", "1000")
    try:
        yield brokers
    finally:
        for broker in brokers:
            broker.kill()


@pytest.fixture
def quiet(tmp_path: Path, nats_url: str) -> Iterator[list[BrokerProcess]]:
    """No background scrub: damage is met by reads."""
    brokers = start_cluster(tmp_path, nats_url, "--scrub-bytes-per-s", "0")
    try:
        yield brokers
    finally:
        for broker in brokers:
            broker.kill()


def value(i: int) -> bytes:
    return b"%06d|" % i * 20


async def fill(js: Client) -> None:
    await js.create_stream(STREAM, SUBJECT, replication_factor=3, segment_bytes_max=64 * 1024)
    acks = await js.publish_batch([PublishMessage(SUBJECT, value(i)) for i in range(COUNT)],
                                  window=200, ack_policy="all")
    assert len(acks) == COUNT
    # Every replica holds everything: the ISR is whole and the HW at the end.
    async def settled() -> bool | None:
        info = (await js.stream_info(STREAM)).partitions[0]
        return True if len(info.isr) == 3 and info.high_watermark == COUNT else None
    await eventually(settled, "a whole ISR at the end")


def log_dir(broker: BrokerProcess) -> Path:
    return broker.data_dir / "logs" / f"{STREAM}-0"


def flip_five_bits(broker: BrokerProcess, segment: int = 1, at: float = 0.5) -> int:
    """Flip 5 bits in the body of a batch in the middle of the `segment`-th segment file
    (sealed); the file position of the first."""
    path = sorted(log_dir(broker).glob("*.log"))[segment]
    data = path.read_bytes()
    position = 0
    while position < len(data) * at:
        position += fmt.parse_header(data, position).size
    target = position + fmt.BATCH_HEADER.size + 40  # inside the records of that batch
    with open(path, "r+b") as f:
        for i in range(5):
            f.seek(target + 3 * i)
            byte = f.read(1)[0]
            f.seek(target + 3 * i)
            f.write(bytes([byte ^ (1 << i)]))
    return target


async def read_everything(js: Client, start: int = 0) -> list[bytes]:
    values: list[bytes] = []
    offset = start
    deadline = time.monotonic() + DEADLINE_S
    while offset < COUNT:
        assert time.monotonic() < deadline, f"read stuck at {offset}"
        result = await js.fetch(STREAM, 0, offset, max_bytes=16 * 1024)
        values.extend(m.value for m in result.messages)
        offset = result.next_offset
    return values


async def metric(broker: BrokerProcess, name: str) -> int:
    """The broker's metric `name`, summed over its labels."""
    async with httpx.AsyncClient(base_url=broker.http_url, timeout=10) as http:
        text = (await http.get("/metrics")).text
    values = [float(line.split()[-1]) for line in text.splitlines()
              if line.startswith((name + " ", name + "{"))]
    assert values, f"no {name} in /metrics"
    return int(sum(values))


async def integrity_of(broker: BrokerProcess) -> dict[str, object]:
    async with httpx.AsyncClient(base_url=broker.http_url, timeout=10) as http:
        partition = (await http.get(f"/streams/{STREAM}")).json()["partitions"][0]
    found: dict[str, object] = partition["integrity"]
    return found


def same_files(a: BrokerProcess, b: BrokerProcess) -> bool:
    files = sorted(p.name for p in log_dir(a).glob("*.log"))
    return files == sorted(p.name for p in log_dir(b).glob("*.log")) and all(
        (log_dir(a) / f).read_bytes() == (log_dir(b) / f).read_bytes() for f in files)


async def test_a_damaged_follower_leaves_the_isr_heals_and_rejoins(
        scrubbing: list[BrokerProcess]) -> None:
    brokers = scrubbing
    async with jetstream.connect(",".join(b.address for b in brokers)) as js:
        await fill(js)
        leader = (await js.stream_info(STREAM)).partitions[0].leader
        victim = brokers[(leader + 1) % 3]
        flip_five_bits(victim)

        async def left() -> bool | None:
            # It may be healed and back within a few ms: the leader counts the shrink.
            shrinks = await metric(brokers[leader], "jetstream_partition_isr_shrinks_total")
            return True if shrinks >= 1 else None
        await eventually(left, "the damaged follower out of the ISR")

        async def rejoined() -> bool | None:
            isr = (await js.stream_info(STREAM)).partitions[0].isr
            return True if len(isr) == 3 else None
        await eventually(rejoined, "the healed follower back in the ISR")
        assert await metric(victim, "jetstream_damage_repaired_total") >= 1
        assert (await integrity_of(victim))["damage"] == []
        # Healed in place: byte for byte the leader's copy again.
        assert same_files(victim, brokers[leader])
        assert await read_everything(js) == [value(i) for i in range(COUNT)]


async def test_a_damaged_leader_serves_every_record_right_and_heals(
        quiet: list[BrokerProcess]) -> None:
    brokers = quiet
    async with jetstream.connect(",".join(b.address for b in brokers)) as js:
        await fill(js)
        leader = brokers[(await js.stream_info(STREAM)).partitions[0].leader]
        flip_five_bits(leader)
        # The leader checked these bytes when it wrote them, so it sends them as they are;
        # the reader meets the CRC mismatch, asks again with every byte checked, and the
        # leader heals from a follower's copy before answering.
        assert await read_everything(js) == [value(i) for i in range(COUNT)]
        assert await metric(leader, "jetstream_damage_repaired_total") >= 1
        assert (await integrity_of(leader))["damage"] == []
        follower = next(b for b in brokers if b is not leader)
        assert same_files(leader, follower)


async def test_damage_in_every_copy_is_a_lost_range_and_the_rest_reads(
        quiet: list[BrokerProcess]) -> None:
    brokers = quiet
    async with jetstream.connect(",".join(b.address for b in brokers)) as js:
        await fill(js)
        for broker in brokers:  # the same batch in every replica (they are byte-identical)
            flip_five_bits(broker)
        with pytest.raises(RangeLost) as lost:
            await read_everything(js)
        first, end = lost.value.first_offset, lost.value.end_offset
        assert 0 < first < end < COUNT
        # Everything else reads, and right.
        assert await read_everything(js, end) == [value(i) for i in range(end, COUNT)]
        before = []
        offset = 0
        while offset < first:
            result = await js.fetch(STREAM, 0, offset, max_bytes=1024)
            before.extend(m.value for m in result.messages if m.offset < first)
            offset = result.next_offset
        assert before == [value(i) for i in range(first)]
        leader = brokers[(await js.stream_info(STREAM)).partitions[0].leader]
        assert (await integrity_of(leader))["lost"] == [
            {"first_offset": first, "end_offset": end}]
        assert await metric(leader, "jetstream_lost_ranges") == 1
    # An operator's scrub lists the range as lost on every replica and exits 1.
    addresses = ",".join(b.address for b in brokers)
    result = cli(addresses, "scrub", STREAM, "--json", ok=False)
    assert result.returncode == 1, result.stderr
    replicas = json.loads(result.stdout)["replicas"]
    assert sorted(r["broker_id"] for r in replicas) == [0, 1, 2]
    for replica in replicas:
        assert replica["lost"] == [{"first_offset": first, "end_offset": end}], replica
