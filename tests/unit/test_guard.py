"""The expectations and dedupe guard of a partition (jetstream.idempotence): table tests of each
rule, and a property test of raced publishes with retried ids against a model log."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jetstream.errors import (
    DuplicateSequence,
    KeyNotTracked,
    KeyOffsetMismatch,
    OffsetMismatch,
    OutOfOrderSequence,
    ProducerFenced,
    ProtocolError,
    RegisterMismatch,
)
from jetstream.idempotence import dedupe
from jetstream.idempotence import headers as h
from jetstream.idempotence.dedupe import GuardLimits, IdWindow
from jetstream.idempotence.guard import (
    KEY_ABSENT,
    Admitted,
    Duplicate,
    Expectations,
    Guard,
    ProducerSequence,
    Refused,
    Verdict,
)
from jetstream.idempotence.replay import rebuild, scan_keys
from jetstream.protocol.names import parse_selector
from jetstream.stream import format as fmt
from jetstream.stream.log import Log
from tests.unit.log_helpers import T0, Clock, make, value


@dataclass
class Stored:
    offset: int
    timestamp_ms: int
    key: bytes | None
    headers: Mapping[str, bytes] = field(default_factory=dict)


class Partition:
    """A guard and the model log it guards: what a leader's append path does."""

    def __init__(self, limits: GuardLimits | None = None, track_keys: bool = True) -> None:
        self.guard = Guard(limits or GuardLimits(), track_keys=track_keys)
        self.log: list[Stored] = []
        self.now = T0

    def publish(self, expect: Expectations, keys: list[bytes | None] | None = None,
                fail: bool = False) -> Verdict:
        return self.append([(expect, keys or [None])], fail)[0]

    def append(self, publishes: list[tuple[Expectations, list[bytes | None]]],
               fail: bool = False) -> list[Verdict]:
        """One append of several publishes; `fail`: the log refuses it (nothing changes)."""
        p = self.guard.begin(len(self.log), 0, self.now)
        verdicts = []
        records: list[Stored] = []
        for expect, keys in publishes:
            verdict = p.admit(expect, keys)
            verdicts.append(verdict)
            if isinstance(verdict, Admitted):
                assert verdict.offset == len(self.log) + len(records)
                for i, key in enumerate(keys):
                    headers = {**(verdict.first_headers if i == 0 else {}),
                               **(verdict.last_headers if i == len(keys) - 1 else {})}
                    records.append(Stored(verdict.offset + i, self.now, key, headers))
        if not fail:
            self.log.extend(records)
            p.commit()
        return verdicts

    def replayed(self) -> Guard:
        guard = Guard(self.guard.limits, track_keys=self.guard.track_keys)
        for r in self.log:
            guard.replay(r.offset, r.timestamp_ms, r.key, r.headers)
        return guard


def test_expected_offset_holds_once() -> None:
    part = Partition()
    assert isinstance(part.publish(Expectations(expected_offset=0)), Admitted)
    verdict = part.publish(Expectations(expected_offset=0))
    assert isinstance(verdict, Refused) and isinstance(verdict.error, OffsetMismatch)
    assert verdict.error.log_end_offset == 1
    assert isinstance(part.publish(Expectations(expected_offset=1)), Admitted)


def test_pending_publishes_of_one_append_count() -> None:
    part = Partition()
    first, second = part.append([(Expectations(expected_offset=0), [None, None]),
                                 (Expectations(expected_offset=0), [None])])
    assert isinstance(first, Admitted) and first.offset == 0
    assert isinstance(second, Refused) and second.error.fields["log_end_offset"] == 2


def test_failed_append_changes_nothing() -> None:
    part = Partition()
    part.append([(Expectations(msg_id="a", union_registers={"owner": "x"}), [b"k"])],
                fail=True)
    assert part.guard.registers == {} and len(part.guard.ids) == 0
    assert isinstance(part.publish(Expectations(msg_id="a", expected_offset=0)), Admitted)


