"""A bounded, process-wide pool of open file descriptors for segment and index files.

Theory of operation: a broker may hold thousands of partitions with many segments each; keeping
every file open would exhaust descriptors. Files are opened on demand and closed least recently
used first once more than `max_open` are open. A descriptor is pinned while a caller uses it
(`with pool.pinned(path) as fd:`) and is never closed under a pin, so a thread doing a long
fsync or pread cannot see its descriptor closed and reused for another file. If every open
descriptor is pinned the pool goes over its limit for a moment rather than fail.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

DEFAULT_MAX_OPEN = 1024


class _Entry:
    __slots__ = ("closing", "fd", "pins")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.pins = 0
        self.closing = False  # closed by its last unpin (see `close`)


class HandlePool:
    def __init__(self, max_open: int = DEFAULT_MAX_OPEN) -> None:
        if max_open < 2:
            raise ValueError("max_open must be at least 2")
        self.max_open = max_open
        self._lock = threading.Lock()
        self._open: OrderedDict[str, _Entry] = OrderedDict()
        self.opens = 0  # how many times a file was opened: tests and metrics watch churn

    @property
    def open_count(self) -> int:
        with self._lock:
            return len(self._open)

    @contextmanager
    def pinned(self, path: Path | str, *, create: bool = False) -> Iterator[int]:
        """An open read-write descriptor of `path`, valid inside the block."""
        key = str(path)
        with self._lock:
            entry = self._open.get(key)
            if entry is None:
                flags = os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0)
                entry = _Entry(os.open(key, flags, 0o644))
                self.opens += 1
                self._open[key] = entry
            else:
                self._open.move_to_end(key)
            entry.pins += 1
            self._evict_locked()
        try:
            yield entry.fd
        finally:
            with self._lock:
                entry.pins -= 1
                if entry.closing and entry.pins == 0:
                    os.close(entry.fd)
                self._evict_locked()

    def dup(self, path: Path | str) -> int:
        """A descriptor of `path` that the caller owns and must close (for sendfile)."""
        with self.pinned(path) as fd:
            return os.dup(fd)

    def close(self, path: Path | str) -> None:
        """Close `path` (before deleting or renaming it). If a thread has it pinned (a long
        fsync of a segment that a truncation deletes), its descriptor is closed when that
        thread is done with it; the next `pinned(path)` opens the path afresh."""
        with self._lock:
            entry = self._open.pop(str(path), None)
            if entry is not None:
                if entry.pins:
                    entry.closing = True
                else:
                    os.close(entry.fd)

    def _evict_locked(self) -> None:
        if len(self._open) <= self.max_open:
            return
        for key in list(self._open):
            if len(self._open) <= self.max_open:
                break
            entry = self._open[key]
            if entry.pins == 0:
                del self._open[key]
                os.close(entry.fd)


DEFAULT_POOL = HandlePool()
