"""The key index's writes, in a worker process (jetstream.server.process_pool).

Theory of operation: the broker reads each newly committed range of a compacted replica's
log (an IO thread: a few preads) and hands the bytes to `index_read`, which runs in the key
index's worker process: it cuts the entries out of the records (`newest_entries`) and writes
them in one LMDB transaction. So the per-record Python of indexing never holds the broker's
interpreter lock. LMDB serves several processes at once: the broker keeps the same
environment open for lookups, which see each committed transaction, and it alone creates,
wipes and resets an index (`KeyIndex.open`); the worker only opens what is there
(`KeyIndex.open_existing`) and keeps the last few open between jobs.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

from jetstream.compaction.key_index import KeyIndex, newest_entries

#: Indexes a worker keeps open between jobs (each holds descriptors and a mapping).
OPEN_MAX = 16

_open: OrderedDict[tuple[Path, int], KeyIndex] = OrderedDict()


def index_read(directory: Path, created_version: int, map_size_bytes: int, data: bytes,
               min_offset: int, covered: int) -> None:
    """Index the records of `data` (whole, CRC-checked batches read from the log) at or past
    `min_offset`, and record that the index covers everything below `covered`."""
    index = _opened(directory, created_version, map_size_bytes)
    try:
        index.apply_entries(newest_entries(data, min_offset), covered)
    except BaseException:
        _close(directory, created_version)  # opened afresh for the next job
        raise


def _opened(directory: Path, created_version: int, map_size_bytes: int) -> KeyIndex:
    key = (directory, created_version)
    index = _open.get(key)
    if index is not None:
        _open.move_to_end(key)
        return index
    for other in [k for k in _open if k[0] == directory]:  # an earlier incarnation's
        _close(*other)
    index = KeyIndex.open_existing(directory, created_version=created_version,
                                   map_size_bytes=map_size_bytes)
    _open[key] = index
    while len(_open) > OPEN_MAX:
        _close(*next(iter(_open)))
    return index


def _close(directory: Path, created_version: int) -> None:
    index = _open.pop((directory, created_version), None)
    if index is not None:
        index.close()