def test_duplicate_answered_with_original_offset_even_when_expectation_moved() -> None:
    part = Partition()
    part.publish(Expectations())
    assert part.publish(Expectations(msg_id="m", expected_offset=1)) == Admitted(
        1, {h.MSG_ID: b"m"}, {h.MSG_ID: b"m"})
    part.publish(Expectations())
    assert part.publish(Expectations(msg_id="m", expected_offset=1)) == Duplicate(1)
    assert len(part.log) == 3


def test_id_window_expires_by_age_and_by_count() -> None:
    part = Partition(GuardLimits(duplicate_window_ms=1000, ids_max=2))
    part.publish(Expectations(msg_id="a"))
    part.now += 1001
    assert isinstance(part.publish(Expectations(msg_id="a")), Admitted)  # window passed
    part.publish(Expectations(msg_id="b"))
    part.publish(Expectations(msg_id="c"))  # pushes out the second "a", the oldest
    assert isinstance(part.publish(Expectations(msg_id="a")), Admitted)
    assert part.publish(Expectations(msg_id="c")) == Duplicate(3)


def test_key_expectations() -> None:
    part = Partition()
    assert isinstance(part.publish(Expectations(expected_key_offset=KEY_ABSENT), [b"k"]),
                      Admitted)
    refused = part.publish(Expectations(expected_key_offset=KEY_ABSENT), [b"k"])
    assert isinstance(refused, Refused) and isinstance(refused.error, KeyOffsetMismatch)
    assert refused.error.fields == {"key": "k", "expected_offset": -1, "last_offset": 0}
    assert isinstance(part.publish(Expectations(expected_key_offset=0), [b"k"]), Admitted)
    assert isinstance(part.publish(Expectations(expected_key_offset=KEY_ABSENT), [b"j"]),
                      Admitted)


def test_keys_evicted_past_the_limit_are_not_tracked() -> None:
    part = Partition(GuardLimits(keys_max=2))
    for key in (b"a", b"b", b"c"):
        part.publish(Expectations(), [key])
    refused = part.publish(Expectations(expected_key_offset=KEY_ABSENT), [b"a"])
    assert isinstance(refused, Refused) and isinstance(refused.error, KeyNotTracked)
    assert isinstance(part.publish(Expectations(expected_key_offset=2), [b"c"]), Admitted)


def test_registers_check_union_subtract() -> None:
    part = Partition()
    free = parse_selector("!owner")
    won = part.publish(Expectations(check_registers=free, union_registers={"owner": "a"}))
    assert isinstance(won, Admitted)
    assert won.last_headers[h.REGISTERS] == b'{"owner":"a"}'
    lost = part.publish(Expectations(check_registers=free, union_registers={"owner": "b"}))
    assert isinstance(lost, Refused) and isinstance(lost.error, RegisterMismatch)
    assert lost.error.fields["registers"] == {"owner": "a"}
    part.publish(Expectations(subtract_registers={"owner": "b"}))  # not its value: kept
    assert part.guard.registers == {"owner": "a"}
    part.publish(Expectations(check_registers=parse_selector("owner=a"),
                              subtract_registers={"owner": "a"}))
    assert part.guard.registers == {}
    assert part.replayed().registers == {}


def test_register_count_is_bounded() -> None:
    part = Partition()
    verdict = part.publish(Expectations(union_registers={f"r{i}": "v" for i in range(65)}))
    assert isinstance(verdict, Refused) and isinstance(verdict.error, ProtocolError)


