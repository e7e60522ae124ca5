"""Idempotent producer sessions: exactly-once publishes through retries and failovers.

Theory of operation (Kafka's idempotent producer): a producer has an id and an epoch; each
publish takes the next sequence number of its partition (its target subject) and carries
(id, epoch, sequence) in its envelope. The partition leader stores a sequence once: a retry
of one it holds is answered with its original offset (`Ack.duplicate`), one past a gap is
refused with OUT_OF_ORDER_SEQUENCE, and a newer epoch of the same id fences the older
(PRODUCER_FENCED). The leader keeps this state in its log, so it survives failover. The
first sequence of an epoch a leader does not know must be 0: a publish whose earlier
sequences are all acked says so (`resume`), so a leader that forgot an idle producer takes
it up, while one whose earlier publishes may still be on their way (or lost) is refused
as a gap.

So a publish here retries on its own — the same bytes, the same sequence — on an ack
timeout, a lost connection, a leader change (also when no leader subscribes to the subject
for a moment), too few in-sync replicas, and a gap (an earlier
publish of this producer was lost and is being retried too), until it is acked or its
`timeout` passes: no duplicates, no gaps. Publishes may run concurrently; each partition's
sequences are given in the order the calls are made. A new session of the same id with a
higher epoch (a restarted task) fences this one: its publishes raise ProducerFenced.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from jetstream.client.publisher import ExpectingItem, Stamp
from jetstream.client.types import PublishMessage
from jetstream.errors import (
    AckTimeout,
    BrokerUnavailable,
    JetstreamError,
    NoStreamForSubject,
    NotEnoughReplicas,
    NotLeader,
    OutOfOrderSequence,
    ProtocolError,
)
from jetstream.idempotence.headers import check_producer
from jetstream.protocol.ack import Ack
from jetstream.protocol.envelope import AckPolicy


class Sender(Protocol):
    """What a session needs of the client (jetstream.client.publishing)."""

    def target_subject(self, subject: str, key: bytes | None,
                       partition: int | None) -> str: ...

    async def publish_expecting(self, items: Iterable[ExpectingItem], *,
                                ack_policy: AckPolicy | str | None = None,
                                window: int = 1000, timeout: float = ...
                                ) -> tuple[list[Ack | None], JetstreamError | None]: ...

    async def publish_to(self, target: str, value: bytes | None, key: bytes | None,
                         headers: Mapping[str, bytes] | None,
                         ack_policy: AckPolicy | str | None, timeout: float,
                         **expect: Any) -> Ack | None: ...

#: Errors after which the same publish is sent again (no stream reading the subject: while
#: a partition's leadership moves, nobody subscribes to it for a moment).
RETRIED = (AckTimeout, BrokerUnavailable, NotLeader, NotEnoughReplicas, OutOfOrderSequence,
           NoStreamForSubject)
ATTEMPT_TIMEOUT_S = 2.0
SESSION_TIMEOUT_S = 60.0
BACKOFF_S = (0.05, 0.1, 0.2, 0.5, 1.0)


class IdempotentProducer:
    """Publishes of one producer session (see the module doc). Build with
    `Client.idempotent_producer`."""

    def __init__(self, publishing: Sender, producer_id: str | None, epoch: int) -> None:
        self.producer_id = producer_id or uuid.uuid4().hex
        self.epoch = epoch
        check_producer(self.producer_id, epoch, 0)
        self._publishing = publishing
        self._sequences: dict[str, int] = {}
        #: Per target subject, the sequences given and not acked yet.
        self._unacked: dict[str, set[int]] = {}

    def _next(self, target: str) -> int:
        sequence = self._sequences.get(target, 0)
        self._sequences[target] = sequence + 1
        self._unacked.setdefault(target, set()).add(sequence)
        return sequence

    def _stamp(self, target: str, sequence: int) -> Stamp:
        """The stamp of `sequence`, with `resume` when every earlier one of `target` is
        acked."""
        if sequence and min(self._unacked[target]) == sequence:
            return (self.producer_id, self.epoch, sequence, True)
        return (self.producer_id, self.epoch, sequence)

    def _acked(self, target: str, sequence: int) -> None:
        unacked = self._unacked[target]
        unacked.discard(sequence)
        if not unacked:
            del self._unacked[target]

    async def publish(self, subject: str, value: bytes | None, *, key: bytes | None = None,
                      headers: Mapping[str, bytes] | None = None,
                      partition: int | None = None,
                      ack_policy: AckPolicy | str | None = None,
                      timeout: float = SESSION_TIMEOUT_S,
                      attempt_timeout: float = ATTEMPT_TIMEOUT_S) -> Ack:
        """Publish once and for all (Client.publish's arguments): retried with the same
        sequence until acked or `timeout` seconds passed (then the last error is raised; the
        message may be stored). Raises ProducerFenced when a newer epoch took over."""
        if ack_policy is not None and AckPolicy(ack_policy) is AckPolicy.NONE:
            raise ProtocolError("an idempotent publish waits for its ack: not ack_policy none",
                                field="ack_policy")
        target = self._publishing.target_subject(subject, key, partition)
        sequence = self._next(target)
        deadline = time.monotonic() + timeout
        for attempt in range(1 << 30):
            try:
                ack = await self._publishing.publish_to(
                    target, value, key, headers, ack_policy, attempt_timeout,
                    producer=self._stamp(target, sequence))
            except RETRIED:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise
                await asyncio.sleep(min(BACKOFF_S[min(attempt, len(BACKOFF_S) - 1)], left))
                continue
            assert ack is not None
            self._acked(target, sequence)
            return ack
        raise AssertionError("unreachable")

    async def publish_batch(self, messages: Sequence[PublishMessage], *, window: int = 1000,
                            ack_policy: AckPolicy | str | None = None,
                            timeout: float = SESSION_TIMEOUT_S,
                            attempt_timeout: float = ATTEMPT_TIMEOUT_S) -> list[Ack]:
        """Publish many messages once and for all, up to `window` un-acked at once
        (Client.publish_batch's pipelining, each message stamped with its sequence): after a
        retried error, the messages not acked yet are sent again, in order, with the same
        sequences, until every one is acked or `timeout` seconds passed (then the last
        error is raised; messages may be stored). Acks in order. Raises ProducerFenced."""
        if ack_policy is not None and AckPolicy(ack_policy) is AckPolicy.NONE:
            raise ProtocolError("an idempotent publish waits for its ack: not ack_policy none",
                                field="ack_policy")
        items: list[ExpectingItem] = []
        for message in messages:
            target = self._publishing.target_subject(message.subject, message.key,
                                                     message.partition)
            value = None if message.value is None else bytes(message.value)
            items.append(((target, value, message.key, message.headers),
                          {"producer": (self.producer_id, self.epoch, self._next(target))}))
        acks: list[Ack | None] = [None] * len(items)
        pending = list(range(len(items)))
        deadline = time.monotonic() + timeout
        for attempt in range(1 << 30):
            got, error = await self._publishing.publish_expecting(
                self._restamped(items, pending),
                ack_policy=ack_policy, window=window, timeout=attempt_timeout)
            for i, ack in zip(pending, got, strict=False):
                acks[i] = ack
                if ack is not None:
                    self._acked(items[i][0][0], items[i][1]["producer"][2])
            pending = [i for i in pending if acks[i] is None]
            if not pending:
                return [ack for ack in acks if ack is not None]
            if error is not None and not isinstance(error, RETRIED):
                raise error
            left = deadline - time.monotonic()
            if left <= 0:
                raise error if error is not None else AckTimeout(
                    items[pending[0]][0][0], round(attempt_timeout * 1000))
            await asyncio.sleep(min(BACKOFF_S[min(attempt, len(BACKOFF_S) - 1)], left))
        raise AssertionError("unreachable")

    def _restamped(self, items: list[ExpectingItem], pending: list[int]
                   ) -> list[ExpectingItem]:
        """The pending items, the first of each target stamped again (it may `resume`: only
        the first can have every earlier sequence acked)."""
        out: list[ExpectingItem] = []
        seen: set[str] = set()
        for i in pending:
            item = items[i]
            target = item[0][0]
            if target not in seen:
                seen.add(target)
                item = (item[0], {"producer": self._stamp(target, item[1]["producer"][2])})
            out.append(item)
        return out
