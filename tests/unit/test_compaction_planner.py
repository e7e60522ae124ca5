"""The cleaner's pure parts: planning, segment grouping, the checkpoint and its tombstone
marks, the offset map's budget, the key scan and the rewrite of batches."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jetstream.compaction import checkpoint as cp
from jetstream.compaction import offset_map
from jetstream.compaction.offset_map import ENTRY_OVERHEAD_BYTES, OffsetMap, scan_keys
from jetstream.compaction.planner import (
    CompactionConfig,
    PartitionView,
    SegmentInfo,
    choose,
    dirty_ratio,
    first_uncleanable_offset,
    group_segments,
    plan,
)
from jetstream.compaction.rewrite import PassStats, filter_batches
from jetstream.errors import InvalidConfig
from jetstream.stream import format as fmt

NOW = 1_000_000


def seg(base: int, end: int, size: int = 100, first_ts: int = 0, max_ts: int = 0
        ) -> SegmentInfo:
    return SegmentInfo(base, end, size, first_ts, max_ts)


def view(segments: list[SegmentInfo], *, active: int | None = None, hw: int = 10**9,
         dirty: int = 0, key: str = "p", **config: object) -> PartitionView:
    active_base = segments[-1].next_offset if active is None else active
    return PartitionView(key, tuple(segments), active_base, hw, dirty,
                         CompactionConfig(**config))  # type: ignore[arg-type]


FOUR = [seg(0, 10), seg(10, 20), seg(20, 30), seg(30, 40)]


@pytest.mark.parametrize(("kwargs", "expected"), [
    ({}, 40),                                         # the active segment
    ({"hw": 25}, 25),                                 # the high watermark
    ({"active": 30}, 30),
])
def test_first_uncleanable_offset(kwargs: dict[str, int], expected: int) -> None:
    assert first_uncleanable_offset(view(FOUR, **kwargs), NOW) == expected  # type: ignore[arg-type]


def test_min_compaction_lag_stops_at_the_first_young_segment() -> None:
    segments = [seg(0, 10, max_ts=NOW - 500), seg(10, 20, max_ts=NOW - 50),
                seg(20, 30, max_ts=NOW - 600)]
    assert first_uncleanable_offset(view(segments, min_compaction_lag_ms=100), NOW) == 10
    assert first_uncleanable_offset(view(segments, min_compaction_lag_ms=10), NOW) == 30


def test_dirty_ratio_counts_whole_segments() -> None:
    assert dirty_ratio(view(FOUR, dirty=0), NOW) == 1.0
    assert dirty_ratio(view(FOUR, dirty=20), NOW) == 0.5
    assert dirty_ratio(view(FOUR, dirty=15), NOW) == 0.75  # the segment holding it is dirty
    assert dirty_ratio(view(FOUR, dirty=40), NOW) == 0.0
    assert dirty_ratio(view(FOUR, dirty=20, hw=30), NOW) == pytest.approx(1 / 3)


def test_plan_follows_the_threshold_and_max_lag() -> None:
    assert plan(view(FOUR, dirty=20), NOW) is not None                        # 0.5 >= 0.5
    assert plan(view(FOUR, dirty=20, min_cleanable_dirty_ratio=0.6), NOW) is None
    old = [seg(0, 10), seg(10, 20), seg(20, 30, first_ts=NOW - 1000),
           seg(30, 40, first_ts=NOW)]
    forced = plan(view(old, dirty=20, min_cleanable_dirty_ratio=0.9,
                       max_compaction_lag_ms=1000), NOW)
    assert forced is not None and forced.forced
    assert plan(view(old, dirty=20, min_cleanable_dirty_ratio=0.9,
                     max_compaction_lag_ms=1001), NOW) is None
    assert plan(view(FOUR, dirty=40), NOW) is None  # nothing dirty


def test_tombstones_due_make_a_pass_without_dirty_data() -> None:
    clean = view(FOUR, dirty=40)
    assert plan(clean, NOW) is None
    due = PartitionView("p", tuple(FOUR), 40, 10**9, 40, CompactionConfig(), NOW)
    found = plan(due, NOW)
    assert found is not None and found.forced
    later = PartitionView("p", tuple(FOUR), 40, 10**9, 40, CompactionConfig(), NOW + 1)
    assert plan(later, NOW) is None


def test_choose_takes_forced_then_the_filthiest() -> None:
    a = view(FOUR, dirty=20, key="a")
    b = view(FOUR, dirty=10, key="b")
    old = [seg(0, 10, first_ts=NOW - 10), seg(10, 20), seg(20, 30), seg(30, 40)]
    c = view(old, dirty=30, key="c", max_compaction_lag_ms=5, min_cleanable_dirty_ratio=0.9)
    chosen = choose([a, b], NOW)
    assert chosen is not None and chosen.key == "b"
    chosen = choose([a, b, c], NOW)
    assert chosen is not None and chosen.key == "c"
    chosen = choose([a, b, c], NOW, skip=frozenset({"c", "b"}))
    assert chosen is not None and chosen.key == "a"
    assert choose([], NOW) is None


def test_group_segments_by_size_and_offset_span() -> None:
    sizes = [seg(0, 10, 40), seg(10, 20, 40), seg(20, 30, 40), seg(30, 40, 200),
             seg(40, 50, 10)]
    groups = group_segments(sizes, 100)
    assert [[s.base_offset for s in g] for g in groups] == [[0, 10], [20], [30], [40]]
    wide = [seg(0, 10), seg(10, 2**32 + 5)]
    assert len(group_segments(wide, 10**9)) == 2


@pytest.mark.parametrize(("field", "value"), [
    ("min_cleanable_dirty_ratio", 1.5), ("min_cleanable_dirty_ratio", True),
    ("min_compaction_lag_ms", -1), ("delete_retention_ms", "x"),
    ("max_compaction_lag_ms", -5),
])
def test_bad_compaction_config(field: str, value: object) -> None:
    with pytest.raises(InvalidConfig) as caught:
        CompactionConfig(**{field: value})  # type: ignore[arg-type]
    assert caught.value.fields["field"] == field


def test_max_lag_below_min_lag_is_refused() -> None:
    with pytest.raises(InvalidConfig):
        CompactionConfig(min_compaction_lag_ms=10, max_compaction_lag_ms=5)


# -- the checkpoint ----------------------------------------------------------------------------


def test_checkpoint_round_trip_and_damage(tmp_path: Path) -> None:
    assert cp.read(tmp_path) == cp.CleanerCheckpoint()
    value = cp.CleanerCheckpoint(50, (cp.Mark(10, 5), cp.Mark(50, 9)))
    cp.write(tmp_path, value)
    assert cp.read(tmp_path) == value
    path = tmp_path / cp.CHECKPOINT_FILE
    path.write_bytes(path.read_bytes().replace(b"50", b"51", 1))
    assert cp.read(tmp_path) == cp.CleanerCheckpoint()  # damaged: nothing cleaned yet


def test_first_passed_follows_the_marks() -> None:
    value = cp.CleanerCheckpoint(50, (cp.Mark(10, 5), cp.Mark(50, 9)))
    assert [value.first_passed_ms(o) for o in (0, 9, 10, 49, 50)] == [5, 5, 9, 9, None]


@given(passes=st.lists(st.tuples(st.integers(1, 50), st.integers(0, 100), st.booleans()),
                       max_size=200))
def test_marks_stay_bounded_and_never_move_a_horizon_earlier(
        passes: list[tuple[int, int, bool]]) -> None:
    state = cp.CleanerCheckpoint()
    end, now = 0, 0
    retention = 10_000  # nothing expires: every first-passed time must survive merges
    truth: dict[int, int] = {}  # an offset a pass passed first -> when
    for advance, wait, tombstones in passes:
        start, end, now = end, end + advance, now + wait
        state = state.after_pass(end, now, retention, tombstones)
        if tombstones:
            for offset in range(start, end):
                truth[offset] = now
        assert len(state.marks) <= cp.MARKS_MAX
        assert state.first_dirty_offset == end
    for offset, when in truth.items():
        got = state.first_passed_ms(offset)
        assert got is not None and got >= when


def test_expired_marks_are_dropped() -> None:
    state = cp.CleanerCheckpoint().after_pass(10, 0, 100).after_pass(20, 50, 100)
    assert state.tombstones_due_ms(100) == 100
    state = state.after_pass(30, 120, 100, new_tombstones=False)
    assert state.marks == (cp.Mark(20, 50),)
    assert state.first_dirty_offset == 30


# -- offset map and key scan ------------------------------------------------------------------

records = st.builds(fmt.Record, value=st.none() | st.binary(max_size=40),
                    key=st.none() | st.binary(max_size=12),
                    headers=st.dictionaries(st.text(max_size=4), st.binary(max_size=4),
                                            max_size=2),
                    subject=st.text(max_size=8), timestamp_ms=st.none())


@given(batch=st.lists(records, min_size=1, max_size=30), base=st.integers(0, 2**40))
def test_scan_keys_agrees_with_decoding(batch: list[fmt.Record], base: int) -> None:
    data = fmt.encode_batch(base, 1, batch, 5)
    header = fmt.parse_header(data)
    expected = [(r.offset, r.key, r.value is None) for r in fmt.decode_records(data, 0, header)]
    assert scan_keys(data, 0, header) == expected


def _outcome(scan: Callable[[bytes, int, fmt.BatchHeader], object], data: bytes, pos: int,
             header: fmt.BatchHeader) -> object:
    try:
        return scan(data, pos, header)
    except Exception as exc:
        return type(exc), str(exc)


@settings(max_examples=300)
@given(batch=st.lists(records, min_size=1, max_size=20), base=st.integers(0, 2**40),
       flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=3),
       cut=st.integers(0, 40), count_delta=st.integers(-2, 2), pad=st.binary(max_size=8),
       short_delta=st.integers(0, 1))
def test_the_key_scan_in_c_gives_what_the_python_loop_gives(
        batch: list[fmt.Record], base: int, flips: list[tuple[int, int]], cut: int,
        count_delta: int, pad: bytes, short_delta: int) -> None:
    """On whole batches, and on batches with bytes changed (past the batch header, whose
    CRC the caller checks), cut short, padded or whose header claims other record counts or
    a smaller last offset delta, both loops give the same keys or the same error."""
    if not offset_map.ACCELERATED:
        pytest.skip("jetstream/compaction/_scan_c.c is not built")
    data = bytearray(pad + fmt.encode_batch(base, 1, batch, 5))
    header = fmt.parse_header(bytes(data), len(pad))
    for at, value in flips:
        data[len(pad) + fmt.BATCH_HEADER.size + at % max(1, len(data) - len(pad)
                                                            - fmt.BATCH_HEADER.size)] = value
    if cut > 30:  # one time in four, the last 1..10 bytes cut off
        data = data[:len(data) - (cut - 30)]
    header = header._replace(record_count=max(0, header.record_count + count_delta),
                             last_offset_delta=header.last_offset_delta - short_delta)
    blob = bytes(data)
    assert _outcome(scan_keys, blob, len(pad), header) == \
        _outcome(offset_map._scan_keys, blob, len(pad), header)
    if not flips and cut <= 30 and count_delta == short_delta == 0:  # a whole batch
        assert scan_keys(blob, len(pad), header) == [
            (r.offset, r.key, r.value is None) for r in fmt.decode_records(blob, len(pad),
                                                                           header)]


def test_the_offset_map_takes_whole_segments_within_its_budget() -> None:
    budget = 3 * (1 + ENTRY_OVERHEAD_BYTES)
    offset_map = OffsetMap(budget)
    assert offset_map.add_segment([(0, b"a", False), (1, b"b", False), (2, b"a", False)], 3)
    assert offset_map.get(b"a") == 2 and offset_map.end_offset == 3
    assert not offset_map.add_segment([(3, b"c", False), (4, b"d", False)], 5)
    assert offset_map.get(b"c") is None and offset_map.end_offset == 3  # all or nothing
    assert offset_map.add_segment([(5, b"c", False), (6, None, False), (7, b"a", True)], 8)
    assert (offset_map.get(b"a"), len(offset_map)) == (7, 3)


# -- rewriting batches -------------------------------------------------------------------------


@given(batches=st.lists(st.lists(records, min_size=1, max_size=8), min_size=1, max_size=8),
       data=st.data())
def test_filtered_batches_tile_the_same_offsets(batches: list[list[fmt.Record]],
                                               data: st.DataObject) -> None:
    encoded: list[bytes] = []
    base = 0
    for batch in batches:
        encoded.append(fmt.encode_batch(base, 1, batch, 5))
        base += len(batch)
    drop = data.draw(st.sets(st.integers(0, base - 1)))
    stats = PassStats()
    items = [(b, 0, fmt.parse_header(b)) for b in encoded]
    out = list(filter_batches(items, lambda offset, key, tomb: offset not in drop, stats))
    joined = b"".join(out)
    headers = [h for _p, h in fmt.iter_batches(joined)]
    assert headers[0].base_offset == 0 and headers[-1].next_offset == base
    assert all(a.next_offset == b.base_offset for a, b in itertools.pairwise(headers))
    before = fmt.decode_batches(b"".join(encoded))
    assert fmt.decode_batches(joined) == [r for r in before if r.offset not in drop]
    assert stats.records_removed == len(drop)
    for original, (_b, _p, header) in zip(encoded, items, strict=True):
        if not any(header.base_offset <= o <= header.last_offset for o in drop):
            assert any(kept is original for kept in out)  # kept whole: the same bytes


def test_an_emptied_run_never_crosses_a_leader_epoch() -> None:
    batches = [fmt.encode_batch(0, 1, [fmt.Record(b"a", b"k")], 5),
               fmt.encode_batch(1, 1, [fmt.Record(b"b", b"k")], 5),
               fmt.encode_batch(2, 2, [fmt.Record(b"c", b"k")], 5),
               fmt.encode_batch(3, 2, [fmt.Record(b"d", b"k")], 6)]
    items = [(b, 0, fmt.parse_header(b)) for b in batches]
    out = list(filter_batches(items, lambda offset, key, tomb: offset == 3, PassStats()))
    headers = [fmt.parse_header(b) for b in out]
    assert [(h.base_offset, h.last_offset, h.leader_epoch, h.record_count)
            for h in headers] == [(0, 1, 1, 0), (2, 2, 2, 0), (3, 3, 2, 1)]