def test_producer_sequences() -> None:
    part = Partition(GuardLimits(sequences_max=2))

    def send(seq: int, epoch: int = 0, resume: bool = False) -> Verdict:
        return part.publish(Expectations(producer=ProducerSequence("p", epoch, seq, resume)))

    first = send(5)  # an unknown producer's sequences before 5 may be on their way
    assert isinstance(first, Refused) and isinstance(first.error, OutOfOrderSequence)
    assert first.error.fields["expected_sequence"] == 0
    assert isinstance(send(5, resume=True), Admitted)  # the sender holds acks for 0..4
    assert isinstance(send(6), Admitted)
    assert send(6) == Duplicate(1)
    gap = send(8)
    assert isinstance(gap, Refused) and isinstance(gap.error, OutOfOrderSequence)
    assert gap.error.fields["expected_sequence"] == 7
    assert isinstance(send(7), Admitted)
    assert isinstance(send(8), Admitted)
    old = send(5)  # stored, but no longer remembered with its offset
    assert isinstance(old, Refused) and isinstance(old.error, DuplicateSequence)
    late = send(3, epoch=1)  # a new epoch starts at 0 too
    assert isinstance(late, Refused) and isinstance(late.error, OutOfOrderSequence)
    assert isinstance(send(0, epoch=1), Admitted)  # a new epoch fences the old one
    fenced = send(9)
    assert isinstance(fenced, Refused) and isinstance(fenced.error, ProducerFenced)
    assert fenced.error.fields["current_epoch"] == 1
    replayed = part.replayed()
    state = replayed.producers.get("p")
    assert state is not None and (state.epoch, state.last_sequence) == (1, 0)


def test_a_new_epoch_sent_again_from_a_checkpoint_is_taken_up_after_its_duplicates() -> None:
    part = Partition()

    def send(sequence: int, epoch: int, msg: int, resume: bool = False) -> Verdict:
        return part.publish(Expectations(msg_id=f"m{msg}", producer=ProducerSequence(
            "p", epoch, sequence, resume)))

    for i in range(3):
        assert isinstance(send(i, 0, i), Admitted)
    # Epoch 1 starts again at m1, which epoch 0 stored with m2 (its acks were lost).
    assert send(0, 1, 1, resume=True) == Duplicate(1)
    assert send(1, 1, 2) == Duplicate(2)
    assert isinstance(send(2, 1, 3), Admitted)  # after the duplicates, in a later append
    # One append: the duplicates hold their places for the new record behind them.
    first, second, new = part.append([
        (Expectations(msg_id="m2", producer=ProducerSequence("p", 2, 0, True)), [None]),
        (Expectations(msg_id="m3", producer=ProducerSequence("p", 2, 1)), [None]),
        (Expectations(msg_id="m4", producer=ProducerSequence("p", 2, 2)), [None])])
    assert (first, second) == (Duplicate(2), Duplicate(3)) and isinstance(new, Admitted)
    # A duplicate out of order holds no place: what follows it is still refused.
    assert send(5, 3, 1) == Duplicate(1)  # epoch 3 must start at 0
    late = send(6, 3, 9)
    assert isinstance(late, Refused) and isinstance(late.error, OutOfOrderSequence)
    assert late.error.fields["expected_sequence"] == 0
    state = part.guard.producers.get("p")
    assert state is not None and (state.epoch, state.last_sequence) == (2, 2)


def test_producer_retries_within_one_append() -> None:
    part = Partition()
    stamp = ProducerSequence("p", 0, 0)
    first, again = part.append([(Expectations(producer=stamp), [None]),
                                (Expectations(producer=stamp), [None])])
    assert isinstance(first, Admitted) and again == Duplicate(0)


def test_untracked_keys_on_a_stream_without_key_tracking() -> None:
    part = Partition(track_keys=False)
    verdict = part.publish(Expectations(expected_key_offset=KEY_ABSENT), [b"k"])
    assert isinstance(verdict, Refused) and isinstance(verdict.error, KeyNotTracked)


def test_header_codec_round_trips_and_ignores_foreign_values() -> None:
    stamp = h.encode_producer("app-1.x", 3, 2**40)
    assert h.producer({h.PRODUCER: stamp}) == ("app-1.x", 3, 2**40)
    assert h.producer({h.PRODUCER: b"garbage"}) is None
    assert h.registers({h.REGISTERS: b"[1]"}) is None
    assert h.registers({h.REGISTERS: h.encode_registers({"b": "2", "a": "1"})}) == {
        "a": "1", "b": "2"}
    assert h.msg_id({h.MSG_ID: b"\xff"}) is None
    with pytest.raises(ProtocolError):
        h.check_producer("bad id", 0, 0)
    with pytest.raises(ProtocolError):
        h.check_msg_id("")


