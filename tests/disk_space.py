"""Small filesystems of their own for tests that fill a disk: a tmpfs mounted over a
directory (mounting needs root: where it is not allowed, TmpfsUnavailable, and the tests
skip), and a filler file that takes the room a test wants taken and gives it back."""

from __future__ import annotations

import errno
import os
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

FILLER = "filler"
_CHUNK = 4096


class TmpfsUnavailable(Exception):
    """A tmpfs cannot be mounted here (not root, or no mount command)."""


@contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` ("24m") mounted on `path` (created), unmounted afterwards."""
    path.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                               str(path)], capture_output=True, text=True)
    except OSError as exc:
        raise TmpfsUnavailable(str(exc)) from exc
    if done.returncode != 0:
        raise TmpfsUnavailable(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def tmpfs_available() -> bool:
    """Whether a tmpfs can be mounted here."""
    with tempfile.TemporaryDirectory(prefix="jetstream-tmpfs-") as scratch:
        try:
            with tmpfs(Path(scratch) / "probe", "1m"):
                return True
        except TmpfsUnavailable:
            return False


def used_percent(directory: Path) -> float:
    stats = os.statvfs(directory)
    return 100.0 * (stats.f_blocks - stats.f_bavail) / stats.f_blocks


def fill(directory: Path, percent: float | None = None) -> int:
    """Take room on `directory`'s filesystem with the file FILLER in it, until `percent` of
    the filesystem is in use, or (None) to the last byte; the filler's size."""
    path = directory / FILLER
    stats = os.statvfs(directory)
    block = stats.f_frsize
    wanted = stats.f_blocks * block if percent is None else int(
        stats.f_blocks * block * percent / 100)
    room = (stats.f_blocks - stats.f_bavail) * block
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        if wanted > room:
            try:
                os.posix_fallocate(fd, size, wanted - room)
            except OSError as exc:
                if exc.errno != errno.ENOSPC or percent is not None:
                    raise
        size = os.fstat(fd).st_size
        if percent is None:  # whatever is left, a block at a time
            try:
                while True:
                    size += os.pwrite(fd, b"\0" * _CHUNK, size)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


def free(directory: Path) -> None:
    """Give back the room `fill` took."""
    (directory / FILLER).unlink(missing_ok=True)
