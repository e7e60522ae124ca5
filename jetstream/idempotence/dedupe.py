"""What a partition leader remembers to answer retried publishes (pure: no IO, no clock).

Theory of operation
- Message ids (NATS JetStream's `Nats-Msg-Id`): `IdWindow` maps each id stored within the
  last `duplicate_window_ms` to the offset it was stored at. Ids are kept in append order, so
  the oldest is always first: it expires first, by age (its record's timestamp is older than
  the window) or by count (`ids_max`), whichever comes first.
- Idempotent producers (Kafka's producer id, epoch and sequence): `ProducerTable` keeps, per
  producer id, its epoch, the last sequence stored and the offsets of its last
  `sequences_max` sequences. A sequence at or below the last is a retry: answered with its
  offset when it is still remembered. One above the last + 1 is a gap. A higher epoch
  replaces the producer's state; a lower one is fenced. Producers idle longer than the window
  expire, and the least recently active goes first past `producers_max`. The first sequence
  of an epoch the table does not know must be 0; a later one is a gap (its earlier sequences
  may have been lost on the way: NATS drops a publish that nobody subscribes to while a
  leadership moves), unless the publish says `resume`: its sender holds acks for every
  earlier sequence, so the table forgot the producer (idle, or evicted) and takes it up
  where it is.

Both are fed in log order, by the leader's appends and by the replay of a log tail when a
broker becomes leader; both take the timestamps of the records, so a replay and the live
path agree on what has expired.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType

_ids_c: ModuleType | None
try:  # the id table in C, when it was built (setup.py; optional)
    from jetstream.idempotence import _ids_c
except ImportError:  # pragma: no cover - a build without a C compiler
    _ids_c = None

#: Whether the id window keeps its ids in the C table (the Python one holds the same).
ACCELERATED = _ids_c is not None


@dataclass(frozen=True, slots=True)
class GuardLimits:
    """How much a partition leader remembers for expectations and retries (units last)."""

    #: How long a message id is remembered after its record's timestamp.
    duplicate_window_ms: int = 120_000
    #: Most message ids remembered per partition; past it the oldest expire early.
    ids_max: int = 1_000_000
    #: Most idempotent producers remembered per partition; past it the least recently
    #: active expire early.
    producers_max: int = 10_000
    #: Sequences (with their offsets) remembered per producer to answer retries.
    sequences_max: int = 1_000
    #: Most keys whose last offset the leader tracks for key expectations.
    keys_max: int = 1_000_000

    def __post_init__(self) -> None:
        for name in ("duplicate_window_ms", "ids_max", "producers_max", "sequences_max",
                     "keys_max"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")


class _IdTable:
    """Message id -> offset with the ids' append order (jetstream/idempotence/_ids_c.c is
    the same in C): a dict, and the order in two deques of (id, offset). A place in the order
    is left behind when its id was stored again later (at a larger offset) or popped: it is
    dropped, forgetting nothing, when it comes to the front; after each forget the front is
    an id's own place."""

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}
        self._order: collections.deque[str] = collections.deque()
        self._offsets: collections.deque[int] = collections.deque()
        self.get = self._ids.get

    def __len__(self) -> int:
        return len(self._ids)

    def get_many(self, ids: list[str | None]) -> list[int | None]:
        get = self._ids.get
        return [None if msg_id is None else get(msg_id) for msg_id in ids]

    def add_new(self, staged: Mapping[str, int]) -> None:
        self._ids.update(staged)
        self._order.extend(staged)
        self._offsets.extend(staged.values())

    def pop(self, msg_id: str) -> None:
        self._ids.pop(msg_id, None)

    def forget(self, count: int) -> None:
        while count > 0 and self._order:
            count -= self._pop_front()
        self._skip_left_behind()

    def forget_before(self, offset: int) -> None:
        offsets = self._offsets
        while offsets and offsets[0] < offset:
            self._pop_front()
        self._skip_left_behind()

    def front_offset(self) -> int | None:
        return self._offsets[0] if self._offsets else None

    def clear(self) -> None:
        self._ids.clear()
        self._order.clear()
        self._offsets.clear()

    def _pop_front(self) -> int:
        msg_id, offset = self._order.popleft(), self._offsets.popleft()
        if self._ids.get(msg_id) == offset:
            del self._ids[msg_id]
            return 1
        return 0

    def _skip_left_behind(self) -> None:
        order, offsets, ids = self._order, self._offsets, self._ids
        while order and ids.get(order[0]) != offsets[0]:
            order.popleft()
            offsets.popleft()