# -- the property: raced writers, retried ids ---------------------------------------------------

KEYS = [b"k0", b"k1"]


@st.composite
def rounds(draw: st.DrawFn) -> list[list[tuple[str, int, int]]]:
    """Rounds of raced publishes, each (kind, writer, msg id number): ids repeat (retries)."""
    publish = st.tuples(st.sampled_from(["offset", "key", "register", "id"]),
                        st.integers(0, 3), st.integers(0, 40))
    return [draw(st.lists(publish, min_size=1, max_size=6))
            for _ in range(draw(st.integers(1, 12)))]


@settings(max_examples=200, deadline=None)
@given(rounds(), st.lists(st.booleans(), max_size=12), st.integers(0, 3))
def test_raced_publishes_never_store_a_duplicate_nor_win_twice(
        plan: list[list[tuple[str, int, int]]], failures: list[bool],
        appends_per_round: int) -> None:
    part = Partition(GuardLimits(duplicate_window_ms=10_000))
    won: dict[tuple[str, object], int] = {}
    answered: dict[str, int] = {}
    for number, publishes in enumerate(plan):
        # Every writer of the round read the partition before any of them published.
        seen_end = len(part.log)
        seen_keys = {k: part.guard.keys.get(k, KEY_ABSENT) for k in KEYS}
        free = "lock" not in part.guard.registers
        requests: list[tuple[Expectations, list[bytes | None], tuple[str, object] | None]] = []
        for kind, writer, id_number in publishes:
            msg_id = f"m{id_number}"
            key = KEYS[writer % 2]
            if kind == "offset":
                expect = Expectations(msg_id=msg_id, expected_offset=seen_end)
                claim: tuple[str, object] | None = ("offset", seen_end)
            elif kind == "key":
                expect = Expectations(msg_id=msg_id, expected_key_offset=seen_keys[key])
                claim = ("key", (key, seen_keys[key]))
            elif kind == "register" and free:
                expect = Expectations(msg_id=msg_id, check_registers=parse_selector("!lock"),
                                      union_registers={"lock": str(writer)})
                claim = ("register", number)
            else:
                expect, claim = Expectations(msg_id=msg_id), None
            requests.append((expect, [key], claim))
        # Split the round into appends; some fail (the log refused: nothing stored).
        size = max(1, appends_per_round or len(requests))
        for start in range(0, len(requests), size):
            chunk = requests[start:start + size]
            fail = bool(failures) and failures[(number + start) % len(failures)]
            verdicts = part.append([(e, k) for e, k, _c in chunk], fail=fail)
            for (expect, _keys, claim), verdict in zip(chunk, verdicts, strict=True):
                assert expect.msg_id is not None
                if isinstance(verdict, Duplicate) and not fail:
                    assert verdict.offset == answered[expect.msg_id]
                if fail or not isinstance(verdict, Admitted):
                    continue
                answered[expect.msg_id] = verdict.offset
                if claim is not None:
                    assert claim not in won, f"{claim} satisfied twice"
                    won[claim] = verdict.offset
        if "lock" in part.guard.registers and number % 3 == 2:
            part.publish(Expectations(
                subtract_registers={"lock": part.guard.registers["lock"]}))
        part.now += 1000
    stored: dict[bytes, int] = {}
    for r in part.log:
        if h.MSG_ID in r.headers:
            before = stored.get(r.headers[h.MSG_ID])
            assert before is None or r.timestamp_ms - before > 10_000, \
                "a message id was stored twice inside the window"
            stored[r.headers[h.MSG_ID]] = r.timestamp_ms
    # A new leader replaying the log decides exactly as this one would.
    replayed = part.replayed()
    assert replayed.registers == part.guard.registers
    assert dict(replayed.keys) == dict(part.guard.keys)
    for msg_id, offset in answered.items():
        assert replayed.ids.offset_of(msg_id) == offset


