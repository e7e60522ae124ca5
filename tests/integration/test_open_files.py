"""A broker holding hundreds of partitions within a small budget of open files: its
descriptors (counted in /proc/PID/fd) stay under `open_files_max`, reads of sealed segments
across every partition return the right records, before and after a restart, and the key
indexes of a compacted stream share the budget. /health and /metrics report the limit, the
budget and the open count."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import jetstream
from jetstream.client import Client
from jetstream.client.types import PublishMessage
from jetstream.server.process import BrokerProcess

PARTITIONS = 300
ROUNDS = 3
OPEN_FILES_MAX = 64
#: Descriptors a broker holds besides partition files: its output, the logs lock, the
#: epoll, listening and NATS sockets, a client or two, a NATS server's pipes.
OTHER_FDS_MAX = 40
#: Over half of segment_bytes_max: each message is a batch of its own, in a segment of its
#: own, so every round but the last leaves a sealed segment in every partition.
VALUE_BYTES = 2500
SETTLE_S = 5.0
POLL_S = 0.02


@pytest.fixture
def budgeted(tmp_path: Path, nats_url: str) -> Iterator[BrokerProcess]:
    """A broker holding at most OPEN_FILES_MAX partition files open, stopped after the test."""
    process = BrokerProcess(tmp_path / "broker", nats_url,
                            extra_args=("--open-files-max", str(OPEN_FILES_MAX)))
    try:
        yield process.start()
    finally:
        process.stop()


def _value(partition: int, round_: int) -> bytes:
    head = f"{partition}:{round_}|".encode()
    return (head * (VALUE_BYTES // len(head) + 1))[:VALUE_BYTES]


def _fd_targets(pid: int) -> list[str]:
    targets = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            targets.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except FileNotFoundError:  # closed meanwhile
            continue
    return targets


def _partition_files(broker: BrokerProcess) -> list[str]:
    """The broker's open descriptors of files under its logs directory (segments, key
    indexes), the logs lock aside."""
    logs = str(broker.data_dir.resolve() / "logs")
    return [t for t in _fd_targets(broker.pid)
            if t.startswith(logs + "/") and not t.endswith("/.logs.lock")]


def _hard_limit(pid: int) -> int:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            assert soft == hard, line  # raised at start
            return int(hard)
    raise AssertionError("no open-file limit in /proc/PID/limits")


def _assert_within_budget(broker: BrokerProcess) -> None:
    """The broker's partition files within the budget, and all its descriptors within the
    budget and a few more. A read's answer is sent from a duplicate of its segment's
    descriptor, closed once sent, which may be a moment after the client has it: wait for
    that (with a deadline)."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        files, every = _partition_files(broker), _fd_targets(broker.pid)
        within = len(files) <= OPEN_FILES_MAX and len(every) <= OPEN_FILES_MAX + OTHER_FDS_MAX
        if within or time.monotonic() > deadline:
            break
        time.sleep(POLL_S)
    assert len(files) <= OPEN_FILES_MAX, sorted(files)
    assert len(every) <= OPEN_FILES_MAX + OTHER_FDS_MAX, sorted(every)


def _files_metrics(broker: BrokerProcess) -> dict[str, int]:
    metrics = httpx.get(f"{broker.http_url}/metrics").text
    return {name: int(value) for name, value in (line.split() for line in metrics.splitlines()
                                                 if line.startswith("jetstream_files_"))}


async def _read_every_partition(js: Client) -> None:
    for p in range(PARTITIONS):
        offset, values = 0, []
        while offset < ROUNDS:
            result = await js.fetch("wide", p, offset, max_bytes=1)  # a batch at a time
            values += [m.value for m in result.messages]
            offset = result.next_offset
        assert values == [_value(p, r) for r in range(ROUNDS)], p


async def test_hundreds_of_partitions_stay_within_the_open_files_budget(
        budgeted: BrokerProcess) -> None:
    broker = budgeted
    async with jetstream.connect(broker.address) as js:
        await js.create_stream("wide", "wide.in", partitions=PARTITIONS, segment_bytes_max=4096)
        for r in range(ROUNDS):
            # One message per partition per round, all acked before the next round.
            acks = await js.publish_batch(
                [PublishMessage("wide.in", _value(p, r), partition=p)
                 for p in range(PARTITIONS)], window=PARTITIONS)
            assert sorted(a.offset for a in acks) == [r] * PARTITIONS
        _assert_within_budget(broker)
        listing = await js.list_segments("wide", 7)
        assert len(listing.segments) == ROUNDS  # two sealed, one active
        await _read_every_partition(js)
        _assert_within_budget(broker)
    async with httpx.AsyncClient(base_url=broker.http_url) as http:
        health = (await http.get("/health")).json()["files"]
    assert health["open_files_max"] == OPEN_FILES_MAX
    assert 0 < health["open"] <= OPEN_FILES_MAX
    assert health["limit"] == health["hard_limit"] == _hard_limit(broker.pid)
    assert health["process_open"] <= OPEN_FILES_MAX + OTHER_FDS_MAX
    figures = _files_metrics(broker)
    assert figures["jetstream_files_max"] == OPEN_FILES_MAX
    # Far more partitions than descriptors: files were closed and opened again.
    assert figures["jetstream_files_evictions_total"] >= PARTITIONS

    broker.restart()  # every log opened again (recovery) within the budget
    async with jetstream.connect(broker.address) as js:
        _assert_within_budget(broker)
        await _read_every_partition(js)
    _assert_within_budget(broker)


async def test_key_indexes_share_the_open_files_budget(budgeted: BrokerProcess) -> None:
    # 40 key indexes of 3 descriptors each would not fit in 64 beside the segments.
    partitions, keys = 40, 200
    async with jetstream.connect(budgeted.address) as js:
        await js.create_stream("table", "table.in", partitions=partitions,
                               cleanup_policy="compact")
        for r in range(2):
            acks = await js.publish_batch(
                [PublishMessage("table.in", f"{k}:{r}".encode(), key=f"k{k}".encode())
                 for k in range(keys)], window=keys)
        assert len({a.partition for a in acks}) > partitions // 2
        for k, ack in enumerate(acks):  # the second round's: each key's newest value
            entry = await js.get("table", f"k{k}".encode(), min_offset=ack.offset)
            assert entry is not None and entry.value == f"{k}:1".encode(), k
            assert entry.partition == ack.partition and entry.offset == ack.offset
            _assert_within_budget(budgeted)
    # The indexes did not fit: some were closed and opened again by a later read.
    assert _files_metrics(budgeted)["jetstream_files_evictions_total"] > 0
