"""A bounded, process-wide pool of open file descriptors: segment files, and other per-partition
resources that hold descriptors (a compacted partition's key index).

Theory of operation: a broker may hold thousands of partitions with many segments each; keeping
every file open would exhaust descriptors. Files are opened on demand and closed least recently
used first once more than `max_open` descriptors are open. An entry is pinned while a caller
uses it (`with pool.pinned(path) as fd:`) and is never closed under a pin, so a thread doing a
long fsync or pread cannot see its descriptor closed and reused for another file. If every
open entry is pinned the pool goes over its limit for a moment rather than fail.

Two tiers. Each log marks its active segment hot (`set_hot`): appends and reads of the newest
records go there, and a scan of sealed segments (a consumer reading from the start, the
scrubber, the log cleaner) must not close it, or the next append would reopen it. Eviction
takes the least recently used cold entry first and a hot one only when every open entry is
hot or pinned: with more partitions than the budget, the idle partitions' active segments are
closed too and reopened by their next use.

Other resources (`lease`) are any object with `close()`, opened by a callable and counted at
`cost` descriptors (an LMDB environment holds three); they share the budget and the cold tier
with sealed segments.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Generic, Protocol, TypeVar, cast

DEFAULT_MAX_OPEN = 1024
#: The smallest budget: a log's active segment and one sealed segment being read.
MAX_OPEN_MIN = 2


class Closeable(Protocol):
    def close(self) -> None: ...


R = TypeVar("R", bound=Closeable)


class _Entry:
    __slots__ = ("closing", "cost", "pins", "resource")

    def __init__(self, resource: int | Closeable, cost: int) -> None:
        self.resource = resource  # a descriptor, or a leased object
        self.cost = cost
        self.pins = 0
        self.closing = False  # closed by its last unpin (see `close`)

    def release(self) -> None:
        if isinstance(self.resource, int):
            os.close(self.resource)
        else:
            self.resource.close()


class _Pinned:
    """`HandlePool.pinned`'s block."""

    __slots__ = ("_create", "_entry", "_key", "_pool")

    def __init__(self, pool: HandlePool, key: str, create: bool) -> None:
        self._pool = pool
        self._key = key
        self._create = create
        self._entry: _Entry | None = None

    def _open(self) -> int:
        flags = os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if self._create else 0)
        return os.open(self._key, flags, 0o644)

    def __enter__(self) -> int:
        entry = self._entry = self._pool._pin(self._key, self._open, 1)
        assert isinstance(entry.resource, int), self._key
        return entry.resource

    def __exit__(self, *exc: object) -> None:
        entry, self._entry = self._entry, None
        if entry is not None:
            self._pool._unpin(entry)


class _Leased(Generic[R]):
    """`HandlePool.lease`'s block."""

    __slots__ = ("_cost", "_entry", "_key", "_open", "_pool")

    def __init__(self, pool: HandlePool, key: str, open_: Callable[[], R], cost: int) -> None:
        self._pool = pool
        self._key = key
        self._open = open_
        self._cost = cost
        self._entry: _Entry | None = None

    def __enter__(self) -> R:
        entry = self._entry = self._pool._pin(self._key, self._open, self._cost)
        return cast(R, entry.resource)

    def __exit__(self, *exc: object) -> None:
        entry, self._entry = self._entry, None
        if entry is not None:
            self._pool._unpin(entry)


class HandlePool:
    def __init__(self, max_open: int = DEFAULT_MAX_OPEN) -> None:
        if max_open < MAX_OPEN_MIN:
            raise ValueError(f"max_open must be at least {MAX_OPEN_MIN}")
        self.max_open = max_open
        self._lock = threading.Lock()
        self._cold: OrderedDict[str, _Entry] = OrderedDict()
        self._hot: OrderedDict[str, _Entry] = OrderedDict()
        self._hot_keys: set[str] = set()
        self._open_cost = 0
        #: Files and leases opened, and entries closed to stay within the budget: tests and
        #: metrics watch churn.
        self.opens = 0
        self.evictions = 0

    @property
    def open_count(self) -> int:
        """Descriptors held open now (a lease counts its cost)."""
        with self._lock:
            return self._open_cost

    @property
    def hot_count(self) -> int:
        """Hot entries open now (active segments)."""
        with self._lock:
            return len(self._hot)

    def pinned(self, path: Path | str, *, create: bool = False) -> _Pinned:
        """An open read-write descriptor of `path`, valid inside the block (`with`; every
        append and read takes one: a plain object, not a generator)."""
        return _Pinned(self, str(path), create)

    def lease(self, key: str, open_: Callable[[], R], cost: int) -> _Leased[R]:
        """The resource held under `key`, opened by `open_` when it is not open, counted at
        `cost` descriptors; valid inside the block (`with`; a plain object, not a generator:
        every read by key takes one). `close(key)` closes it (after the block, if it is in
        use)."""
        return _Leased(self, key, open_, cost)

    def dup(self, path: Path | str) -> int:
        """A descriptor of `path` that the caller owns and must close (for sendfile)."""
        with self.pinned(path) as fd:
            return os.dup(fd)

    def set_hot(self, path: Path | str, hot: bool) -> None:
        """Mark `path` hot (a log's active segment: closed last) or cold again (sealed)."""
        key = str(path)
        with self._lock:
            if hot:
                self._hot_keys.add(key)
            else:
                self._hot_keys.discard(key)
            source, target = (self._cold, self._hot) if hot else (self._hot, self._cold)
            entry = source.pop(key, None)
            if entry is not None:
                target[key] = entry

    def close(self, path: Path | str) -> None:
        """Close `path` (before deleting or renaming it) and forget that it is hot. If a
        thread has it pinned (a long fsync of a segment that a truncation deletes), it is
        closed when that thread is done with it; the next `pinned(path)` opens it afresh."""
        key = str(path)
        with self._lock:
            self._hot_keys.discard(key)
            entry = self._cold.pop(key, None) or self._hot.pop(key, None)
            if entry is not None:
                self._open_cost -= entry.cost
                if entry.pins:
                    entry.closing = True
                else:
                    entry.release()

    def _pin(self, key: str, open_: Callable[[], int | Closeable], cost: int) -> _Entry:
        with self._lock:
            tier = self._hot if key in self._hot_keys else self._cold
            entry = tier.get(key)
            if entry is None:
                # Make room first, so the budget holds even while this one opens.
                self._evict_locked(self.max_open - cost)
                entry = tier[key] = _Entry(open_(), cost)
                self._open_cost += cost
                self.opens += 1
            else:
                tier.move_to_end(key)
            entry.pins += 1
            return entry

    def _unpin(self, entry: _Entry) -> None:
        with self._lock:
            entry.pins -= 1
            if entry.closing and entry.pins == 0:
                entry.release()
            self._evict_locked(self.max_open)

    def _evict_locked(self, allowed: int) -> None:
        """Close unpinned entries, cold before hot, least recently used first, until at most
        `allowed` descriptors are open (or every open entry is pinned)."""
        for tier in (self._cold, self._hot):
            excess = self._open_cost - allowed
            if excess <= 0:
                return
            # Walk from the oldest end only as far as needed: usually one entry.
            victims = []
            for key, entry in tier.items():
                if excess <= 0:
                    break
                if entry.pins == 0:
                    victims.append(key)
                    excess -= entry.cost
            for key in victims:
                entry = tier.pop(key)
                self._open_cost -= entry.cost
                self.evictions += 1
                entry.release()


DEFAULT_POOL = HandlePool()
