"""Putting a cleaned segment in place of the segments it replaces, crash-safely.

Theory of operation (Kafka's .cleaned / .swap protocol): the log cleaner writes the cleaned
copy of a run of sealed segments as `<base>.log.cleaned` (base: the run's first base offset)
and fsyncs it. The swap then:
  1. renames it to `<base>.log.swap` and fsyncs the directory — the commit point: from here
     on, recovery finishes the swap; before it, recovery deletes the `.cleaned` file;
  2. deletes the replaced segments' files (their log and index files);
  3. renames the swap file to `<base>.log`, fsyncs the directory, and builds and writes its
     indexes.
Recovery at open (`complete_swaps`, before segments are listed) deletes `*.log.cleaned`, and
for each `*.log.swap` deletes every segment whose base offset lies in the swap's offset range
and renames the swap into place. A crash at any step thus leaves the old segments or the new
one, never both and never neither. A cleaned segment covers exactly the offsets of the
segments it replaces (jetstream.compaction.rewrite keeps every batch's range), so the log
stays contiguous.

Readers holding a descriptor of a replaced file (a `FileSlice`) finish from its bytes: a
deleted file stays readable through an open descriptor.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from jetstream.errors import StorageError
from jetstream.stream import checkpoint
from jetstream.stream import format as fmt
from jetstream.stream.handles import HandlePool
from jetstream.stream.segment import Segment, log_file_name

CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"

#: Called with the name of each swap step before it runs (tests inject crashes with it).
StepHook = Callable[[str], None]


def _no_hook(step: str) -> None:
    pass


def cleaned_path(directory: Path, base_offset: int) -> Path:
    return directory / (log_file_name(base_offset) + CLEANED_SUFFIX)


def write_cleaned(directory: Path, base_offset: int, batches: Iterable[bytes],
                  write_bytes_max: int = 4 * 1024 * 1024) -> Path:
    """Write `batches` (whole batches, in offset order, the first at `base_offset`'s range)
    to `<base>.log.cleaned` and fsync it. Bytes are written in chunks of about
    `write_bytes_max`, so memory stays bounded however large the segment."""
    path = cleaned_path(directory, base_offset)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        pending: list[bytes] = []
        size = 0
        for batch in batches:
            pending.append(batch)
            size += len(batch)
            if size >= write_bytes_max:
                _write_all(fd, b"".join(pending))
                pending, size = [], 0
        if pending:
            _write_all(fd, b"".join(pending))
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        path.unlink(missing_ok=True)
        raise
    os.close(fd)
    return path


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def is_sealed_run(segments: Sequence[Segment], replaced: Sequence[Segment]) -> bool:
    """Whether `replaced` still stands in `segments` (the log's, oldest first) as consecutive
    sealed segments, each ending where the next begins: what the cleaner read is still
    there."""
    start = next((i for i, s in enumerate(segments) if s is replaced[0]), -1)
    end = start + len(replaced)
    if start < 0 or end >= len(segments):  # gone, or the last one is the active segment
        return False
    run = segments[start:end + 1]
    return all(a is b for a, b in zip(run, replaced, strict=False)) and all(
        a.next_offset == b.base_offset for a, b in itertools.pairwise(run))


def swap_in(directory: Path, cleaned: Path, base_offset: int, replaced: Sequence[Segment],
            pool: HandlePool, index_interval_bytes: int,
            hook: StepHook = _no_hook) -> Segment:
    """Steps 1-3 above; returns the new segment, indexed and sealed. The caller holds the
    log's lock and replaces `replaced` by it in the segment list."""
    swap = directory / (log_file_name(base_offset) + SWAP_SUFFIX)
    hook("rename-to-swap")
    os.replace(cleaned, swap)
    checkpoint.fsync_dir(directory)
    for segment in replaced:
        hook("delete-replaced")
        segment.delete()
    hook("rename-into-place")
    final = directory / log_file_name(base_offset)
    os.replace(swap, final)
    checkpoint.fsync_dir(directory)
    hook("index")
    return _indexed(directory, base_offset, pool, index_interval_bytes)


def _indexed(directory: Path, base_offset: int, pool: HandlePool,
             index_interval_bytes: int) -> Segment:
    segment = Segment(directory, base_offset, pool, index_interval_bytes)
    cut = segment.recover()  # builds the indexes; the file was fsynced whole before
    if cut:
        raise StorageError(f"cleaned segment {segment.log_path} has {cut} invalid bytes")
    segment.seal(fsync=True)
    return segment


def complete_swaps(directory: Path, pool: HandlePool) -> int:
    """Recovery: drop unfinished cleanings, finish committed swaps. Returns swaps finished."""
    for leftover in directory.glob("*.log" + CLEANED_SUFFIX):
        leftover.unlink()
    finished = 0
    for swap in sorted(directory.glob("*.log" + SWAP_SUFFIX)):
        stem = swap.name[:20]
        if len(swap.name) != 24 + len(SWAP_SUFFIX) or not stem.isdigit():
            continue
        base = int(stem)
        end = _end_offset(swap)
        for path in directory.glob("*.log"):
            name = path.name
            if len(name) == 24 and name[:20].isdigit() and base <= int(name[:20]) < end:
                Segment(directory, int(name[:20]), pool, 1).delete()
        for suffix in (".index", ".timeindex"):
            (directory / f"{base:020d}{suffix}").unlink(missing_ok=True)
        os.replace(swap, directory / log_file_name(base))
        finished += 1
    if finished:
        checkpoint.fsync_dir(directory)
    return finished


def _end_offset(path: Path) -> int:
    """One past the last offset of the batches in a (complete, fsynced) segment file."""
    end = 0
    with path.open("rb") as f:
        position = 0
        while True:
            head = f.read(fmt.BATCH_HEADER.size)
            if len(head) < fmt.BATCH_HEADER.size:
                return end
            header = fmt.parse_header(head)
            end = header.next_offset
            position += header.size
            f.seek(position)
