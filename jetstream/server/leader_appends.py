"""A partition leader's direct appends: records that did not come through its NATS
subscription (the HTTP API, a publish with expectations over the socket API, a mirror's
copied batches), checked, appended and answered once durable or committed; and the
`PendingBatch` every append waits in.

`LeaderAppends` is a part of jetstream.server.partition.PartitionLeader, apart to keep each
file to one concern: it uses the leader's log, guard, disk monitor and metrics, and hands
each batch to the leader's durability and commit path (`_enqueue`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from jetstream.errors import NotEnoughReplicas, NotLeader, RecordTooLarge
from jetstream.idempotence.guard import Expectations
from jetstream.protocol.envelope import AckPolicy
from jetstream.raft_meta.model import PartitionState, StreamConfig
from jetstream.server.disk import DiskMonitor
from jetstream.server.guarded import PartitionGuard, expectations, judge_direct
from jetstream.server.metrics import PartitionMetrics
from jetstream.server.mirror_writes import mirror_error
from jetstream.stream.copying import CopyPlan
from jetstream.stream.format import Record
from jetstream.stream.log import Log

_ALL = AckPolicy.ALL


@dataclass(slots=True)
class PendingBatch:
    """An appended batch waiting to become durable and then committed, with the acks (inbox,
    payload) each stage releases."""

    next_offset: int
    leader_acks: list[tuple[str, bytes]]
    all_acks: list[tuple[str, bytes]]
    waiters: list[asyncio.Future[None]] = field(default_factory=list)
    #: (inbox, correlation id) of the `all` acks, to answer them with an error instead.
    all_targets: list[tuple[str, str | None]] = field(default_factory=list)


class LeaderAppends:
    stream: StreamConfig
    state: PartitionState
    log: Log
    guarded: PartitionGuard
    metrics: PartitionMetrics
    _stopping: bool
    _tier_ready: asyncio.Event
    _disk: DiskMonitor | None

    if TYPE_CHECKING:  # the leader's, which the direct appends go through
        def _refuse_all(self) -> bool: ...

        def _not_enough_replicas(self) -> NotEnoughReplicas: ...

        async def _wait_for_room(self) -> None: ...

        def _on_append(self) -> None: ...

        async def _enqueue(self, batch: PendingBatch) -> None: ...

    async def append_direct(self, records: list[Record], policy: AckPolicy) -> tuple[int, int]:
        """Append records that did not come through NATS (HTTP API); returns (first offset,
        next offset) once they are durable (`leader`) or committed (`all`)."""
        first, end, _duplicate = await self.append_expecting(records, policy, None)
        return first, end

    async def append_expecting(self, records: list[Record], policy: AckPolicy,
                               expect: Expectations | None) -> tuple[int, int, bool]:
        """`append_direct` of one publish with expectations, all or nothing: (first offset,
        next offset, False), or (original first offset, the same + len(records), True) for a
        retry stored before. Raises the guard's refusal (OFFSET_MISMATCH, ...)."""
        refused = mirror_error(self.stream)
        if refused is not None:
            raise refused
        for record in records:
            size = 0 if record.value is None else len(record.value)
            if size > self.stream.max_message_bytes:
                raise RecordTooLarge(size, self.stream.max_message_bytes)
        if policy is _ALL and self._refuse_all():
            raise self._not_enough_replicas()
        await self._tier_ready.wait()
        if expect is None:  # a message id in the records' headers asks too
            expect = expectations(records[0].headers)
        if self.guarded.must_wait(expect is not None):
            await self.guarded.loaded()
        if self._stopping or (expect is not None and self.guarded.guard is None):
            raise NotLeader(self.stream.name, self.state.partition)  # not (yet) leading
        if expect is not None and expect.expected_key_offset is not None:
            await self.guarded.keys_loaded()
        await self._wait_for_room()
        if self._disk is not None:
            self._disk.check(len(records))
        judged = judge_direct(self.guarded, self.log, records, expect)
        if isinstance(judged, int):  # a retry: answered once what it follows is
            first, end, duplicate = judged, judged + len(records), True
            batch = PendingBatch(self.log.log_end_offset, [], [])
        else:
            records, guard_pass = judged
            info = self.log.append(records, self.state.leader_epoch, sync=False)
            if guard_pass is not None:
                guard_pass.commit()
            self._on_append()
            self.metrics.appended_records += len(records)
            self.metrics.appended_bytes += info.size_bytes
            first, end, duplicate = info.base_offset, info.log_end_offset, False
            batch = PendingBatch(info.log_end_offset, [], [])
        await self._enqueue_and_wait(batch, policy)
        return first, end, duplicate

    async def append_copied(self, plan: Callable[[int, int], CopyPlan],
                            policy: AckPolicy) -> CopyPlan:
        """Append whole batches copied from a mirror's source (jetstream.server.mirror_api):
        `plan(log end offset, leader epoch)` says what to append (checked, re-stamped, what
        the log holds already left out; it raises to refuse), called with no await before
        the append. Returns it once the log end is durable (`leader`) or committed (`all`)."""
        if policy is _ALL and self._refuse_all():
            raise self._not_enough_replicas()
        await self._tier_ready.wait()
        if self._stopping:
            raise NotLeader(self.stream.name, self.state.partition)
        await self._wait_for_room()
        copied = plan(self.log.log_end_offset, self.state.leader_epoch)
        if copied.data:
            if self._disk is not None:
                self._disk.check(copied.records)
            info = self.log.append_batches(copied.data, sync=False, verified=True)
            self._on_append()
            self.metrics.appended_records += copied.records
            self.metrics.appended_bytes += info.size_bytes
        await self._enqueue_and_wait(PendingBatch(self.log.log_end_offset, [], []), policy)
        return copied

    async def _enqueue_and_wait(self, batch: PendingBatch, policy: AckPolicy) -> None:
        """Queue a direct append's batch; return once `policy` is met."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if policy is not AckPolicy.NONE:
            batch.waiters.append(done)
        else:
            done.set_result(None)
        await self._enqueue(batch)
        await done
