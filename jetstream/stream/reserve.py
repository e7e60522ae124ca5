"""Room held in reserve on a data disk, so that the writes which free space can still be made
when the disk is full.

Theory of operation: the broker keeps a file `reserve` of `disk_reserve_bytes` in its data
directory, allocated with posix_fallocate so its blocks are really taken. A write the broker
needs in order to get out of a full disk (the metadata that deletes a stream or changes its
retention) goes through `DiskReserve.write`: when it fails for lack of room, the reserve is
released (the file deleted, its blocks freed) and the write tried once more. `ensure` takes
the room back when the disk has it again (at start, and at the broker's disk checks).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from jetstream.stream.checkpoint import DISK_FULL_ERRNOS

FILE_NAME = "reserve"
log = logging.getLogger(__name__)
T = TypeVar("T")


class DiskReserve:
    def __init__(self, directory: Path, size_bytes: int) -> None:
        self.path = directory / FILE_NAME
        self.size_bytes = size_bytes

    @property
    def held(self) -> bool:
        try:
            return self.size_bytes > 0 and self.path.stat().st_size >= self.size_bytes
        except FileNotFoundError:
            return False

    def ensure(self) -> bool:
        """Hold the reserve, if the disk has room for it; whether it is held."""
        if self.size_bytes <= 0 or self.held:
            return True
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                os.posix_fallocate(fd, 0, self.size_bytes)
            finally:
                os.close(fd)
        except OSError as exc:
            if exc.errno not in DISK_FULL_ERRNOS:
                raise
            self.path.unlink(missing_ok=True)
            return False
        return True

    def release(self) -> bool:
        """Free the reserve's room; whether there was any to free."""
        try:
            self.path.unlink()
        except FileNotFoundError:
            return False
        log.warning("disk full: released the %d-byte reserve at %s", self.size_bytes,
                    self.path)
        return True

    def write(self, write: Callable[[], T]) -> T:
        """`write()`, and once more after releasing the reserve if it ran out of room."""
        try:
            return write()
        except OSError as exc:
            if exc.errno not in DISK_FULL_ERRNOS or not self.release():
                raise
        return write()
