"""The leader epoch cache (KIP-101 / KIP-279): assignment, end offsets, truncation from both
ends, persistence, and the log's rebuild of a missing or damaged cache from batch headers."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jetstream.errors import StaleLeaderEpoch
from jetstream.stream import checkpoint
from jetstream.stream import format as fmt
from jetstream.stream.config import LogConfig
from jetstream.stream.epoch import (
    FILE_NAME,
    KIND,
    UNDEFINED,
    EpochEndOffset,
    EpochEntry,
    LeaderEpochCache,
)
from jetstream.stream.handles import HandlePool
from jetstream.stream.log import Log


def cache_with(directory: Path, entries: list[tuple[int, int]]) -> LeaderEpochCache:
    cache = LeaderEpochCache(directory)
    for epoch, start in entries:
        cache.assign(epoch, start)
    return cache


def pairs(cache: LeaderEpochCache) -> list[tuple[int, int]]:
    return [(e.epoch, e.start_offset) for e in cache.entries]


def reloaded(directory: Path) -> list[tuple[int, int]]:
    return pairs(LeaderEpochCache(directory))


# -- the cache on its own ----------------------------------------------------------------------


def test_empty_cache(tmp_path: Path) -> None:
    cache = LeaderEpochCache(tmp_path)
    assert cache.entries == []
    assert cache.latest_epoch == UNDEFINED
    assert cache.end_offset_for_epoch(0, 10) == EpochEndOffset(UNDEFINED, UNDEFINED)
    assert cache.epoch_for_offset(0) == UNDEFINED
    assert not (tmp_path / FILE_NAME).exists()


def test_assign_appends_and_persists(tmp_path: Path) -> None:
    cache = cache_with(tmp_path, [(1, 0), (3, 10), (5, 20)])
    assert cache.entries == [EpochEntry(1, 0), EpochEntry(3, 10), EpochEntry(5, 20)]
    assert cache.latest_epoch == 5
    assert reloaded(tmp_path) == [(1, 0), (3, 10), (5, 20)]
    assert checkpoint.read_entries(tmp_path / FILE_NAME, KIND) == [(1, 0), (3, 10), (5, 20)]


def test_reassigning_the_latest_epoch_keeps_its_first_offset(tmp_path: Path) -> None:
    cache = cache_with(tmp_path, [(1, 0), (3, 10)])
    cache.assign(3, 15)
    assert pairs(cache) == [(1, 0), (3, 10)]
    assert reloaded(tmp_path) == [(1, 0), (3, 10)]


def test_assign_drops_entries_at_or_past_the_new_start(tmp_path: Path) -> None:
    # The log was truncated below epoch 5's start without telling the cache; the new epoch
    # beginning at 10 replaces everything that began at or after 10.
    cache = cache_with(tmp_path, [(1, 0), (3, 10), (5, 20)])
    cache.assign(7, 10)
    assert pairs(cache) == [(1, 0), (7, 10)]
    assert reloaded(tmp_path) == [(1, 0), (7, 10)]


ENTRIES = [(1, 0), (3, 10), (5, 20)]


@pytest.mark.parametrize(
    ("requested", "expected"),
    [
        (0, (UNDEFINED, UNDEFINED)),  # older than every known epoch
        (1, (1, 10)),
        (2, (1, 10)),  # unknown epoch: the largest known one below it
        (3, (3, 20)),
        (4, (3, 20)),
        (5, (5, 30)),  # the latest epoch ends at the log end offset
        (6, (5, 30)),
        (100, (5, 30)),
    ],
)
def test_end_offset_for_epoch(tmp_path: Path, requested: int, expected: tuple[int, int]) -> None:
    cache = cache_with(tmp_path, ENTRIES)
    assert cache.end_offset_for_epoch(requested, 30) == EpochEndOffset(*expected)


@given(
    epochs=st.lists(st.integers(0, 50), min_size=1, max_size=8, unique=True).map(sorted),
    gaps=st.lists(st.integers(1, 100), min_size=8, max_size=8),
    extra=st.integers(0, 100),
    requested=st.integers(0, 60),
)
def test_end_offset_for_epoch_matches_its_definition(
    epochs: list[int], gaps: list[int], extra: int, requested: int
) -> None:
    starts = [sum(gaps[:i]) for i in range(len(epochs))]
    log_end = starts[-1] + extra
    with tempfile.TemporaryDirectory() as d:
        cache = LeaderEpochCache(Path(d), persist=False)
        for epoch, start in zip(epochs, starts, strict=True):
            cache.assign(epoch, start)
        got = cache.end_offset_for_epoch(requested, log_end)
        assert list(Path(d).iterdir()) == []
    # KIP-279: the largest known epoch <= the requested one, and where the next one began.
    known = [i for i, e in enumerate(epochs) if e <= requested]
    if not known:
        assert got == EpochEndOffset(UNDEFINED, UNDEFINED)
    else:
        i = known[-1]
        end = starts[i + 1] if i + 1 < len(epochs) else log_end
        assert got == EpochEndOffset(epochs[i], end)


def test_epoch_for_offset(tmp_path: Path) -> None:
    cache = cache_with(tmp_path, ENTRIES)
    assert [cache.epoch_for_offset(o) for o in (0, 9, 10, 19, 20, 1000)] == [1, 1, 3, 3, 5, 5]
    cache.truncate_from_start(5)
    assert cache.epoch_for_offset(4) == UNDEFINED
    assert cache.epoch_for_offset(5) == 1


@pytest.mark.parametrize(
    ("end", "expected"),
    [
        (30, ENTRIES),
        (21, ENTRIES),
        (20, [(1, 0), (3, 10)]),
        (11, [(1, 0), (3, 10)]),
        (10, [(1, 0)]),
        (1, [(1, 0)]),
        (0, []),
    ],
)
def test_truncate_from_end(tmp_path: Path, end: int, expected: list[tuple[int, int]]) -> None:
    cache = cache_with(tmp_path, ENTRIES)
    cache.truncate_from_end(end)
    assert pairs(cache) == expected
    assert reloaded(tmp_path) == expected


@pytest.mark.parametrize(
    ("start", "expected"),
    [
        (0, ENTRIES),
        (5, [(1, 5), (3, 10), (5, 20)]),
        (10, [(3, 10), (5, 20)]),
        (15, [(3, 15), (5, 20)]),
        (20, [(5, 20)]),
        (25, [(5, 25)]),
    ],
)
def test_truncate_from_start(tmp_path: Path, start: int,
                             expected: list[tuple[int, int]]) -> None:
    cache = cache_with(tmp_path, ENTRIES)
    cache.truncate_from_start(start)
    assert pairs(cache) == expected
    assert reloaded(tmp_path) == expected
    # The epochs of the offsets that remain are unchanged.
    for offset in range(start, 30):
        assert cache.epoch_for_offset(offset) == LeaderEpochCache(tmp_path).epoch_for_offset(
            offset)


def test_clear_persists(tmp_path: Path) -> None:
    cache = cache_with(tmp_path, ENTRIES)
    cache.clear()
    assert cache.entries == [] and cache.latest_epoch == UNDEFINED
    assert reloaded(tmp_path) == []


def test_not_persisted_when_asked(tmp_path: Path) -> None:
    cache = LeaderEpochCache(tmp_path, persist=False)
    cache.assign(1, 0)
    cache.truncate_from_start(3)
    assert pairs(cache) == [(1, 3)]
    assert not (tmp_path / FILE_NAME).exists()


@pytest.mark.parametrize(
    "entries",
    [
        [(3, 0), (2, 10)],  # epochs decrease
        [(1, 10), (2, 10)],  # start offsets do not increase
        [(1, 10), (2, 5)],
        [(-1, 0)],
        [(1, -5)],
    ],
)
def test_invalid_persisted_entries_are_dropped(tmp_path: Path,
                                               entries: list[tuple[int, int]]) -> None:
    checkpoint.write_entries(tmp_path / FILE_NAME, KIND, list(entries))
    assert LeaderEpochCache(tmp_path).entries == []


def test_damaged_file_reads_as_empty(tmp_path: Path) -> None:
    cache_with(tmp_path, ENTRIES)
    path = tmp_path / FILE_NAME
    data = bytearray(path.read_bytes())
    data[len(KIND) + 4] ^= 0x02
    path.write_bytes(bytes(data))
    assert LeaderEpochCache(tmp_path).entries == []


# -- the log's cache -------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000_000

    def __call__(self) -> int:
        return self.now


def open_log(directory: Path, **config: object) -> Log:
    cfg = LogConfig(segment_bytes_max=4096, **config)
    return Log(directory, cfg, pool=HandlePool(16), clock=Clock())


def append_epochs(log: Log, plan: list[tuple[int, int]]) -> None:
    """Append `count` single-record batches at `epoch` for each (epoch, count)."""
    for epoch, count in plan:
        for _ in range(count):
            log.append([fmt.Record(b"v" * 300)], epoch)


PLAN = [(0, 10), (2, 15), (5, 20)]
PLAN_ENTRIES = [(0, 0), (2, 10), (5, 25)]


def test_log_assigns_epochs_from_appends(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        append_epochs(log, PLAN)
        assert pairs(log.epochs) == PLAN_ENTRIES
        assert log.latest_epoch == 5
        assert log.end_offset_for_epoch(2) == EpochEndOffset(2, 25)
        assert log.end_offset_for_epoch(5) == EpochEndOffset(5, 45)
        assert log.end_offset_for_epoch(3) == EpochEndOffset(2, 25)
        with pytest.raises(StaleLeaderEpoch) as err:
            log.append([fmt.Record(b"x")], 4)
        assert (err.value.epoch, err.value.latest, err.value.code) == (4, 5, "STALE_LEADER_EPOCH")
        assert log.log_end_offset == 45
    assert reloaded(tmp_path) == PLAN_ENTRIES


def test_log_follower_appends_assign_epochs(tmp_path: Path) -> None:
    with open_log(tmp_path / "leader") as leader, open_log(tmp_path / "follower") as follower:
        append_epochs(leader, PLAN)
        offset = 0
        while offset < leader.log_end_offset:
            data, offset = leader.read_bytes(offset, 1000)
            follower.append_batches(data)
        assert pairs(follower.epochs) == PLAN_ENTRIES
        stale = fmt.encode_batch(45, 4, [fmt.Record(b"x")], 1)
        with pytest.raises(StaleLeaderEpoch):
            follower.append_batches(stale)
        assert follower.log_end_offset == 45


def test_an_epoch_led_without_records_gives_way_when_the_replica_follows(
        tmp_path: Path) -> None:
    """A replica that led epoch 4 for an instant, appending nothing, then follows a leader
    whose log continues in epoch 3: truncating to its log end drops the empty epoch, so the
    leader's epoch-3 batches are taken (they were refused as stale, and the follower stuck)."""
    with open_log(tmp_path) as log:
        log.append([fmt.Record(b"a"), fmt.Record(b"b")], leader_epoch=3)
        log.start_leader_epoch(4)
        assert pairs(log.epochs) == [(3, 0), (4, 2)]
        log.truncate_to(log.log_end_offset)
        assert pairs(log.epochs) == [(3, 0)]
        log.append_batches(fmt.encode_batch(2, 3, [fmt.Record(b"c")], 1))
        assert log.log_end_offset == 3 and pairs(log.epochs) == [(3, 0)]


