"""The broker's epoch fence: no role, ISR proposal or fetch below an epoch already acted on.

Theory of operation (the pure cores are jetstream.isr.highest_epochs and
jetstream.isr.epoch_journal): the broker keeps, in <data_dir>/leader-epochs and the journal
beside it, the highest (stream version, leader epoch) it has seen per partition, and makes
each change durable before it takes a role at a new epoch (`admit`): appended to the journal
and fsynced, the table rewritten whole (fsynced, renamed into place) only when the journal
outgrew it, so a role change writes bytes in proportion to what changed. A partition whose
metadata epoch is below the recorded one gets no role until the metadata catches up (a
warning is logged once per refused mark): after a power cut, pysyncobj's unsynced journal
may replay an older state than the one this broker already acted on. The follower's requests
and the leader's ISR proposals are checked against it too (`check`). A damaged table file is
logged and the broker starts without it: the metadata is then the only guard, as before the
file existed; a damaged journal is logged and the table alone is used. `/metrics` counts the
bytes written, the appends and the compactions.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Container, Iterable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path

from jetstream.errors import FencedLeaderEpoch
from jetstream.isr import epoch_journal, highest_epochs
from jetstream.isr.epoch_journal import Loaded
from jetstream.isr.highest_epochs import CorruptEpochFile, EpochMark, HighestEpochs, Refused
from jetstream.raft_meta.model import PartitionState
from jetstream.stream.checkpoint import append_fsynced, write_atomic

log = logging.getLogger(__name__)

PartitionKey = tuple[str, int]


def mark_of(state: PartitionState) -> EpochMark:
    return EpochMark(state.created_version, state.leader_epoch)


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def load_epochs(data_dir: Path) -> Loaded:
    """The table of highest epochs the files in `data_dir` hold. Raises CorruptEpochFile
    for a damaged table file."""
    return epoch_journal.load(_read(data_dir / highest_epochs.FILE_NAME),
                              _read(data_dir / epoch_journal.FILE_NAME))


@dataclass(slots=True)
class FenceMetrics:
    bytes_written: int = 0
    appends: int = 0
    compactions: int = 0


class EpochFence:
    """The highest epochs this broker acted on, durable in `data_dir` (see the module
    docstring)."""

    def __init__(self, data_dir: Path, executor: Executor) -> None:
        self.path = data_dir / highest_epochs.FILE_NAME
        self.journal_path = data_dir / epoch_journal.FILE_NAME
        self._executor = executor
        self.metrics = FenceMetrics()
        try:
            loaded = load_epochs(data_dir)
        except CorruptEpochFile as exc:
            log.error("%s is damaged (%s): starting without the epochs it recorded",
                      self.path, exc)
            loaded = Loaded(HighestEpochs(), 0, 0, compact=True)
        if loaded.damage:
            log.warning("%s: %s", self.journal_path, loaded.damage)
        self._epochs = loaded.table
        self._generation = loaded.generation
        self._journal_records = loaded.journal_records
        #: The next write rewrites the table whole (see jetstream.isr.epoch_journal).
        self._compact = loaded.compact
        #: A write failed: changes taken from the table are not durable yet.
        self._unsaved = False
        #: Partitions refused a role, with the metadata mark refused (warned about once).
        self._refused: dict[PartitionKey, EpochMark] = {}

    async def admit(self, wanted: Mapping[PartitionKey, PartitionState],
                    held: Container[PartitionKey], *, unwanted: Iterable[PartitionKey] = (),
                    streams: Collection[str] | None = None,
                    gone: Iterable[PartitionKey] = ()) -> dict[PartitionKey, PartitionState]:
        """The partitions in `wanted`, except those `held` (they have a role), whose epoch
        is not below the highest recorded; the new highest epochs are made durable before
        this returns. The marks of partitions `gone` (their stream was deleted) are
        forgotten, and `unwanted` partitions (looked at, not wanted) are no longer refused.
        A full pass gives every stream of the metadata (`streams`) instead: the marks of
        other streams are forgotten, and refusals of partitions not in `wanted`."""
        if streams is not None:
            self._epochs.retain_streams(streams)
            self._refused = {k: v for k, v in self._refused.items() if k in wanted}
        self._epochs.forget(gone)
        for key in unwanted:
            self._refused.pop(key, None)
        admitted = {}
        for key, partition in wanted.items():
            if key in held:
                continue
            mark = mark_of(partition)
            outcome = self._epochs.observe(key, mark)
            if isinstance(outcome, Refused):
                if self._refused.get(key) != mark:
                    log.warning("%s/%d: the metadata says leader epoch %d (stream version %d), "
                                "below the %d (version %d) this broker saw before: no role "
                                "until the metadata catches up", key[0], key[1],
                                mark.leader_epoch, mark.created_version,
                                outcome.recorded.leader_epoch, outcome.recorded.created_version)
                self._refused[key] = mark
                continue
            self._refused.pop(key, None)
            admitted[key] = partition
        await self._persist()
        return admitted

    async def _persist(self) -> None:
        """Make the table's changes durable: appended to the journal, or the table rewritten
        whole when the journal outgrew it. After a failed write the next one compacts (a
        partial append must not be followed by more records)."""
        changes = self._epochs.take_changes()
        if not changes and not self._unsaved:
            return
        records = self._journal_records + len(changes)
        compact = self._compact or epoch_journal.should_compact(records, len(self._epochs))
        loop = asyncio.get_running_loop()
        try:
            if compact:
                generation = self._generation + 1
                table = self._epochs.serialize(generation)
                journal = epoch_journal.encode_header(generation)
                await loop.run_in_executor(self._executor, self._rewrite, table, journal)
                self._generation, self._journal_records = generation, 0
                self.metrics.compactions += 1
                self.metrics.bytes_written += len(table) + len(journal)
            else:
                data = epoch_journal.encode_changes(changes)
                await loop.run_in_executor(self._executor, append_fsynced, self.journal_path,
                                           data)
                self._journal_records = records
                self.metrics.appends += 1
                self.metrics.bytes_written += len(data)
        except BaseException:
            # The changes taken are in memory only: the next call writes the table whole.
            self._compact = self._unsaved = True
            raise
        self._compact = self._unsaved = False

    def _rewrite(self, table: bytes, journal: bytes) -> None:
        write_atomic(self.path, table)  # now the old journal is stale (another generation)
        write_atomic(self.journal_path, journal)

    def check(self, state: PartitionState) -> None:
        """Raise FencedLeaderEpoch when `state`'s epoch is below the highest recorded."""
        key = (state.stream, state.partition)
        if not self._epochs.admits(key, mark_of(state)):
            highest = self._epochs.highest(key)
            assert highest is not None
            raise FencedLeaderEpoch(state.stream, state.partition, state.leader_epoch,
                                    highest.leader_epoch)

    def render_metrics(self) -> list[str]:
        m = self.metrics
        lines = []
        for name, value, text in (
                ("bytes_written", m.bytes_written,
                 "Bytes written to make highest epochs durable (journal and table)."),
                ("appends", m.appends, "Appends to the highest-epochs journal."),
                ("compactions", m.compactions, "Rewrites of the whole highest-epochs table.")):
            lines += [f"# HELP jetstream_epoch_fence_{name}_total {text}",
                      f"# TYPE jetstream_epoch_fence_{name}_total counter",
                      f"jetstream_epoch_fence_{name}_total {value}"]
        lines += ["# HELP jetstream_epoch_fence_marks Partitions with a recorded epoch.",
                  "# TYPE jetstream_epoch_fence_marks gauge",
                  f"jetstream_epoch_fence_marks {len(self._epochs)}"]
        return lines

    def refused(self) -> list[tuple[PartitionKey, int, int | None]]:
        """Each partition refused a role: its key, the metadata's leader epoch, and the
        higher one recorded (None if forgotten since)."""
        out = []
        for key, mark in self._refused.items():
            recorded = self._epochs.highest(key)
            out.append((key, mark.leader_epoch,
                        recorded.leader_epoch if recorded is not None else None))
        return out
