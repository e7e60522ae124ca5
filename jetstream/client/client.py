"""The asyncio client: `async with jetstream.connect("127.0.0.1:4300") as js:`.

Theory of operation: the client talks to brokers over their socket API and publishes
through NATS.
- Brokers: `connect` takes bootstrap addresses ("host:port,host:port", a list, or the
  JETSTREAM_BROKERS environment variable). Starting opens a connection to the first one that
  answers and reads the metadata: the brokers (id, address, NATS URL) and every stream with
  its partitions and their leaders. Connections to other brokers open lazily, one per broker,
  when a request must go to the leader of a partition it leads.
- Metadata is a cache. Admin calls refresh it; `publish` refreshes it when it is older than
  `metadata_max_age_s`; a request that fails with NOT_LEADER or a lost connection refreshes
  it and retries at the (new) leader, with exponential backoff and a bounded number of
  attempts (`_with_leader`).
- Publishing goes through NATS (nats-py), connected on first use to `nats_url`, else to the
  NATS URL the brokers report. Envelopes and acks are the publisher's (publisher.py). The
  partition of a message: the one given; else, when a known stream reads exactly this subject
  with N > 1 partitions, `zlib.crc32(key) % N` for a keyed message and round-robin without a
  key; else the subject as is (partition 0 of every stream on it).
- Reading: `fetch` is one Fetch at the partition's leader, its record batches decoded and
  CRC-checked (jetstream.stream.format.decode_batches); `subscribe` (subscription.py) pulls
  batch after batch with one fetch in flight ahead of the consumer. With
  `read_isr_replica=True` a fetch goes to a replica of the partition's ISR (chosen at random
  from the metadata, kept while it answers), which serves what is committed as far as it
  knows (KIP-392); on any error there the fetch is retried at the leader and another replica
  is chosen next time.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import os
import random
import time
import uuid
import weakref
import zlib
from collections.abc import Awaitable, Callable, Generator, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import nats

from jetstream.client.connection import BrokerConnection, split_address
from jetstream.client.publisher import BatchItem, Publisher
from jetstream.client.subscription import StopAt, Subscription
from jetstream.client.types import (
    Ack,
    BrokerInfo,
    FetchResult,
    Message,
    PartitionInfo,
    PublishMessage,
    Start,
    StreamInfo,
)
from jetstream.errors import (
    BrokerUnavailable,
    CorruptRecord,
    JetstreamError,
    NotLeader,
    ProtocolError,
    UnknownPartition,
    UnknownStream,
)
from jetstream.protocol import messages as m
from jetstream.protocol import names
from jetstream.protocol.envelope import AckPolicy
from jetstream.protocol.frames import MiB
from jetstream.stream.format import BatchFormatError, decode_batches_as

_T = TypeVar("_T")

BROKERS_ENV = "JETSTREAM_BROKERS"
METADATA_MAX_AGE_S = 30.0
PUBLISH_TIMEOUT_S = 5.0
FETCH_BYTES_DEFAULT = 1 * MiB
#: Retries of a request at a partition's leader after NOT_LEADER or a lost connection.
LEADER_ATTEMPTS_MAX = 8
RETRY_BACKOFF_S = 0.05
RETRY_BACKOFF_MAX_S = 2.0
#: nats-py's outgoing buffer and flusher queue: large enough that a publish window never
#: blocks on them.
NATS_PENDING_BYTES = 32 * MiB
NATS_FLUSHER_QUEUE = 16_384
#: Publish subjects whose syntax check is remembered.
VALID_SUBJECTS_MAX = 4096


def parse_brokers(brokers: str | Sequence[str] | None) -> list[str]:
    """Bootstrap addresses from "host:port,host:port", a list of them, or (None) the
    JETSTREAM_BROKERS environment variable. Raises ProtocolError when there are none or one
    is not host:port."""
    if brokers is None:
        brokers = os.environ.get(BROKERS_ENV, "")
    items = brokers.split(",") if isinstance(brokers, str) else list(brokers)
    addresses = [item.strip() for item in items if item.strip()]
    if not addresses:
        raise ProtocolError(f"no broker addresses: pass brokers= or set {BROKERS_ENV}",
                            field="brokers")
    for address in addresses:
        try:
            split_address(address)
        except ValueError as exc:
            raise ProtocolError(str(exc), field="brokers") from None
    return addresses


def connect(
    brokers: str | Sequence[str] | None = None,
    *,
    nats_url: str | None = None,
    client_id: str | None = None,
    connect_timeout_s: float = 5.0,
    request_timeout_s: float = 30.0,
    requests_max: int = 256,
    metadata_max_age_s: float = METADATA_MAX_AGE_S,
) -> Client:
    """A client for the brokers at `brokers` (see `parse_brokers`). Use it as
    `async with connect(...) as js:` or `js = await connect(...)` then `await js.close()`.
    Starting raises BrokerUnavailable when no bootstrap broker answers."""
    return Client(parse_brokers(brokers), nats_url=nats_url,
                  client_id=client_id or f"jetstream-py-{os.getpid()}-{uuid.uuid4().hex[:8]}",
                  connect_timeout_s=connect_timeout_s, request_timeout_s=request_timeout_s,
                  requests_max=requests_max, metadata_max_age_s=metadata_max_age_s)


class Client:
    """A Jetstream client. Build it with `connect`; every method is a coroutine except
    `subscribe`, which returns an async iterator."""

    def __init__(self, bootstrap: list[str], *, nats_url: str | None, client_id: str,
                 connect_timeout_s: float, request_timeout_s: float, requests_max: int,
                 metadata_max_age_s: float) -> None:
        self.bootstrap = bootstrap
        self.client_id = client_id
        self._nats_url = nats_url
        self._new_connection = functools.partial(
            BrokerConnection, client_id=client_id, connect_timeout_s=connect_timeout_s,
            request_timeout_s=request_timeout_s, requests_max=requests_max)
        self._connect_timeout_s = connect_timeout_s
        self._metadata_max_age_s = metadata_max_age_s
        self._connections: dict[int, BrokerConnection] = {}
        self._connect_lock = asyncio.Lock()
        self._brokers: dict[int, BrokerInfo] = {}
        #: The broker leading the metadata as of the last refresh; None when unknown.
        self.metadata_leader: int | None = None
        self._streams: dict[str, StreamInfo] = {}
        self._by_subject: dict[str, list[StreamInfo]] = {}
        self._metadata_at = float("-inf")
        self._refreshing: asyncio.Future[None] | None = None
        self._round_robin: dict[str, itertools.count[int]] = {}
        #: The ISR replica each partition read with `read_isr_replica` is fetched from.
        self._read_replicas: dict[tuple[str, int], int] = {}
        # Subjects already checked: a publisher usually repeats a few, and the check is slow.
        self._valid_subjects: set[str] = set()
        self._publisher: Publisher | None = None
        self._nats_lock = asyncio.Lock()
        # Weak: a subscription its consumer dropped without closing must not be kept alive.
        self._subscriptions: weakref.WeakSet[Subscription] = weakref.WeakSet()
        self._closed = False

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> Client:
        """Connect to a bootstrap broker and read the metadata. Raises BrokerUnavailable."""
        await self.refresh_metadata()
        return self

    def __await__(self) -> Generator[Any, None, Client]:
        return self.start().__await__()

    async def __aenter__(self) -> Client:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop subscriptions, fail publishes still waiting for acks, close every
        connection. Idempotent."""
        self._closed = True
        if self._refreshing is not None:
            self._refreshing.cancel()
        for subscription in list(self._subscriptions):
            await subscription.close()
        if self._publisher is not None:
            publisher, self._publisher = self._publisher, None
            await publisher.close()
        connections, self._connections = self._connections, {}
        for connection in connections.values():
            await connection.close()

    # -- metadata -----------------------------------------------------------------------------

    @property
    def brokers(self) -> list[BrokerInfo]:
        """The brokers of the cluster, as of the last metadata refresh."""
        return [self._brokers[i] for i in sorted(self._brokers)]

    async def refresh_metadata(self) -> None:
        """Read brokers and streams again. Raises BrokerUnavailable when no broker answers."""
        response = await self._admin(m.MetadataRequest())
        assert isinstance(response, m.MetadataResponse)
        self._brokers = {b["id"]: BrokerInfo.from_dict(b) for b in response.brokers}
        self.metadata_leader = None if response.metadata_leader < 0 else response.metadata_leader
        self._set_streams([StreamInfo.from_dict(s) for s in response.streams])

    def _set_streams(self, streams: Iterable[StreamInfo]) -> None:
        self._streams = {s.name: s for s in streams}
        self._index_subjects()
        self._metadata_at = time.monotonic()

    def _index_subjects(self) -> None:
        by_subject: dict[str, list[StreamInfo]] = {}
        for stream in sorted(self._streams.values(), key=lambda s: s.name):
            by_subject.setdefault(stream.subject, []).append(stream)
        self._by_subject = by_subject

    async def _refresh_quietly(self) -> None:
        with contextlib.suppress(JetstreamError):
            await self.refresh_metadata()

    # -- streams ------------------------------------------------------------------------------

    async def create_stream(
        self,
        name: str,
        subject: str,
        *,
        partitions: int = 1,
        group: str | None = None,
        labels: Mapping[str, str] | None = None,
        ack_policy: AckPolicy | str | None = None,
        fsync: str | None = None,
        retention_ms: int | None = None,
        retention_bytes: int | None = None,
        retention_messages: int | None = None,
        max_message_bytes: int | None = None,
        segment_bytes_max: int | None = None,
        replication_factor: int | None = None,
        min_isr: int | None = None,
    ) -> StreamInfo:
        """Create a stream reading `subject` (partition p > 0 reads `<subject>.<p>`); options
        left None take the broker's defaults. Idempotent: creating a stream that exists with
        the same config returns it. Raises StreamExists (another config),
        InvalidStreamConfig (a bad name, subject or value), NotEnoughReplicas."""
        config: dict[str, Any] = {"name": name, "subject": subject, "partitions": partitions}
        options = {"group": group, "labels": dict(labels) if labels is not None else None,
                   "ack_policy": _enum_value(ack_policy), "fsync": _enum_value(fsync),
                   "retention_ms": retention_ms, "retention_bytes": retention_bytes,
                   "retention_messages": retention_messages,
                   "max_message_bytes": max_message_bytes,
                   "segment_bytes_max": segment_bytes_max,
                   "replication_factor": replication_factor, "min_isr": min_isr}
        config.update((k, v) for k, v in options.items() if v is not None)
        await self._admin(m.CreateStreamRequest(config))
        return await self.stream_info(name)

    async def delete_stream(self, name: str) -> None:
        """Delete a stream and its data. Raises UnknownStream."""
        try:
            await self._admin(m.DeleteStreamRequest(name))
        finally:
            if self._streams.pop(name, None) is not None:
                self._index_subjects()

    async def list_streams(self) -> list[StreamInfo]:
        """Every stream, sorted by name."""
        response = await self._admin(m.ListStreamsRequest())
        assert isinstance(response, m.ListStreamsResponse)
        streams = [StreamInfo.from_dict(s) for s in response.streams]
        self._set_streams(streams)
        return streams

    async def stream_info(self, name: str) -> StreamInfo:
        """The stream `name` with its partitions (offsets included when the answering broker
        leads them). Raises UnknownStream."""
        response = await self._admin(m.MetadataRequest([name]))
        assert isinstance(response, m.MetadataResponse)
        self._brokers = {b["id"]: BrokerInfo.from_dict(b) for b in response.brokers}
        found = [StreamInfo.from_dict(s) for s in response.streams if s["name"] == name]
        if not found:
            if self._streams.pop(name, None) is not None:
                self._index_subjects()
            raise UnknownStream(name)
        self._streams[name] = found[0]
        self._index_subjects()
        return found[0]

    # -- publishing ---------------------------------------------------------------------------

    async def publish(
        self,
        subject: str,
        value: bytes,
        *,
        key: bytes | None = None,
        headers: Mapping[str, bytes] | None = None,
        ack_policy: AckPolicy | str | None = None,
        partition: int | None = None,
        timeout: float = PUBLISH_TIMEOUT_S,
    ) -> Ack | None:
        """Publish `value` on `subject` through NATS and wait for the ack (the stream's ack
        policy unless `ack_policy` says otherwise). With `ack_policy="none"` nothing comes
        back: the message is sent and None returned at once. The partition is `partition` if given,
        else chosen from `key` (crc32(key) % N) or round-robin when a known stream reads
        exactly `subject` with N > 1 partitions. When several streams read the subject, each
        stores the message and the first ack is returned. Raises AckTimeout (no ack within
        `timeout` seconds: the message may still be stored), NoStreamForSubject (nothing
        reads the subject), the error of an error ack (MESSAGE_TOO_LARGE, ...),
        ProtocolError for bad arguments."""
        publisher = await self._ensure_publisher()
        self._maybe_refresh()
        target = self._choose_subject(subject, key, partition)
        return await publisher.publish(target, bytes(value), key, headers, ack_policy, timeout)

    async def publish_batch(
        self,
        messages: Iterable[PublishMessage | tuple[str, bytes]],
        *,
        window: int = 1000,
        ack_policy: AckPolicy | str | None = None,
        timeout: float = PUBLISH_TIMEOUT_S,
    ) -> list[Ack]:
        """Publish many messages with up to `window` of them un-acked at once, and return
        their acks in order (Ack.subject is None: batch acks do not carry it); with
        `ack_policy="none"` send them all and return []. Partitions
        are chosen as in `publish`. Raises the first error an ack carries (after it, nothing
        more is sent; earlier messages may be stored), AckTimeout when no ack arrives for
        `timeout` seconds, NoStreamForSubject."""
        publisher = await self._ensure_publisher()
        self._maybe_refresh()
        items = (self._batch_item(message) for message in messages)
        return await publisher.publish_batch(items, ack_policy, window, timeout)

    def _batch_item(self, message: PublishMessage | tuple[str, bytes]) -> BatchItem:
        if isinstance(message, tuple):
            subject, value = message
            return self._choose_subject(subject, None, None), bytes(value), None, None
        target = self._choose_subject(message.subject, message.key, message.partition)
        return target, bytes(message.value), message.key, message.headers

    def _choose_subject(self, subject: str, key: bytes | None, partition: int | None) -> str:
        if subject not in self._valid_subjects:
            if not names.is_subject(subject, wildcards=False):
                raise ProtocolError(f"cannot publish on {subject!r}: not a NATS subject "
                                    "without wildcards", field="subject")
            if len(self._valid_subjects) >= VALID_SUBJECTS_MAX:
                self._valid_subjects.clear()
            self._valid_subjects.add(subject)
        if partition is not None:
            return names.partition_subject(subject, partition)
        count = self._partition_count(subject)
        if count <= 1:
            return subject
        if key is not None:
            chosen = zlib.crc32(key) % count
        else:
            chosen = next(self._round_robin.setdefault(subject, itertools.count())) % count
        return names.partition_subject(subject, chosen)

    def _partition_count(self, subject: str) -> int:
        """Partitions of the first stream (by name) reading exactly `subject` that has more
        than one; 1 when there is none."""
        for stream in self._by_subject.get(subject, ()):
            if stream.partition_count > 1:
                return stream.partition_count
        return 1

    def _maybe_refresh(self) -> None:
        """Refresh stale metadata in the background: publishing does not wait for it (it
        only picks partitions), and a slow broker must not hold up NATS publishes."""
        if self._refreshing is None and \
                time.monotonic() - self._metadata_at > self._metadata_max_age_s:
            self._refreshing = asyncio.ensure_future(self._refresh_quietly())
            self._refreshing.add_done_callback(self._refreshed)

    def _refreshed(self, task: asyncio.Future[None]) -> None:
        self._refreshing = None
        self._metadata_at = time.monotonic()  # after a failure too: retry at the next age

    async def _ensure_publisher(self) -> Publisher:
        if self._publisher is not None:
            return self._publisher
        async with self._nats_lock:
            if self._publisher is None:
                self._check_open()
                nc = await self._connect_nats()
                publisher = Publisher(nc)
                await publisher.start()
                self._publisher = publisher
        return self._publisher

    async def _connect_nats(self) -> Any:
        urls = self._nats_urls()
        try:
            return await nats.connect(
                servers=urls, name=f"jetstream-client-{self.client_id}",
                connect_timeout=self._connect_timeout_s, max_reconnect_attempts=60,
                reconnect_time_wait=0.5, pending_size=NATS_PENDING_BYTES,
                flusher_queue_size=NATS_FLUSHER_QUEUE, error_cb=_quiet, disconnected_cb=_quiet0,
                reconnected_cb=_quiet0, closed_cb=_quiet0)
        except Exception as exc:  # nats-py raises several unrelated types
            raise BrokerUnavailable(",".join(urls), f"cannot connect to NATS: "
                                                    f"{exc!r}") from None

    def _nats_urls(self) -> list[str]:
        text = self._nats_url or next((b.nats_url for b in self.brokers if b.nats_url), "")
        urls = [u.strip() for u in text.split(",") if u.strip()]
        if not urls:
            raise ProtocolError("no NATS URL: the brokers do not report one; pass nats_url=",
                                field="nats_url")
        return urls

    # -- reading ------------------------------------------------------------------------------

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
        return await self._with_leader(stream, partition,
                                       lambda conn: _fetch_once(conn, request))

    async def _fetch_from_replica(self, stream: str, partition: int,
                                  request: m.FetchRequest) -> FetchResult | None:
        """`request` at the partition's chosen ISR replica; None when there is none or it
        failed (the caller asks the leader)."""
        key = (stream, partition)
        replica = await self._read_replica(stream, partition)
        if replica is None:
            return None
        try:
            return await _fetch_once(await self._connection(self._brokers[replica].address),
                                     request)
        except JetstreamError as exc:
            if self._closed:
                raise
            self._read_replicas.pop(key, None)
            if isinstance(exc, NotLeader):  # it left the ISR, or the metadata moved on
                await self._refresh_quietly()
            return None

    async def _read_replica(self, stream: str, partition: int) -> int | None:
        """The ISR replica fetched from with `read_isr_replica`: kept while it is in the
        ISR the metadata names, else one picked at random."""
        info = self._streams.get(stream)
        if info is None:
            info = await self.stream_info(stream)  # raises UnknownStream
        if not 0 <= partition < info.partition_count:
            raise UnknownPartition(stream, partition)
        isr = [b for b in info.partitions[partition].isr if b in self._brokers]
        chosen = self._read_replicas.get((stream, partition))
        if chosen in isr:
            return chosen
        if not isr:
            return None
        chosen = self._read_replicas[(stream, partition)] = random.choice(isr)
        return chosen

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
                                    max_wait_ms=max_wait_ms, read_isr_replica=read_isr_replica)
        self._subscriptions.add(subscription)
        return subscription

    def _forget_subscription(self, subscription: Subscription) -> None:
        self._subscriptions.discard(subscription)

    async def partition_status(self, stream: str, partition: int) -> PartitionInfo:
        """The partition as its leader describes it: offsets included (high watermark, log
        start and end, and each replica's log end offset as the leader knows it). One
        request at the leader the metadata names, not retried (a status view should not
        wait for a failover): raises UnknownStream, UnknownPartition, NotLeader (that broker
        does not lead it) or BrokerUnavailable."""
        conn = await self._leader_connection(stream, partition)
        response = await conn.request(m.MetadataRequest([stream]))
        assert isinstance(response, m.MetadataResponse)
        if not response.streams:
            raise UnknownStream(stream)
        info = StreamInfo.from_dict(response.streams[0])
        if not 0 <= partition < info.partition_count:
            raise UnknownPartition(stream, partition)
        found = info.partitions[partition]
        if found.log_end_offset is None:  # that broker does not lead it (any more)
            raise NotLeader(stream, partition, found.leader)
        return found

    async def offset_for_timestamp(self, stream: str, partition: int, timestamp_ms: int) -> int:
        """The first offset whose message has a timestamp at or after `timestamp_ms`; the high
        watermark when no committed message is that recent. messages.EARLIEST_TIMESTAMP and
        LATEST_TIMESTAMP ask for the log start offset and the high watermark."""
        request = m.OffsetForTimestampRequest(stream, partition, timestamp_ms)

        async def call(conn: BrokerConnection) -> int:
            response = await conn.request(request)
            assert isinstance(response, m.OffsetForTimestampResponse)
            return response.offset

        return await self._with_leader(stream, partition, call)

    # -- connections and retries --------------------------------------------------------------

    async def _with_leader(self, stream: str, partition: int,
                           call: Callable[[BrokerConnection], Awaitable[_T]]) -> _T:
        """`call` on a connection to the partition's leader. After NOT_LEADER or a lost
        connection: refresh the metadata, back off, retry (LEADER_ATTEMPTS_MAX in all)."""
        delay = RETRY_BACKOFF_S
        for attempt in range(1, LEADER_ATTEMPTS_MAX + 1):
            try:
                return await call(await self._leader_connection(stream, partition))
            except (NotLeader, BrokerUnavailable):
                if attempt == LEADER_ATTEMPTS_MAX or self._closed:
                    raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_BACKOFF_MAX_S)
            await self._refresh_quietly()
        raise AssertionError("unreachable")

    async def _leader_connection(self, stream: str, partition: int) -> BrokerConnection:
        info = self._streams.get(stream)
        if info is None:
            info = await self.stream_info(stream)  # raises UnknownStream
        if not 0 <= partition < info.partition_count:
            raise UnknownPartition(stream, partition)
        leader = info.partitions[partition].leader
        if leader < 0 or leader not in self._brokers:
            raise NotLeader(stream, partition)
        return await self._connection(self._brokers[leader].address)

    async def _admin(self, request: m.Request) -> m.Response:
        """`request` at any broker (metadata and stream admin): the connected ones first, then
        the bootstrap and known addresses. Raises BrokerUnavailable when none answers."""
        tried: list[str] = []
        for address in self._candidate_addresses():
            try:
                connection = await self._connection(address)
                return await connection.request(request)
            except BrokerUnavailable as exc:
                tried.append(f"{address} ({exc.reason})")
        raise BrokerUnavailable(",".join(self._candidate_addresses()),
                                "no broker answered: " + "; ".join(tried))

    def _candidate_addresses(self) -> list[str]:
        addresses = [c.address for c in self._connections.values() if not c.closed]
        addresses += self.bootstrap + [b.address for b in self.brokers]
        return list(dict.fromkeys(addresses))

    async def _connection(self, address: str) -> BrokerConnection:
        """The open connection to the broker at `address`, opened if needed."""
        self._check_open()
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

    def _open_connection(self, address: str) -> BrokerConnection | None:
        for broker_id, connection in list(self._connections.items()):
            if connection.closed:
                del self._connections[broker_id]
            elif connection.address == address:
                return connection
        info = next((b for b in self._brokers.values() if b.address == address), None)
        known = self._connections.get(info.id) if info is not None else None
        return known if known is not None and not known.closed else None

    def _check_open(self) -> None:
        if self._closed:
            raise BrokerUnavailable(",".join(self.bootstrap), "the client was closed")


async def _fetch_once(conn: BrokerConnection, request: m.FetchRequest) -> FetchResult:
    response, payload = await conn.fetch(request)
    stream, partition, offset = request.stream, request.partition, request.offset
    try:
        messages = decode_batches_as(payload, Message, (stream, partition), min_offset=offset)
    except BatchFormatError as exc:
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


def _enum_value(value: Any) -> Any:
    return value.value if hasattr(value, "value") else value


async def _quiet(exc: Exception) -> None:
    """nats-py logs connection errors itself unless given callbacks; the client reports
    failures through its own exceptions."""


async def _quiet0() -> None:
    """See `_quiet`."""
