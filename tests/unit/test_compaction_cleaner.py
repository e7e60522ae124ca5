"""The log cleaner on real logs: the latest value per key survives every pass, offsets keep
their records, deleted keys stay deleted, tombstones live out their horizon, and a crash at
any step of a swap recovers to the old or the new segments."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jetstream.compaction import checkpoint as cleaner_checkpoint
from jetstream.compaction.cleaner import (
    OffsetMapTooSmall,
    clean,
    prepare,
    read_batches,
    rewrite,
    swap,
)
from jetstream.compaction.planner import CleaningPlan, CompactionConfig
from jetstream.errors import CorruptRecord, SegmentsChanged
from jetstream.idempotence.dedupe import GuardLimits
from jetstream.idempotence.headers import MSG_ID, REGISTERS, encode_registers
from jetstream.idempotence.replay import rebuild
from jetstream.raft_meta.model import StreamConfig
from jetstream.stream import format as fmt
from jetstream.stream.cleaning import StepHook
from jetstream.stream.config import FsyncPolicy, LogConfig
from jetstream.stream.handles import HandlePool
from jetstream.stream.log import Log
from tests.unit.log_helpers import Clock, crash

T0 = 1_700_000_000_000
DAY = 24 * 3600 * 1000


def open_log(path: Path, clock: Clock) -> Log:
    config = LogConfig(segment_bytes_max=4096, fsync=FsyncPolicy.NEVER)
    return Log(path, config, pool=HandlePool(64), clock=clock)


Entry = tuple[bytes | None, bytes | None]  # key, value (None value: tombstone)


def append(log: Log, entries: list[Entry], per_batch: int = 3) -> None:
    for i in range(0, len(entries), per_batch):
        log.append([fmt.Record(v, k) for k, v in entries[i:i + per_batch]], 0)


def everything(log: Log) -> list[fmt.StoredRecord]:
    out: list[fmt.StoredRecord] = []
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        data, next_offset = log.read_bytes(offset, 1 << 20)
        out.extend(fmt.decode_batches(data, min_offset=offset))
        assert next_offset > offset
        offset = next_offset
    return out


def latest(records: list[fmt.StoredRecord]) -> dict[bytes, bytes | None]:
    view: dict[bytes, bytes | None] = {}
    for r in records:
        if r.key is not None:
            view[r.key] = r.value
    return view


def live(view: dict[bytes, bytes | None]) -> dict[bytes, bytes]:
    return {k: v for k, v in view.items() if v is not None}


def whole_plan(log: Log) -> CleaningPlan:
    return CleaningPlan("p", 0, log.sealed_segments()[-1].next_offset if
                        log.sealed_segments() else 0, 1.0, False)


def run_pass(log: Log, now_ms: int, retention_ms: int = DAY, budget: int = 1 << 20,
             hook: StepHook | None = None) -> None:
    config = CompactionConfig(delete_retention_ms=retention_ms, segment_bytes_max=4096)
    clean(log, whole_plan(log), config, budget, now_ms=now_ms, hook=hook)


entries = st.lists(
    st.tuples(st.none() | st.sampled_from([b"a", b"b", b"c", b"d", b"e", b"ff" * 10]),
              st.none() | st.binary(max_size=60)),
    min_size=1, max_size=120)


@settings(max_examples=40, deadline=None)
@given(first=entries, second=entries, retention=st.sampled_from([0, DAY]))
def test_latest_values_survive_passes(tmp_path_factory: pytest.TempPathFactory,
                                      first: list[Entry], second: list[Entry],
                                      retention: int) -> None:
    clock = Clock(T0)
    log = open_log(tmp_path_factory.mktemp("log"), clock)
    try:
        append(log, first)
        before = everything(log)
        run_pass(log, T0, retention)
        after = everything(log)
        append(log, second)
        run_pass(log, T0 + 1, retention)
        final = everything(log)
        model = latest(before + [r for r in everything(log) if r.offset >= len(first)])
        # Every survivor is an original record, unchanged, at its own offset.
        originals = {r.offset: r for r in before}
        for r in after:
            assert originals[r.offset] == r
        offsets = [r.offset for r in final]
        assert offsets == sorted(set(offsets))
        assert live(latest(final)) == live(model)
        keyless = [r.offset for r in before if r.key is None]
        assert set(keyless) <= set(offsets)
        if retention == 0:  # past their horizon at once: no tombstone below the cleaned end
            end = cleaner_checkpoint.read(log.directory).first_dirty_offset
            assert not [r for r in final if r.value is None and r.key is not None
                        and r.offset < end]
    finally:
        log.close()
    reopened = open_log(log.directory, clock)
    try:
        assert everything(reopened) == final
    finally:
        reopened.close()


def test_keys_are_compacted_and_segments_shrink(tmp_path: Path) -> None:
    log = open_log(tmp_path, Clock(T0))
    append(log, [(b"k%d" % (i % 10), b"v%d" % i) for i in range(2000)], per_batch=10)
    size_before, segments_before = log.size_bytes, len(log.segment_base_offsets)
    run_pass(log, T0)
    records = everything(log)
    sealed_end = log.sealed_segments()[-1].next_offset
    cleaned = [r for r in records if r.offset < sealed_end]
    assert len({r.key for r in cleaned}) == len(cleaned)  # one record per key below the end
    assert live(latest(records)) == {b"k%d" % k: b"v%d" % (1990 + k) for k in range(10)}
    assert log.size_bytes < size_before / 5
    # Grouping goes by sizes before cleaning (as Kafka's): the next pass merges the small
    # cleaned segments into few.
    append(log, [(b"k%d" % (i % 10), b"w%d" % i) for i in range(500)], per_batch=10)
    run_pass(log, T0 + 1)
    assert len(log.segment_base_offsets) < segments_before / 2
    assert live(latest(everything(log))) == {b"k%d" % k: b"w%d" % (490 + k) for k in range(10)}
    log.close()


def test_a_tombstone_lives_out_its_horizon(tmp_path: Path) -> None:
    log = open_log(tmp_path, Clock(T0))
    append(log, [(b"gone", b"1"), (b"gone", None)] + [(b"x", b"%d" % i) for i in range(400)])
    run_pass(log, T0, retention_ms=1000)
    records = everything(log)
    assert [r.offset for r in records if r.key == b"gone"] == [1]  # the tombstone stays
    run_pass(log, T0 + 999, retention_ms=1000)
    assert [r.offset for r in everything(log) if r.key == b"gone"] == [1]
    run_pass(log, T0 + 1000, retention_ms=1000)
    assert [r.offset for r in everything(log) if r.key == b"gone"] == []
    assert b"gone" not in latest(everything(log))
    log.close()


def test_offsets_reads_and_follower_copies_skip_gaps(tmp_path: Path) -> None:
    log = open_log(tmp_path / "leader", Clock(T0))
    append(log, [(b"k", b"%d" % i) for i in range(300)], per_batch=5)
    run_pass(log, T0)
    # A read at a removed offset returns the next record.
    first = log.read_records(10, 4096)
    assert first and first[0].offset > 10
    # A follower copying the compacted log byte for byte ends with the same records.
    follower = open_log(tmp_path / "follower", Clock(T0))
    offset = 0
    while offset < log.log_end_offset:
        data, offset = log.read_bytes(offset, 2048)
        follower.append_batches(data)
    assert follower.log_end_offset == log.log_end_offset
    assert everything(follower) == everything(log)
    # ... and from the middle of a compacted batch on, too (skip_held keeps the range).
    late = open_log(tmp_path / "late", Clock(T0))
    data, _ = log.read_bytes(0, 1 << 20)
    late.truncate_fully_and_start_at(7)
    late.append_batches(fmt.skip_held(data, 7))
    assert [r.offset for r in everything(late)] == [r.offset for r in everything(log)
                                                      if 7 <= r.offset < late.log_end_offset]
    for each in (log, follower, late):
        each.close()


def test_a_reader_in_a_replaced_segment_finishes(tmp_path: Path) -> None:
    log = open_log(tmp_path, Clock(T0))
    append(log, [(b"k%d" % (i % 3), b"%d" % i) for i in range(600)])
    piece = log.read(0, 1 << 20)
    run_pass(log, T0)
    with piece:  # the old file is gone from the directory, not from this descriptor
        old = fmt.decode_batches(piece.read())
    assert [r.offset for r in old] == list(range(len(old)))
    log.close()


STEPS = ["rename-to-swap", "delete-replaced", "rename-into-place", "index"]


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("seed", [1, 2])
def test_a_crash_at_every_swap_step_recovers_old_or_new(tmp_path: Path, step: str,
                                                       seed: int) -> None:
    rng = random.Random(seed)
    clock = Clock(T0)
    log = open_log(tmp_path / "log", clock)
    entries: list[Entry] = [(b"k%d" % rng.randrange(20), b"v%d" % i) for i in range(1500)]
    append(log, entries)
    before = everything(log)
    model = latest(before)

    class Crash(Exception):
        pass

    def hook(at: str) -> None:
        if at == step:
            raise Crash(at)

    with pytest.raises(Crash):
        run_pass(log, T0, hook=hook)
    crash(log)
    reopened = open_log(tmp_path / "log", clock)
    try:
        records = everything(reopened)
        offsets = [r.offset for r in records]
        assert offsets == sorted(set(offsets))
        assert latest(records) == model
        assert reopened.log_end_offset == log.log_end_offset
        assert not list((tmp_path / "log").glob("*.cleaned"))
        assert not list((tmp_path / "log").glob("*.swap"))
        if step == "rename-to-swap":  # before the commit point: the old segment set
            assert records == before
        # And the next pass finishes the job.
        run_pass(reopened, T0 + 1)
        assert latest(everything(reopened)) == model
    finally:
        reopened.close()


def test_a_segment_deleted_meanwhile_aborts_the_swap(tmp_path: Path) -> None:
    log = open_log(tmp_path, Clock(T0))
    append(log, [(b"k", b"%d" % i) for i in range(600)])
    sealed = log.sealed_segments()
    path = tmp_path / "x.log.cleaned"
    path.write_bytes(b"")
    log.truncate_to(sealed[1].base_offset)  # the run no longer ends before the active one
    with pytest.raises(SegmentsChanged):
        log.replace_segments(sealed[:2], path)
    assert not path.exists()
    log.close()


def test_a_map_too_small_for_one_segment_is_an_error(tmp_path: Path) -> None:
    log = open_log(tmp_path, Clock(T0))
    append(log, [(b"key-%d" % i, b"v") for i in range(600)])
    with pytest.raises(OffsetMapTooSmall):
        run_pass(log, T0, budget=1000)
    log.close()


def test_a_full_map_ends_the_pass_after_the_last_segment_that_fit(tmp_path: Path) -> None:
    log = open_log(tmp_path, Clock(T0))
    append(log, [(b"key-%04d" % i, b"v" * 20) for i in range(800)])
    sealed = log.sealed_segments()
    assert len(sealed) > 4
    run_pass(log, T0, budget=10_000)
    end = cleaner_checkpoint.read(log.directory).first_dirty_offset
    assert sealed[0].next_offset <= end < sealed[-1].next_offset
    assert end in {s.next_offset for s in sealed}
    log.close()


def test_corrupt_batches_are_refused_not_cleaned(tmp_path: Path) -> None:
    log = open_log(tmp_path, Clock(T0))
    append(log, [(b"k", b"%d" % i) for i in range(600)])
    segment = log.sealed_segments()[1]
    data = bytearray(segment.log_path.read_bytes())
    data[60] ^= 0xFF
    segment.log_path.write_bytes(bytes(data))
    with pytest.raises(CorruptRecord):
        list(read_batches(segment.log_path))
    with pytest.raises(CorruptRecord):
        run_pass(log, T0)
    log.close()


def test_a_register_change_survives_compaction(tmp_path: Path) -> None:
    log = open_log(tmp_path, Clock(T0))
    registers = {REGISTERS: encode_registers({"owner": "a"})}
    log.append([fmt.Record(b"v0", b"k", registers)], 0)
    append(log, [(b"k", b"v%d" % i) for i in range(1, 400)], per_batch=10)
    run_pass(log, T0)
    records = everything(log)
    assert next(r.offset for r in records if r.key == b"k") == 0  # superseded, yet kept
    assert rebuild(log, GuardLimits(), T0, track_keys=False).registers == {"owner": "a"}
    assert live(latest(records)) == {b"k": b"v399"}
    log.close()


def test_records_with_ids_inside_the_duplicate_window_are_not_compacted(
        tmp_path: Path) -> None:
    clock = Clock(T0)
    log = open_log(tmp_path, clock)
    log.append([fmt.Record(b"old", b"k", {MSG_ID: b"old-id"})], 0)
    clock.now += 60_000
    log.append([fmt.Record(b"new", b"k", {MSG_ID: b"new-id"})], 0)
    append(log, [(b"k", b"v%d" % i) for i in range(400)], per_batch=10)
    config = CompactionConfig(segment_bytes_max=4096, duplicate_window_ms=30_000)
    clean(log, whole_plan(log), config, 1 << 20, now_ms=clock.now + 1)
    kept = [r.value for r in everything(log) if MSG_ID in r.headers]
    assert kept == [b"new"]  # the old id left the window: compacted as any record
    assert rebuild(log, GuardLimits(duplicate_window_ms=30_000), clock.now + 1,
                   track_keys=False).ids.offset_of("new-id") == 1
    assert StreamConfig("s", "s", duplicate_window_ms=5000).compaction_config() \
        .duplicate_window_ms == 5000
    log.close()


def test_a_read_past_a_batchs_kept_records_goes_on_to_the_next_segment(
        tmp_path: Path) -> None:
    """A batch whose last offsets compaction removed, at a segment's end: a read from one
    of those offsets returns the next segment's records, not an empty list that looks like
    the log's end."""
    log = open_log(tmp_path / "log", Clock(T0))
    # One batch per segment; the second rewrites `c`, so the first batch loses its tail.
    big = b"v" * 1500  # two batches together outgrow a segment: the cleaner keeps both
    for batch in ([(b"a", big), (b"b", big), (b"c", big)],
                  [(b"c", big), (b"d", big), (b"e", big)]):
        append(log, batch)
        assert log.roll_if_older(T0 + DAY, log.log_end_offset)
    run_pass(log, T0)
    assert log.segment_base_offsets == [0, 3, 6]
    assert [r.offset for r in log.read_records(0)] == [0, 1]  # one segment per read
    # Offset 2 (c's first value) is gone; its batch still holds 0 and 1.
    assert [r.offset for r in log.read_records(2)] == [3, 4, 5]
    log.close()