# -- rebuilding from a real log -------------------------------------------------------------------


def _append_admitted(log: Log, guard: Guard, expect: Expectations, key: bytes | None,
                     now: int) -> Verdict:
    p = guard.begin(log.log_end_offset, log.log_start_offset, now)
    verdict = p.admit(expect, [key])
    if isinstance(verdict, Admitted):
        info = log.append([fmt.Record(b"v", key, dict(verdict.first_headers))], 0)
        assert info.base_offset == verdict.offset
        p.commit()
    return verdict


def test_rebuild_reads_the_window_and_the_last_register_change(tmp_path: Path) -> None:
    clock = Clock()
    limits = GuardLimits(duplicate_window_ms=60_000)
    log = make(tmp_path, clock, segment_bytes_max=4096)
    guard = Guard(limits, track_keys=False)
    _append_admitted(log, guard, Expectations(union_registers={"owner": "a"}), None, clock.now)
    _append_admitted(log, guard, Expectations(msg_id="old"), None, clock.now)
    clock.now += 120_000  # both now lie outside the window
    for i in range(150):  # several segments of plain records later
        log.append([fmt.Record(value(i))], 0)
    assert len(log.segment_base_offsets) > 3
    _append_admitted(log, guard, Expectations(msg_id="new",
                                              producer=ProducerSequence("p", 2, 7, resume=True)),
                     None, clock.now)
    rebuilt = rebuild(log, limits, clock.now, track_keys=False)
    assert rebuilt.registers == {"owner": "a"}
    assert rebuilt.ids.offset_of("new") == 152 and rebuilt.ids.offset_of("old") is None
    state = rebuilt.producers.get("p")
    assert state is not None and (state.epoch, state.last_sequence) == (2, 7)
    log.close()


def test_rebuild_of_a_compacted_stream_and_its_older_keys_know_every_key(
        tmp_path: Path) -> None:
    clock = Clock()
    log = make(tmp_path, clock, segment_bytes_max=4096)
    guard = Guard(GuardLimits(), track_keys=True)
    for i in range(30):
        _append_admitted(log, guard, Expectations(), f"k{i % 7}".encode(), clock.now)
        clock.now += 10_000
    rebuilt = rebuild(log, GuardLimits(), clock.now, track_keys=True)
    assert 0 < rebuilt.keys_from < log.log_end_offset  # the window's tail only
    assert rebuilt.learn_older_keys(scan_keys(log, 0, rebuilt.keys_from), 0,
                                    rebuilt.keys_from)
    assert list(rebuilt.keys.items()) == list(guard.keys.items())
    p = rebuilt.begin(log.log_end_offset, log.log_start_offset, clock.now)
    assert isinstance(p.admit(Expectations(expected_key_offset=KEY_ABSENT), [b"nope"]),
                      Admitted)
    log.close()


def test_rebuild_of_a_log_without_headers_is_empty(segmented: Log) -> None:
    rebuilt = rebuild(segmented, GuardLimits(), T0 + 100, track_keys=False)
    assert rebuilt.registers == {} and len(rebuilt.ids) == 0 and len(rebuilt.producers) == 0


def test_admit_id_is_admit_of_an_id_alone() -> None:
    guard = Guard(GuardLimits(), track_keys=True)
    p = guard.begin(5, 0, T0)
    assert p.admit_id("a", b"k") == -1
    assert p.admit_id("a", b"k") == 5  # staged in this pass
    assert p.admit(Expectations(msg_id="a"), [b"k"]) == Duplicate(5)
    p.commit()
    assert guard.keys[b"k"] == 5
    assert guard.begin(6, 0, T0).admit_id("a", None) == 5


# -- a compacted log's older keys, learned after the leader started --------------------------------


