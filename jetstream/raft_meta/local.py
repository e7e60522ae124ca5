"""Metadata for a single broker: the state machine applied in process, persisted to files.

This is the same interface the Raft-backed metadata offers (propose a command, read the
state, be told of changes), so the broker does not know which one it runs on. Each applied
command is on disk (appended to a journal and fsynced, or folded into a new snapshot) before
its result is returned; the work per command does not grow with the number of streams
(jetstream.raft_meta.local_journal).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jetstream.errors import StorageError
from jetstream.raft_meta import local_journal as journal
from jetstream.raft_meta.fsm import Command, MetadataState
from jetstream.stream.checkpoint import append_fsynced, write_atomic
from jetstream.stream.reserve import DiskReserve

FILE_NAME = "metadata.json"
JOURNAL_NAME = "metadata.journal"

Listener = Callable[[Command, Any], None]

log = logging.getLogger(__name__)


class LocalMetadata:
    def __init__(self, directory: Path, reserve: DiskReserve | None = None) -> None:
        self._path = directory / FILE_NAME
        self._journal_path = directory / JOURNAL_NAME
        #: On a full disk the metadata is written into the reserve's room (deleting a stream
        #: must work then: it is how space is freed).
        self._reserve = reserve
        directory.mkdir(parents=True, exist_ok=True)
        self.state = MetadataState()
        self._generation = 0
        if self._path.exists():
            self.state, self._generation = journal.decode_snapshot(self._path.read_bytes())
        self._records = 0
        #: Whether the journal must be rewritten before the next append (missing, stale, or
        #: with a torn tail); nothing is written at start, so a full disk can start.
        self._compact_first = True
        if self._journal_path.exists():
            read = journal.decode_journal(self._journal_path.read_bytes(), self._generation)
            for command in read.commands:
                self._replay(command)
            self._records = len(read.commands)
            self._compact_first = not read.complete
        self._listeners: list[Listener] = []

    def _replay(self, command: Command) -> None:
        try:
            self.state.apply(command)
        except Exception as exc:  # it applied once: the journal is not this snapshot's
            raise StorageError(f"{self._journal_path}: a journaled command no longer applies "
                               f"({command!r}: {exc})") from exc

    @property
    def is_leader(self) -> bool:
        return True

    def add_listener(self, listener: Listener) -> None:
        """`listener(command, result)` runs after each applied command."""
        self._listeners.append(listener)

    async def propose(self, command: Command) -> Any:
        """Apply `command`; its JetstreamError propagates with the state unchanged. The new
        state is on disk before anyone sees it."""
        candidate = self.state.copy()
        result = candidate.apply(command)
        if self._compact_first or journal.compact_due(self._records + 1, candidate):
            self._write(lambda: self._compact(candidate))
        else:
            self._write(lambda: self._append(journal.encode_record(command)))
        self.state = candidate
        for listener in self._listeners:
            listener(command, result)
        return result

    def _write(self, write: Callable[[], None]) -> None:
        if self._reserve is None:
            write()
        else:
            self._reserve.write(write)

    def _compact(self, state: MetadataState) -> None:
        """The snapshot at the next generation, then an empty journal of it."""
        generation = self._generation + 1
        write_atomic(self._path, journal.encode_snapshot(state, generation))
        self._generation, self._records, self._compact_first = generation, 0, True
        write_atomic(self._journal_path, journal.encode_header(generation))
        self._compact_first = False

    def _append(self, record: bytes) -> None:
        """Append one record; a failed append leaves the file as it was (a retry after the
        reserve's release must not follow a torn record)."""
        size = os.path.getsize(self._journal_path)
        try:
            append_fsynced(self._journal_path, record)
        except OSError:
            os.truncate(self._journal_path, size)
            raise
        self._records += 1
