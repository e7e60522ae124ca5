"""Reads by key from compacted streams: the client side of the replicated KV table.

Theory of operation: a key lives in the partition `publish` sends it to (crc32(key) % N), so
`get` asks that partition's leader (or, with `read_isr_replica`, an in-sync replica) for the
key's newest committed record, answered from the broker's key index. `min_offset` (for
example a publish ack's offset) makes the read wait, bounded, until the index covers it:
read-your-writes. `keys` pages over live keys, partition by partition.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from jetstream.client.connection import BrokerConnection
from jetstream.client.partitioner import key_partition
from jetstream.client.routing import Router
from jetstream.errors import JetstreamError
from jetstream.protocol import messages as m

GET_WAIT_MS_DEFAULT = 5_000
_R = TypeVar("_R", bound=m.Response)


@dataclass(frozen=True, slots=True)
class Entry:
    """A key's newest committed value in a compacted stream."""

    key: bytes
    value: bytes
    offset: int
    timestamp_ms: int
    partition: int
    headers: Mapping[str, bytes] = field(default_factory=dict)


class KeyValueReads:
    """`get` and `keys` on compacted streams."""

    _router: Router

    async def get(self, stream: str, key: bytes, *, min_offset: int | None = None,
                  wait_ms: int = GET_WAIT_MS_DEFAULT,
                  read_isr_replica: bool = False) -> Entry | None:
        """The newest committed value of `key`, or None when the key has none (never
        written, or deleted by a tombstone). With `min_offset`, waits up to `wait_ms` until
        the partition's committed records up to that offset are indexed (else raises
        OffsetNotIndexed). Raises NotCompacted, UnknownStream, NotLeader/BrokerUnavailable
        when retries ran out."""
        info = await self._router.stream(stream)
        partition = key_partition(key, info.partition_count)
        request = m.GetRequest(stream, partition, key,
                               -1 if min_offset is None else min_offset,
                               wait_ms if min_offset is not None else 0, read_isr_replica)
        response = await self._key_request(stream, partition, request, m.GetResponse)
        if not response.found or response.deleted or response.value is None:
            return None
        return Entry(key, response.value, response.offset, response.timestamp_ms, partition,
                     response.headers)

    async def keys(self, stream: str, *, prefix: bytes = b"", after: bytes | None = None,
                   limit: int = 1000, read_isr_replica: bool = False) -> list[bytes]:
        """Live keys of a compacted stream starting with `prefix`, after `after` (the last key
        of the previous page), at most `limit` (10,000 at most), across its partitions."""
        info = await self._router.stream(stream)
        pages = []
        for partition in range(info.partition_count):
            request = m.KeysRequest(stream, partition, prefix, after, limit, read_isr_replica)
            response = await self._key_request(stream, partition, request, m.KeysResponse)
            pages.append(response.keys)
        return list(heapq.merge(*pages))[:limit]

    async def _key_request(self, stream: str, partition: int, request: m.Request,
                           response_type: type[_R]) -> _R:
        router = self._router
        read_replica = getattr(request, "read_replica", False)
        if read_replica:
            replica = await router.read_replica(stream, partition)
            if replica is not None:
                try:
                    conn = await router.broker_connection(replica)
                    return m.expect_response(await conn.request(request), response_type)
                except JetstreamError as exc:
                    if router.closed:
                        raise
                    await router.forget_read_replica(stream, partition, exc)

        async def once(conn: BrokerConnection) -> _R:
            return m.expect_response(await conn.request(request), response_type)

        return await router.with_leader(stream, partition, once)