def test_log_truncation_truncates_epochs(tmp_path: Path) -> None:
    with open_log(tmp_path, retention_messages=15) as log:
        append_epochs(log, PLAN)
        log.truncate_to(30)
        assert pairs(log.epochs) == PLAN_ENTRIES
        log.truncate_to(25)
        assert pairs(log.epochs) == [(0, 0), (2, 10)]
        # A lower epoch than the one truncated away is accepted again.
        log.append([fmt.Record(b"x")], 3)
        assert pairs(log.epochs) == [(0, 0), (2, 10), (3, 25)]
        deleted = log.apply_retention()
        assert deleted and log.log_start_offset > 10
        assert pairs(log.epochs) == [(2, log.log_start_offset), (3, 25)]
    with open_log(tmp_path) as log:
        assert pairs(log.epochs)[0] == (2, log.log_start_offset)
        log.truncate_fully_and_start_at(100)
        assert log.epochs.entries == []
        log.append([fmt.Record(b"x")], 7)
        assert pairs(log.epochs) == [(7, 100)]
    assert reloaded(tmp_path) == [(7, 100)]


@pytest.mark.parametrize("damage", ["delete", "flip", "truncate", "stale", "foreign"])
def test_log_rebuilds_a_missing_or_damaged_cache(tmp_path: Path, damage: str) -> None:
    with open_log(tmp_path) as log:
        append_epochs(log, PLAN)
        assert len(log.segment_base_offsets) > 2
    path = tmp_path / FILE_NAME
    if damage == "delete":
        path.unlink()
    elif damage == "flip":
        data = bytearray(path.read_bytes())
        data[-12] ^= 0x10
        path.write_bytes(bytes(data))
    elif damage == "truncate":
        path.write_bytes(path.read_bytes()[:-5])
    elif damage == "stale":
        # A well-formed cache that misses the latest epoch (written before it was assigned).
        checkpoint.write_entries(path, KIND, [(0, 0), (2, 10)])
    else:
        # A well-formed cache from another history.
        checkpoint.write_entries(path, KIND, [(0, 0), (9, 3)])
    with open_log(tmp_path) as log:
        assert pairs(log.epochs) == PLAN_ENTRIES
        assert log.end_offset_for_epoch(2) == EpochEndOffset(2, 25)
    assert reloaded(tmp_path) == PLAN_ENTRIES


