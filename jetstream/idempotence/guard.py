"""The expectations and dedupe state of one partition, decided in log order (pure: no IO, no
clock).

Theory of operation
- A publish may carry `Expectations`: a message id, an idempotent producer's (id, epoch,
  sequence), an expected first offset, an expected last offset of its key, a register
  selector to check and register labels to set or remove. The leader judges every publish
  of an append *in log order* against the state of everything appended before it, committed
  or not (a publish ahead of it in the same append counts too), so of two raced publishes
  with the same expectation the second always sees the first.
- One append is one `Pass`: `Guard.begin` opens it at the log end offset; `admit` judges a
  publish and, when it is stored, stages what it changes (its offsets, id, sequence, key
  offsets, registers); `plain` stages records without expectations (they move the offsets and
  the keys). Nothing touches the guard until `commit` (after the log accepted the append);
  a failed append just drops the pass. A publish is all or nothing: one verdict for all its
  records.
- Order of the checks: fencing first (a fenced producer gets nothing), then duplicates (a
  retry of a stored publish is answered with its first offset even though its
  expectations no longer hold: it succeeded), then sequence gaps, then the expectations.
  A message-id duplicate whose stamp comes in order (the next sequence, or the first of a
  new epoch) also moves the producer's sequence on, in this leader's memory: a writer that
  took a new epoch and sends again from its checkpoint what an older epoch stored gets the
  new records after those duplicates taken. A pass holding only such duplicates is still
  committed.
- What the log must carry so that a new leader rebuilds exactly this state
  (jetstream.idempotence.headers) comes out of `admit` as record headers.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from jetstream.errors import (
    DuplicateSequence,
    JetstreamError,
    KeyNotTracked,
    KeyOffsetMismatch,
    OffsetMismatch,
    OutOfOrderSequence,
    ProducerFenced,
    ProtocolError,
    RegisterMismatch,
)
from jetstream.idempotence import headers as h
from jetstream.idempotence.dedupe import GuardLimits, IdWindow, ProducerTable
from jetstream.protocol.names import LABELS_MAX, Selector

#: `expected_key_offset` meaning: the key must have no record.
KEY_ABSENT = -1


@dataclass(frozen=True, slots=True)
class ProducerSequence:
    """An idempotent producer's stamp on one publish."""

    producer_id: str
    epoch: int
    sequence: int
    #: Every earlier sequence of this epoch was acknowledged to the sender: a leader that
    #: forgot the producer takes it up at `sequence` (otherwise the first must be 0).
    resume: bool = False


@dataclass(frozen=True, slots=True)
class Expectations:
    """What a publish asks of the partition. Everything is optional."""

    msg_id: str | None = None
    producer: ProducerSequence | None = None
    expected_offset: int | None = None
    #: The offset the latest record with the publish's key must be at; KEY_ABSENT: none.
    expected_key_offset: int | None = None
    check_registers: Selector | None = None
    #: Register labels set / removed with the publish (None: none).
    union_registers: Mapping[str, str] | None = None
    subtract_registers: Mapping[str, str] | None = None

    @property
    def changes_registers(self) -> bool:
        return bool(self.union_registers or self.subtract_registers)


NO_EXPECTATIONS = Expectations()


@dataclass(frozen=True, slots=True)
class Admitted:
    """Store the publish at `offset`; add `first_headers` to its first record and
    `last_headers` to its last (the same record for a publish of one)."""

    offset: int
    first_headers: Mapping[str, bytes]
    last_headers: Mapping[str, bytes]


@dataclass(frozen=True, slots=True)
class Duplicate:
    """Do not store: it was stored at `offset` already."""

    offset: int


@dataclass(frozen=True, slots=True)
class Refused:
    """Do not store: `error` says why."""

    error: JetstreamError


Verdict = Admitted | Duplicate | Refused


