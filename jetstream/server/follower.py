"""The follower of one partition on this broker: truncate, then fetch from the leader.

Theory of operation: a thin async shell over jetstream.isr.follower (the KIP-279 truncation
planner) and the log. It runs one task for one leader epoch; the broker replaces it when the
leader or the epoch changes.

1. Truncation: the follower asks the leader (END_OFFSET_FOR_EPOCH) where its own latest epoch
   ends there, and does what `plan_truncation` says: truncate and ask again about the epoch
   the plan names (never about the log's latest epoch afterwards: an entry left at the LEO
   would make it ask the same question forever), stop, or drop the log and restart it at the
   leader's log start offset.
2. Fetching: the partition joins this broker's fetch session at its leader's broker
   (jetstream.server.replica_fetcher), which fetches every partition this broker follows
   there in one request, naming a partition only when its entry (`session_entry`: offset =
   LEO, epoch, unfit, verify) changed. What comes back (`take_answer`, then `end_answer`) is
   appended as it is (byte-identical batches) and made durable through the stream's fsync
   policy before the next request, because the offset it names tells the leader that
   everything below it is held here. The follower's HW is min(leader HW, LEO), checkpointed
   `checkpoint_interval_ms` after it moved (as a leader's is: never at once, so that a burst
   over many partitions writes no file in the path of its acks). When the leader's log start
   passes this copy's (its retention deleted segments), this copy applies its own retention
   below it.
3. Fence: before each request the follower checks its epoch against the highest this broker
   recorded (`fence`, jetstream.isr.highest_epochs): it never asks or fetches below it. Its
   END_OFFSET_FOR_EPOCH requests carry its epoch, so a leader at another epoch refuses them.
4. Reads (KIP-392): a consumer that opts in may read from this follower while it is in the
   ISR: committed records below the follower's HW, never past it, so never anything a later
   truncation could remove (truncation never cuts below a committed offset). A reader at the
   HW long-polls until the HW moves (each fetch response may carry a higher leader HW).
5. Errors: a partition the leader refuses, or a session that fails, is truncated again
   and rejoins after a bounded, doubling back-off (the leader may have changed its log
   meanwhile). When the leader has not answered
   for `replica_leader_timeout_ms`, the follower reports it (`report_failure`) to the metadata
   leader, and again at most once per timeout while the silence lasts. A refusal in which
   the leader's broker names itself the leader (its role is starting: a broker starts many
   roles in turn) is an answer, for LEADER_START_GRACE_S after this follower started.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from functools import partial
from typing import Any, Protocol

from jetstream.client.connection import BrokerConnection
from jetstream.errors import (
    CorruptRecord,
    DiskFull,
    InvalidBatch,
    JetstreamError,
    NotLeader,
    OffsetOutOfRange,
)
from jetstream.isr.disk_full import FollowerDisk
from jetstream.isr.follower import (
    Done,
    TruncateFully,
    TruncateTo,
    epoch_to_ask,
    plan_truncation,
    start_past_removed,
)
from jetstream.isr.leader import Unfit
from jetstream.protocol import messages as m
from jetstream.protocol.replica_fetch import PartitionAnswer, SessionPartition
from jetstream.raft_meta.model import PartitionState, StreamConfig
from jetstream.server.batched_calls import BatchedCalls, nothing
from jetstream.server.config import BrokerConfig
from jetstream.server.disk import DiskMonitor
from jetstream.stream import format as fmt
from jetstream.stream.checkpoint import DISK_FULL_ERRNOS
from jetstream.stream.config import FsyncPolicy
from jetstream.stream.epoch import EpochEndOffset
from jetstream.stream.file_slice import FileSlice
from jetstream.stream.log import Log
from jetstream.tasks import cancel_and_wait, wait_event

log = logging.getLogger(__name__)

BACKOFF_MS_MIN = 50
BACKOFF_MS_MAX = 1_000
#: How long after a follower starts a refusal from a leader whose role is starting counts
#: as an answer (a broker starting thousands of leader roles takes seconds).
LEADER_START_GRACE_S = 60.0

#: Reports that the leader is silent: (stream, partition, leader epoch); True when the
#: metadata leader got the report.
ReportFailure = Callable[[str, int, int], Awaitable[bool]]
#: Raises FencedLeaderEpoch when the partition's epoch is below the highest recorded.
Fence = Callable[[PartitionState], None]


class Fetcher(Protocol):
    """This broker's fetch session at one leader broker (jetstream.server.replica_fetcher)."""

    async def connection(self) -> BrokerConnection:
        """The connection to the leader broker (shared: truncation asks over it too)."""
        ...

    async def follow(self, follower: PartitionFollower) -> None:
        """Fetch `follower`'s partition in the session until the leader refuses it or the
        session fails (raised)."""
        ...