def test_log_rebuild_after_retention_starts_at_the_log_start(tmp_path: Path) -> None:
    with open_log(tmp_path, retention_messages=30) as log:
        append_epochs(log, PLAN)
        log.apply_retention()
        start = log.log_start_offset
        assert 10 < start < 25
        expected = [(2, start), (5, 25)]
        assert pairs(log.epochs) == expected
    (tmp_path / FILE_NAME).unlink()
    with open_log(tmp_path) as log:
        assert pairs(log.epochs) == expected


@pytest.mark.parametrize(
    ("at", "bit"),
    [
        (7, 0x04),  # base_offset: the header walk itself fails
        (15, 0x40),  # leader_epoch 2 -> 66: must not be learned
        (12, 0x01),  # leader_epoch 2 -> 2 + 2**24
        (15, 0x02),  # leader_epoch 2 -> 0
        (200, 0x10),  # a record's value
    ],
)
def test_log_rebuild_over_a_damaged_trusted_batch(tmp_path: Path, at: int, bit: int) -> None:
    """The cache is rebuilt from batches of trusted segments (not scanned at open): a damaged
    batch ends the log there rather than failing the open or teaching the cache a bad epoch."""
    with open_log(tmp_path, index_interval_bytes=1) as log:
        append_epochs(log, PLAN)  # 375-byte batches, 10 to a segment
        assert log.segment_base_offsets == [0, 10, 20, 30, 40]
    path = tmp_path / f"{10:020d}.log"
    data = bytearray(path.read_bytes())
    data[2 * 375 + at] ^= bit  # the batch at offset 12
    path.write_bytes(bytes(data))
    (tmp_path / FILE_NAME).unlink()
    with open_log(tmp_path, index_interval_bytes=1) as log:
        assert log.log_end_offset == 12
        assert log.recovery.dropped_segments == 3
        assert pairs(log.epochs) == [(0, 0), (2, 10)]
        assert [r.offset for r in log.read_records(0, 1 << 20)] == list(range(10))
        assert [r.offset for r in log.read_records(10, 1 << 20)] == [10, 11]
        log.append([fmt.Record(b"x")], 5)
        assert pairs(log.epochs) == [(0, 0), (2, 10), (5, 12)]
    assert reloaded(tmp_path) == [(0, 0), (2, 10), (5, 12)]


def test_a_new_leader_epoch_starts_at_the_log_end_offset_before_any_append(
        tmp_path: Path) -> None:
    with Log(tmp_path / "p") as log:
        log.append([fmt.Record(b"a"), fmt.Record(b"b")], leader_epoch=0)
        log.start_leader_epoch(3)
        assert log.end_offset_for_epoch(0).end_offset == 2
        assert (log.end_offset_for_epoch(3).epoch, log.end_offset_for_epoch(3).end_offset) == (
            3, 2)
        log.start_leader_epoch(3)  # idempotent
        with pytest.raises(StaleLeaderEpoch):
            log.start_leader_epoch(2)
        log.append([fmt.Record(b"c")], leader_epoch=3)
    with Log(tmp_path / "p") as again:
        assert [(e.epoch, e.start_offset) for e in again.epochs.entries] == [(0, 0), (3, 2)]
