"""Publishing through NATS and matching the acks that come back.

Theory of operation: a publisher sends through plain NATS, so acks come back through NATS
too. The client makes one inbox prefix (`_INBOX.<nuid>`) and one subscription on
`<prefix>.*`. Each message gets a correlation id (a decimal counter, one token) and goes out
in an envelope (jetstream.protocol.envelope) whose `ack_inbox` is `<prefix>.<id>`; the same
subject is the NATS reply subject, so when no subscriber at all reads the subject, the NATS
server answers at once with a "503 no responders" status message on it, and the publish fails
with NoStreamForSubject instead of waiting out its timeout. Acks (jetstream.protocol.ack)
carry the correlation id; a dict maps it to the waiter: a future for `publish`, a slot of a
batch for `publish_batch`. An error ack fails its waiter with the error it carries. When
several streams read one subject each acks the message; the first ack settles the waiter and
later ones find nothing and are dropped.

`publish_batch` keeps up to `window` messages un-acked. Its envelopes share one ack inbox
(`<prefix>.b<n>`) and ask for `batch_ack`, so the broker acks each append batch with one
NATS message instead of one per record; each message's reply subject stays `<prefix>.<id>`
for the no-responders signal. nats-py's publish only appends to its pending buffer (its
flusher task writes), so the loop never flushes per message; it yields to the event loop only
when the window is full (or nats-py's flusher queue is).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription as NatsSubscription
from nats.errors import MaxPayloadError

from jetstream.errors import (
    AckTimeout,
    BrokerUnavailable,
    JetstreamError,
    NoStreamForSubject,
    ProtocolError,
    RecordTooLarge,
)
from jetstream.protocol.ack import Ack, ErrorAck, parse_ack
from jetstream.protocol.envelope import AckPolicy, encode_envelope
from jetstream.tasks import wait_event

log = logging.getLogger(__name__)

#: Acks and status messages the inbox subscription may buffer before nats-py drops them.
INBOX_PENDING_MSGS_MAX = 1_000_000
INBOX_PENDING_BYTES_MAX = 256 * 1024 * 1024
_NO_RESPONDERS = "503"
#: publish_batch yields to the event loop after this many messages, so nats-py's flusher
#: sends them (and the broker starts on them) while the next ones are encoded.
YIELD_EVERY = 64

#: One item of a batch: subject, value, key, headers.
BatchItem = tuple[str, bytes | None, bytes | None, Mapping[str, bytes] | None]
#: An idempotent producer's stamp of one message: producer id, epoch, sequence, and
#: optionally `resume` (every earlier sequence of the epoch was acked: jetstream.idempotence).
Stamp = tuple[str, int, int] | tuple[str, int, int, bool]
#: A batch item with its envelope's expectation fields: `msg_id`, `producer` (a Stamp),
#: `expected_offset`, `expected_last_offset_for_key`, `check_registers`, ...
ExpectingItem = tuple[BatchItem, Mapping[str, Any]]
_NO_EXPECT: Mapping[str, Any] = {}


@dataclass(slots=True)
class _Batch:
    """The acks of one `publish_batch` call, in publish order."""

    subjects: list[str] = field(default_factory=list)
    acks: list[Ack | None] = field(default_factory=list)
    outstanding: int = 0
    error: JetstreamError | None = None
    error_index: int = -1
    #: Wake the publishing loop when `outstanding` drops to this (or on an error).
    wake_at: int = -1
    wake: asyncio.Event = field(default_factory=asyncio.Event)

    def settle(self, index: int, outcome: Ack | JetstreamError) -> None:
        # Called once per message: its waiter is removed from the dict first.
        self.outstanding -= 1
        if isinstance(outcome, JetstreamError):
            if self.error is None:
                self.error, self.error_index = outcome, index
            self.wake.set()
            return
        self.acks[index] = outcome
        if self.outstanding <= self.wake_at:
            self.wake.set()


_Waiter = asyncio.Future[Ack] | tuple[_Batch, int]


class Publisher:
    """The NATS half of a client: publishes envelopes and resolves their acks."""

    def __init__(self, nc: NatsClient) -> None:
        self._nc = nc
        self.inbox_prefix: str = nc.new_inbox()
        self._ids = itertools.count(1)
        self._batch_ids = itertools.count(1)
        self._waiters: dict[str, _Waiter] = {}
        self._sub: NatsSubscription | None = None

    async def start(self) -> None:
        self._sub = await self._nc.subscribe(
            self.inbox_prefix + ".*", cb=self._on_message,
            pending_msgs_limit=INBOX_PENDING_MSGS_MAX,
            pending_bytes_limit=INBOX_PENDING_BYTES_MAX)

    async def close(self) -> None:
        """Fail what still waits for an ack, and close the NATS connection."""
        waiters, self._waiters = self._waiters, {}
        closed = BrokerUnavailable(self._nats_address(), "the client was closed")
        for waiter in waiters.values():
            _settle(waiter, closed)
        try:
            await self._nc.drain()
        except Exception:  # already closed or disconnected: nothing left to flush
            await self._nc.close()

    # -- publishing ---------------------------------------------------------------------------

    async def publish(self, subject: str, value: bytes | None, key: bytes | None,
                      headers: Mapping[str, bytes] | None, ack_policy: AckPolicy | str | None,
                      timeout_s: float, **expect: Any) -> Ack | None:
        """`expect`: the envelope's expectation fields (msg_id, producer, ...)."""
        if _no_ack(ack_policy):
            await self.send_unacked(subject, value, key, headers, **expect)
            return None
        correlation_id = str(next(self._ids))
        inbox = f"{self.inbox_prefix}.{correlation_id}"
        payload = encode_envelope(value, key, headers, inbox, correlation_id, ack_policy,
                                  **expect)
        future: asyncio.Future[Ack] = asyncio.get_running_loop().create_future()
        self._waiters[correlation_id] = future
        try:
            await self._send(subject, payload, inbox)
            return await asyncio.wait_for(future, timeout_s)
        except TimeoutError:
            raise AckTimeout(subject, round(timeout_s * 1000), correlation_id) from None
        finally:
            self._waiters.pop(correlation_id, None)

    async def send_unacked(self, subject: str, value: bytes | None, key: bytes | None,
                           headers: Mapping[str, bytes] | None, **expect: Any) -> None:
        """Publish with ack policy `none`: nothing comes back, so nothing is awaited."""
        payload = encode_envelope(value, key, headers, None, None, AckPolicy.NONE, **expect)
        try:
            await self._nc.publish(subject, payload)
        except MaxPayloadError:
            raise RecordTooLarge(len(payload), self._nc.max_payload) from None

    async def publish_batch(self, items: Iterable[BatchItem],
                            ack_policy: AckPolicy | str | None,
                            window: int, timeout_s: float) -> list[Ack]:
        if window < 1:
            raise ProtocolError(f"window must be at least 1, got {window}", field="window")
        if _no_ack(ack_policy):
            for i, item in enumerate(items):
                await self.send_unacked(*item)
                if i % YIELD_EVERY == YIELD_EVERY - 1:
                    await asyncio.sleep(0)
            return []
        acks, error = await self.publish_expecting(
            ((item, _NO_EXPECT) for item in items), ack_policy, window, timeout_s)
        if error is not None:
            raise error
        return _all_acks(acks)

    async def publish_expecting(self, items: Iterable[ExpectingItem],
                                ack_policy: AckPolicy | str | None, window: int,
                                timeout_s: float
                                ) -> tuple[list[Ack | None], JetstreamError | None]:
        """`publish_batch` of messages that each carry their envelope's expectation fields
        (an idempotent producer's stamp, a msg id, an expected offset, ...), sent in order on
        this one connection, so a partition's leader judges them in that order. Returns what
        each message got (None: no ack) and the first error (AckTimeout too) instead of
        raising it; after an error nothing more is sent."""
        if window < 1:
            raise ProtocolError(f"window must be at least 1, got {window}", field="window")
        batch = await self._send_batch(iter(items), ack_policy, window, timeout_s)
        if batch.error is not None:
            batch.error.add_note(f"message {batch.error_index} of the batch, on subject "
                                 f"{batch.subjects[batch.error_index]!r}")
        return batch.acks, batch.error

    async def _send_batch(self, items: Iterator[ExpectingItem],
                          ack_policy: AckPolicy | str | None, window: int,
                          timeout_s: float) -> _Batch:
        """Send `items` with at most `window` un-acked; the batch once every ack came or one
        failed or timed out (its `error`: the first error, or AckTimeout)."""
        batch = _Batch()
        inbox = f"{self.inbox_prefix}.b{next(self._batch_ids)}"
        ids: list[str] = []
        try:
            for (subject, value, key, headers), expect in items:
                if batch.outstanding >= window:
                    await self._wait(batch, window - 1, timeout_s)
                if batch.error is not None:
                    break
                correlation_id = str(next(self._ids))
                payload = encode_envelope(value, key, headers, inbox, correlation_id,
                                          ack_policy, batch_ack=True, **expect)
                self._waiters[correlation_id] = (batch, len(batch.acks))
                ids.append(correlation_id)
                batch.subjects.append(subject)
                batch.acks.append(None)
                batch.outstanding += 1
                await self._send(subject, payload, f"{self.inbox_prefix}.{correlation_id}")
                if len(ids) % YIELD_EVERY == 0:
                    await asyncio.sleep(0)  # let nats-py's flusher write what is queued
            await self._wait(batch, 0, timeout_s)
        except AckTimeout as exc:
            batch.error, batch.error_index = exc, batch.acks.index(None)
        finally:
            for correlation_id in ids:
                self._waiters.pop(correlation_id, None)
        return batch

    async def _wait(self, batch: _Batch, outstanding: int, timeout_s: float) -> None:
        """Until at most `outstanding` messages of the batch wait for acks, or one failed.
        Raises AckTimeout when no ack comes for `timeout_s`."""
        while batch.outstanding > outstanding and batch.error is None:
            batch.wake.clear()
            batch.wake_at = outstanding
            before = batch.outstanding
            if not await wait_event(batch.wake, timeout_s):
                if batch.outstanding < before or batch.error is not None:
                    continue  # progress came with the timeout
                index = batch.acks.index(None)
                raise AckTimeout(batch.subjects[index], round(timeout_s * 1000))

    async def _send(self, subject: str, payload: bytes, reply: str) -> None:
        try:
            await self._nc.publish(subject, payload, reply=reply)
        except MaxPayloadError:
            raise RecordTooLarge(len(payload), self._nc.max_payload) from None

    # -- acks ---------------------------------------------------------------------------------

    async def _on_message(self, msg: Msg) -> None:
        data = msg.data
        if not data:
            if msg.headers and msg.headers.get("Status") == _NO_RESPONDERS:
                subject = msg.headers.get("Nats-Subject") or "?"
                self._settle(msg.subject.rpartition(".")[2], NoStreamForSubject(subject))
            return
        try:
            result = parse_ack(data)
        except ProtocolError as exc:
            log.warning("dropped a malformed ack on %s: %s", msg.subject, exc)
            return
        if isinstance(result, ErrorAck):
            if result.correlation_id is not None:
                self._settle(result.correlation_id, result.error)
            return
        waiters = self._waiters
        for ack in result:
            waiter = waiters.pop(ack.correlation_id, None) if ack.correlation_id else None
            if waiter is not None:
                _settle(waiter, ack)

    def _settle(self, correlation_id: str, outcome: Ack | JetstreamError) -> None:
        waiter = self._waiters.pop(correlation_id, None)
        if waiter is not None:
            _settle(waiter, outcome)

    def _nats_address(self) -> str:
        url = getattr(self._nc, "connected_url", None)
        return url.netloc if url is not None else "nats"


def _settle(waiter: _Waiter, outcome: Ack | JetstreamError) -> None:
    """Hand a message's ack, or the error it failed with, to whoever waits for it."""
    if isinstance(waiter, tuple):
        batch, index = waiter
        batch.settle(index, outcome)
    elif not waiter.done():
        if isinstance(outcome, JetstreamError):
            waiter.set_exception(outcome)
        else:
            waiter.set_result(outcome)


def _all_acks(acks: list[Ack | None]) -> list[Ack]:
    """The acks in publish order, once every message is acked."""
    got = [ack for ack in acks if ack is not None]
    assert len(got) == len(acks), "a batch settled without errors has every ack"
    return got


def _no_ack(ack_policy: AckPolicy | str | None) -> bool:
    return ack_policy is not None and str(ack_policy) == AckPolicy.NONE.value