class Fetchers(Protocol):
    def for_leader(self, leader_id: int) -> Fetcher: ...


def _no_fence(state: PartitionState) -> None:
    """Checks nothing."""


class PartitionFollower:
    def __init__(self, stream: StreamConfig, state: PartitionState, log_: Log, *,
                 config: BrokerConfig, executor: Executor | None, fetchers: Fetchers,
                 report_failure: ReportFailure, fence: Fence = _no_fence,
                 damage_found: Callable[[tuple[str, int]], None] | None = None,
                 disk: DiskMonitor | None = None, appends: BatchedCalls | None = None) -> None:
        self.stream = stream
        self.state = state
        self.log = log_
        self._config = config
        self._executor = executor
        self._fetchers = fetchers
        self._report_failure = report_failure
        self._fence = fence
        self._damage_found = damage_found
        self.high_watermark = min(log_.read_high_watermark(), log_.log_end_offset)
        self._checkpointed_hw = self.high_watermark
        self._task: asyncio.Task[None] | None = None
        self._last_answer_s = self._started_s = time.monotonic()
        self._last_report_s = 0.0
        #: The fsync of the last append under `always`, running in a thread.
        self._append_synced: asyncio.Future[None] | None = None
        #: Between `take_answer` and `end_answer`: whether the disk was full when an append
        #: began (None: no append).
        self._appending: bool | None = None
        #: The INTERVAL policy's fsync under way (appends under it are made on the loop).
        self._sync_done: asyncio.Future[None] | None = None
        self._hw_changed = asyncio.Event()
        self._stopping = False
        #: Why this replica must not be in the ISR now (jetstream.isr.leader.Unfit), told to
        #: the leader with every fetch: "" when it may be. Damage in the log overrides it
        #: ("corrupt") until healed: see `unfit_now`.
        self.unfit: Unfit = ""
        #: Where to cut the log before the next fetch: damage that cannot be healed in place
        #: (jetstream.server.integrity) is fetched again from the leader.
        self._repair_truncation: int | None = None
        #: The next fetch asks the leader to check every byte it sends (its last answer held
        #: a batch that failed its CRC here).
        self._verify_next = False
        self._disk = disk
        self._disk_standing = FollowerDisk()
        #: Runs appends off the loop together with other followers' (else one job each).
        self._appends = appends

    @property
    def name(self) -> str:
        return f"{self.stream.name}/{self.state.partition}"

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"follow {self.name}")

    @property
    def in_sync(self) -> bool:
        """In the ISR as the metadata last told this broker."""
        return self._config.broker_id in self.state.isr

    def stopping(self) -> None:
        """Try no more fetches (`stop` follows: a broker stopping many followers marks them
        all first, so none retries while the others stop)."""
        self._stopping = True

    async def stop(self) -> None:
        self._stopping = True
        self._wake_readers()
        await cancel_and_wait(self._task)
        self._task = None
        for running in (self._append_synced, self._sync_done):
            if running is not None:
                # An fsync still running in its thread must end before the next role (a
                # leader starting its epoch at the LEO) touches the log.
                with contextlib.suppress(Exception):
                    await running
        self.checkpoint()

    # -- the loop -------------------------------------------------------------------------------

    async def _run(self) -> None:
        # Loops on `_stopping`, not only until cancelled: on Python 3.11 a cancellation that
        # lands as a connection fails comes out of asyncio.wait_for as that failure, and a
        # follower that ran on would hold up the broker's reconcile waiting for it.
        backoff_ms = BACKOFF_MS_MIN
        while not self._stopping:
            try:
                fetcher = self._fetchers.for_leader(self.state.leader)
                await self._truncate(await fetcher.connection())
                backoff_ms = BACKOFF_MS_MIN
                # Fetched with every other partition this broker follows at that leader,
                # until the leader refuses this one or the session fails.
                await fetcher.follow(self)
            except OffsetOutOfRange as exc:
                if not await self._start_past_removed(exc):
                    log.info("%s: following broker %d failed: %s", self.name,
                             self.state.leader, exc)
            except (JetstreamError, OSError) as exc:
                log.info("%s: following broker %d failed: %s", self.name, self.state.leader, exc)
                if self._leader_starting(exc):
                    self._answered()
            except Exception:  # a bug: keep following rather than leave the replica behind
                log.exception("%s: follower failed", self.name)
            if self._stopping:
                return
            await self._maybe_report()
            await asyncio.sleep(backoff_ms / 1000)
            backoff_ms = min(2 * backoff_ms, BACKOFF_MS_MAX)

    async def _maybe_report(self) -> None:
        now = time.monotonic()
        timeout_s = self._config.replica_leader_timeout_ms / 1000
        if now - self._last_answer_s < timeout_s or now - self._last_report_s < timeout_s:
            return
        delivered = False
        with contextlib.suppress(JetstreamError, OSError):
            delivered = await self._report_failure(self.stream.name, self.state.partition,
                                                   self.state.leader_epoch)
        if delivered:  # else try again after the next round's back-off
            self._last_report_s = now

    def _leader_starting(self, exc: Exception) -> bool:
        """The leader's broker refused, naming itself the leader: alive, its role starting."""
        return (isinstance(exc, NotLeader) and exc.fields.get("leader_id") == self.state.leader
                and time.monotonic() - self._started_s < LEADER_START_GRACE_S)

    def _answered(self) -> None:
        self._last_answer_s = time.monotonic()

    def heard_from_leader(self, at_s: float) -> None:
        """The leader last answered this broker's fetch session at `at_s` (monotonic)."""
        self._last_answer_s = max(self._last_answer_s, at_s)

    # -- truncation -----------------------------------------------------------------------------

    async def _truncate(self, conn: BrokerConnection) -> None:
        """KIP-279: cut off what the leader does not hold (see jetstream.isr.follower)."""
        epoch = epoch_to_ask(self.log.epochs.entries)
        while epoch is not None:
            self._fence(self.state)
            answer = await conn.request(m.EndOffsetForEpochRequest(
                self.stream.name, self.state.partition, epoch,
                current_leader_epoch=self.state.leader_epoch))
            self._answered()
            assert isinstance(answer, m.EndOffsetForEpochResponse)
            step = plan_truncation(
                self.log.epochs.entries, self.log.log_end_offset,
                EpochEndOffset(answer.leader_epoch, answer.end_offset),
                leader_log_start_offset=answer.log_start_offset)
            log.info("%s: truncation step %s (LEO %d)", self.name, step,
                     self.log.log_end_offset)
            if isinstance(step, TruncateTo):
                self.log.truncate_to(step.offset)
                epoch = step.then_ask_epoch
            elif isinstance(step, Done):
                self.log.truncate_to(step.truncate_to)
                epoch = None
            else:
                assert isinstance(step, TruncateFully)
                self.log.truncate_fully_and_start_at(step.start_at)
                epoch = None
        self.high_watermark = min(self.high_watermark, self.log.log_end_offset)

    async def _start_past_removed(self, refusal: OffsetOutOfRange) -> bool:
        """The leader no longer holds where this log ends: restart it empty at the leader's
        log start (jetstream.isr.follower.start_past_removed). Whether it did."""
        step = start_past_removed(self.log.log_end_offset, refusal.oldest)
        if step is None:
            return False
        log.warning("%s: the leader's log starts at %d, past this log's end %d: starting "
                    "empty there", self.name, step.start_at, self.log.log_end_offset)
        await asyncio.get_running_loop().run_in_executor(
            self._executor, self.log.truncate_fully_and_start_at, step.start_at)
        self.high_watermark = self.log.log_end_offset
        return True

    # -- fetching -------------------------------------------------------------------------------

    def unfit_now(self) -> Unfit:
        """What to tell the leader: "corrupt" while the log holds damage not yet healed."""
        return "corrupt" if self.log.damage else self.unfit

    def truncate_for_repair(self, offset: int) -> None:
        """Cut the log at `offset` before the next fetch (damage from there on is fetched
        again from the leader). The follower is out of the ISR meanwhile: it says "corrupt"
        until the cut is made."""
        if self._repair_truncation is None or offset < self._repair_truncation:
            self._repair_truncation = offset

    def session_entry(self) -> list[Any]:
        """This partition as the fetch session names it now (SessionPartition's wire form):
        where it fetches from, and what the leader must know (unfit, verify). Cuts the log
        first when a repair asked for it. Raises FencedLeaderEpoch when the partition's epoch
        is below the highest recorded."""
        self._fence(self.state)
        if self._repair_truncation is not None:
            offset, self._repair_truncation = self._repair_truncation, None
            if offset < self.log.log_end_offset:
                log.warning("%s: log cut at %d to fetch damaged batches again", self.name,
                            offset)
                self.log.truncate_to(max(offset, self.log.log_start_offset))
                self.high_watermark = min(self.high_watermark, self.log.log_end_offset)
        self._say_if_full()
        return SessionPartition.wire_of(self.stream.name, self.state.partition,
                                        self.log.log_end_offset, self.state.leader_epoch,
                                        self.unfit_now(), self._verify_next)

    def take_answer(self, answer: PartitionAnswer, payload: bytes
                    ) -> asyncio.Future[None] | None:
        """Begin with what the leader's session answered for this partition: append its
        records from this log's end, unless the disk is above its high watermark. The append
        runs here; returns the future of its fsync, which runs in a thread (fsync `always`),
        else None; either way `end_answer` follows, with the failure (raised here or by the
        future).
        The fetcher waits for a whole answer's futures at once, with no task for each."""
        self._answered()
        full = self._disk_full()
        self._appending = (full if payload and self._disk_standing.may_append(full)
                           else None)
        if self._appending is None:
            self._disk_standing.after_fetch(full, None)
            return None
        # Only a write to the page cache: on the loop. That saves a thread hop per answer and
        # keeps Python off the IO threads, where it would compete with the loop for the
        # interpreter; only the fsync, which blocks, runs in a thread.
        self._append(payload)
        if self.stream.fsync is FsyncPolicy.ALWAYS:
            return self._sync_appended()
        self._sync_when_due()
        return None

    def end_answer(self, answer: PartitionAnswer, failure: Exception | None) -> bool:
        """After `take_answer`'s append: raise what fails this partition (`failure` unless
        it is a full disk), learn the leader's HW. True when the leader's retention deleted
        segments (its log start passed this log's): `follow_retention` follows."""
        full, self._appending = self._appending, None
        if full is not None:
            self._appended(full, failure)
        hw = min(answer.high_watermark, self.log.log_end_offset)
        if hw > self.high_watermark:
            self.high_watermark = hw
            self._wake_readers()
        return answer.log_start_offset > self.log.log_start_offset

    def _appended(self, full: bool, failure: Exception | None) -> None:
        """An append that finds no room keeps none of the batch it failed on (the log's
        appends are all or nothing) and makes this replica unfit until one succeeds."""
        if isinstance(failure, InvalidBatch):
            # Damaged on the way or in the leader's files since it checked them: ask
            # it to check what it sends (it then heals or serves around its damage).
            self._verify_next = True
            raise failure
        if isinstance(failure, DiskFull) or (
                isinstance(failure, OSError) and failure.errno in DISK_FULL_ERRNOS):
            log.warning("%s: no room to append at %d: %s", self.name,
                        self.log.log_end_offset, failure)
            self._disk_standing.after_fetch(full, False)
            return
        if failure is not None:
            raise failure
        self._verify_next = False
        self._disk_standing.after_fetch(full, True)

    async def follow_retention(self, answer: PartitionAnswer) -> None:
        """Apply this copy's own retention below the leader's log start, never past what
        the leader deleted nor at or past this copy's HW."""
        bound = min(answer.log_start_offset, self.high_watermark)
        deleted = await asyncio.get_running_loop().run_in_executor(
            self._executor, partial(self.log.apply_retention, max_offset=bound))
        if deleted:
            log.info("retention deleted %d segments of %s", len(deleted), self.name)

    @property
    def retry_wanted(self) -> bool:
        """An append found no room: the session should name this partition again after a
        disk check, so that the leader sends its records again."""
        return self.unfit == "disk_full" and not self._disk_full()

    # -- a full disk (jetstream.isr.disk_full) ----------------------------------------------------

    def _disk_full(self) -> bool:
        return self._disk is not None and self._disk.full

    def _say_if_full(self) -> None:
        """Tell the leader with the next fetch whether the disk keeps this replica out of the
        ISR (damage in the log comes first: `unfit_now`)."""
        self.unfit = self._disk_standing.unfit(self._disk_full())

    # -- consumer reads ---------------------------------------------------------------------------

    async def read(self, offset: int, max_bytes: int, max_wait_ms: int, *,
                   verify: bool = False) -> FileSlice:
        """Batches from `offset`, never at or past this follower's HW, waiting up to
        `max_wait_ms` for it to move when the reader is caught up. Damage met raises
        CorruptRecord (and is healed in the background)."""
        deadline = time.monotonic() + max_wait_ms / 1000
        while True:
            bound = self.high_watermark
            if bound < offset <= self.log.log_end_offset:
                piece = FileSlice(-1, 0, 0, offset, offset)  # ahead of the HW: wait for it
            else:
                try:
                    piece = self.log.read(offset, max_bytes, upper_bound=bound,
                                          skip_empty=True, verify=verify)
                except CorruptRecord:
                    # The reader falls back to the leader; this copy is healed meanwhile.
                    if self._damage_found is not None:
                        self._damage_found((self.stream.name, self.state.partition))
                    raise
            remaining = deadline - time.monotonic()
            if piece.length or remaining <= 0 or self._stopping:
                return piece
            changed = self._hw_changed
            await wait_event(changed, remaining)

    def _wake_readers(self) -> None:
        changed, self._hw_changed = self._hw_changed, asyncio.Event()
        changed.set()

    def _sync_appended(self) -> asyncio.Future[None]:
        """Under ALWAYS: the fsync of what `_append` just wrote, in a thread (batched with
        the other followers' of this turn: one syncfs may stand in for their fsyncs)."""
        if self._appends is not None:
            self._append_synced = self._appends.call(nothing, then=self._make_durable,
                                                   durable=self.log)
        else:
            self._append_synced = asyncio.get_running_loop().run_in_executor(
                self._executor, self._make_durable)
        return self._append_synced

    def _sync_when_due(self) -> None:
        """Under INTERVAL: the fsync the interval calls for, in a thread, one at a time
        (with the other calls of this turn: followers whose interval passed together share
        one syncfs)."""
        if (self._sync_done is None or self._sync_done.done()) and self.log.sync_due():
            if self._appends is not None:
                self._sync_done = self._appends.call(nothing, then=self.log.maybe_sync,
                                                     durable=self.log)
            else:
                self._sync_done = asyncio.get_running_loop().run_in_executor(
                    self._executor, self.log.maybe_sync)
            self._sync_done.add_done_callback(self._synced)

    def _synced(self, done: asyncio.Future[None]) -> None:
        if not done.cancelled() and done.exception() is not None:
            log.warning("%s: fsync failed (again with a later append): %s", self.name,
                        done.exception())

    def _append(self, payload: bytes) -> None:
        """Append, without an fsync (`_make_durable` or `_sync_when_due` follows). A first
        batch that starts below this log's end (this copy was cut inside one of the leader's
        batches: truncated there, or cut back after a power loss) is appended from the log
        end on."""
        data = fmt.skip_held(payload, self.log.log_end_offset)
        if data is not payload:
            log.warning("%s: the leader's batches straddle this log's end %d: appending from "
                        "there", self.name, self.log.log_end_offset)
        if data:
            self.log.append_batches(data, sync=False)

    def _make_durable(self) -> None:
        """Make what was appended durable by the stream's policy (in a thread: it may
        fsync)."""
        self.log.sync_appended()

    @property
    def hw_unsaved(self) -> bool:
        """The HW moved past its checkpoint (the fetcher calls `checkpoint`
        `checkpoint_interval_ms` after it first did)."""
        return min(self.high_watermark, self.log.log_end_offset) != self._checkpointed_hw

    def checkpoint(self) -> None:
        hw = min(self.high_watermark, self.log.log_end_offset)
        if hw != self._checkpointed_hw:
            with contextlib.suppress(JetstreamError, OSError):
                self.log.write_high_watermark(hw)
            self._checkpointed_hw = hw
