"""The leader of one partition on this broker: NATS in, log append, fsync, commit, acks out.

Theory of operation
- Ingest: the partition's NATS subscription (a queue subscription when the stream is in a
  group; jetstream.server.nats_port) buffers messages in a bounded queue. The ingest task
  takes whatever has arrived since its last append as one batch (up to a record and byte
  limit), turns each message into a record (an envelope is unpacked; anything else is stored
  as it came: payload as value, NATS headers as headers, subject kept) and appends the batch
  without fsync.
- Durability: with fsync `always`, a sync task fsyncs in a thread while the ingest task
  appends the next batch, so one fsync covers every batch that landed before it started
  (group commit across batches). Other policies count a batch as written when appended.
- Commit: the high watermark (HW) is the offset below which every in-sync replica holds the
  data. On one broker the ISR is this broker, so the HW follows the durable log end offset.
  Acks for policy `leader` go out when the leader's own write is durable, for `all` when
  the HW passes the message; `none` gets no ack. Acks of one batch are published together
  (nats-py buffers them into few socket writes); envelopes that ask for it share one ack.
- Fetch: reads are served from the log up to the HW; a reader at the HW waits for it to
  move (long poll) until its deadline.
- Back-pressure: at most `ingest_inflight_batches_max` batches wait for fsync; past that the
  ingest task stops taking messages, the subscription's queue fills, and what does not fit
  is dropped (a slow consumer, counted in the subscription). A dropped message was never
  appended nor acked: the publisher's request times out and it retries. Nothing acked is
  ever dropped.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from concurrent.futures import Executor
from dataclasses import dataclass, field

from jetstream.errors import JetstreamError, OffsetOutOfRange, RecordTooLarge
from jetstream.protocol import ack as ack_codec
from jetstream.protocol.envelope import PREFIX_BYTES as ENVELOPE_PREFIX
from jetstream.protocol.envelope import AckPolicy, decode_envelope
from jetstream.raft_meta.model import PartitionState, StreamConfig
from jetstream.server.config import BrokerConfig
from jetstream.server.metrics import PartitionMetrics
from jetstream.server.nats_port import NatsPort, Subscription
from jetstream.server.nats_wire import NatsMsg
from jetstream.stream.config import FsyncPolicy
from jetstream.stream.format import NO_HEADERS, Record
from jetstream.stream.log import FileSlice, Log

log = logging.getLogger(__name__)

_NO_ACK = AckPolicy.NONE


@dataclass(slots=True)
class PendingBatch:
    """An appended batch waiting to become durable and then committed, with the acks (inbox,
    payload) each stage releases."""

    next_offset: int
    leader_acks: list[tuple[str, bytes]]
    all_acks: list[tuple[str, bytes]]
    waiters: list[asyncio.Future[None]] = field(default_factory=list)


class PartitionLeader:
    def __init__(
        self,
        stream: StreamConfig,
        state: PartitionState,
        log_: Log,
        nats_port: NatsPort,
        config: BrokerConfig,
        executor: Executor | None,
        metrics: PartitionMetrics,
    ) -> None:
        self.stream = stream
        self.state = state
        self.log = log_
        self._nats = nats_port
        self._config = config
        self._executor = executor
        self.metrics = metrics
        self.subject = stream.partition_subject(state.partition)
        self._acks = ack_codec.AckEncoder(stream.name, state.partition)
        self._always = stream.fsync is FsyncPolicy.ALWAYS
        # Batches appended but not yet durable (leader acks) / not yet committed (all acks).
        self._unsynced: collections.deque[PendingBatch] = collections.deque()
        self._uncommitted: collections.deque[PendingBatch] = collections.deque()
        self._durable_end = log_.log_end_offset
        self.high_watermark = log_.log_end_offset
        self._hw_changed = asyncio.Event()
        self._sync_wanted = asyncio.Event()
        self._room = asyncio.Condition()
        self._sub: Subscription | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._checkpointed_hw = -1
        self._stopping = False

    @property
    def name(self) -> str:
        return f"{self.stream.name}/{self.state.partition}"

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        self._sub = await self._nats.subscribe(
            self.subject, self.stream.group, self._config.ingest_pending_msgs_max,
            self._config.ingest_pending_bytes_max)
        self._tasks = [asyncio.create_task(self._ingest_loop(), name=f"ingest {self.name}")]
        if self._always:
            self._tasks.append(asyncio.create_task(self._sync_loop(), name=f"sync {self.name}"))
        self._tasks.append(asyncio.create_task(self._housekeeping_loop(),
                                               name=f"housekeeping {self.name}"))

    async def stop(self) -> None:
        """Stop taking messages, finish what was taken (append, fsync, ack), then stop."""
        self._stopping = True
        sub, self._sub = self._sub, None
        if sub is not None:
            with contextlib.suppress(Exception):
                await sub.close()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []
        # Messages already buffered are appended and acked: they were received.
        if sub is not None:
            while batch := sub.take_batch(self._config.ingest_batch_records_max,
                                          self._config.ingest_batch_bytes_max):
                await self._append_messages(batch)
        await self._sync_now()
        self._checkpoint()

    @property
    def dropped(self) -> int:
        """Messages the subscription dropped because ingest fell behind (never acked)."""
        return self._sub.dropped if self._sub is not None else 0

    # -- ingest -------------------------------------------------------------------------------

    async def _ingest_loop(self) -> None:
        assert self._sub is not None
        sub = self._sub
        records_max = self._config.ingest_batch_records_max
        bytes_max = self._config.ingest_batch_bytes_max
        while True:
            await self._wait_for_room()
            batch = await sub.next_batch(records_max, bytes_max)
            if batch:
                await self._append_messages(batch)

    async def _wait_for_room(self) -> None:
        limit = self._config.ingest_inflight_batches_max
        if len(self._unsynced) + len(self._uncommitted) < limit:
            return
        async with self._room:
            await self._room.wait_for(
                lambda: len(self._unsynced) + len(self._uncommitted) < limit)

    async def _append_messages(self, msgs: list[NatsMsg]) -> None:
        records: list[Record] = []
        # (index in records, inbox, correlation id, policy, batch ack) of messages to ack
        targets: list[tuple[int, str, str | None, AckPolicy, bool]] = []
        default_policy = self.stream.ack_policy
        max_bytes = self.stream.max_message_bytes
        errors: list[tuple[str, str | None, JetstreamError]] = []
        # The hot loop of ingest: plain tuples, locals, no calls a message can do without.
        new_record = tuple.__new__
        for subject, reply, nats_headers, data in msgs:
            envelope = decode_envelope(data) if data.startswith(ENVELOPE_PREFIX) else None
            if envelope is None:
                value, key, corr, inbox = data, None, None, reply
                headers = _nats_headers(nats_headers) if nats_headers else NO_HEADERS
                policy, batch_ack = default_policy, False
            else:
                value, key, corr = envelope.value, envelope.key, envelope.correlation_id
                inbox = envelope.ack_inbox or reply
                headers = envelope.headers
                policy = envelope.ack_policy or default_policy
                batch_ack = envelope.batch_ack
            if len(value) > max_bytes:
                if inbox:
                    errors.append((inbox, corr, RecordTooLarge(len(value), max_bytes)))
                self.metrics.errors += 1
                continue
            if inbox and policy is not _NO_ACK:
                targets.append((len(records), inbox, corr, policy, batch_ack))
            records.append(new_record(Record, (value, key, headers, subject, None)))
        if errors:
            await self._publish_errors(errors)
        if not records:
            return
        try:
            info = self.log.append(records, self.state.leader_epoch, sync=False)
        except JetstreamError as exc:
            log.warning("append to %s failed: %s", self.name, exc)
            self.metrics.errors += len(records)
            await self._publish_errors([(t[1], t[2], exc) for t in targets])
            return
        self.metrics.appended_records += len(records)
        self.metrics.appended_bytes += info.size_bytes
        leader_acks, all_acks = self._encode_acks(info.base_offset, records, targets)
        await self._enqueue(PendingBatch(info.log_end_offset, leader_acks, all_acks))

    def _encode_acks(
        self, base: int, records: list[Record],
        targets: list[tuple[int, str, str | None, AckPolicy, bool]],
    ) -> tuple[list[tuple[str, bytes]], list[tuple[str, bytes]]]:
        """The ack messages of an appended batch, by the stage that releases them."""
        out: dict[AckPolicy, list[tuple[str, bytes]]] = {AckPolicy.LEADER: [],
                                                         AckPolicy.ALL: []}
        grouped: dict[tuple[str, AckPolicy], list[tuple[int, str | None]]] = {}
        encode = self._acks.encode
        for i, inbox, corr, policy, batch_ack in targets:
            if batch_ack:
                grouped.setdefault((inbox, policy), []).append((base + i, corr))
            else:
                out[policy].append((inbox, encode(base + i, records[i].subject, corr, policy)))
        step = ack_codec.ACK_ENTRIES_MAX
        for (inbox, policy), entries in grouped.items():
            for j in range(0, len(entries), step):
                out[policy].append((inbox, ack_codec.encode_batch_ack(
                    self.stream.name, self.state.partition, policy, entries[j:j + step])))
        return out[AckPolicy.LEADER], out[AckPolicy.ALL]

    async def _enqueue(self, batch: PendingBatch) -> None:
        self._unsynced.append(batch)
        if self._always:
            self._sync_wanted.set()
        else:
            await self._on_durable(self.log.log_end_offset)

    async def append_direct(self, records: list[Record], policy: AckPolicy) -> tuple[int, int]:
        """Append records that did not come through NATS (HTTP API); returns (first offset,
        next offset) once they are durable (`leader`) or committed (`all`)."""
        for record in records:
            if len(record.value) > self.stream.max_message_bytes:
                raise RecordTooLarge(len(record.value), self.stream.max_message_bytes)
        await self._wait_for_room()
        info = self.log.append(records, self.state.leader_epoch, sync=False)
        self.metrics.appended_records += len(records)
        self.metrics.appended_bytes += info.size_bytes
        batch = PendingBatch(info.log_end_offset, [], [])
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if policy is not AckPolicy.NONE:
            batch.waiters.append(done)
        else:
            done.set_result(None)
        await self._enqueue(batch)
        await done
        return info.base_offset, info.log_end_offset

    # -- durability, commit and acks ---------------------------------------------------------------

    async def _sync_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._sync_wanted.wait()
            self._sync_wanted.clear()
            target = self.log.log_end_offset
            await loop.run_in_executor(self._executor, self.log.sync_through, target)
            await self._on_durable(target)

    async def _sync_now(self) -> None:
        target = self.log.log_end_offset
        if target > self._durable_end or self._unsynced:
            if self._always:
                await asyncio.get_running_loop().run_in_executor(
                    self._executor, self.log.sync_through, target)
            await self._on_durable(target)

    async def _on_durable(self, end_offset: int) -> None:
        """The leader's own copy is durable below `end_offset`."""
        self._durable_end = max(self._durable_end, end_offset)
        acks: list[tuple[str, bytes]] = []
        while self._unsynced and self._unsynced[0].next_offset <= self._durable_end:
            batch = self._unsynced.popleft()
            acks.extend(batch.leader_acks)
            self._uncommitted.append(batch)
        # One broker: the ISR is this broker alone, so what is durable here is committed.
        await self._advance_high_watermark(self._durable_end, acks)

    async def _advance_high_watermark(self, hw: int, acks: list[tuple[str, bytes]]) -> None:
        assert self.log.log_start_offset <= hw <= self.log.log_end_offset
        if hw > self.high_watermark:
            self.high_watermark = hw
            self.metrics.high_watermark = hw
            changed, self._hw_changed = self._hw_changed, asyncio.Event()
            changed.set()
        while self._uncommitted and self._uncommitted[0].next_offset <= self.high_watermark:
            batch = self._uncommitted.popleft()
            acks.extend(batch.all_acks)
            for waiter in batch.waiters:
                if not waiter.done():
                    waiter.set_result(None)
        if acks:
            await self._publish_acks(acks)
        async with self._room:
            self._room.notify_all()

    async def _publish_acks(self, acks: list[tuple[str, bytes]]) -> None:
        await self._nats.publish_many(acks)
        self.metrics.acked += len(acks)

    async def _publish_errors(self, errors: list[tuple[str, str | None, JetstreamError]]) -> None:
        stream, partition = self.stream.name, self.state.partition
        with contextlib.suppress(Exception):
            await self._nats.publish_many([
                (inbox, ack_codec.encode_error_ack(stream, partition, corr, exc))
                for inbox, corr, exc in errors])

    # -- reads --------------------------------------------------------------------------------

    async def read(self, offset: int, max_bytes: int, max_wait_ms: int,
                   committed: bool = True) -> FileSlice:
        """Batches from `offset`, never at or past the HW (with `committed`), waiting up to
        `max_wait_ms` for data when the reader is caught up."""
        deadline = time.monotonic() + max_wait_ms / 1000
        while True:
            bound = self.high_watermark if committed else self.log.log_end_offset
            if bound < offset <= self.log.log_end_offset:
                piece = FileSlice(-1, 0, 0, offset, offset)  # ahead of the HW: wait for it
            else:
                piece = self.log.read(offset, max_bytes, upper_bound=bound)
            remaining = deadline - time.monotonic()
            if piece.length or remaining <= 0 or self._stopping:
                return piece
            changed = self._hw_changed
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), remaining)

    def check_offset(self, offset: int) -> None:
        if not self.log.log_start_offset <= offset <= self.log.log_end_offset:
            raise OffsetOutOfRange(offset, self.log.log_start_offset, self.high_watermark)

    # -- housekeeping ----------------------------------------------------------------------------

    async def _housekeeping_loop(self) -> None:
        loop = asyncio.get_running_loop()
        checkpoint_s = self._config.checkpoint_interval_ms / 1000
        retention_s = self._config.retention_check_ms / 1000
        next_retention = time.monotonic() + retention_s
        # The INTERVAL policy's fsyncs run here, in a thread (appends pass sync=False).
        interval_s = (self.stream.fsync_interval_ms / 1000
                      if self.stream.fsync is FsyncPolicy.INTERVAL else checkpoint_s)
        next_checkpoint = time.monotonic() + checkpoint_s
        while True:
            await asyncio.sleep(min(interval_s, checkpoint_s))
            if self.stream.fsync is FsyncPolicy.INTERVAL:
                await loop.run_in_executor(self._executor, self.log.maybe_sync)
            if time.monotonic() >= next_checkpoint:
                next_checkpoint = time.monotonic() + checkpoint_s
                await loop.run_in_executor(self._executor, self._checkpoint)
            if time.monotonic() >= next_retention:
                next_retention = time.monotonic() + retention_s
                deleted = await loop.run_in_executor(
                    self._executor, _apply_retention, self.log, self.high_watermark)
                if deleted:
                    log.info("retention deleted %d segments of %s", len(deleted), self.name)

    def _checkpoint(self) -> None:
        hw = self.high_watermark
        if hw != self._checkpointed_hw:
            self.log.write_high_watermark(min(hw, self.log.log_end_offset))
            self._checkpointed_hw = hw


def _apply_retention(log_: Log, high_watermark: int) -> list[int]:
    return log_.apply_retention(max_offset=high_watermark)


def _nats_headers(headers: dict[str, str] | None) -> dict[str, bytes]:
    if not headers:
        return {}
    return {k: v.encode() for k, v in headers.items()}
