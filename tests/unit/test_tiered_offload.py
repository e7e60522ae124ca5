"""The offload pass and store reads of one partition, on real logs and a real `file://` store
(the same tests run against moto's S3 in tests/integration/test_tiered.py): offloaded data
read back byte for byte after local deletion, a crash at every step of a pass, a corrupted
object, listings that pick up another writer's fragments and drop pruned ones."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from jetstream.errors import CorruptFragment, FragmentStoreUnavailable, OffsetOutOfRange
from jetstream.stream import format as fmt
from jetstream.stream.handles import HandlePool
from jetstream.stream.log import Log
from jetstream.tiered.index import StoredFragment
from jetstream.tiered.names import Compression, partition_prefix
from jetstream.tiered.offload import PassResult
from jetstream.tiered.partition_tier import PartitionTier, TierConfig
from jetstream.tiered.planner import TotalRetention
from jetstream.tiered.reader import FragmentCache
from jetstream.tiered.settings import StoreRetention, TieredSettings
from jetstream.tiered.store import FragmentStore, StoreRegistry
from tests.unit.log_helpers import Clock, append_n, make

STREAM, PARTITION = "orders", 0
NO_RETENTION = TotalRetention(None, None, None)
STEPS = ("listed", "read", "put", "verified", "deleted_local")


class Crash(Exception):
    """A pass stopped dead at a step (the broker was killed there)."""


def settings(url: str, compression: Compression = Compression.NONE,
             local_bytes: int | None = 1, ) -> TieredSettings:
    return TieredSettings(url, compression, None, local_bytes, StoreRetention.DELETE)


def new_tier(url: str, tmp_path: Path, *, crash_at: str | None = None,
             compression: Compression = Compression.NONE,
             local_bytes: int | None = 1) -> PartitionTier:
    def hook(step: str) -> None:
        if step == crash_at:
            raise Crash(step)

    cache = FragmentCache(tmp_path / f"cache-{id(hook)}", 1 << 30, HandlePool(64), None)
    return PartitionTier(STREAM, PARTITION, settings(url, compression, local_bytes),
                         StoreRegistry(), cache, TierConfig(), None, hook)


def run_pass(tier: PartitionTier, log: Log, hw: int | None = None,
             total: TotalRetention = NO_RETENTION, now_ms: int = 0) -> PassResult | Exception:
    job = tier.prepare(log, log.log_end_offset if hw is None else hw, total, now_ms,
                       now_ms)
    try:
        outcome: PassResult | Exception = job()
    except Exception as exc:
        outcome = exc
    tier.finish(outcome, now_ms)
    return outcome


async def read_all(tier: PartitionTier, log: Log, start: int, end: int) -> bytes:
    """Every batch from `start` to `end`, from the store below the local log start and from
    the log above it, as one run of bytes."""
    out = bytearray()
    offset = start
    while offset < end:
        if offset < log.log_start_offset:
            piece = await tier.read(offset, 64 * 1024, end, log)
        else:
            piece = log.read(offset, 64 * 1024, end)
        with piece:
            assert piece.length > 0 and piece.first_offset == offset
            out += piece.read()
            offset = piece.next_offset
    return bytes(out)


@pytest.fixture
def segmented(tmp_path: Path) -> Iterator[tuple[Log, bytes]]:
    """A log of 200 offsets over about ten segments, and its bytes as read before any
    offload."""
    log = make(tmp_path / "log", Clock(), segment_bytes_max=4096)
    append_n(log, 100, per_batch=2)
    assert len(log.segment_base_offsets) >= 8
    original = asyncio.run(read_all(None, log, 0, 200))  # type: ignore[arg-type]
    yield log, original
    log.close()


def store_url(tmp_path: Path) -> str:
    return f"file://{tmp_path / 'store'}"


def offloaded(log: Log, tmp_path: Path, local_bytes: int | None = 1
              ) -> tuple[str, PartitionTier, StoredFragment]:
    """The store's URL, a tier that offloaded every sealed segment of `log` (and deleted
    them locally, unless `local_bytes` is None) and the fragment holding offset 0."""
    url = store_url(tmp_path)
    tier = new_tier(url, tmp_path, local_bytes=local_bytes)
    for _ in range(5):
        run_pass(tier, log)
    first = tier.index.covering(0)
    assert first is not None
    return url, tier, first


def keys(url: str) -> list[str]:
    return sorted(o.key for o in FragmentStore(url).list_keys(
        partition_prefix("", STREAM, PARTITION)))


@pytest.mark.parametrize("compression", list(Compression))
def test_offloaded_data_reads_back_byte_for_byte(segmented: tuple[Log, bytes], tmp_path: Path,
                                                 compression: Compression) -> None:
    log, original = segmented
    url = store_url(tmp_path)
    tier = new_tier(url, tmp_path, compression=compression)
    sealed = len(log.segment_base_offsets) - 1
    while isinstance(result := run_pass(tier, log), PassResult) and result.uploaded:
        pass
    assert isinstance(result, PassResult)
    assert len(keys(url)) == sealed and all(k.endswith(compression.extension)
                                            for k in keys(url))
    # Local retention of 1 byte: every sealed segment left once verified in the store.
    assert len(log.segment_base_offsets) == 1 and log.log_start_offset > 0
    assert tier.start_offset(log) == 0 and tier.metrics.backlog_bytes == 0
    assert asyncio.run(read_all(tier, log, 0, 200)) == original


def test_nothing_uncommitted_is_offloaded_nor_deleted(segmented: tuple[Log, bytes],
                                                      tmp_path: Path) -> None:
    log, _original = segmented
    url = store_url(tmp_path)
    tier = new_tier(url, tmp_path)
    run_pass(tier, log, hw=0)
    assert keys(url) == [] and log.log_start_offset == 0
    assert tier.listed and tier.metrics.backlog_bytes == 0


@pytest.mark.parametrize("crash_at", STEPS)
def test_a_crash_at_any_step_loses_nothing_and_duplicates_nothing(
        segmented: tuple[Log, bytes], tmp_path: Path, crash_at: str) -> None:
    log, original = segmented
    url = store_url(tmp_path)
    crashed = new_tier(url, tmp_path, crash_at=crash_at)
    outcome = run_pass(crashed, log)
    assert isinstance(outcome, Crash)
    # What the crash left: every offset still readable, locally or from verified objects.
    assert log.log_start_offset == 0 or crash_at == "deleted_local"
    # The next leader (a fresh tier: nothing in memory) resumes from the listing alone.
    resumed = new_tier(url, tmp_path)
    for _ in range(10):
        run_pass(resumed, log)
    sealed_bases = [f.begin for f in resumed.index.fragments]
    assert len(keys(url)) == len(set(sealed_bases)) == len(resumed.index)
    assert len(log.segment_base_offsets) == 1
    assert asyncio.run(read_all(resumed, log, 0, 200)) == original


def test_a_corrupt_object_is_an_error_naming_it(segmented: tuple[Log, bytes],
                                                tmp_path: Path) -> None:
    log, _original = segmented
    url, tier, first = offloaded(log, tmp_path)
    path = tmp_path / "store" / first.name.key("")
    data = bytearray(path.read_bytes())
    data[100] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptFragment) as info:
        asyncio.run(tier.read(0, 4096, 200, log))
    assert info.value.url == f"{url}/{first.name.key('')}"


def test_listing_picks_up_other_writers_and_drops_pruned(segmented: tuple[Log, bytes],
                                                         tmp_path: Path) -> None:
    log, _original = segmented
    url, writer, _first = offloaded(log, tmp_path, None)  # keeps its local copy
    # A reader elsewhere (another cluster's broker) on an empty log: the listing is all.
    other = make(tmp_path / "other", Clock())
    reader = new_tier(url, tmp_path, local_bytes=None)
    moved = asyncio.run(reader.open_log(other, lambda: False))
    assert moved and other.log_start_offset == writer.index.end_offset
    stored_end = other.log_start_offset
    assert asyncio.run(read_all(reader, other, 0, stored_end)) == \
        asyncio.run(read_all(writer, log, 0, stored_end))
    # A prune by the writer; the reader's next listing drops the pruned fragments.
    pruned = asyncio.run(writer.prune(log, 100, None))
    assert pruned.deleted_fragments and all(f.end <= 100 for f in pruned.deleted_fragments)
    cut = max(f.end for f in pruned.deleted_fragments)
    assert log.log_start_offset == writer.start_offset(log) == cut
    reader.listed = False  # the listing interval passed
    run_pass(reader, other)
    assert all(f.end > 100 for f in reader.index.all())
    with pytest.raises(Exception) as info:
        asyncio.run(reader.read(0, 4096, stored_end, other))
    assert getattr(info.value, "code", "") == "OFFSET_OUT_OF_RANGE"
    other.close()


def test_a_read_past_the_index_lists_the_store_once_before_it_is_refused(
        segmented: tuple[Log, bytes], tmp_path: Path) -> None:
    log, original = segmented
    url = store_url(tmp_path)
    # A new leader's index, listed while the store was still empty (its follower's last
    # listing); the old leader offloads everything after that.
    other = make(tmp_path / "other", Clock())
    reader = new_tier(url, tmp_path, local_bytes=None)
    assert asyncio.run(reader.list_once(0)) and reader.index.covering(0) is None
    url, writer, first = offloaded(log, tmp_path, None)
    listings = 0
    list_once = reader.list_once

    async def counted(now_ms: int) -> bool:
        nonlocal listings
        listings += 1
        return await list_once(now_ms)
    reader.list_once = counted  # type: ignore[method-assign]

    async def read(tier: PartitionTier) -> bytes:
        with await tier.read(0, 1 << 20, first.end, other) as piece:
            assert piece.first_offset == 0 and piece.next_offset == first.end
            return piece.read()
    assert asyncio.run(read(reader)) == asyncio.run(read(writer))
    assert original.startswith(asyncio.run(read(reader)))
    assert listings == 1
    # Past what the store holds: refused, without listing again within LIST_ON_MISS_MS.
    with pytest.raises(OffsetOutOfRange):
        asyncio.run(reader.read(writer.index.end_offset, 4096, 10**6, other))
    assert listings == 1
    other.close()


def test_retention_deletes_the_oldest_fragments_and_local_segments(
        segmented: tuple[Log, bytes], tmp_path: Path) -> None:
    log, _original = segmented
    url, tier, _first = offloaded(log, tmp_path, None)
    stored = len(keys(url))
    run_pass(tier, log, total=TotalRetention(None, None, 100))
    assert 0 < len(keys(url)) < stored
    assert tier.start_offset(log) >= 100 - 2 * 10 and log.log_start_offset >= 90


def test_an_unreachable_store_fails_the_pass_and_backs_off(segmented: tuple[Log, bytes],
                                                           tmp_path: Path) -> None:
    log, _original = segmented
    blocker = tmp_path / "not-a-dir"
    blocker.write_bytes(b"")
    tier = new_tier(f"file://{blocker}/store", tmp_path)
    outcome = run_pass(tier, log, now_ms=1000)
    assert isinstance(outcome, FragmentStoreUnavailable)
    assert tier.store_error is not None and tier.store_error.code == \
        "FRAGMENT_STORE_UNAVAILABLE"
    assert log.log_start_offset == 0  # nothing deleted
    due, deleted = tier.finish(outcome, 2000)
    assert not deleted and 2000 < due <= 2000 + TierConfig().backoff_ms_max


def test_batches_in_a_fragment_are_the_segment_format(segmented: tuple[Log, bytes],
                                                      tmp_path: Path) -> None:
    log, _original = segmented
    url = store_url(tmp_path)
    tier = new_tier(url, tmp_path, local_bytes=None)
    run_pass(tier, log)
    first = tier.index.covering(0)
    assert first is not None
    data = (tmp_path / "store" / first.name.key("")).read_bytes()
    batches = list(fmt.iter_batches(data))
    assert batches[0][1].base_offset == 0 and batches[-1][1].next_offset == first.end


def test_a_fragment_gone_since_the_listing_is_out_of_range(segmented: tuple[Log, bytes],
                                                           tmp_path: Path) -> None:
    log, _original = segmented
    _url, tier, first = offloaded(log, tmp_path)
    (tmp_path / "store" / first.name.key("")).unlink()  # a lifecycle rule took it
    with pytest.raises(OffsetOutOfRange) as info:
        asyncio.run(tier.read(0, 4096, 200, log))
    assert info.value.oldest == first.end and tier.index.covering(0) is None


def test_timestamp_lookups_reach_into_the_store(tmp_path: Path) -> None:
    log = make(tmp_path / "log", Clock(), segment_bytes_max=4096)
    for i in range(200):  # one record a second, from T
        log.append([fmt.Record(b"x" * 60, None, fmt.NO_HEADERS, "",
                               1_700_000_000_000 + i * 1000)], 0)
    expected = {t: log.offset_for_timestamp(t) for t in
                (0, 1_700_000_000_000, 1_700_000_000_500, 1_700_000_037_000,
                 1_700_000_120_000, 1_700_000_199_000, 1_800_000_000_000)}
    _url, tier, _first = offloaded(log, tmp_path)
    assert log.log_start_offset > 120  # most of the history is only in the store
    for timestamp, offset in expected.items():
        stored = asyncio.run(tier.offset_for_timestamp(timestamp, log))
        local = log.offset_for_timestamp(timestamp)
        # What the broker answers: the store's offset when one is older than the local start.
        answer = stored if local == log.log_start_offset and stored is not None else local
        assert answer == offset, (timestamp, stored, local)
    assert asyncio.run(tier.offset_for_timestamp(1_800_000_000_000, log)) is None
    log.close()


def test_a_large_object_is_read_in_parts_byte_for_byte(tmp_path: Path) -> None:
    from jetstream.tiered.store import GET_PART_BYTES

    store = FragmentStore(store_url(tmp_path))
    payload = bytes(range(256)) * ((2 * GET_PART_BYTES + 12345) // 256 + 1)
    store.put("big/object", payload)
    for size in (len(payload), 0):  # in parts (size known), or whole
        parts = asyncio.run(store.get_async("big/object", size))
        assert len(parts) == (3 if size else 1)
        assert b"".join(parts) == payload
