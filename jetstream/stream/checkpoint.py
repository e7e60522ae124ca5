"""Small files that must survive a crash whole: written to a temp file, fsynced, renamed over
the old one, and the directory fsynced, so a reader sees the old or the new content, never a
mix. Each file carries a CRC32C of its content so a damaged file reads as absent (the callers
then fall back to the safe choice: a full recovery scan) instead of as a wrong number.

    Checkpoint file (text, UTF-8):
      line 1: "<kind> <version>"
      lines:  one entry per line, space-separated integers
      last:   "crc <crc32c of the previous lines, hex>"
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from pathlib import Path

import crc32c as _crc32c

VERSION = 1
#: What a write that ran out of room fails with.
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
log = logging.getLogger(__name__)


def fsync_dir(path: Path) -> None:
    """Make a file creation, rename or deletion in `path` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


#: What one read of `read_small` asks for.
READ_CHUNK_BYTES = 1 << 16


def read_small(path: Path | str) -> bytes | None:
    """The whole content of a file, or None when it is missing: plain system calls, without
    the buffered file object `open` builds (a broker reads a few small files for each of
    thousands of logs as it starts)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        chunks = []
        while chunk := os.read(fd, READ_CHUNK_BYTES):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def write_atomic(path: Path, data: bytes, *, durable: bool = True) -> None:
    """Replace `path` with `data`, fsynced, all or nothing. Writers of the same file at once
    (a thread and the event loop) each use a temporary file of their own, so neither replaces
    the other's half-written one; the last to finish wins. Recovery removes `*.tmp` leftovers.
    Not `durable`: no fsync (a crash may leave the old file, or a damaged one that its
    format tells apart): for a file that recovery would write the same again."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}-{threading.get_ident()}.tmp")
    try:
        write_and_close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), data,
                       durable)
    except OSError:
        tmp.unlink(missing_ok=True)  # a full disk: leave no half-written file behind
        raise
    os.replace(tmp, path)
    if durable:
        fsync_dir(path.parent)


def append_fsynced(path: Path, data: bytes) -> None:
    """Append `data` to the existing file `path` and fsync it. A crash may leave a prefix of
    `data` at the end (a torn tail): the file's format must tell it apart."""
    write_and_close(os.open(path, os.O_WRONLY | os.O_APPEND), data)


def write_and_close(fd: int, data: bytes, fsync: bool = True) -> None:
    """Write all of `data` to `fd`, fsync (unless told not to), close."""
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic_if_room(path: Path, data: bytes, *, durable: bool = True) -> bool:
    """`write_atomic` for files whose older content stays correct, only less current (a
    recovery point, a high watermark checkpoint): on a full disk the old file is kept and
    False returned; other errors raise."""
    try:
        write_atomic(path, data, durable=durable)
    except OSError as exc:
        if exc.errno not in DISK_FULL_ERRNOS:
            raise
        log.warning("%s not updated: %s", path, exc.strerror)
        return False
    return True


def checked_line(text: str) -> bytes:
    """`text` as a journal line: followed by a space, its CRC32C (8 hex digits), a newline."""
    return f"{text} {_crc32c.crc32c(text.encode()):08x}\n".encode()


def line_text(line: bytes) -> str | None:
    """The text of a `checked_line` (without its newline) whose CRC matches, else None."""
    try:
        text = line.decode()
    except UnicodeDecodeError:
        return None
    body, _, crc = text.rpartition(" ")
    if len(crc) != 8 or not all(c in "0123456789abcdef" for c in crc):
        return None
    return body if int(crc, 16) == _crc32c.crc32c(body.encode()) else None


def encode_entries(kind: str, entries: list[tuple[int, ...]]) -> bytes:
    body = f"{kind} {VERSION}\n" + "".join(" ".join(map(str, e)) + "\n" for e in entries)
    crc = _crc32c.crc32c(body.encode())
    return (body + f"crc {crc:08x}\n").encode()


def write_entries(path: Path, kind: str, entries: list[tuple[int, ...]], *,
                  durable: bool = True) -> None:
    write_atomic(path, encode_entries(kind, entries), durable=durable)


def read_entries(path: Path, kind: str) -> list[tuple[int, ...]] | None:
    """The entries of a checkpoint, or None when it is missing or damaged."""
    data = read_small(path)
    if data is None:
        return None
    try:
        text = data.decode()
    except UnicodeDecodeError:
        return None
    lines = text.split("\n")
    if len(lines) < 3 or lines[-1] != "" or not lines[-2].startswith("crc "):
        return None
    body = "\n".join(lines[:-2]) + "\n"
    try:
        crc = int(lines[-2][4:], 16)
    except ValueError:
        return None
    if crc != _crc32c.crc32c(body.encode()) or lines[0] != f"{kind} {VERSION}":
        return None
    try:
        return [tuple(int(x) for x in line.split()) for line in lines[1:-2]]
    except ValueError:
        return None


def write_offset(path: Path, kind: str, offset: int) -> None:
    write_entries(path, kind, [(offset,)])


def write_offset_if_room(path: Path, kind: str, offset: int, *, durable: bool = True) -> bool:
    """`write_offset` of an offset whose older value stays safe (see write_atomic_if_room)."""
    return write_atomic_if_room(path, encode_entries(kind, [(offset,)]), durable=durable)


def read_offset(path: Path, kind: str) -> int | None:
    entries = read_entries(path, kind)
    if entries is None or len(entries) != 1 or len(entries[0]) != 1 or entries[0][0] < 0:
        return None
    return entries[0][0]
