"""Leader epoch cache: for each leader epoch, the first offset its leader appended.

Theory of operation (Kafka KIP-101 and KIP-279): a replica that becomes a follower, or
restarts, must cut off any suffix of its log that the new leader does not have. The high
watermark checkpoint is not enough for that (it can lag, and truncating to it can lose
committed data or keep divergent data). Instead the follower asks the leader for the end
offset of the follower's latest epoch; the leader answers with the largest epoch it knows that
is <= the one asked and the offset where the next epoch began (or its log end offset). The
follower truncates there and, if its own epoch there differs, repeats with the epoch before.

The cache is a list of (epoch, start_offset) with both strictly increasing. It is persisted
through jetstream.stream.checkpoint after every change, before the change is acted on.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

from jetstream.stream import checkpoint

log = logging.getLogger(__name__)

FILE_NAME = "leader-epoch-checkpoint"
KIND = "leader-epoch"
UNDEFINED = -1


@dataclass(frozen=True, slots=True)
class EpochEntry:
    epoch: int
    start_offset: int


@dataclass(frozen=True, slots=True)
class EpochEndOffset:
    """The answer to a follower: `epoch` is the largest known epoch <= the one asked, and
    `end_offset` the first offset after it. Both UNDEFINED when no such epoch is known."""

    epoch: int
    end_offset: int


class LeaderEpochCache:
    def __init__(self, directory: Path, *, persist: bool = True) -> None:
        self._path = directory / FILE_NAME
        self._persist = persist
        loaded = checkpoint.read_entries(self._path, KIND) if persist else None
        self._entries: list[EpochEntry] = []
        for entry in loaded or []:
            if len(entry) == 2:
                self._entries.append(EpochEntry(entry[0], entry[1]))
        if not self._valid(self._entries):
            # A damaged cache is dropped, not trusted: the log rebuilds it from batch headers.
            self._entries = []
        #: The entries the file holds (as loaded or last written; see `_flush`).
        self._written = list(self._entries)

    @staticmethod
    def _valid(entries: list[EpochEntry]) -> bool:
        return all(
            a.epoch < b.epoch and a.start_offset < b.start_offset
            for a, b in pairwise(entries)
        ) and all(e.epoch >= 0 and e.start_offset >= 0 for e in entries)

    @property
    def entries(self) -> list[EpochEntry]:
        return list(self._entries)

    @property
    def latest_epoch(self) -> int:
        return self._entries[-1].epoch if self._entries else UNDEFINED

    def assign(self, epoch: int, start_offset: int, *, durable: bool = True) -> None:
        """Record that `epoch` began at `start_offset`. Re-assigning the latest epoch is a
        no-op; an epoch below the latest is refused by the caller before it gets here. Not
        `durable`: for an epoch starting at the log's end (see `_flush`), or by recovery,
        which writes what it learned once at the end (`write_unwritten`)."""
        if self._entries and epoch == self._entries[-1].epoch:
            return
        assert epoch > self.latest_epoch, (epoch, self.latest_epoch)
        # Entries at or past the new start were truncated away in the log already; drop them.
        while self._entries and self._entries[-1].start_offset >= start_offset:
            self._entries.pop()
        self._entries.append(EpochEntry(epoch, start_offset))
        self._flush(durable)

    def end_offset_for_epoch(self, requested: int, log_end_offset: int) -> EpochEndOffset:
        if not self._entries or requested < self._entries[0].epoch:
            return EpochEndOffset(UNDEFINED, UNDEFINED)
        if requested >= self._entries[-1].epoch:
            return EpochEndOffset(self._entries[-1].epoch, log_end_offset)
        for i in range(len(self._entries) - 1, -1, -1):
            if self._entries[i].epoch <= requested:
                return EpochEndOffset(self._entries[i].epoch, self._entries[i + 1].start_offset)
        raise AssertionError("unreachable: first entry's epoch <= requested")

    def epoch_for_offset(self, offset: int) -> int:
        """The epoch whose leader appended `offset` (UNDEFINED before the first entry)."""
        found = UNDEFINED
        for entry in self._entries:
            if entry.start_offset > offset:
                break
            found = entry.epoch
        return found

    def truncate_from_end(self, end_offset: int, *, durable: bool = True) -> None:
        """The log was truncated to `end_offset`: forget epochs that began at or after it.
        Not `durable`: kept in memory until the next write (see `_flush`)."""
        kept = [e for e in self._entries if e.start_offset < end_offset]
        if kept != self._entries:
            self._entries = kept
            self._flush(durable)

    def truncate_from_start(self, start_offset: int, *, durable: bool = True) -> None:
        """The log now starts at `start_offset`: the epoch covering it begins there."""
        kept = [e for e in self._entries if e.start_offset >= start_offset]
        covering = [e for e in self._entries if e.start_offset < start_offset]
        if covering and (not kept or kept[0].start_offset > start_offset):
            kept.insert(0, EpochEntry(covering[-1].epoch, start_offset))
        if kept != self._entries:
            self._entries = kept
            self._flush(durable)

    def clear(self, *, durable: bool = True) -> None:
        if self._entries:
            self._entries = []
            self._flush(durable)

    def _flush(self, durable: bool = True) -> None:
        """Write the entries, fsynced. A change that is not `durable` is only kept in memory
        until the next write (or `write_unwritten`, at a clean close): it is one that
        recovery makes again by itself when a crash loses it. That is dropping entries past
        the log's end or before its start, and an epoch that starts at the log's end (a
        crash before any record of it leaves nothing to drop; records of it on disk make
        recovery's check see a latest epoch the file lacks, and it rebuilds the cache from
        the batches). A restart then writes nothing for each of its partitions."""
        if self._persist and durable:
            self._write(self._entries)

    def _write(self, entries: list[EpochEntry], durable: bool = True) -> None:
        checkpoint.write_entries(self._path, KIND, [(e.epoch, e.start_offset) for e in entries],
                                 durable=durable)
        self._written = list(entries)

    def write_unwritten(self, log_end_offset: int, *, durable: bool = True) -> None:
        """Write the changes held only in memory (the log closes cleanly, rolls a segment or
        recovered epochs at `log_end_offset`), leaving out epochs that start at the end
        (recovery would drop them). On a full disk they stay in memory only. Not `durable`:
        no fsync (the caller syncs the file system)."""
        entries = [e for e in self._entries if e.start_offset < log_end_offset]
        if self._persist and entries != self._written:
            try:
                self._write(entries, durable)
            except OSError as exc:
                # Kept in memory: recovery makes these entries again from the batches.
                if exc.errno not in checkpoint.DISK_FULL_ERRNOS:
                    raise
                log.warning("%s not updated: %s", self._path, exc.strerror)