class Guard:
    """The committed-or-appended state of one partition's leader."""

    def __init__(self, limits: GuardLimits, *, track_keys: bool, keys_from: int = 0) -> None:
        self.limits = limits
        self.ids = IdWindow(limits)
        self.producers = ProducerTable(limits)
        self.registers: dict[str, str] = {}
        self.track_keys = track_keys
        #: key -> offset of its latest record, for every key written at or after `keys_from`
        #: (ordered by that offset, oldest first).
        self.keys: collections.OrderedDict[bytes, int] = collections.OrderedDict()
        self.keys_from = keys_from

    def begin(self, log_end_offset: int, log_start_offset: int, now_ms: int) -> Pass:
        """Open the pass of one append at the log end offset."""
        self.ids.expire(now_ms)
        self.producers.expire(now_ms)
        return Pass(self, log_end_offset, log_start_offset, now_ms)

    # -- replay: the records of a log tail, in order ---------------------------------------

    def replay(self, offset: int, timestamp_ms: int, key: bytes | None,
               headers: Mapping[str, bytes]) -> None:
        """Learn a stored record (a new leader reads its log tail through this)."""
        if key is not None and self.track_keys:
            self.key_at(key, offset)
        if not headers:
            return
        msg_id = h.msg_id(headers)
        if msg_id is not None:
            self.ids.add(msg_id, offset, timestamp_ms)
        stamp = h.producer(headers)
        if stamp is not None:
            producer_id, epoch, sequence = stamp
            self.producers.add(producer_id, epoch, sequence, offset, timestamp_ms)
        registers = h.registers(headers)
        if registers is not None:
            self.registers = registers

    def key_at(self, key: bytes, offset: int) -> None:
        """The latest record of `key` is at `offset` (offsets only grow)."""
        keys = self.keys
        if key in keys:
            del keys[key]
        keys[key] = offset
        if len(keys) > self.limits.keys_max:
            self._evict()

    def keys_at(self, latest: Mapping[bytes, int]) -> None:
        """`key_at` for each (key, offset) of `latest`, in its order (offsets growing)."""
        keys = self.keys
        pop = keys.pop
        for key, offset in latest.items():
            pop(key, None)
            keys[key] = offset
        if len(keys) > self.limits.keys_max:
            self._evict()

    def learn_older_keys(self, older: Mapping[bytes, int], scanned_from: int,
                         scanned_to: int) -> bool:
        """The latest offset of each key in the records at [scanned_from, scanned_to), in
        offset order, read while this guard tracked keys from `scanned_to` on (a new leader
        reads its older records in the background): they go before the keys learned since,
        less those written again since, and the guard tracks keys from `scanned_from`. False
        (nothing learned) when the guard dropped keys meanwhile (past `keys_max`) and now
        tracks from later than `scanned_to`: the older ones would be dropped first anyway."""
        if not self.track_keys or self.keys_from != scanned_to:
            return False
        merged = collections.OrderedDict(
            (key, offset) for key, offset in older.items() if key not in self.keys)
        merged.update(self.keys)
        self.keys = merged
        self.keys_from = scanned_from
        self._evict()
        return True

    def _evict(self) -> None:
        keys = self.keys
        while len(keys) > self.limits.keys_max:
            _evicted, evicted_offset = keys.popitem(last=False)
            self.keys_from = max(self.keys_from, evicted_offset + 1)


