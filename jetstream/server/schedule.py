"""When each piece of a broker's background work is next due: a pure timer heap.

Theory of operation: background work (an ISR tick, a checkpoint, an fsync, a retention
check) belongs to an owner, the key (one partition's housekeeping), and is of one kind. A
(key, kind) is due at most once at a time: scheduling it again keeps the earlier of the two
due times, so an event that makes work due sooner brings it forward, and one that would make
it due later changes nothing (the work, when it runs, schedules its next run itself). Each
kind has its own heap, so that the shell can hold a kind back while a batch of it runs and
still take the others. Entries cancelled or brought forward stay in their heap until they
come to the top (lazy deletion); a heap is rebuilt once its dead entries outnumber the live
ones, so it never holds more than about twice the live entries.

The class is pure: no IO, no clock. Due times and `now_ms` come in as arguments,
milliseconds of one monotonic clock.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterable
from typing import Generic, TypeVar

K = TypeVar("K")
W = TypeVar("W", bound=Hashable)

#: Dead entries a heap may hold beyond its live ones before it is rebuilt.
_SLACK = 64


class Schedule(Generic[K, W]):
    """Due times of work, at most one per (key, kind), at most `entries_max` in all."""

    def __init__(self, kinds: Iterable[W], entries_max: int) -> None:
        assert entries_max > 0, entries_max
        self.entries_max = entries_max
        # Per kind: (due_ms, sequence, key); an entry is live while _due holds its sequence.
        self._heaps: dict[W, list[tuple[int, int, K]]] = {kind: [] for kind in kinds}
        self._due: dict[tuple[K, W], tuple[int, int]] = {}
        self._live: dict[W, int] = dict.fromkeys(self._heaps, 0)
        self._sequence = 0

    def __len__(self) -> int:
        """Live entries."""
        return len(self._due)

    def count(self, kind: W) -> int:
        """Live entries of `kind`."""
        return self._live[kind]

    def due_at(self, key: K, kind: W) -> int | None:
        """When `kind` of `key` is due, None when it is not scheduled."""
        entry = self._due.get((key, kind))
        return None if entry is None else entry[0]

    def add(self, key: K, kind: W, due_ms: int) -> bool:
        """`kind` of `key` is due at `due_ms`, unless it is due sooner already. True when
        `due_ms` was taken. Raises OverflowError past `entries_max` entries."""
        current = self._due.get((key, kind))
        if current is not None and current[0] <= due_ms:
            return False
        if current is None:
            if len(self._due) >= self.entries_max:
                raise OverflowError(
                    f"the schedule holds {self.entries_max} entries, its most: a broker "
                    f"holds more partitions than it was sized for")
            self._live[kind] += 1
        self._sequence += 1
        self._due[(key, kind)] = (due_ms, self._sequence)
        heap = self._heaps[kind]
        heapq.heappush(heap, (due_ms, self._sequence, key))
        self._compact(kind)
        return True

    def cancel(self, key: K) -> None:
        """Forget every entry of `key`."""
        for kind in self._heaps:
            if self._due.pop((key, kind), None) is not None:
                self._live[kind] -= 1
                self._compact(kind)

    def next_due_ms(self, kinds: Iterable[W] | None = None) -> int | None:
        """The earliest due time among `kinds` (all when None); None when none is due."""
        earliest: int | None = None
        for kind in self._heaps if kinds is None else kinds:
            top = self._top(kind)
            if top is not None and (earliest is None or top < earliest):
                earliest = top
        return earliest

    def pop_due(self, kind: W, now_ms: int) -> list[K]:
        """The keys whose `kind` is due at `now_ms`, earliest first, now unscheduled."""
        keys: list[K] = []
        while (top := self._top(kind)) is not None and top <= now_ms:
            _due, _sequence, key = heapq.heappop(self._heaps[kind])
            del self._due[(key, kind)]
            self._live[kind] -= 1
            keys.append(key)
        return keys

    def _top(self, kind: W) -> int | None:
        """The due time of the earliest live entry of `kind` (dead ones above it dropped)."""
        heap = self._heaps[kind]
        while heap:
            due_ms, sequence, key = heap[0]
            if self._due.get((key, kind)) == (due_ms, sequence):
                return due_ms
            heapq.heappop(heap)
        return None

    def _compact(self, kind: W) -> None:
        heap = self._heaps[kind]
        if len(heap) > 2 * self._live[kind] + _SLACK:
            live = [(due, seq, key) for due, seq, key in heap
                    if self._due.get((key, kind)) == (due, seq)]
            heapq.heapify(live)
            self._heaps[kind] = live
