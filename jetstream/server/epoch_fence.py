"""The broker's epoch fence: no role, ISR proposal or fetch below an epoch already acted on.

Theory of operation (the pure core is jetstream.isr.highest_epochs): the broker keeps, in
<data_dir>/leader-epochs (fsynced, renamed into place), the highest (stream version, leader
epoch) it has seen per partition, and writes it before it takes a role at a new epoch
(`admit`). A partition whose metadata epoch is below the recorded one gets no role until the
metadata catches up (a warning is logged once per refused mark): after a power cut,
pysyncobj's unsynced journal may replay an older state than the one this broker already
acted on. The follower's requests and the leader's ISR proposals are checked against it too
(`check`). A damaged file is logged and the broker starts without it: the metadata is then
the only guard, as before the file existed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Container, Mapping
from concurrent.futures import Executor
from pathlib import Path

from jetstream.errors import FencedLeaderEpoch
from jetstream.isr import highest_epochs
from jetstream.isr.highest_epochs import CorruptEpochFile, EpochMark, HighestEpochs, Refused
from jetstream.raft_meta.model import PartitionState
from jetstream.stream.checkpoint import write_atomic

log = logging.getLogger(__name__)

PartitionKey = tuple[str, int]


def mark_of(state: PartitionState) -> EpochMark:
    return EpochMark(state.created_version, state.leader_epoch)


class EpochFence:
    """The highest epochs this broker acted on, durable in `data_dir` (see the module
    docstring)."""

    def __init__(self, data_dir: Path, executor: Executor) -> None:
        self.path = data_dir / highest_epochs.FILE_NAME
        self._executor = executor
        self._epochs = self._load()
        #: Partitions refused a role, with the metadata mark refused (warned about once).
        self._refused: dict[PartitionKey, EpochMark] = {}

    def _load(self) -> HighestEpochs:
        try:
            return HighestEpochs.parse(self.path.read_bytes())
        except FileNotFoundError:
            return HighestEpochs()
        except CorruptEpochFile as exc:
            log.error("%s is damaged (%s): starting without the epochs it recorded",
                      self.path, exc)
            return HighestEpochs()

    async def admit(self, streams: Collection[str],
                    wanted: Mapping[PartitionKey, PartitionState],
                    held: Container[PartitionKey]) -> dict[PartitionKey, PartitionState]:
        """The partitions in `wanted`, except those `held` (they have a role), whose epoch
        is not below the highest recorded; the new highest epochs are made durable before
        this returns."""
        changed = self._epochs.retain_streams(streams)
        self._refused = {k: v for k, v in self._refused.items() if k in wanted}
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
            changed |= outcome.changed
            admitted[key] = partition
        if changed:
            data = self._epochs.serialize()
            await asyncio.get_running_loop().run_in_executor(
                self._executor, write_atomic, self.path, data)
        return admitted

    def check(self, state: PartitionState) -> None:
        """Raise FencedLeaderEpoch when `state`'s epoch is below the highest recorded."""
        key = (state.stream, state.partition)
        if not self._epochs.admits(key, mark_of(state)):
            highest = self._epochs.highest(key)
            assert highest is not None
            raise FencedLeaderEpoch(state.stream, state.partition, state.leader_epoch,
                                    highest.leader_epoch)

    def refused(self) -> list[tuple[PartitionKey, int, int | None]]:
        """Each partition refused a role: its key, the metadata's leader epoch, and the
        higher one recorded (None if forgotten since)."""
        out = []
        for key, mark in self._refused.items():
            recorded = self._epochs.highest(key)
            out.append((key, mark.leader_epoch,
                        recorded.leader_epoch if recorded is not None else None))
        return out
