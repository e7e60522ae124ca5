"""The leader of one partition on this broker: NATS in, log append, fsync, commit, acks out.

Theory of operation
- Ingest: the partition's NATS subscription (a queue subscription when the stream is in a
  load-balance group; jetstream.server.nats_port) buffers messages in a bounded queue. The
  ingest task takes whatever has arrived since its last append as one batch (up to a record
  and byte limit), turns each message into a record (an envelope is unpacked; anything else
  is stored as it came: payload as value, NATS headers as headers, subject kept) and appends
  the batch without fsync (jetstream.server.ingest_batch). Expectations and message ids are
  judged by the partition's guard (jetstream.server.guarded) in log order, with no await
  between judging and appending.
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
- Replication (cluster mode, `replication` given): the leader owns an isr.LeaderState. The
  HW is what that core decides from the leader's durable LEO and the followers' fetch
  offsets; its ISR proposals go to the metadata through `replication.propose_isr` (a task
  each, proposing again while the outcome is unknown; a refusal ends in
  `on_proposal_failed`, a commit in `on_isr_committed`, also when the broker's metadata
  listener sees it first, through `on_metadata`), and a tick when the core says one is due
  (`_tick`) lets it shrink the ISR of followers that stopped fetching (those steps are
  jetstream.server.leader_isr's). Followers fetch uncommitted records up to the LEO
  (`replica_fetch`), long-polling on appends. While the
  ISR is smaller than min_isr, `all` publishes are refused with NOT_ENOUGH_REPLICAS and not
  appended. A leader that loses leadership (`abdicate`) stops ingest and answers the `all`
  acks it still owes with NOT_LEADER: it can no longer commit them, though the new leader
  may still hold them.
- Housekeeping (HW checkpoints, `interval` fsyncs, retention, the ISR tick) has no task
  here: the broker's scheduler runs it when an event made it due
  (jetstream.server.housekeeping).
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
from concurrent.futures import Executor
from functools import partial

from jetstream.errors import (
    JetstreamError,
    NotEnoughReplicas,
    NotLeader,
)
from jetstream.isr.leader import (
    AdvanceHighWatermark,
    Decision,
    LeaderState,
    ProposeIsr,
    Unfit,
)
from jetstream.offsets.records import is_internal
from jetstream.protocol import ack as ack_codec
from jetstream.raft_meta.model import PartitionState, StreamConfig
from jetstream.server import leader_isr
from jetstream.server.batched_calls import BatchedCalls, nothing
from jetstream.server.config import BrokerConfig
from jetstream.server.disk import DiskMonitor
from jetstream.server.guarded import PartitionGuard
from jetstream.server.housekeeping import Housekeeping
from jetstream.server.ingest_batch import (
    IngestBatch,
    apply_verdicts,
    asks_key_offsets,
    encode_acks,
    take_messages,
)
from jetstream.server.leader_appends import LeaderAppends, PendingBatch
from jetstream.server.leader_isr import Replication, SessionWatch
from jetstream.server.leader_reads import LeaderReads, ReadAround
from jetstream.server.metrics import PartitionMetrics
from jetstream.server.mirror_writes import mirror_error, refusals
from jetstream.server.nats_port import NatsPort, Subscription
from jetstream.server.nats_wire import NatsMsg
from jetstream.server.scheduler import Scheduler
from jetstream.stream.config import FsyncPolicy
from jetstream.stream.file_slice import FileSlice
from jetstream.stream.log import AppendInfo, Log
from jetstream.tasks import cancel_and_wait
from jetstream.tiered.partition_tier import PartitionTier

log = logging.getLogger(__name__)


class PartitionLeader(LeaderAppends, LeaderReads):
    def __init__(
        self,
        stream: StreamConfig,
        state: PartitionState,
        log_: Log,
        nats_port: NatsPort,
        config: BrokerConfig,
        executor: Executor | None,
        metrics: PartitionMetrics,
        scheduler: Scheduler,
        replication: Replication | None = None,
        disk: DiskMonitor | None = None,
        read_around: ReadAround | None = None,
        sessions: SessionWatch | None = None,
        tier: PartitionTier | None = None,
        syncs: BatchedCalls | None = None,
    ) -> None:
        self.stream = stream
        #: Runs fsyncs off the loop together with other leaders' (else one job each).
        self._syncs = syncs
        #: Tiered storage (a stream with a `fragment_store`): offload and reads from the store.
        self.tier = tier
        self._tier_ready = asyncio.Event()
        self._disk = disk
        self._read_around = read_around
        self._sessions = sessions
        self.state = state
        self.log = log_
        self._nats = nats_port
        self._config = config
        self._executor = executor
        self.metrics = metrics
        self.subject = stream.partition_subject(state.partition)
        self._key = (stream.name, state.partition)
        self._acks = ack_codec.AckEncoder(stream.name, state.partition)
        self._sync_task: asyncio.Task[None] | None = None
        # Batches appended but not yet durable (leader acks) / not yet committed (all acks).
        self._unsynced: collections.deque[PendingBatch] = collections.deque()
        self._uncommitted: collections.deque[PendingBatch] = collections.deque()
        self._durable_end = log_.log_end_offset
        self._replication = replication
        self.isr: LeaderState | None = None
        # One broker: everything on disk was committed. A cluster leader starts from its
        # checkpoint: its suffix may not be on the other replicas yet.
        self.high_watermark = (log_.log_end_offset if replication is None
                               else min(log_.read_high_watermark(), log_.log_end_offset))
        self._hw_changed = asyncio.Event()
        self._sync_wanted = asyncio.Event()
        self._room = asyncio.Condition()
        self._sub: Subscription | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._proposals: set[asyncio.Task[None]] = set()
        self._scheduler = scheduler
        self._housekeeping = Housekeeping(self, scheduler, config, self._tick, tier=tier)
        self._stopping = False
        self.guarded = PartitionGuard(stream, config)

    @property
    def _always(self) -> bool:
        """Acks wait for an fsync (the stream's current policy)."""
        return self.stream.fsync is FsyncPolicy.ALWAYS

    @property
    def name(self) -> str:
        return f"{self.stream.name}/{self.state.partition}"

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        self._tasks.append(asyncio.create_task(self._open_tier(), name=f"tier {self.name}"))
        if not is_internal(self.stream.name):  # no expectations there: no log to read
            # Read from the log when an append first needs it (the others do not wait).
            self.guarded.serve(self.log, self._executor, f"guard {self.name}")
        if self._replication is not None:
            self._start_replication(self._replication)
        if not is_internal(self.stream.name):  # internal streams take only append_direct
            self._sub = await self._nats.subscribe(
                self.subject, self.stream.ingest_group, self._config.ingest_pending_msgs_max,
                self._config.ingest_pending_bytes_max)
            self._tasks.append(asyncio.create_task(self._ingest_loop(),
                                                   name=f"ingest {self.name}"))
        if self._always:
            self._start_sync_loop()
        self._housekeeping.start()

    def _start_sync_loop(self) -> None:
        if self._sync_task is None:
            self._sync_task = asyncio.create_task(self._sync_loop(), name=f"sync {self.name}")
            self._tasks.append(self._sync_task)

    def _start_replication(self, replication: Replication) -> None:
        self.log.start_leader_epoch(self.state.leader_epoch)
        self.isr = LeaderState(
            replication.broker_id, self.state.leader_epoch, self.state.replicas,
            self.state.isr, self.high_watermark, self.log.log_end_offset,
            self._scheduler.now_ms(), replication.replica_lag_ms_max, self.stream.min_isr)

    async def abdicate(self) -> None:
        """Leadership moved: stop taking messages at once and answer the `all` acks still owed
        with NOT_LEADER (this broker can no longer commit them)."""
        await self._stop_taking()
        await self._sync_now()
        owed: list[tuple[str, str | None, JetstreamError]] = []
        error = NotLeader(self.stream.name, self.state.partition)
        for batch in (*self._unsynced, *self._uncommitted):
            owed.extend((inbox, corr, error) for inbox, corr in batch.all_targets)
            for waiter in batch.waiters:
                if not waiter.done():
                    waiter.set_exception(error)
        self._unsynced.clear()
        self._uncommitted.clear()
        if owed:
            await self._publish_errors(owed)
        self._wake_readers()
        self._housekeeping.checkpoint()

    async def _stop_taking(self) -> Subscription | None:
        """Stop taking messages: close the NATS subscription (returned, for what it still
        buffers) and stop the background tasks."""
        self._stopping = True
        self._housekeeping.stop()
        sub, self._sub = self._sub, None
        if sub is not None:
            with contextlib.suppress(Exception):
                await sub.close()
        await self._cancel_tasks()
        self.guarded.release()
        return sub

    async def _cancel_tasks(self) -> None:
        for task in list(self._proposals):
            task.cancel()
        await cancel_and_wait(*self._tasks)
        self._tasks = []

    async def stop(self) -> None:
        """Stop taking messages, finish what was taken (append, fsync, ack), then stop."""
        sub = await self._stop_taking()
        # Messages already buffered are appended and acked: they were received.
        if sub is not None:
            while batch := sub.take_batch(self._config.ingest_batch_records_max,
                                          self._config.ingest_batch_bytes_max):
                await self._append_messages(batch)
        await self._sync_now()
        self._housekeeping.checkpoint()

    def reconfigure(self, stream: StreamConfig) -> None:
        """The stream was updated (its tiered settings unchanged: those take a new leader).
        A new fsync policy applies from the next batch: under `always` the sync loop starts;
        leaving it, the batches waiting for an fsync get it, then acks no longer wait."""
        was_always = self._always
        self.stream = stream
        self.guarded.reconfigure(stream, self.log)
        if self._always != was_always and not self._stopping:
            if self._always:
                self._start_sync_loop()
            else:
                self._sync_wanted.set()
        self._housekeeping.segments_changed()

    def segments_changed(self) -> None:
        """A segment was rolled other than by an append (by the log cleaner)."""
        self._housekeeping.segments_changed()

    @property
    def dropped(self) -> int:
        """Messages the subscription dropped because ingest fell behind (never acked)."""
        return self._sub.dropped if self._sub is not None else 0

    # -- ingest -------------------------------------------------------------------------------

    async def _open_tier(self) -> None:
        """A broker on an empty disk: the log starts after the history the fragment store
        holds, before anything is appended (offsets are never reused)."""
        try:
            log_ = self.log
            if (self.tier is not None and self._replication is None
                    and log_.log_start_offset == log_.log_end_offset
                    and await self.tier.open_log(log_, lambda: self._stopping)):
                self.high_watermark = self._durable_end = log_.log_end_offset
                self.metrics.high_watermark = self.high_watermark
        finally:
            self._tier_ready.set()

    @property
    def read_start_offset(self) -> int:
        """The first offset a consumer can read: in the fragment store, or on disk."""
        if self.tier is None:
            return self.log.log_start_offset
        return self.tier.start_offset(self.log)

    async def _ingest_loop(self) -> None:
        assert self._sub is not None
        sub = self._sub
        await self._tier_ready.wait()
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
        refused = mirror_error(self.stream)
        if refused is not None:  # only its datastream writes a mirror
            self.metrics.errors += len(msgs)
            await self._publish_errors(refusals(msgs, refused))
            return
        refuse_all = self._refuse_all()
        batch = take_messages(msgs, self.stream, refuse_all, self._not_enough_replicas)
        self.metrics.errors += len(batch.errors)
        if self.guarded.must_wait(batch.expects is not None):
            await self.guarded.loaded()
            if self.guarded.guard is None:  # stopping before the guard was loaded
                await self._publish_errors(refusals(
                    msgs, NotLeader(self.stream.name, self.state.partition)))
                return
        if self.guarded.keys_pending and asks_key_offsets(batch):
            await self.guarded.keys_loaded()
        info: AppendInfo | None = None
        # Judged and appended with no await between: no other append comes in between.
        guard_pass = (self.guarded.begin(self.log)
                      if self.guarded.needed(batch.expects is not None) else None)
        if guard_pass is not None:
            apply_verdicts(batch, guard_pass)
        if batch.records:
            try:
                if self._disk is not None:
                    self._disk.check(len(batch.records))
                info = self.log.append(batch.records, self.state.leader_epoch, sync=False)
            except JetstreamError as exc:
                log.warning("append to %s failed: %s", self.name, exc)
                self.metrics.errors += len(batch.records)
                batch.errors.extend((t[1], t[2], exc) for t in batch.targets)
                batch.errors.extend((d[0], d[1], exc) for d in batch.duplicates)
                batch.duplicates.clear()
        if guard_pass is not None and (info is not None or not batch.records):
            # The log took the append, or there was none (duplicates only: the producer
            # sequences they moved on).
            guard_pass.commit()
        if info is not None or batch.duplicates:
            await self._enqueue_appended(batch, info)
        if batch.errors:
            await self._publish_errors(batch.errors)

    async def _enqueue_appended(self, batch: IngestBatch, info: AppendInfo | None) -> None:
        if info is not None:
            self.metrics.appended_records += len(batch.records)
            self.metrics.appended_bytes += info.size_bytes
            self._on_append()
        else:
            batch.targets = []
        leader_acks, all_acks, all_targets = encode_acks(
            self._acks, info.base_offset if info is not None else 0, batch)
        end = info.log_end_offset if info is not None else self.log.log_end_offset
        await self._enqueue(PendingBatch(end, leader_acks, all_acks, all_targets=all_targets))

    def _refuse_all(self) -> bool:
        return leader_isr.refuse_all(self.isr, self._sessions, self._key)

    def _not_enough_replicas(self) -> NotEnoughReplicas:
        assert self.isr is not None
        return leader_isr.not_enough_replicas(self.isr, self._sessions, self._key)

    def _on_append(self) -> None:
        self._housekeeping.appended()
        if self.isr is not None:
            # Followers of a partition idle until now spoke of it only through their
            # sessions: hear where they stand before the log end moves past it, or the first
            # append after a long quiet would find them lagging since the quiet began.
            leader_isr.refresh_standing(self.isr, self._sessions, self._key)
            self.isr.on_leader_append(self.log.log_end_offset)
            self._wake_readers()  # followers long-poll on the LEO

    def _wake_readers(self) -> None:
        changed, self._hw_changed = self._hw_changed, asyncio.Event()
        changed.set()
        if self._sessions is not None:
            self._sessions.changed((self.stream.name, self.state.partition))

    async def _enqueue(self, batch: PendingBatch) -> None:
        self._unsynced.append(batch)
        if self._always:
            self._sync_wanted.set()
        else:
            await self._on_durable(self.log.log_end_offset)

    # (appends that do not come through NATS: jetstream.server.leader_appends)

    # -- durability, commit and acks ---------------------------------------------------------------

    async def _sync_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._sync_wanted.wait()
            self._sync_wanted.clear()
            target = self.log.log_end_offset
            if self._syncs is not None:
                await self._syncs.call(nothing, then=partial(self.log.sync_through, target),
                                       durable=self.log)
            else:
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
        if self.isr is None:
            # One broker: the ISR is this broker alone, so what is durable is committed.
            await self._advance_high_watermark(self._durable_end, acks)
        else:
            await self._apply(self.isr.on_leader_durable(self._durable_end), acks)

    async def _apply(self, decisions: list[Decision],
                     acks: list[tuple[str, bytes]] | None = None) -> None:
        """Carry out the ISR core's decisions (and publish `acks` either way)."""
        self._housekeeping.isr_changed()
        hw = self.high_watermark
        for decision in decisions:
            if isinstance(decision, AdvanceHighWatermark):
                hw = max(hw, decision.offset)
            elif isinstance(decision, ProposeIsr):
                task = asyncio.create_task(self._propose_isr(decision))
                task.add_done_callback(_log_task_failure)
                self._proposals.add(task)
                task.add_done_callback(self._proposals.discard)
        # A batch that appended nothing (retries answered as duplicates) is committed as
        # soon as it is queued: the HW need not move for it.
        if hw > self.high_watermark or acks or (
                self._uncommitted and self._uncommitted[0].next_offset <= hw):
            await self._advance_high_watermark(hw, acks if acks is not None else [])

    async def _propose_isr(self, decision: ProposeIsr) -> None:
        isr, replication = self.isr, self._replication
        assert replication is not None and isr is not None
        await leader_isr.propose_until_known(self.name, decision, isr, replication,
                                             self.metrics, lambda: self._stopping, self._apply)

    def on_metadata(self, state: PartitionState) -> None:
        """The metadata changed this partition at the same leader epoch (an ISR change)."""
        assert state.leader_epoch == self.state.leader_epoch, (state, self.state)
        self.state = state
        if self.isr is not None and not self._stopping and tuple(sorted(state.isr)) != \
                self.isr.isr:
            leader_isr.count_isr_change(self.metrics, self.isr.isr, state.isr)
            decisions = self.isr.on_isr_committed(state.isr, state.leader_epoch)
            task = asyncio.get_running_loop().create_task(self._apply(decisions))
            task.add_done_callback(_log_task_failure)

    async def _tick(self, now: int) -> None:
        """Tick the ISR core (the scheduler calls it when the core said a tick is due), once
        it heard where the followers of this partition stand in their fetch sessions."""
        assert self.isr is not None
        # Every follower first, then one decision.
        leader_isr.refresh_standing(self.isr, self._sessions, self._key)
        await self._apply(self.isr.tick(now))

    async def _advance_high_watermark(self, hw: int, acks: list[tuple[str, bytes]]) -> None:
        assert self.log.log_start_offset <= hw <= self.log.log_end_offset
        if hw > self.high_watermark:
            self.high_watermark = hw
            self.metrics.high_watermark = hw
            self._wake_readers()
            self._housekeeping.high_watermark_moved()
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

    # -- reads (the rest in jetstream.server.leader_reads) -------------------------------------

    async def replica_fetch(self, replica_id: int, offset: int, leader_epoch: int,
                            max_bytes: int, max_wait_ms: int, unfit: Unfit = "", *,
                            verify: bool = False) -> FileSlice:
        """A follower's fetch of this partition alone (FETCH; brokers fetch through their
        sessions, jetstream.server.fetch_sessions): it holds every offset below `offset`;
        `unfit`, why it must not be in the ISR now (jetstream.isr.leader). Records up to the
        LEO. It also returns as soon as the HW moves, so that followers, which serve
        committed reads up to the HW they learn from these answers, learn it without waiting
        for the next records."""
        hw_seen = self.high_watermark  # before this fetch moves it: the follower must learn it
        await self.follower_fetched(replica_id, offset, leader_epoch, unfit)
        return await self.read(offset, max_bytes, max_wait_ms, committed=False, hw_seen=hw_seen,
                               verify=verify)

    async def follower_fetched(self, replica_id: int, offset: int, leader_epoch: int,
                               unfit: Unfit = "") -> None:
        """Follower `replica_id` fetches at `offset` in `leader_epoch`: it holds every offset
        below. Raises NotLeader, FencedLeaderEpoch or OffsetOutOfRange when it cannot."""
        await self._apply(leader_isr.follower_fetch(
            self.isr, self.state, self.log, self._stopping, replica_id, offset, leader_epoch,
            unfit))

    def log_start_moved(self) -> None:
        """Retention deleted segments: followers fetching through sessions learn the new log
        start with the next answer."""
        if self._sessions is not None:
            self._sessions.changed((self.stream.name, self.state.partition))

    @property
    def serving(self) -> bool:
        """Still leading: not stopping nor abdicating."""
        return not self._stopping


def _log_task_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("replication task failed", exc_info=task.exception())