class IdWindow:
    """Message id -> offset of every id stored within the window, oldest first, and the
    time of each add: an id expires with the add that stored it. The ids are in an id table
    (`_IdTable`, or its C twin when it was built)."""

    def __init__(self, limits: GuardLimits, *, accelerated: bool = True) -> None:
        self.limits = limits
        self._ids: _IdTable = (_ids_c.IdTable() if accelerated and _ids_c is not None
                               else _IdTable())
        #: (first offset, timestamp) of each add, oldest first (one per timestamp): the ids
        #: from that offset on were stored at that time or later.
        self._adds: collections.deque[tuple[int, int]] = collections.deque()
        #: The offset `msg_id` was stored at, or None (ingest asks once per publish with an
        #: id); `offsets_of` asks for many at once.
        self.offset_of: Callable[[str], int | None] = self._ids.get
        self.offsets_of: Callable[[list[str | None]], list[int | None]] = self._ids.get_many

    def __len__(self) -> int:
        return len(self._ids)

    def add(self, msg_id: str, offset: int, timestamp_ms: int) -> None:
        """Remember `msg_id` stored at `offset` (offsets only grow)."""
        self.add_all({msg_id: offset}, timestamp_ms)

    def add_all(self, staged: Mapping[str, int], timestamp_ms: int) -> None:
        """Remember every (message id -> offset) of `staged`, in its order (offsets only
        grow), the oldest forgotten past `ids_max`."""
        get = self._ids.get
        if any(get(msg_id) is not None for msg_id in staged):  # stored twice: past the window
            for msg_id in staged:
                self._ids.pop(msg_id)
        self.add_new(staged, timestamp_ms)

    def add_new(self, staged: Mapping[str, int], timestamp_ms: int) -> None:
        """`add_all` of ids none of which is remembered (a leader's pass looked each up)."""
        if not staged:
            return
        ids = self._ids
        ids.add_new(staged)
        adds = self._adds
        if not adds or adds[-1][1] != timestamp_ms:
            adds.append((next(iter(staged.values())), timestamp_ms))
        excess = len(ids) - self.limits.ids_max
        if excess > 0:
            ids.forget(excess)
            front = ids.front_offset()
            while len(adds) > 1 and (front is None or adds[1][0] <= front):
                adds.popleft()

    def expire(self, now_ms: int) -> None:
        """Forget ids whose records are older than the window."""
        oldest = now_ms - self.limits.duplicate_window_ms
        adds = self._adds
        while adds and adds[0][1] < oldest:
            adds.popleft()
        if not adds:
            self._ids.clear()
            return
        self._ids.forget_before(adds[0][0])


@dataclass(slots=True)
class ProducerState:
    epoch: int
    last_sequence: int
    last_timestamp_ms: int
    #: sequence -> offset of the last `sequences_max` sequences stored, oldest first.
    offsets: collections.OrderedDict[int, int]


@dataclass(frozen=True, slots=True)
class SequenceCheck:
    """What the table says of a (producer, epoch, sequence): `verdict` is "new" (store it),
    "duplicate" (stored at `offset`, -1 when no longer remembered), "gap" (expected
    `expected` next), or "fenced" (the producer is at epoch `expected`)."""

    verdict: str
    offset: int = -1
    expected: int = -1


def _first_of_epoch(sequence: int, resume: bool) -> SequenceCheck:
    if sequence == 0 or resume:
        return SequenceCheck("new")
    return SequenceCheck("gap", expected=0)


class ProducerTable:
    def __init__(self, limits: GuardLimits) -> None:
        self.limits = limits
        self._producers: collections.OrderedDict[str, ProducerState] = (
            collections.OrderedDict())

    def __len__(self) -> int:
        return len(self._producers)

    def get(self, producer_id: str) -> ProducerState | None:
        return self._producers.get(producer_id)

    def check(self, producer_id: str, epoch: int, sequence: int,
              last: tuple[int, int] | None = None, resume: bool = False) -> SequenceCheck:
        """Judge a publish against the table, or against `last` (epoch, last sequence) when
        an append in flight before it changed the producer. `resume`: the sender holds acks
        for every earlier sequence of this epoch (see the module doc)."""
        state = self._producers.get(producer_id)
        if last is None:
            if state is None:
                return _first_of_epoch(sequence, resume)
            last = (state.epoch, state.last_sequence)
        current_epoch, last_sequence = last
        if epoch < current_epoch:
            return SequenceCheck("fenced", expected=current_epoch)
        if epoch > current_epoch:
            return _first_of_epoch(sequence, resume)
        if sequence == last_sequence + 1:
            return SequenceCheck("new")
        if sequence > last_sequence:
            return SequenceCheck("gap", expected=last_sequence + 1)
        offset = -1
        if state is not None and state.epoch == epoch:
            offset = state.offsets.get(sequence, -1)
        return SequenceCheck("duplicate", offset=offset)

    def add(self, producer_id: str, epoch: int, sequence: int, offset: int,
            timestamp_ms: int) -> None:
        """Record that the producer's `sequence` was stored at `offset`."""
        state = self._producers.pop(producer_id, None)
        if state is None or epoch > state.epoch:
            state = ProducerState(epoch, sequence, timestamp_ms, collections.OrderedDict())
        elif epoch < state.epoch:  # an older epoch in a replayed log: already fenced
            self._producers[producer_id] = state
            return
        state.last_sequence = max(state.last_sequence, sequence)
        state.last_timestamp_ms = max(state.last_timestamp_ms, timestamp_ms)
        state.offsets[sequence] = offset
        while len(state.offsets) > self.limits.sequences_max:
            state.offsets.popitem(last=False)
        self._producers[producer_id] = state  # most recently active last
        while len(self._producers) > self.limits.producers_max:
            self._producers.popitem(last=False)

    def expire(self, now_ms: int) -> None:
        """Forget producers idle for longer than the window."""
        oldest = now_ms - self.limits.duplicate_window_ms
        producers = self._producers
        while producers:
            state = next(iter(producers.values()))
            if state.last_timestamp_ms >= oldest:
                return
            producers.popitem(last=False)
