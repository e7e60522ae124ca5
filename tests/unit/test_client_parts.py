"""The client's pure parts without a broker: the metadata cache, partition choice, and a
subscription driven by a stand-in reader (all it needs of the client is PartitionReader)."""

from __future__ import annotations

import inspect
import zlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jetstream.client import client as client_module
from jetstream.client import sync
from jetstream.client.metadata import ClusterMetadata, partition_of
from jetstream.client.partitioner import VALID_SUBJECTS_MAX, Partitioner
from jetstream.client.subscription import PartitionReader, Subscription
from jetstream.client.types import FetchResult, Message, Start, StreamInfo
from jetstream.errors import ProtocolError, UnknownPartition
from jetstream.protocol import messages as m


def stream(name: str, subject: str, partitions: int) -> StreamInfo:
    return StreamInfo.from_dict({
        "name": name, "subject": subject,
        "partitions": [{"partition": p, "leader": 1, "leader_epoch": 0, "replicas": [1],
                        "isr": [1]} for p in range(partitions)]})


# -- metadata ------------------------------------------------------------------------------------


def test_metadata_indexes_streams_by_subject_and_counts_partitions() -> None:
    metadata = ClusterMetadata()
    metadata.set_streams([stream("b", "orders", 3), stream("a", "orders", 1),
                          stream("c", "other", 2)], now=10.0)
    assert [s.name for s in metadata.streams_on("orders")] == ["a", "b"]
    assert metadata.partition_count("orders") == 3  # the first by name with more than one
    assert metadata.partition_count("nobody.reads.this") == 1
    metadata.drop_stream("b")
    assert metadata.partition_count("orders") == 1
    metadata.put_stream(stream("b", "orders", 5))
    assert metadata.partition_count("orders") == 5
    assert not metadata.is_stale(now=39.0, max_age_s=30.0)
    assert metadata.is_stale(now=41.0, max_age_s=30.0)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["put", "drop"]), st.sampled_from("abcdef"),
                          st.sampled_from(["x", "y", "z"])), max_size=40))
def test_metadata_index_by_subject_matches_a_rebuild_after_any_changes(
        changes: list[tuple[str, str, str]]) -> None:
    """put_stream and drop_stream correct the subject index in place: it always equals the
    index of the same streams set at once."""
    metadata = ClusterMetadata()
    metadata.set_streams([stream("c", "x", 1), stream("a", "y", 2)], now=0.0)
    for change, name, subject in changes:
        if change == "put":
            metadata.put_stream(stream(name, subject, 1 + ord(name) % 3))
        else:
            metadata.drop_stream(name)
    rebuilt = ClusterMetadata()
    current = [s for s in (metadata.stream(n) for n in "abcdef") if s is not None]
    rebuilt.set_streams(current, now=0.0)
    for subject in ("x", "y", "z"):
        assert metadata.streams_on(subject) == rebuilt.streams_on(subject)


def test_metadata_names_brokers_by_id_and_no_leader_as_none() -> None:
    metadata = ClusterMetadata()
    metadata.set_brokers([{"id": 2, "host": "h2", "port": 2}, {"id": 1, "host": "h1", "port": 1}])
    assert [b.address for b in metadata.broker_list()] == ["h1:1", "h2:2"]
    metadata.set_metadata_leader(-1)
    assert metadata.metadata_leader is None
    metadata.set_metadata_leader(2)
    assert metadata.metadata_leader == 2


def test_partition_of_checks_the_range() -> None:
    info = stream("s", "s", 2)
    assert partition_of(info, 1).partition == 1
    for bad in (-1, 2):
        with pytest.raises(UnknownPartition):
            partition_of(info, bad)


# -- partitioner ---------------------------------------------------------------------------------


