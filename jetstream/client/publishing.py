"""The client's publishing calls: through NATS, each message waiting for its ack.

Theory of operation: brokers read streams from NATS subjects, so the client publishes on
NATS (nats-py) like any publisher, never through a broker's socket. The NATS connection is
opened on first use, to `nats_url`, else to the NATS URL the brokers report, and it and the
ack bookkeeping belong to the Publisher (publisher.py). Before sending, each message's
subject is chosen from its key or partition (partitioner.py) using the metadata, which is
refreshed in the background when it is older than the client's `metadata_max_age_s`: a
publish never waits for a broker.

`Publishing` is one part of `Client` (client.py): it owns the NATS side of the client and
reaches the metadata through the client's router.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import nats
from nats.aio.client import Client as NatsClient

from jetstream.client.idempotent import IdempotentProducer
from jetstream.client.partitioner import Partitioner
from jetstream.client.publisher import BatchItem, ExpectingItem, Publisher
from jetstream.client.routing import Router
from jetstream.client.types import Ack, PublishMessage
from jetstream.errors import BrokerUnavailable, JetstreamError, ProtocolError
from jetstream.protocol.envelope import AckPolicy
from jetstream.protocol.frames import MiB

PUBLISH_TIMEOUT_S = 5.0
#: nats-py's outgoing buffer and flusher queue: large enough that a publish window never
#: blocks on them.
NATS_PENDING_BYTES = 32 * MiB
NATS_FLUSHER_QUEUE = 16_384


class Publishing:
    """Publish one message or many, through NATS, and wait for their acks."""

    _router: Router
    client_id: str

    def __init__(self, *, nats_url: str | None, connect_timeout_s: float,
                 partition_count: Callable[[str], int],
                 nats_options: Mapping[str, Any] | None = None) -> None:
        self._nats_url = nats_url
        self._nats_options = dict(nats_options or {})
        self._nats_connect_timeout_s = connect_timeout_s
        self._partitioner = Partitioner(partition_count)
        self._publisher: Publisher | None = None
        self._nats_lock = asyncio.Lock()

    async def publish(
        self,
        subject: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        headers: Mapping[str, bytes] | None = None,
        ack_policy: AckPolicy | str | None = None,
        partition: int | None = None,
        timeout: float = PUBLISH_TIMEOUT_S,
        msg_id: str | None = None,
        expected_offset: int | None = None,
        expected_last_offset_for_key: int | None = None,
        check_registers: str | None = None,
        union_registers: Mapping[str, str] | None = None,
        subtract_registers: Mapping[str, str] | None = None,
    ) -> Ack | None:
        """Publish `value` on `subject` through NATS and wait for the ack (the stream's ack
        policy unless `ack_policy` says otherwise). A None value with a key is a tombstone:
        on a compacted stream it deletes the key. With `ack_policy="none"` nothing comes
        back: the message is sent and None returned at once. The partition is `partition` if given,
        else chosen from `key` (crc32(key) % N) or round-robin when a known stream reads
        exactly `subject` with N > 1 partitions. When several streams read the subject, each
        stores the message and the first ack is returned. Raises AckTimeout (no ack within
        `timeout` seconds: the message may still be stored), NoStreamForSubject (nothing
        reads the subject), the error of an error ack (MESSAGE_TOO_LARGE, ...),
        ProtocolError for bad arguments.

        Expectations (all optional, checked by the partition leader in log order): `msg_id`
        makes the publish idempotent within the stream's `duplicate_window_ms` (a retry is
        answered with the original's offset and `Ack.duplicate`); `expected_offset` (the
        record must land there, else OffsetMismatch), `expected_last_offset_for_key` (the
        key's latest record must be at that offset, -1: the key has none; compacted streams;
        else KeyOffsetMismatch), `check_registers` (a label selector the partition's
        registers must match, else RegisterMismatch) and `union_registers` /
        `subtract_registers` (register labels set / removed with the record)."""
        target = self.target_subject(subject, key, partition)
        expect = {name: v for name, v in (
            ("msg_id", msg_id), ("expected_offset", expected_offset),
            ("expected_last_offset_for_key", expected_last_offset_for_key),
            ("check_registers", check_registers), ("union_registers", union_registers),
            ("subtract_registers", subtract_registers)) if v is not None}
        return await self.publish_to(target, value, key, headers, ack_policy, timeout,
                                     **expect)

    def target_subject(self, subject: str, key: bytes | None, partition: int | None) -> str:
        """The subject a publish goes to: `subject`, or its partition's subject."""
        return self._partitioner.subject_for(subject, key, partition)

    async def publish_to(self, target: str, value: bytes | None, key: bytes | None,
                         headers: Mapping[str, bytes] | None,
                         ack_policy: AckPolicy | str | None, timeout: float,
                         **expect: Any) -> Ack | None:
        """Publish to the partition subject `target` (`expect`: envelope fields)."""
        publisher = await self._ensure_publisher()
        self._router.refresh_in_background()
        data = None if value is None else bytes(value)
        return await publisher.publish(target, data, key, headers, ack_policy, timeout,
                                       **expect)

    async def publish_expecting(self, items: Iterable[ExpectingItem], *,
                                ack_policy: AckPolicy | str | None = None,
                                window: int = 1000, timeout: float = PUBLISH_TIMEOUT_S
                                ) -> tuple[list[Ack | None], JetstreamError | None]:
        """Messages to partition subjects (`target_subject`), each with its envelope's
        expectation fields (`msg_id`, `producer` as (id, epoch, sequence),
        `expected_offset`, `expected_last_offset_for_key`, `check_registers`,
        `union_registers`, `subtract_registers`), up to `window` un-acked, sent in order on
        one connection so a partition's leader judges them in that order: each one's ack
        (None: not acknowledged) and the first error (AckTimeout too), returned, not raised;
        nothing after the error is sent. Used by idempotent producers and datastreams."""
        publisher = await self._ensure_publisher()
        self._router.refresh_in_background()
        return await publisher.publish_expecting(items, ack_policy, window, timeout)

    def idempotent_producer(self, producer_id: str | None = None,
                            epoch: int = 0) -> IdempotentProducer:
        """An idempotent producer session (jetstream.client.idempotent): its publishes retry
        on their own with no duplicates and no gaps. `producer_id` (1..64 of A-Z a-z 0-9 . _
        -; default: a random one) with a higher `epoch` fences the sessions of lower
        epochs."""
        return IdempotentProducer(self, producer_id, epoch)

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
        self._router.refresh_in_background()
        items = (self._batch_item(message) for message in messages)
        return await publisher.publish_batch(items, ack_policy, window, timeout)

    def _batch_item(self, message: PublishMessage | tuple[str, bytes]) -> BatchItem:
        if isinstance(message, tuple):
            subject, value = message
            return self._partitioner.subject_for(subject, None, None), bytes(value), None, None
        target = self._partitioner.subject_for(message.subject, message.key, message.partition)
        data = None if message.value is None else bytes(message.value)
        return target, data, message.key, message.headers

    async def delete(self, stream: str, key: bytes, *,
                     ack_policy: AckPolicy | str | None = None,
                     timeout: float = PUBLISH_TIMEOUT_S) -> Ack | None:
        """Delete `key` from a compacted stream: publish a tombstone (the key with a null
        value) to the stream's subject, in the partition the key hashes to. Its readers see
        the tombstone; compaction then removes the key's older records, and the tombstone
        itself after the stream's `delete_retention_ms`. Raises UnknownStream."""
        info = await self._router.load_stream(stream)
        return await self.publish(info.subject, None, key=key, ack_policy=ack_policy,
                                  timeout=timeout)

    async def _close_publisher(self) -> None:
        """Fail publishes still waiting for acks and close the NATS connection."""
        if self._publisher is not None:
            publisher, self._publisher = self._publisher, None
            await publisher.close()

    async def _ensure_publisher(self) -> Publisher:
        if self._publisher is not None:
            return self._publisher
        async with self._nats_lock:
            if self._publisher is None:
                self._router.check_open()
                nc = await self._connect_nats()
                publisher = Publisher(nc)
                await publisher.start()
                self._publisher = publisher
        return self._publisher

    async def _connect_nats(self) -> NatsClient:
        urls = self._nats_urls()
        try:
            return await nats.connect(
                servers=urls, name=f"jetstream-client-{self.client_id}",
                connect_timeout=self._nats_connect_timeout_s, max_reconnect_attempts=60,
                reconnect_time_wait=0.5, pending_size=NATS_PENDING_BYTES,
                flusher_queue_size=NATS_FLUSHER_QUEUE, error_cb=_quiet, disconnected_cb=_quiet0,
                reconnected_cb=_quiet0, closed_cb=_quiet0, **self._nats_options)
        except Exception as exc:  # nats-py raises several unrelated types
            raise BrokerUnavailable(",".join(urls), f"cannot connect to NATS: "
                                                    f"{exc!r}") from None

    def _nats_urls(self) -> list[str]:
        brokers = self._router.metadata.broker_list()
        text = self._nats_url or next((b.nats_url for b in brokers if b.nats_url), "")
        urls = [u.strip() for u in text.split(",") if u.strip()]
        if not urls:
            raise ProtocolError("no NATS URL: the brokers do not report one; pass nats_url=",
                                field="nats_url")
        return urls


async def _quiet(exc: Exception) -> None:
    """nats-py logs connection errors itself unless given callbacks; the client reports
    failures through its own exceptions."""


async def _quiet0() -> None:
    """See `_quiet`."""
