"""Exclusive locks that keep two processes from opening one log.

Theory of operation: a log opened on its own (a tool, a benchmark, a test) holds an flock on
`<log dir>/.lock` for as long as it is open. A broker holds thousands of logs, and a lock
each would cost a descriptor per partition replica; instead it holds one lock on the
directory of all its logs (`<data_dir>/logs/.logs.lock`, a `DirLock`) and opens each log
under it, holding nothing of the log's own.

Each side takes its own lock first and then checks the other's (`check_free`): a log opened
under a held parent checks that nobody holds the log's `.lock`; a log on its own checks that
nobody holds its parent's `.logs.lock`. Whichever of two processes comes second sees the
first one's lock, so they never both open the log. flock locks belong to an open file
description, so this holds between two opens in one process too.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from jetstream.errors import StorageError

#: In a log directory: the lock of a log opened on its own.
LOG_LOCK_FILE = ".lock"
#: In a directory of logs (a broker's `<data_dir>/logs`): the lock of every log in it.
LOGS_LOCK_FILE = ".logs.lock"


class DirLock:
    """An exclusive flock on `<directory>/<name>`, held until `release()`. Raises
    StorageError when another open (this process or another) holds it: stop that process,
    or open the directory elsewhere."""

    def __init__(self, directory: Path, name: str) -> None:
        self.directory = directory
        self.path = directory / name
        directory.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._fd)
            raise StorageError(f"{directory} is open in another process") from None

    @property
    def held(self) -> bool:
        return self._fd >= 0

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def check_free(path: Path | str, what: Path) -> None:
    """Raise StorageError if someone holds the lock file `path` (which guards `what`). Holds
    nothing afterwards; a missing file is free."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        raise StorageError(f"{what} is open in another process") from None
    finally:
        os.close(fd)


def lock_log(directory: Path, parent_lock: DirLock | None) -> DirLock | None:
    """Lock the log in `directory` (it exists) for one open. Under `parent_lock` (the lock of
    `directory.parent`) nothing more is held: returns None once nobody holds the log's own
    lock. Else returns the log's own lock, once nobody holds its parent's."""
    if parent_lock is not None:
        assert parent_lock.held and parent_lock.directory == directory.parent, (
            parent_lock.path, directory)
        check_free(f"{directory}/{LOG_LOCK_FILE}", directory)
        return None
    own = DirLock(directory, LOG_LOCK_FILE)
    try:
        check_free(directory.parent / LOGS_LOCK_FILE, directory)
    except BaseException:
        own.release()
        raise
    return own
