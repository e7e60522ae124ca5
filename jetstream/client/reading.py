"""The client's reading calls: fetch, subscribe, the offset lookup by timestamp, and the
segment listing and raw fetch of bulk readers.

Theory of operation: a read is a Fetch at the partition's leader, through the router's
`with_leader` (NOT_LEADER and lost connections refresh the metadata and retry there with
backoff). Its record batches are decoded and CRC-checked (jetstream.stream.format), and
nothing at or past the high watermark the broker reported is handed out, whatever the
broker sent. With `read_isr_replica=True` a fetch goes to a replica of the partition's ISR
instead (the router's `read_replica`), which serves what is committed as far as it knows
(KIP-392); on any error there the fetch is retried at the leader and another replica is
chosen next time. `subscribe` builds a Subscription (subscription.py), which pulls batch
after batch through `fetch` with one fetch in flight ahead of its consumer; the client
closes the subscriptions still open when it closes.

Bulk readers (Spark) plan with `list_segments` (the leader's segment files and its high
watermark, of one moment) and read the files themselves, or take the record batches
undecoded with `fetch_raw` when the files are out of reach; both go to the leader through
`with_leader`, and fetch_raw is the same Fetch as `fetch`, with the same errors.

`Reading` is one part of `Client` (client.py): it owns the open subscriptions and reaches
the brokers through the client's router.
"""

from __future__ import annotations

import dataclasses
import weakref

from jetstream.client.connection import BrokerConnection
from jetstream.client.routing import Router
from jetstream.client.subscription import StopAt, Subscription
from jetstream.client.types import FetchResult, Message, RawFetch, SegmentListing, Start
from jetstream.errors import CorruptRecord, JetstreamError
from jetstream.protocol import messages as m
from jetstream.protocol.frames import MiB
from jetstream.stream.format import BatchFormatError, decode_batches_as

FETCH_BYTES_DEFAULT = 1 * MiB