def cleaned_files(log: Log) -> list[Path]:
    return sorted(log.directory.glob("*.cleaned"))


def test_segments_changed_between_rewrite_and_swap_leave_no_cleaned_file(
        tmp_path: Path) -> None:
    log = open_log(tmp_path, Clock(T0))
    append(log, [(b"key-%d" % (i % 7), b"v" * 30) for i in range(900)])
    before = everything(log)
    config = CompactionConfig(segment_bytes_max=4096)
    prepared = prepare(log, whole_plan(log), config, 1 << 20, now_ms=T0)
    rewritten = rewrite(prepared.job)
    assert len(rewritten.groups) >= 2 and len(cleaned_files(log)) == len(rewritten.groups)
    cut = log.sealed_segments()[-1].base_offset
    log.truncate_to(cut)  # the last group's segments are gone
    with pytest.raises(SegmentsChanged):
        swap(log, prepared, rewritten)
    assert cleaned_files(log) == []
    # The groups swapped in before it lost no latest value; the checkpoint did not move.
    assert latest(everything(log)) == latest([r for r in before if r.offset < cut])
    assert cleaner_checkpoint.read(log.directory).first_dirty_offset == 0
    log.close()


def test_a_rewrite_that_fails_midway_removes_what_it_wrote(tmp_path: Path) -> None:
    log = open_log(tmp_path, Clock(T0))
    append(log, [(b"key-%04d" % i, b"v" * 30) for i in range(400)])
    run_pass(log, T0)  # everything so far is clean: the next pass maps only new segments
    append(log, [(b"key-%04d" % i, b"w" * 30) for i in range(400)])
    clean_part = [s for s in log.sealed_segments()
                  if s.next_offset <= cleaner_checkpoint.read(log.directory).first_dirty_offset]
    assert len(clean_part) >= 2
    victim = clean_part[-1]  # in a later group than the first
    data = bytearray(victim.log_path.read_bytes())
    data[60] ^= 0xFF
    victim.log_path.write_bytes(bytes(data))
    prepared = prepare(log, whole_plan(log), CompactionConfig(segment_bytes_max=4096), 1 << 20,
                       now_ms=T0)
    with pytest.raises(CorruptRecord):
        rewrite(prepared.job)
    assert cleaned_files(log) == []
    log.close()
