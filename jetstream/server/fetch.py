"""Reads of a partition's log over the socket API: Fetch, the offset lookups and the
segment listing.

Theory of operation: every read is answered from this broker's own roles
(jetstream.server.roles), never forwarded.
- Fetch by a consumer (`isolation="committed"`) is served by the partition's leader, up to
  its high watermark, long-polling up to `max_wait_ms` when the offset is at the HW. A
  consumer that asks for `read_replica` may be served by an in-sync follower instead, below
  the HW that follower knows (it may lag the leader's), never anything later truncated.
- Fetch by a replica (`isolation="uncommitted"`, `replica_id` >= 0) reads up to the
  leader's log end and reports the replica's position to the leader's ISR core. Consumers
  may not read uncommitted records: they could be truncated later.
- `max_bytes` and `max_wait_ms` are capped by the broker's `fetch_bytes_max` and
  `fetch_wait_ms_max`. The answer carries the records as a slice of the segment file, which
  the socket API sends with sendfile.
- OffsetForTimestamp answers the first offset at or after a time (the log start and the HW
  for the EARLIEST and LATEST markers), never past the HW.
- ListSegments is a bulk reader's plan (Spark reads segment files itself): the leader's
  segments with their sizes, its offsets and its HW, all of one moment (no await between
  reading the HW, which moves only on this loop, and the snapshot the log takes under its
  lock), and where the files are.
- EndOffsetForEpoch is a follower's truncation question (Kafka KIP-101): the end offset of
  an epoch in the leader's log, fenced by the follower's idea of the current leader epoch.
"""

from __future__ import annotations

from jetstream.errors import FencedLeaderEpoch, ProtocolError, StorageError
from jetstream.isr.leader import as_unfit
from jetstream.protocol import messages as m
from jetstream.server.api import FetchResult
from jetstream.server.config import BrokerConfig
from jetstream.server.follower import PartitionFollower
from jetstream.server.roles import Roles


class Reads:
    """The read handlers of the socket API (see the module docstring)."""

    def __init__(self, config: BrokerConfig, roles: Roles) -> None:
        self._config = config
        self._roles = roles

    async def fetch(self, request: m.FetchRequest) -> FetchResult:
        if request.isolation != "committed" and request.replica_id < 0:
            raise ProtocolError("only replicas may read uncommitted records",
                                field="isolation")
        key = (request.stream, request.partition)
        if request.read_replica and key not in self._roles.leaders:
            follower = self._roles.followers.get(key)
            if follower is not None and follower.in_sync:
                return await self._fetch_from_follower(follower, request)
        leader = self._roles.leader_for(request.stream, request.partition)
        max_bytes = min(request.max_bytes, self._config.fetch_bytes_max)
        wait_ms = min(request.max_wait_ms, self._config.fetch_wait_ms_max)
        if request.isolation == "uncommitted":
            piece = await leader.replica_fetch(request.replica_id, request.offset,
                                               request.leader_epoch, max_bytes, wait_ms,
                                               as_unfit(request.unfit),
                                               verify=request.verify)
        else:
            piece = await leader.read(request.offset, max_bytes, wait_ms,
                                      verify=request.verify)
        leader.metrics.fetched_bytes += piece.length
        # A replica copies the local log only; a consumer may read the fragment store too.
        start = (leader.log.log_start_offset if request.isolation == "uncommitted"
                 else leader.read_start_offset)
        response = m.FetchResponse(
            request.stream, request.partition, leader.high_watermark, start,
            leader.log.log_end_offset, piece.next_offset, leader.state.leader_epoch)
        return response, piece

    async def _fetch_from_follower(self, follower: PartitionFollower, request: m.FetchRequest
                                   ) -> FetchResult:
        """A consumer's read at an in-sync follower: committed records below the HW this
        follower knows, never anything later truncated."""
        max_bytes = min(request.max_bytes, self._config.fetch_bytes_max)
        wait_ms = min(request.max_wait_ms, self._config.fetch_wait_ms_max)
        piece = await follower.read(request.offset, max_bytes, wait_ms, verify=request.verify)
        log_ = follower.log
        response = m.FetchResponse(
            request.stream, request.partition, min(follower.high_watermark, log_.log_end_offset),
            log_.log_start_offset, log_.log_end_offset, piece.next_offset,
            follower.state.leader_epoch)
        return response, piece

    async def offset_for_timestamp(self, request: m.OffsetForTimestampRequest
                                   ) -> m.OffsetForTimestampResponse:
        leader = self._roles.leader_for(request.stream, request.partition)
        if request.timestamp_ms == m.EARLIEST_TIMESTAMP:
            return m.OffsetForTimestampResponse(leader.read_start_offset)
        if request.timestamp_ms == m.LATEST_TIMESTAMP:
            return m.OffsetForTimestampResponse(leader.high_watermark)
        log_ = leader.log
        offset = log_.offset_for_timestamp(request.timestamp_ms)
        if (offset == log_.log_start_offset and leader.tier is not None
                and leader.read_start_offset < offset):
            # The first local record is recent enough: an older one may be in the store.
            stored = await leader.tier.offset_for_timestamp(request.timestamp_ms, log_)
            offset = offset if stored is None else stored
        return m.OffsetForTimestampResponse(min(offset, leader.high_watermark))

    async def list_segments(self, request: m.ListSegmentsRequest) -> m.ListSegmentsResponse:
        key = (request.stream, request.partition)
        leader = self._roles.leader_for(*key)
        # The HW first: retention (in a thread) deletes only below the HW it was given, and
        # the log end only grows at a leader, so the snapshot's offsets bracket it.
        high_watermark = leader.high_watermark
        snapshot = leader.log.segment_snapshot()
        assert snapshot.log_start_offset <= high_watermark <= snapshot.log_end_offset, (
            snapshot.log_start_offset, high_watermark, snapshot.log_end_offset)
        if len(snapshot.segments) > m.SEGMENTS_MAX:
            raise StorageError(f"{request.stream}/{request.partition} has "
                               f"{len(snapshot.segments)} segments, more than one answer "
                               f"lists ({m.SEGMENTS_MAX}): fetch it instead")
        files = self._roles.log_files(key)
        return m.ListSegmentsResponse(
            request.stream, request.partition, high_watermark, snapshot.log_start_offset,
            snapshot.log_end_offset, leader.state.leader_epoch, self._config.broker_id,
            str(files.directory), str(files.version_file), files.stream_version,
            [list(entry) for entry in snapshot.segments])

    async def end_offset_for_epoch(self, request: m.EndOffsetForEpochRequest
                                   ) -> m.EndOffsetForEpochResponse:
        leader = self._roles.leader_for(request.stream, request.partition)
        current = leader.state.leader_epoch
        if request.current_leader_epoch not in (-1, current):
            raise FencedLeaderEpoch(request.stream, request.partition,
                                    request.current_leader_epoch, current)
        answer = leader.log.end_offset_for_epoch(request.leader_epoch)
        return m.EndOffsetForEpochResponse(answer.epoch, answer.end_offset,
                                           leader.read_start_offset)