class Pass:
    """The verdicts of one append, staged until `commit`."""

    def __init__(self, guard: Guard, log_end_offset: int, log_start_offset: int,
                 now_ms: int) -> None:
        self._guard = guard
        self.next_offset = log_end_offset
        self._log_start = log_start_offset
        self._now = now_ms
        self._ids: dict[str, int] = {}
        self._sequences: dict[str, tuple[int, int]] = {}  # producer -> (epoch, last sequence)
        self._stamps: list[tuple[str, int, int, int]] = []  # producer, epoch, sequence, offset
        #: The latest offset of each key staged, in the order of those offsets.
        self._keys: dict[bytes, int] = {}
        self._registers: dict[str, str] | None = None

    @property
    def registers(self) -> dict[str, str]:
        return self._guard.registers if self._registers is None else self._registers

    def plain(self, keys: Sequence[bytes | None]) -> int:
        """Stage records without expectations; returns the offset of the first."""
        first = self.next_offset
        self._stage_keys(keys)
        return first

    def admit_id(self, msg_id: str, key: bytes | None) -> int:
        """`admit` of a one-record publish whose only expectation is its message id (the
        hot path of NATS publishers setting `Nats-Msg-Id`): its original offset when it is a
        duplicate, else -1 (staged at the pass's next offset)."""
        original = self._ids.get(msg_id)
        if original is None:
            original = self._guard.ids.offset_of(msg_id)
            if original is not None:
                return original
        else:
            return original
        self._ids[msg_id] = self.next_offset
        if key is not None and self._guard.track_keys:
            self._stage_keys((key,))
        else:
            self.next_offset += 1
        return -1

    def admit_ids(self, msg_ids: list[str | None],
                  keys: Sequence[bytes | None]) -> dict[int, int]:
        """`admit_id` of each one-record publish whose message id is in `msg_ids`, `plain`
        of each whose is None (`keys`: theirs, in the same order): the original offsets of
        the duplicates, by index."""
        originals: dict[int, int] = {}
        if self._guard.track_keys:
            for i, msg_id in enumerate(msg_ids):
                if msg_id is None:
                    self.plain((keys[i],))
                elif (first := self.admit_id(msg_id, keys[i])) >= 0:
                    originals[i] = first
            return originals
        staged, stage, offset = self._ids.get, self._ids.__setitem__, self.next_offset
        # The window's offsets of them all at once: its lookups wait on memory together.
        for i, (msg_id, stored) in enumerate(zip(msg_ids, self._guard.ids.offsets_of(
                msg_ids), strict=True)):
            if msg_id is not None:
                original = staged(msg_id)
                if original is None:
                    original = stored
                if original is not None:
                    originals[i] = original
                    continue
                stage(msg_id, offset)
            offset += 1
        self.next_offset = offset
        return originals

    def admit(self, expect: Expectations, keys: Sequence[bytes | None]) -> Verdict:
        """Judge one publish of `keys` records (their keys, in order) and stage it when it is
        stored."""
        assert keys, "a publish holds at least one record"
        guard = self._guard
        stamp = expect.producer
        if stamp is not None:
            check = guard.producers.check(stamp.producer_id, stamp.epoch, stamp.sequence,
                                          self._sequences.get(stamp.producer_id),
                                          stamp.resume)
            if check.verdict == "fenced":
                return Refused(ProducerFenced(stamp.producer_id, stamp.epoch, check.expected))
        if expect.msg_id is not None:
            original = self._ids.get(expect.msg_id)
            if original is None:
                original = guard.ids.offset_of(expect.msg_id)
            if original is not None:
                if stamp is not None and check.verdict == "new":
                    # Stored already, sent again in order under a new stamp (a writer that
                    # took a new epoch and starts again from its checkpoint): it holds its
                    # place in the producer's sequence, so what follows it is taken up.
                    self._sequences[stamp.producer_id] = (stamp.epoch, stamp.sequence)
                    self._stamps.append((stamp.producer_id, stamp.epoch, stamp.sequence,
                                         original))
                return Duplicate(original)
        if stamp is not None:
            if check.verdict == "duplicate":
                if check.offset < 0:
                    staged = [s[3] for s in self._stamps
                              if s[0] == stamp.producer_id and s[1:3] == (stamp.epoch,
                                                                          stamp.sequence)]
                    if not staged:
                        return Refused(DuplicateSequence(stamp.producer_id, stamp.sequence))
                    return Duplicate(staged[0])
                return Duplicate(check.offset)
            if check.verdict == "gap":
                return Refused(OutOfOrderSequence(stamp.producer_id, check.expected,
                                                  stamp.sequence))
        refusal = self._check(expect, keys[0])
        if refusal is not None:
            return Refused(refusal)
        return self._stage(expect, keys)

    def _check(self, expect: Expectations, key: bytes | None) -> JetstreamError | None:
        if expect.expected_offset is not None and expect.expected_offset != self.next_offset:
            return OffsetMismatch(expect.expected_offset, self.next_offset)
        if expect.expected_key_offset is not None:
            shown = _show_key(key)
            last = self._last_offset_of(key)
            if last is None:
                return KeyNotTracked(shown, self._guard.keys_from)
            if last != expect.expected_key_offset:
                return KeyOffsetMismatch(shown, expect.expected_key_offset, last)
        selector = expect.check_registers
        if selector is not None and not selector(self.registers):
            return RegisterMismatch(str(selector), dict(self.registers))
        union = expect.union_registers
        if union and len(self.registers.keys() | union.keys()) > LABELS_MAX:
            return ProtocolError(f"the registers would hold more than {LABELS_MAX} labels",
                                 field="union_registers")
        return None

    def _last_offset_of(self, key: bytes | None) -> int | None:
        """The offset of the key's latest record, KEY_ABSENT when it has none, None when
        that is not known."""
        if key is None:
            return KEY_ABSENT
        if not self._guard.track_keys:
            return None
        found = self._keys.get(key)
        if found is None:
            found = self._guard.keys.get(key)
        if found is not None:
            return found
        if self._guard.keys_from <= self._log_start:
            return KEY_ABSENT
        return None

    def _stage(self, expect: Expectations, keys: Sequence[bytes | None]) -> Admitted:
        offset = self.next_offset
        first: dict[str, bytes] = {}
        last = first if len(keys) == 1 else {}
        if expect.msg_id is not None:
            self._ids[expect.msg_id] = offset
            first[h.MSG_ID] = expect.msg_id.encode()
        stamp = expect.producer
        if stamp is not None:
            self._sequences[stamp.producer_id] = (stamp.epoch, stamp.sequence)
            self._stamps.append((stamp.producer_id, stamp.epoch, stamp.sequence, offset))
            first[h.PRODUCER] = h.encode_producer(stamp.producer_id, stamp.epoch,
                                                  stamp.sequence)
        if expect.changes_registers:
            registers = dict(self.registers)
            registers.update(expect.union_registers or {})
            for name, value in (expect.subtract_registers or {}).items():
                if registers.get(name) == value:
                    del registers[name]
            self._registers = registers
            last[h.REGISTERS] = h.encode_registers(registers)
        self._stage_keys(keys)
        return Admitted(offset, first, last)

    def _stage_keys(self, keys: Sequence[bytes | None]) -> None:
        offset = self.next_offset
        if self._guard.track_keys:
            staged = self._keys
            pop = staged.pop
            for i, key in enumerate(keys):
                if key is not None:
                    pop(key, None)  # to the end: the order stays that of the offsets
                    staged[key] = offset + i
        self.next_offset = offset + len(keys)

    def commit(self) -> None:
        """The log accepted the append: make what it staged the guard's state."""
        guard, now = self._guard, self._now
        if self._ids:  # each looked up in the window by this pass: none is there
            guard.ids.add_new(self._ids, now)
        for producer_id, epoch, sequence, offset in self._stamps:
            guard.producers.add(producer_id, epoch, sequence, offset, now)
        if self._keys:
            guard.keys_at(self._keys)
        if self._registers is not None:
            guard.registers = self._registers


def _show_key(key: bytes | None) -> str:
    if key is None:
        return ""
    try:
        return key.decode()
    except UnicodeDecodeError:
        return key.hex()
