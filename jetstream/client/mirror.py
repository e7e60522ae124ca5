"""Record batches as bytes, for copying a stream into a mirror (the `jetstream` datastream
transport in `mirror` mode): a raw Fetch, and MIRROR_APPEND (jetstream.protocol.mirror)."""

from __future__ import annotations

from jetstream.client.routing import Router
from jetstream.protocol import messages as m

#: Room a MIRROR_APPEND frame keeps for its prefix and header below the broker's limit.
FRAME_ROOM_BYTES = 64 * 1024


class MirrorCopying:
    _router: Router

    async def fetch_batches(self, stream: str, partition: int, offset: int, *,
                            max_bytes: int, max_wait_ms: int = 0
                            ) -> tuple[m.FetchResponse, bytes]:
        """One Fetch at the partition's leader, undecoded: its response and whole record
        batches from the one holding `offset` (the last may be cut short at `max_bytes`;
        batches may reach past the high watermark). Raises as `fetch` does."""
        request = m.FetchRequest(stream, partition, offset, max_bytes, max_wait_ms)
        return await self._router.with_leader(stream, partition,
                                              lambda conn: conn.fetch(request))

    async def append_copied(self, stream: str, partition: int, data: bytes | memoryview, *,
                            source: str, owner: str, epoch: int, ack_policy: str = "",
                            timeout_s: float | None = None) -> m.MirrorAppendResponse:
        """MIRROR_APPEND `data` (whole batches of the source, at their own offsets) to the
        partition's leader of the mirror stream `stream`, whose `mirror` setting must be
        `source`. Answers once the ack policy (the stream's, with "") is met. Raises
        MirrorMismatch, MirrorOffsetGap, MirrorFenced, InvalidBatch, NotLeader and
        BrokerUnavailable when retries at the leader ran out."""
        request = m.MirrorAppendRequest(stream, partition, source, owner, epoch, ack_policy)
        return await self._router.with_leader(stream, partition, lambda conn: conn.send_payload(
            request, data, m.MirrorAppendResponse, timeout_s=timeout_s))

    async def copy_bytes_max(self, stream: str, partition: int) -> int:
        """The most bytes of batches one MIRROR_APPEND may carry to the partition's leader."""
        conn = await self._router.leader_connection(stream, partition)
        return conn.max_frame_bytes - FRAME_ROOM_BYTES
