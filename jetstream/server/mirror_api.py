"""MIRROR_APPEND: a mirror's copy of its source's record batches, appended as they are.

Theory of operation: a datastream copying a Jetstream stream into a mirror stream
(jetstream.datastreams.batch_copy) reads whole batches from the source partition's leader
and hands them, still as bytes, to the mirror partition's leader here. The mirror keeps the
source's offsets, so what a copy claims is in its bytes: the first batch's base offset is
where it starts. The leader (PartitionLeader.append_copied, with no await between looking at
its log end and appending) takes the plan of jetstream.stream.copying: every batch's CRC is
checked, the batches it holds already are left out (a copy sent again after a crash or by a
task that moved is answered, not stored twice), a copy that would leave a gap is refused
(MIRROR_OFFSET_GAP), and the rest is re-stamped with the leader's epoch and appended without
decoding a record. The answer comes once the stream's ack policy is met (followers then copy
the batches from the leader as any other).

Refused as well: a stream whose `mirror` setting is not the copy's `source`
(MIRROR_MISMATCH: not a mirror, or of another stream), and a copier whose task epoch is
older than one this leader saw for the same datastream (MIRROR_FENCED: a task that moved on
while the old owner was paused or cut off). Epochs are kept in memory: a new leader learns
them from the first copy it takes, and an older owner's copy that comes first there only
appends the source's own batches at their own offsets.
"""

from __future__ import annotations

from collections.abc import Callable

from jetstream.errors import InvalidBatch, MirrorFenced, MirrorMismatch, MirrorOffsetGap
from jetstream.protocol import messages as m
from jetstream.protocol.envelope import AckPolicy
from jetstream.server.partition import PartitionLeader
from jetstream.stream.copying import CopyError, CopyPlan, plan_copy


class MirrorCopies:
    def __init__(self, leader_for: Callable[[str, int], PartitionLeader]) -> None:
        self._leader_for = leader_for
        #: (stream, partition, owner) -> the newest epoch it copied at.
        self._fences: dict[tuple[str, int, str], int] = {}

    async def append(self, request: m.MirrorAppendRequest) -> m.MirrorAppendResponse:
        leader = self._leader_for(request.stream, request.partition)
        stream = leader.stream
        if stream.mirror != request.source:
            raise MirrorMismatch(stream.name, stream.mirror or "", request.source)
        self._fence(request)
        policy = AckPolicy(request.ack_policy) if request.ack_policy else stream.ack_policy

        def plan(log_end_offset: int, epoch: int) -> CopyPlan:
            self._fence(request)  # again: another copy may have come in while this waited
            if leader.stream.mirror != request.source:
                raise MirrorMismatch(stream.name, leader.stream.mirror or "",
                                     request.source)
            try:
                copied = plan_copy(request.data, log_end_offset, epoch)
            except CopyError as exc:
                raise InvalidBatch(f"mirror copy into {stream.name}/{request.partition}: "
                                   f"{exc}") from None
            if copied.data and copied.first_offset != log_end_offset:
                raise MirrorOffsetGap(stream.name, request.partition, copied.first_offset,
                                      log_end_offset)
            return copied

        copied = await leader.append_copied(plan, policy)
        return m.MirrorAppendResponse(copied.next_offset, copied.records)

    def _fence(self, request: m.MirrorAppendRequest) -> None:
        key = (request.stream, request.partition, request.owner)
        epoch = self._fences.get(key, request.epoch)
        if request.epoch < epoch:
            raise MirrorFenced(request.stream, request.partition, request.epoch, epoch)
        self._fences[key] = request.epoch
