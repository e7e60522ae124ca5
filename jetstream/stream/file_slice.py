"""A read's answer: whole batches of one segment file, as a byte range of an open descriptor.

Theory of operation: a read takes the log's lock only long enough to find the range and to
duplicate the segment's descriptor; the bytes are then sent (`os.sendfile`, zero copy) or
read (`pread`) outside any lock. The duplicate keeps the file readable even if the segment is
deleted meanwhile (retention, truncation, a compaction swap): the reader finishes from the
bytes it was given. A slice of at most INLINE_BYTES_MAX checked bytes is read at once
instead (`data`, no descriptor): the socket API copies such slices into one write anyway, and
a fetch session's answer holds one for each of many partitions, each of which would cost a
`dup` and a `close`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

#: A slice of at most this many bytes may be read into memory at once (see above).
INLINE_BYTES_MAX = 16 * 1024


@dataclass(slots=True)
class FileSlice:
    """Whole batches of one segment file: `length` bytes at `position` of `fd`, or already
    read (`data`, with `fd` -1).

    The caller owns `fd` (a duplicate) and must `close()` it; it stays valid even if the
    segment is deleted meanwhile. `next_offset` is where the following read starts."""

    fd: int
    position: int
    length: int
    first_offset: int
    next_offset: int
    data: bytes | None = None

    def read(self) -> bytes:
        if self.data is not None:
            return self.data
        return os.pread(self.fd, self.length, self.position) if self.length else b""

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> FileSlice:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
