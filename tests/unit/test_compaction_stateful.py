"""A state machine of a compacted log against a model: keyed appends, tombstones, empty values
and keyless records, high watermark moves, cleaner passes (some cut short by a crash at a
swap step), crashes and reopenings of the log and its key index, interleaved with reads and
gets. After every step: offsets strictly increase, every record in the log is the one
appended at its offset, nothing at or above the high watermark was touched, the latest
committed value of every live key is there and is what the key index answers, and no
deleted key has a value."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from jetstream.compaction.cleaner import clean
from jetstream.compaction.key_index import KeyIndex, catch_up
from jetstream.compaction.planner import CleaningPlan, CompactionConfig
from jetstream.stream import format as fmt
from jetstream.stream.config import FsyncPolicy, LogConfig
from jetstream.stream.handles import HandlePool
from jetstream.stream.log import Log
from tests.unit.log_helpers import Clock, crash

T0 = 1_700_000_000_000
KEYS = [b"a", b"b", b"c", b"d", b"long" * 120]
STEPS = ["rename-to-swap", "delete-replaced", "rename-into-place", "index"]


class Crash(Exception):
    pass


class CompactedLog(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="compacted-"))
        self.clock = Clock(T0)
        self.pool = HandlePool(32)
        self.log = self._open()
        self.index = KeyIndex.open(self.dir / "keys.lmdb", created_version=1)
        self.appended: dict[int, fmt.StoredRecord] = {}
        self.batch_ends: list[int] = []
        self.hw = 0

    def _open(self) -> Log:
        return Log(self.dir, LogConfig(segment_bytes_max=4096, fsync=FsyncPolicy.NEVER),
                   pool=self.pool, clock=self.clock)

    def teardown(self) -> None:
        self.index.close()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- the model ----------------------------------------------------------------------------

    def committed_latest(self) -> dict[bytes, bytes | None]:
        latest: dict[bytes, bytes | None] = {}
        for offset in sorted(self.appended):
            record = self.appended[offset]
            if offset < self.hw and record.key is not None:
                latest[record.key] = record.value
        return latest

    # -- rules ----------------------------------------------------------------------------------

    @rule(batch=st.lists(st.tuples(st.none() | st.sampled_from(KEYS),
                                   st.none() | st.sampled_from([b"", b"x", b"y" * 900])),
                         min_size=1, max_size=12))
    def append(self, batch: list[tuple[bytes | None, bytes | None]]) -> None:
        self.clock.now += 1
        info = self.log.append([fmt.Record(v, k) for k, v in batch], 0)
        self.batch_ends.append(info.log_end_offset)
        for offset, (key, value) in zip(range(info.base_offset, info.last_offset + 1), batch,
                                        strict=True):
            self.appended[offset] = fmt.StoredRecord(offset, self.clock.now, value, key,
                                                     fmt.NO_HEADERS, "", 0)

    @rule(data=st.data())
    def advance_high_watermark(self, data: st.DataObject) -> None:
        # The HW moves to batch boundaries (followers copy whole batches).
        ahead = [end for end in self.batch_ends if end > self.hw]
        if ahead:
            self.hw = data.draw(st.sampled_from(ahead))

    @rule(retention_ms=st.sampled_from([0, 5, 10_000]),
          crash_at=st.none() | st.sampled_from(STEPS))
    def clean_pass(self, retention_ms: int, crash_at: str | None) -> None:
        self.clock.now += 3
        sealed = self.log.sealed_segments()
        if not sealed:
            return
        bound = min(self.hw, self.log.segment_base_offsets[-1])

        def hook(step: str) -> None:
            if step == crash_at:
                raise Crash(step)

        plan = CleaningPlan("p", 0, bound, 1.0, False)
        config = CompactionConfig(delete_retention_ms=retention_ms, segment_bytes_max=4096)
        try:
            result = clean(self.log, plan, config, 1 << 20, now_ms=self.clock.now, hook=hook)
        except Crash:
            event(f"crash at {crash_at}")
            self.crash_and_reopen()
        else:
            event("a pass removed records" if result.stats.records_removed else "a pass")

    @rule()
    def crash_and_reopen(self) -> None:
        crash(self.log)
        self.index.close()
        self.log = self._open()
        self.index = KeyIndex.open(self.dir / "keys.lmdb", created_version=1)

    @rule()
    def lose_the_key_index(self) -> None:
        self.index.close()
        (self.dir / "keys.lmdb" / "data.mdb").write_bytes(b"damaged")
        self.index = KeyIndex.open(self.dir / "keys.lmdb", created_version=1)
        assert self.index.covered_offset == 0

    # -- invariants -----------------------------------------------------------------------------

    @invariant()
    def the_log_holds_what_it_should(self) -> None:
        records: list[fmt.StoredRecord] = []
        offset = self.log.log_start_offset
        while offset < self.log.log_end_offset:
            data, next_offset = self.log.read_bytes(offset, 1 << 20)
            records.extend(fmt.decode_batches(data, min_offset=offset))
            assert next_offset > offset
            offset = next_offset
        offsets = [r.offset for r in records]
        assert offsets == sorted(set(offsets))
        for r in records:
            original = self.appended[r.offset]
            assert (r.key, r.value) == (original.key, original.value), r.offset
        # Nothing at or above the HW was touched; keyless records are never removed.
        assert [o for o in offsets if o >= self.hw] == sorted(
            o for o in self.appended if o >= self.hw)
        kept = set(offsets)
        assert all(o in kept for o, r in self.appended.items() if r.key is None)
        # The latest committed value of every key.
        latest: dict[bytes, bytes | None] = {}
        for r in records:
            if r.offset < self.hw and r.key is not None:
                latest[r.key] = r.value
        model = self.committed_latest()
        assert {k: v for k, v in latest.items() if v is not None} == {
            k: v for k, v in model.items() if v is not None}

    @invariant()
    def get_answers_the_latest_committed_value(self) -> None:
        catch_up(self.index, self.log, self.hw)
        for key, value in self.committed_latest().items():
            entry = self.index.get(key)
            if value is None:
                assert entry is None or entry.value is None
            else:
                assert entry is not None and entry.value == value, key
        for key in KEYS:
            if key not in self.committed_latest():
                assert self.index.get(key) is None


CompactedLog.TestCase.settings = settings(max_examples=100, stateful_step_count=50,
                                          deadline=None)
test_compacted_log = CompactedLog.TestCase
