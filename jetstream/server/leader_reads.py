"""A partition leader's reads: batches from an offset for consumers (never past the HW,
long-polling when caught up) and for followers (up to the LEO), from the local log or, for
offsets offloaded below its start, from the fragment store; damage met on the way is healed
or served around.

`LeaderReads` is a part of jetstream.server.partition.PartitionLeader, apart to keep each
file to one concern: it uses the leader's log, tier, high watermark and its event for HW
changes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from jetstream.errors import CorruptRecord
from jetstream.raft_meta.model import PartitionState, StreamConfig
from jetstream.stream.file_slice import FileSlice
from jetstream.stream.log import Log
from jetstream.tasks import wait_event
from jetstream.tiered.partition_tier import PartitionTier

#: Heals or serves around damage a leader's read met (jetstream.server.integrity): None to
#: read again, or a healthy copy to serve.
ReadAround = Callable[[tuple[str, int], Log, CorruptRecord, int, int],
                      Awaitable[FileSlice | None]]


class LeaderReads:
    stream: StreamConfig
    state: PartitionState
    log: Log
    tier: PartitionTier | None
    high_watermark: int
    _stopping: bool
    _hw_changed: asyncio.Event
    _read_around: ReadAround | None

    async def read(self, offset: int, max_bytes: int, max_wait_ms: int,
                   committed: bool = True, hw_seen: int | None = None, *,
                   verify: bool = False) -> FileSlice:
        """Batches from `offset`, never at or past the HW (with `committed`), waiting up to
        `max_wait_ms` for data when the reader is caught up, or (with `hw_seen`) until the HW
        passes `hw_seen`. Damage met on the way is healed or served around
        (jetstream.server.integrity); `verify` checks even bytes counted as checked."""
        deadline = time.monotonic() + max_wait_ms / 1000
        while True:
            bound = self.high_watermark if committed else self.log.log_end_offset
            if bound < offset <= self.log.log_end_offset:
                piece = FileSlice(-1, 0, 0, offset, offset)  # ahead of the HW: wait for it
            else:
                # Consumers pass over batches compaction emptied; a replica copies them.
                piece = await self._read_log(offset, max_bytes, bound, committed, verify)
            remaining = deadline - time.monotonic()
            if piece.length or remaining <= 0 or self._stopping or (
                    hw_seen is not None and self.high_watermark > hw_seen):
                return piece
            changed = self._hw_changed
            await wait_event(changed, remaining)

    async def _read_log(self, offset: int, max_bytes: int, bound: int, skip_empty: bool,
                        verify: bool) -> FileSlice:
        if skip_empty and self.tier is not None and offset < self.log.log_start_offset:
            # A consumer's read of offloaded offsets (a replica copies only what is local).
            return await self.tier.read(offset, max_bytes, bound, self.log)
        try:
            return self.log.read(offset, max_bytes, upper_bound=bound, skip_empty=skip_empty,
                                 verify=verify)
        except CorruptRecord as exc:
            if self._read_around is None:
                raise
            served = await self._read_around((self.stream.name, self.state.partition),
                                             self.log, exc, offset, bound)
            if served is not None:
                return served
        # Healed: read again (damage found again raises).
        return self.log.read(offset, max_bytes, upper_bound=bound, skip_empty=skip_empty,
                             verify=verify)

    async def replica_read(self, offset: int, max_bytes: int, *, verify: bool = False
                           ) -> FileSlice:
        """Batches from `offset` up to the LEO for a follower, without waiting (a fetch
        session waits for all its partitions at once)."""
        return await self._read_log(offset, max_bytes, self.log.log_end_offset, False, verify)