@settings(max_examples=300, deadline=None)
@given(keys=st.lists(st.sampled_from([b"a", b"b", b"c", b"d", b"e", None]), max_size=40),
       data=st.data(), keys_max=st.sampled_from([2, 3, 1_000]))
def test_older_keys_learned_later_give_the_guard_a_whole_replay_gives(
        keys: list[bytes | None], data: st.DataObject, keys_max: int) -> None:
    """A new leader reads its log's tail, starts, appends, and learns the keys of the older
    records in the background: it then knows what replaying the whole log would tell it."""
    limits = GuardLimits(keys_max=keys_max)
    split = data.draw(st.integers(0, len(keys)), label="tail starts at")
    started = data.draw(st.integers(split, len(keys)), label="leader starts at")
    whole = Guard(limits, track_keys=True)
    for offset, key in enumerate(keys):
        whole.replay(offset, T0, key, {})
    guard = Guard(limits, track_keys=True, keys_from=split)
    for offset in range(split, started):  # the tail `rebuild` reads
        guard.replay(offset, T0, keys[offset], {})
    for offset in range(started, len(keys)):  # appends while the older keys are read
        p = guard.begin(offset, 0, T0)
        p.plain([keys[offset]])
        p.commit()
    older: dict[bytes, int] = {}
    for offset, key in enumerate(keys[:split]):
        if key is not None:
            older.pop(key, None)
            older[key] = offset
    guard.learn_older_keys(older, 0, split)
    assert list(guard.keys.items()) == list(whole.keys.items())
    assert guard.keys_from == whole.keys_from


def test_a_key_expectation_before_the_older_keys_are_learned_is_not_judged(
        tmp_path: Path) -> None:
    clock = Clock()
    limits = GuardLimits(duplicate_window_ms=60_000)
    log = make(tmp_path, clock, segment_bytes_max=4096)
    guard = Guard(limits, track_keys=True)
    for i in range(60):
        _append_admitted(log, guard, Expectations(), f"k{i % 9}".encode(), clock.now)
    clock.now += 120_000  # all outside the window: the tail starts at the log end
    rebuilt = rebuild(log, limits, clock.now, track_keys=True)
    assert rebuilt.keys_from == log.log_end_offset and not rebuilt.keys
    p = rebuilt.begin(log.log_end_offset, log.log_start_offset, clock.now)
    assert isinstance(p.admit(Expectations(expected_key_offset=59), [b"k5"]), Refused)
    older = scan_keys(log, log.log_start_offset, rebuilt.keys_from)
    assert rebuilt.learn_older_keys(older, log.log_start_offset, rebuilt.keys_from)
    assert dict(rebuilt.keys) == dict(guard.keys)
    p = rebuilt.begin(log.log_end_offset, log.log_start_offset, clock.now)
    assert isinstance(p.admit(Expectations(expected_key_offset=59), [b"k5"]), Admitted)
    log.close()


class IdsModel:
    """The id window as its docstring states it: each id with the time it was stored,
    forgotten once older than the window or past the count, oldest first."""

    def __init__(self, limits: GuardLimits) -> None:
        self.limits = limits
        self.ids: dict[str, tuple[int, int]] = {}

    def add_all(self, staged: Mapping[str, int], timestamp_ms: int) -> None:
        for msg_id, offset in staged.items():
            self.ids.pop(msg_id, None)
            self.ids[msg_id] = (offset, timestamp_ms)
        while len(self.ids) > self.limits.ids_max:
            del self.ids[next(iter(self.ids))]

    def expire(self, now_ms: int) -> None:
        while self.ids and next(iter(self.ids.values()))[1] < now_ms - \
                self.limits.duplicate_window_ms:
            del self.ids[next(iter(self.ids))]


@settings(max_examples=300, deadline=None)
@given(steps=st.lists(st.tuples(st.lists(st.sampled_from("abcdefgh"), max_size=4),
                                st.sampled_from([0, 1, 10, 25, 49, 50, 51]), st.booleans()),
                      max_size=40),
       ids_max=st.integers(1, 6), accelerated=st.booleans())