def test_partitioner_honours_the_partition_then_the_key_then_round_robin() -> None:
    partitioner = Partitioner(lambda subject: 3 if subject == "orders" else 1)
    assert partitioner.subject_for("orders", b"k", 2) == "orders.2"
    assert partitioner.subject_for("orders", b"k", 0) == "orders"
    expected = zlib.crc32(b"k") % 3
    assert partitioner.subject_for("orders", b"k", None) == \
        ("orders" if expected == 0 else f"orders.{expected}")
    assert [partitioner.subject_for("orders", None, None) for _ in range(4)] == \
        ["orders", "orders.1", "orders.2", "orders"]
    assert partitioner.subject_for("single", None, None) == "single"


@pytest.mark.parametrize("subject", ["orders.*", "orders.>", "", "a..b"])
def test_partitioner_refuses_what_cannot_be_published_on(subject: str) -> None:
    with pytest.raises(ProtocolError) as caught:
        Partitioner(lambda s: 1).subject_for(subject, None, None)
    assert caught.value.fields["field"] == "subject"


def test_partitioner_remembers_a_bounded_number_of_subjects() -> None:
    partitioner = Partitioner(lambda s: 1)
    for i in range(VALID_SUBJECTS_MAX + 10):
        partitioner.subject_for(f"s{i}", None, None)
    assert len(partitioner._valid_subjects) <= VALID_SUBJECTS_MAX


# -- subscription --------------------------------------------------------------------------------


class Partition:
    """A stand-in PartitionReader: a committed log of `hw` messages from `log_start`."""

    def __init__(self, hw: int, log_start: int = 0, batch: int = 3) -> None:
        self.hw, self.log_start, self.batch = hw, log_start, batch
        self.fetches: list[int] = []

    async def fetch(self, stream: str, partition: int, offset: int, *, max_bytes: int,
                    max_wait_ms: int, read_isr_replica: bool) -> FetchResult:
        self.fetches.append(offset)
        end = min(offset + self.batch, self.hw)
        messages = [Message(stream, partition, o, 0, b"v%d" % o, None, {}, "s", 0)
                    for o in range(offset, end)]
        return FetchResult(messages, self.hw, self.log_start, self.hw, max(end, offset))

    async def offset_for_timestamp(self, stream: str, partition: int,
                                   timestamp_ms: int) -> int:
        if timestamp_ms == m.EARLIEST_TIMESTAMP:
            return self.log_start
        if timestamp_ms == m.LATEST_TIMESTAMP:
            return self.hw
        return min(self.log_start + timestamp_ms, self.hw)


def subscription(reader: PartitionReader, **options: Any) -> Subscription:
    settings: dict[str, Any] = {"start": Start.EARLIEST, "offset": None, "timestamp_ms": None,
                                "stop": "latest", "max_bytes": 1024, "max_wait_ms": 0}
    return Subscription(reader, "s", 0, **{**settings, **options})


@pytest.mark.parametrize(
    ("options", "offsets"),
    [
        ({}, [2, 3, 4, 5, 6, 7]),
        ({"start": Start.LATEST}, [7]),
        ({"start": Start.NEW_ONLY}, []),
        ({"start": Start.OFFSET, "offset": 5}, [5, 6, 7]),
        ({"start": Start.TIMESTAMP, "timestamp_ms": 3}, [5, 6, 7]),
        ({"stop": 4}, [2, 3]),
    ],
)
async def test_a_subscription_reads_from_its_start_to_its_stop(options: dict[str, Any],
                                                              offsets: list[int]) -> None:
    reader = Partition(hw=8, log_start=2)
    async with subscription(reader, **options) as sub:
        assert [msg.offset async for msg in sub] == offsets


async def test_closing_a_subscription_tells_its_owner_and_ends_the_iteration() -> None:
    closed: list[Subscription] = []
    sub = subscription(Partition(hw=10), stop=None, on_close=closed.append)
    assert [msg.offset for msg in await sub.next_batch() or []] == [0, 1, 2]
    await sub.close()
    assert closed == [sub]
    assert await sub.next_batch() is None


# -- the sync facade -----------------------------------------------------------------------------


def test_sync_connect_takes_the_arguments_of_connect() -> None:
    assert inspect.signature(sync.connect).parameters == \
        inspect.signature(client_module.connect).parameters
