"""Where the client's requests go: one connection per broker, metadata, leaders, retries.

Theory of operation: the router keeps at most one open connection per broker
(connection.py), opened lazily when a request must go there and replaced when it fails, and
the cluster's metadata (metadata.py), read from any broker. Three kinds of requests:
- Admin and metadata requests go to any broker (`admin`): the connected ones first, then
  the bootstrap addresses and the brokers the metadata names, until one answers.
- A partition's reads go to its leader (`with_leader`). After NOT_LEADER or a lost
  connection the router refreshes the metadata, backs off exponentially and retries at the
  (new) leader, a bounded number of times: a failover is usually over well within them.
- A read that may be served by an in-sync replica (KIP-392) goes to the ISR replica chosen
  for that partition (`read_replica`): picked at random from the metadata's ISR, so readers
  spread over the replicas, and kept while it is in the ISR and answers.
The metadata is a cache: admin calls refresh it, a NOT_LEADER refreshes it, and
`refresh_in_background` refreshes it when it is older than `metadata_max_age_s` without
holding up its caller.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from jetstream.client.connection import BrokerConnection
from jetstream.client.metadata import ClusterMetadata, partition_of
from jetstream.client.types import StreamInfo
from jetstream.errors import (
    BrokerUnavailable,
    JetstreamError,
    NotLeader,
    RangeRepairing,
    UnknownStream,
)
from jetstream.protocol import messages as m

_T = TypeVar("_T")
_R = TypeVar("_R", bound=m.Response)

#: Retries of a request at a partition's leader after NOT_LEADER or a lost connection.
LEADER_ATTEMPTS_MAX = 8
RETRY_BACKOFF_S = 0.05
RETRY_BACKOFF_MAX_S = 2.0


class Router:
    """The connections of one client and the metadata that routes its requests."""

    def __init__(self, bootstrap: list[str], *, client_id: str, connect_timeout_s: float,
                 request_timeout_s: float, requests_max: int,
                 metadata_max_age_s: float, tls: ssl.SSLContext | None = None,
                 credentials: m.Credentials | None = None) -> None:
        self.bootstrap = bootstrap
        self.metadata = ClusterMetadata()
        #: The ISR replica each partition read with `read_isr_replica` is fetched from.
        self.read_replicas: dict[tuple[str, int], int] = {}
        self.closed = False
        self._new_connection = functools.partial(
            BrokerConnection, client_id=client_id, connect_timeout_s=connect_timeout_s,
            request_timeout_s=request_timeout_s, requests_max=requests_max, tls=tls,
            credentials=credentials)
        self._metadata_max_age_s = metadata_max_age_s
        self._connections: dict[int, BrokerConnection] = {}
        self._connect_lock = asyncio.Lock()
        self._refreshing: asyncio.Future[None] | None = None

    def stop(self) -> None:
        """Refuse new requests and stop a background refresh; the connections stay open
        for what is in flight until `close`. Idempotent."""
        self.closed = True
        if self._refreshing is not None:
            self._refreshing.cancel()

    async def close(self) -> None:
        """Stop, and close every connection: requests in flight fail. Idempotent."""
        self.stop()
        connections, self._connections = self._connections, {}
        for connection in connections.values():
            await connection.close()

    def check_open(self) -> None:
        if self.closed:
            raise BrokerUnavailable(",".join(self.bootstrap), "the client was closed")

    # -- metadata -----------------------------------------------------------------------------

    async def refresh_metadata(self) -> None:
        """Read brokers and streams again. Raises BrokerUnavailable when no broker answers."""
        response = await self.admin(m.MetadataRequest(), m.MetadataResponse)
        self.metadata.set_brokers(response.brokers)
        self.metadata.set_metadata_leader(response.metadata_leader)
        self.remember_streams([StreamInfo.from_dict(s) for s in response.streams])

    def remember_streams(self, streams: list[StreamInfo]) -> None:
        """Every stream there is, as an answer just read says."""
        self.metadata.set_streams(streams, time.monotonic())

    async def refresh_quietly(self) -> None:
        """Refresh the metadata, if a broker answers: the caller goes on with what it has."""
        with contextlib.suppress(JetstreamError):
            await self.refresh_metadata()

    def refresh_in_background(self) -> None:
        """Refresh stale metadata without waiting for it: a caller that only picks partitions
        by it (publishing) must not be held up by a slow broker."""
        if self._refreshing is None and \
                self.metadata.is_stale(time.monotonic(), self._metadata_max_age_s):
            self._refreshing = asyncio.ensure_future(self.refresh_quietly())
            self._refreshing.add_done_callback(self._refreshed)

    def _refreshed(self, task: asyncio.Future[None]) -> None:
        self._refreshing = None
        # After a failure too: the next attempt waits for the next age.
        self.metadata.updated_at = time.monotonic()

    async def load_stream(self, name: str) -> StreamInfo:
        """The stream `name` as a broker describes it now (offsets included when that broker
        leads its partitions), remembered. Raises UnknownStream."""
        response = await self.admin(m.MetadataRequest([name]), m.MetadataResponse)
        self.metadata.set_brokers(response.brokers)
        found = [StreamInfo.from_dict(s) for s in response.streams if s["name"] == name]
        if not found:
            self.metadata.drop_stream(name)
            raise UnknownStream(name)
        self.metadata.put_stream(found[0])
        return found[0]

    async def stream(self, name: str) -> StreamInfo:
        """The stream `name` from the metadata, or read when it is not there yet. Raises
        UnknownStream."""
        found = self.metadata.stream(name)
        return found if found is not None else await self.load_stream(name)

    # -- requests -----------------------------------------------------------------------------

    async def admin(self, request: m.Request, response_type: type[_R]) -> _R:
        """`request` at any broker (metadata and stream admin): the connected ones first, then
        the bootstrap and known addresses. Raises BrokerUnavailable when none answers, and the
        error the broker answers with."""
        tried: list[str] = []
        for address in self._candidate_addresses():
            try:
                connection = await self.connection(address)
                response = await connection.request(request)
            except BrokerUnavailable as exc:
                tried.append(f"{address} ({exc.reason})")
            else:
                return m.expect_response(response, response_type)
        raise BrokerUnavailable(",".join(self._candidate_addresses()),
                                "no broker answered: " + "; ".join(tried))

    async def with_leader(self, stream: str, partition: int,
                          call: Callable[[BrokerConnection], Awaitable[_T]]) -> _T:
        """`call` on a connection to the partition's leader. After NOT_LEADER, a lost
        connection or RANGE_REPAIRING (the leader heals damage, or hands its leadership to
        a replica with a healthy copy): refresh the metadata, back off, retry
        (LEADER_ATTEMPTS_MAX in all)."""
        delay = RETRY_BACKOFF_S
        for attempt in range(1, LEADER_ATTEMPTS_MAX + 1):
            try:
                return await call(await self.leader_connection(stream, partition))
            except (NotLeader, BrokerUnavailable, RangeRepairing):
                if attempt == LEADER_ATTEMPTS_MAX or self.closed:
                    raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_BACKOFF_MAX_S)
            await self.refresh_quietly()
        raise AssertionError("unreachable")

    async def leader_connection(self, stream: str, partition: int) -> BrokerConnection:
        """A connection to the partition's leader as the metadata names it. Raises
        UnknownStream, UnknownPartition, NotLeader (no leader known)."""
        leader = partition_of(await self.stream(stream), partition).leader
        if leader < 0 or leader not in self.metadata.brokers:
            raise NotLeader(stream, partition)
        return await self.connection(self.metadata.brokers[leader].address)

    async def read_replica(self, stream: str, partition: int) -> int | None:
        """The ISR replica that reads of the partition with `read_isr_replica` go to: kept
        while it is in the ISR the metadata names, else one picked at random; None when the
        metadata names none. Raises UnknownStream, UnknownPartition."""
        isr = [b for b in partition_of(await self.stream(stream), partition).isr
               if b in self.metadata.brokers]
        key = (stream, partition)
        chosen = self.read_replicas.get(key)
        if chosen in isr:
            return chosen
        if not isr:
            return None
        chosen = self.read_replicas[key] = random.choice(isr)
        return chosen

    async def forget_read_replica(self, stream: str, partition: int, exc: JetstreamError
                                  ) -> None:
        """The chosen replica failed with `exc`: choose again next time, from fresh metadata
        when it is no longer in the ISR."""
        self.read_replicas.pop((stream, partition), None)
        if isinstance(exc, NotLeader):  # it left the ISR, or the metadata moved on
            await self.refresh_quietly()

    # -- connections --------------------------------------------------------------------------

    async def connection(self, address: str) -> BrokerConnection:
        """The open connection to the broker at `address`, opened if needed."""
        self.check_open()
        found = self._open_connection(address)
        if found is not None:
            return found
        async with self._connect_lock:
            found = self._open_connection(address)
            if found is not None:
                return found
            connection = self._new_connection(address)
            await connection.open()
            known = self._connections.get(connection.broker_id)
            if known is not None and not known.closed:
                await connection.close()  # the same broker under another address: keep one
                return known
            self._connections[connection.broker_id] = connection
            return connection

    async def broker_connection(self, broker_id: int) -> BrokerConnection:
        """The connection to the broker `broker_id` of the metadata."""
        return await self.connection(self.metadata.brokers[broker_id].address)

    def _open_connection(self, address: str) -> BrokerConnection | None:
        for broker_id, connection in list(self._connections.items()):
            if connection.closed:
                del self._connections[broker_id]
            elif connection.address == address:
                return connection
        info = next((b for b in self.metadata.brokers.values() if b.address == address), None)
        known = self._connections.get(info.id) if info is not None else None
        return known if known is not None and not known.closed else None

    def _candidate_addresses(self) -> list[str]:
        addresses = [c.address for c in self._connections.values() if not c.closed]
        addresses += self.bootstrap + [b.address for b in self.metadata.broker_list()]
        return list(dict.fromkeys(addresses))