def test_the_id_window_follows_its_model(steps: list[tuple[list[str], int, bool]],
                                         ids_max: int, accelerated: bool) -> None:
    """In its C table and in its Python one."""
    limits = GuardLimits(duplicate_window_ms=50, ids_max=ids_max)
    window, model = IdWindow(limits, accelerated=accelerated), IdsModel(limits)
    offset, now = 0, T0
    for names, elapsed, expire in steps:
        now += elapsed  # the clock never goes back
        staged = {}
        for name in names:
            staged.pop(name, None)
            staged[name] = offset
            offset += 1
        if all(window.offset_of(name) is None for name in staged):
            window.add_new(staged, now)  # what a leader's pass adds
        else:
            window.add_all(staged, now)
        model.add_all(staged, now)
        if expire:
            window.expire(now)
            model.expire(now)
        assert len(window) == len(model.ids)
        assert {n: window.offset_of(n) for n in "abcdefgh"} == {
            n: model.ids[n][0] if n in model.ids else None for n in "abcdefgh"}


table_ops = st.lists(st.one_of(
    st.tuples(st.just("add_new"), st.lists(st.integers(0, 299), max_size=40)),
    st.tuples(st.just("pop"), st.integers(0, 299)),
    st.tuples(st.just("forget"), st.integers(0, 50)),
    st.tuples(st.just("forget_before"), st.integers(0, 3000)),
    st.tuples(st.just("clear"), st.none())), max_size=60)


@settings(max_examples=300, deadline=None)
@given(ops=table_ops)
def test_the_c_id_table_holds_what_the_python_one_holds(
        ops: list[tuple[str, object]]) -> None:
    """Through growth, removals inside runs of colliding slots, places left behind by ids
    stored again or popped, and clears: the same ids, offsets, count and front."""
    if dedupe._ids_c is None:
        pytest.skip("the C table is not built here")
    c_table, py_table = dedupe._ids_c.IdTable(), dedupe._IdTable()
    names = [f"id-{n}" for n in range(300)]
    offset = 0
    for op, arg in ops:
        for table in (c_table, py_table):
            if op == "add_new":
                assert isinstance(arg, list)
                staged = {}
                for n in arg:
                    staged.pop(names[n], None)
                    staged[names[n]] = offset + len(staged)
                table.add_new(staged)
            elif op == "clear":
                table.clear()
            else:
                getattr(table, op)(names[arg] if op == "pop" else arg)  # type: ignore[index]
        if op == "add_new":
            offset += 40
        assert len(c_table) == len(py_table)
        assert c_table.front_offset() == py_table.front_offset()
        probe: list[str | None] = [*names, None]
        assert c_table.get_many(probe) == py_table.get_many(probe)
        assert [c_table.get(n) for n in names] == [py_table.get(n) for n in names]


def test_the_c_id_table_at_a_million_ids() -> None:
    """Adds in batches past a million, forgetting the oldest as the window does: the same
    lookups as the Python table, hits and misses."""
    if dedupe._ids_c is None:
        pytest.skip("the C table is not built here")
    c_table, py_table = dedupe._ids_c.IdTable(), dedupe._IdTable()
    for batch in range(1200):
        staged = {f"{batch}-{i}": batch * 1000 + i for i in range(1000)}
        c_table.add_new(staged)
        py_table.add_new(staged)
        if len(py_table) > 500_000:
            c_table.forget(1000)
            py_table.forget(1000)
        if batch % 100 == 99:
            probe: list[str | None] = [f"{b}-{i}" for b in range(batch - 600, batch + 2, 7)
                                       for i in range(0, 1000, 97)]
            assert c_table.get_many(probe) == py_table.get_many(probe)
            assert len(c_table) == len(py_table) == min((batch + 1) * 1000, 500_000)
    c_table.forget_before(1_100_000)
    py_table.forget_before(1_100_000)
    assert len(c_table) == len(py_table) == 100_000
    assert c_table.front_offset() == py_table.front_offset() == 1_100_000