class Reading:
    """Read a partition's committed messages: one fetch, or a subscription."""

    _router: Router

    def __init__(self) -> None:
        # Weak: a subscription its consumer dropped without closing must not be kept alive.
        self._subscriptions: weakref.WeakSet[Subscription] = weakref.WeakSet()

    async def fetch(self, stream: str, partition: int = 0, offset: int = 0, *,
                    max_bytes: int = FETCH_BYTES_DEFAULT, max_wait_ms: int = 0,
                    read_isr_replica: bool = False) -> FetchResult:
        """One Fetch at the partition's leader: committed messages from `offset`, about
        `max_bytes` of them (at least one), waiting up to `max_wait_ms` when there are none
        yet. With `read_isr_replica`, at a replica of the ISR instead (leader or follower):
        a follower answers only with what it knows is committed, so it may lag the leader
        (its high watermark is the result's), and the fetch falls back to the leader when it
        fails there. Raises UnknownStream, UnknownPartition, OffsetOutOfRange (below the log
        start or past the log end: see its oldest/newest), CorruptRecord (a batch failed its
        CRC), BrokerUnavailable or NotLeader when retries at the leader ran out."""
        request = m.FetchRequest(stream, partition, offset, max_bytes, max_wait_ms,
                                 read_replica=read_isr_replica)
        if read_isr_replica:
            result = await self._fetch_from_replica(stream, partition, request)
            if result is not None:
                return result
        return await self._router.with_leader(stream, partition,
                                              lambda conn: _fetch_once(conn, request))

    async def _fetch_from_replica(self, stream: str, partition: int,
                                  request: m.FetchRequest) -> FetchResult | None:
        """`request` at the partition's chosen ISR replica; None when there is none or it
        failed (the caller asks the leader)."""
        router = self._router
        replica = await router.read_replica(stream, partition)
        if replica is None:
            return None
        try:
            return await _fetch_once(await router.broker_connection(replica), request)
        except JetstreamError as exc:
            if router.closed:
                raise
            await router.forget_read_replica(stream, partition, exc)
            return None

    def subscribe(
        self,
        stream: str,
        partition: int = 0,
        *,
        start: Start = Start.EARLIEST,
        offset: int | None = None,
        timestamp_ms: int | None = None,
        stop: StopAt = None,
        max_bytes: int = FETCH_BYTES_DEFAULT,
        max_wait_ms: int = 1000,
        read_isr_replica: bool = False,
    ) -> Subscription:
        """An async iterator of the partition's committed messages from `start` (EARLIEST,
        LATEST, NEW_ONLY, OFFSET with `offset=`, TIMESTAMP with `timestamp_ms=`) until `stop`:
        None follows the partition forever (long polls of `max_wait_ms`), "latest" stops
        after the high watermark seen when it starts, an int stops before that offset.
        Positions are read when it starts: `sub = await js.subscribe(...)`, `async with
        js.subscribe(...) as sub`, or the first iteration. Iterating raises what `fetch`
        raises; leaving `async with` or `close()` releases it. With `read_isr_replica`, the
        messages are fetched from a replica of the ISR (see `fetch`); positions are still
        read at the leader."""
        subscription = Subscription(self, stream, partition, start=start, offset=offset,
                                    timestamp_ms=timestamp_ms, stop=stop, max_bytes=max_bytes,
                                    max_wait_ms=max_wait_ms, read_isr_replica=read_isr_replica,
                                    on_close=self._subscriptions.discard)
        self._subscriptions.add(subscription)
        return subscription

    def partition_subscription(self, stream: str, partition: int, start: Start,
                               offset: int | None, max_bytes: int,
                               max_wait_ms: int) -> Subscription:
        """An unstarted reader of one partition for a consumer-group member (which closes
        it: it is not one of the client's subscriptions)."""
        return Subscription(self, stream, partition, start=start, offset=offset,
                            timestamp_ms=None, stop=None, max_bytes=max_bytes,
                            max_wait_ms=max_wait_ms)

    async def offset_for_timestamp(self, stream: str, partition: int, timestamp_ms: int) -> int:
        """The first offset whose message has a timestamp at or after `timestamp_ms`; the high
        watermark when no committed message is that recent. messages.EARLIEST_TIMESTAMP and
        LATEST_TIMESTAMP ask for the log start offset and the high watermark."""
        return await offset_at(self._router, stream, partition, timestamp_ms)

    async def list_segments(self, stream: str, partition: int) -> SegmentListing:
        """The partition's segment files at its leader, with the leader's high watermark and
        offsets of the same moment (see SegmentListing for how to read them). Raises
        UnknownStream, UnknownPartition, BrokerUnavailable or NotLeader when retries at the
        leader ran out."""
        request = m.ListSegmentsRequest(stream, partition)

        async def call(conn: BrokerConnection) -> SegmentListing:
            r = m.expect_response(await conn.request(request), m.ListSegmentsResponse)
            return SegmentListing(
                r.stream, r.partition, r.high_watermark, r.log_start_offset, r.log_end_offset,
                r.leader_epoch, r.broker_id, r.directory, r.version_file, r.stream_version,
                tuple((base, size) for base, size in r.segments))

        return await self._router.with_leader(stream, partition, call)

    async def fetch_raw(self, stream: str, partition: int, offset: int, max_bytes: int,
                        max_wait_ms: int = 0) -> RawFetch:
        """One Fetch at the partition's leader, its record batches left undecoded (see
        RawFetch): committed batches from the one holding `offset`, about `max_bytes` of
        them (at least one), waiting up to `max_wait_ms` when there are none yet. Raises as
        `fetch` does: OffsetOutOfRange with the readable range (its oldest/newest) when
        `offset` is below the log start or past the log end; UnknownStream, UnknownPartition,
        BrokerUnavailable or NotLeader when retries at the leader ran out."""
        request = m.FetchRequest(stream, partition, offset, max_bytes, max_wait_ms)

        async def call(conn: BrokerConnection) -> RawFetch:
            response, payload = await conn.fetch(request)
            return RawFetch(response.high_watermark, response.log_start_offset,
                            response.log_end_offset, response.next_offset, payload)

        return await self._router.with_leader(stream, partition, call)

    async def _close_subscriptions(self) -> None:
        for subscription in list(self._subscriptions):
            await subscription.close()


async def offset_at(router: Router, stream: str, partition: int, timestamp_ms: int) -> int:
    """Client.offset_for_timestamp, for the other parts of the client."""
    request = m.OffsetForTimestampRequest(stream, partition, timestamp_ms)

    async def call(conn: BrokerConnection) -> int:
        response = await conn.request(request)
        return m.expect_response(response, m.OffsetForTimestampResponse).offset

    return await router.with_leader(stream, partition, call)


async def _fetch_once(conn: BrokerConnection, request: m.FetchRequest) -> FetchResult:
    response, payload = await conn.fetch(request)
    stream, partition, offset = request.stream, request.partition, request.offset
    try:
        messages = decode_batches_as(payload, Message, (stream, partition), min_offset=offset)
    except BatchFormatError as exc:
        if not request.verify:
            # Damaged since the broker checked them (or on the way): ask again, every byte
            # checked, so the broker finds the damage and heals or serves around it.
            return await _fetch_once(conn, dataclasses.replace(request, verify=True))
        raise CorruptRecord(f"fetch of {stream}/{partition} at {offset} from broker "
                            f"{conn.address}: {exc}") from None
    hw = response.high_watermark
    if messages and messages[-1].offset >= hw:  # never hand out what is not committed
        messages = [msg for msg in messages if msg.offset < hw]
    next_offset = messages[-1].offset + 1 if messages else offset
    if payload and response.next_offset > next_offset:
        next_offset = response.next_offset  # a batch whose records below `offset` were skipped
    return FetchResult(messages, hw, response.log_start_offset, response.log_end_offset,
                       min(next_offset, max(hw, offset)))
