"""The bulk reader's calls against real brokers: LIST_SEGMENTS (the leader's segment files,
sizes and high watermark of one moment) read the way Spark reads them, straight from the
files, and fetch_raw (undecoded record batches); their errors; and in a 3-broker cluster,
the answer coming from the leader only."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

import jetstream
from jetstream.client import BrokerConnection, Client, RawFetch, SegmentListing, sync
from jetstream.errors import NotLeader, OffsetOutOfRange, UnknownPartition, UnknownStream
from jetstream.protocol import messages as m
from jetstream.server.process import BrokerProcess
from jetstream.server.roles import STREAM_VERSION_FILE
from jetstream.stream.format import StoredRecord, decode_batches
from jetstream.stream.segment import log_file_name
from tests.integration.test_cluster import STREAM, SUBJECT, create_stream
from tests.integration.test_cluster import cluster as cluster  # the fixture, re-exported

DEADLINE_S = 10.0
#: Small segments, so a few hundred records span several files.
SEGMENT_BYTES = 4096


def values(count: int) -> list[bytes]:
    return [b"value-%04d-" % i + b"x" * 80 for i in range(count)]


def check_files(listing: SegmentListing, data_dir: Path) -> None:
    """The listing names the partition's directory under `data_dir`, its version marker,
    and files at least as long as the sizes listed."""
    directory = Path(listing.directory)
    assert directory.is_absolute()
    assert directory.resolve() == (
        data_dir / "logs" / f"{listing.stream}-{listing.partition}").resolve()
    assert Path(listing.version_file) == directory / STREAM_VERSION_FILE
    assert Path(listing.version_file).read_text() == listing.stream_version
    for base, size in listing.segments:
        assert size <= (directory / log_file_name(base)).stat().st_size


def read_files(listing: SegmentListing) -> list[StoredRecord]:
    """The committed records of a listing, read from its files as a bulk reader does: at
    most the listed size of each, nothing at or past the high watermark."""
    data = b""
    for base, size in listing.segments:
        with open(Path(listing.directory) / log_file_name(base), "rb") as f:
            part = f.read(size)
        assert len(part) == size
        data += part
    records = decode_batches(data, min_offset=listing.log_start_offset)
    return [r for r in records if r.offset < listing.high_watermark]


async def fetch_all_raw(js: Client, stream: str, start: int, end: int,
                        max_bytes: int = 1024) -> list[StoredRecord]:
    records: list[StoredRecord] = []
    offset = start
    while offset < end:
        raw = await js.fetch_raw(stream, 0, offset, max_bytes)
        assert isinstance(raw.payload, bytes) and raw.payload
        records += decode_batches(raw.payload, min_offset=offset)
        assert raw.next_offset > offset
        offset = raw.next_offset
    return records


async def test_list_segments_names_the_files_of_the_committed_log(broker: BrokerProcess,
                                                                  js: Client) -> None:
    await js.create_stream("bulk", "bulk.in", segment_bytes_max=SEGMENT_BYTES)
    published = values(300)
    acks = await js.publish_batch([("bulk.in", v) for v in published], window=50)

    listing = await js.list_segments("bulk", 0)

    assert listing.high_watermark == acks[-1].offset + 1 == 300
    assert (listing.stream, listing.partition, listing.broker_id) == ("bulk", 0, 0)
    assert (listing.log_start_offset, listing.log_end_offset) == (0, 300)
    assert listing.leader_epoch >= 0
    check_files(listing, broker.data_dir)
    bases = [base for base, _size in listing.segments]
    assert len(bases) > 3 and bases[0] == 0 and bases == sorted(set(bases))
    assert isinstance(listing.segments, tuple) and isinstance(listing.segments[0], tuple)
    assert all(size > 0 for _base, size in listing.segments)
    records = read_files(listing)
    assert [r.offset for r in records] == list(range(300))
    assert [r.value for r in records] == published


async def test_listings_taken_while_publishing_are_consistent(broker: BrokerProcess,
                                                              js: Client) -> None:
    await js.create_stream("busy", "busy.in", segment_bytes_max=SEGMENT_BYTES)
    published = values(2000)
    publishing = asyncio.create_task(
        js.publish_batch([("busy.in", v) for v in published], window=100))
    listings = 0
    try:
        while not publishing.done() or listings == 0:
            listing = await js.list_segments("busy", 0)
            # Every committed record is in the files within the sizes listed: the segment
            # list, the sizes and the high watermark are of one moment.
            records = read_files(listing)
            assert [r.offset for r in records] == list(range(listing.high_watermark))
            assert [r.value for r in records] == published[:listing.high_watermark]
            check_files(listing, broker.data_dir)
            listings += 1
    finally:
        acks = await publishing
    assert len(acks) == 2000 and listings > 1


async def test_fetch_raw_returns_the_batches_undecoded(js: Client) -> None:
    await js.create_stream("raw", "raw.in", segment_bytes_max=SEGMENT_BYTES)
    published = values(120)
    await js.publish_batch([("raw.in", v) for v in published], window=20)

    raw = await js.fetch_raw("raw", 0, 0, 1 << 20)
    assert isinstance(raw, RawFetch)
    assert (raw.high_watermark, raw.log_start_offset, raw.log_end_offset) == (120, 0, 120)
    # Whole batches straight from the log: what a Fetch carries before the client decodes.
    assert [r.value for r in decode_batches(raw.payload)] == published[:raw.next_offset]
    assert [r.value for r in await fetch_all_raw(js, "raw", 0, 120)] == published
    # From inside the log, in small pieces: the first batch may start below the offset.
    assert [r.value for r in await fetch_all_raw(js, "raw", 57, 120, max_bytes=1)] == (
        published[57:])
    at_end = await js.fetch_raw("raw", 0, 120, 1024)
    assert (at_end.payload, at_end.next_offset, at_end.high_watermark) == (b"", 120, 120)
    waited = await js.fetch_raw("raw", 0, 120, 1024, max_wait_ms=50)
    assert (waited.payload, waited.next_offset) == (b"", 120)


async def test_errors_are_the_usual_ones(js: Client) -> None:
    await js.create_stream("known", "known.in")
    await js.publish_batch([("known.in", v) for v in values(10)])

    with pytest.raises(OffsetOutOfRange) as caught:
        await js.fetch_raw("known", 0, 50, 1024)
    assert (caught.value.offset, caught.value.oldest, caught.value.newest) == (50, 0, 10)
    with pytest.raises(UnknownStream):
        await js.list_segments("unknown", 0)
    with pytest.raises(UnknownStream):
        await js.fetch_raw("unknown", 0, 0, 1024)
    with pytest.raises(UnknownPartition):
        await js.list_segments("known", 1)
    with pytest.raises(UnknownPartition):
        await js.fetch_raw("known", 1, 0, 1024)


@pytest.fixture
def fast_retention_broker(tmp_path: Path, nats_url: str) -> Iterator[BrokerProcess]:
    process = BrokerProcess(tmp_path / "broker", nats_url,
                            extra_args=("--retention-check-ms", "20",
                                        "--checkpoint-interval-ms", "20"))
    try:
        yield process.start()
    finally:
        process.stop()


async def test_listing_after_retention_starts_at_the_log_start(
        fast_retention_broker: BrokerProcess) -> None:
    async with jetstream.connect(fast_retention_broker.address) as js:
        await js.create_stream("short", "short.in", segment_bytes_max=SEGMENT_BYTES,
                               retention_bytes=3 * SEGMENT_BYTES)
        published = values(300)
        await js.publish_batch([("short.in", v) for v in published], window=50)

        async def trimmed() -> SegmentListing:
            # Until retention is done (the log within retention_bytes), so that no file the
            # listing names is deleted while this test reads it.
            while (listing := await js.list_segments("short", 0)).log_start_offset == 0 or \
                    sum(size for _base, size in listing.segments) > 3 * SEGMENT_BYTES:
                await asyncio.sleep(0.02)
            return listing

        listing = await asyncio.wait_for(trimmed(), DEADLINE_S)
        start = listing.log_start_offset
        assert listing.segments[0][0] <= start < listing.high_watermark == 300
        check_files(listing, fast_retention_broker.data_dir)
        assert [r.value for r in read_files(listing)] == published[start:]
        with pytest.raises(OffsetOutOfRange) as caught:
            await js.fetch_raw("short", 0, 0, 1024)
        assert caught.value.oldest == start


def test_sync_client_lists_and_fetches_raw(broker: BrokerProcess) -> None:
    with sync.connect(broker.address) as js:
        js.create_stream("plain", "plain.in")
        js.publish("plain.in", b"one")
        listing = js.list_segments("plain", 0)
        assert (listing.high_watermark, listing.segments) == (1, ((0, listing.segments[0][1]),))
        raw = js.fetch_raw("plain", 0, 0, 1024)
        assert [r.value for r in decode_batches(raw.payload)] == [b"one"]


async def test_the_leader_answers_in_a_cluster(cluster: list[BrokerProcess]) -> None:
    state = await create_stream(cluster[0], segment_bytes_max=SEGMENT_BYTES)
    published = values(100)
    async with jetstream.connect(",".join(b.address for b in cluster)) as js:
        acks = await js.publish_batch([(SUBJECT, v) for v in published], window=20)
        assert len(acks) == 100
        listing = await js.list_segments(STREAM, 0)
        raw = await js.fetch_raw(STREAM, 0, 0, 1 << 20)

    leader = next(b for b in cluster if b.broker_id == state["leader"])
    assert listing.broker_id == leader.broker_id
    assert listing.high_watermark == 100
    check_files(listing, leader.data_dir)
    assert [r.value for r in read_files(listing)] == published
    assert decode_batches(raw.payload)[0].value == published[0]
    for follower in (b for b in cluster if b is not leader):
        conn = BrokerConnection(follower.address, client_id="test")
        await conn.open()
        try:
            with pytest.raises(NotLeader) as caught:
                await conn.request(m.ListSegmentsRequest(STREAM, 0))
        finally:
            await conn.close()
        assert caught.value.leader_id == leader.broker_id
