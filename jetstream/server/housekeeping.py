"""The background work of a partition leader, run by the broker's scheduler when it is due.

Theory of operation: no partition has a timer or a task of its own for this. Each kind of
work is scheduled (jetstream.server.scheduler) by the event that makes it due, and nothing is
scheduled while nothing happens:
- ISR tick (cluster mode): when the ISR core says a tick may next decide something
  (`LeaderState.next_tick_ms`: when an ISR member would start to lag), asked again after
  every input of the core, and at most every ISR_TICK_MS_MIN. A tick that comes before its
  time (the follower fetched meanwhile) decides nothing and schedules the next: a leader
  whose followers keep up ticks about once per `replica_lag_ms_max`, one without followers
  in its ISR never.
- HW checkpoint: `checkpoint_interval_ms` after the HW moved, unless one is due already; the
  file is written only when the HW moved past what it holds.
- Fsync under the `interval` policy: `fsync_interval_ms` after an append, unless one is due
  already (a batch of them may share one syncfs: jetstream.server.batched_calls.run_fsyncs).
- Retention (a stream with retention limits): `retention_check_ms` after an append, a move
  of the HW, a stream update or a roll by the log cleaner, when the log has more than one
  segment (retention only deletes sealed ones); after a check, when the oldest sealed segment
  left will be older than `retention_ms`, and never sooner than `retention_check_ms`.
- Offload (a stream with a `fragment_store`, jetstream.tiered.offload): at once when the
  leader starts, shortly after its segments change, after each pass when the tier says
  (the listing interval, or a backoff while the store fails).
An idle partition therefore costs no wake-up and no executor call, except an ISR tick per
`replica_lag_ms_max` while followers are in its ISR, a retention check when its oldest
sealed segment expires, and one offload pass per listing interval with a fragment store.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Protocol

from jetstream.isr.leader import LeaderState
from jetstream.server.batched_calls import LogFsync
from jetstream.server.config import BrokerConfig
from jetstream.server.scheduler import Outcome, Scheduler, Work
from jetstream.stream import retention
from jetstream.stream.config import FsyncPolicy
from jetstream.stream.log import Log, wall_clock_ms
from jetstream.tiered.partition_tier import PartitionTier
from jetstream.tiered.planner import TotalRetention

log = logging.getLogger(__name__)

#: No partition's ISR core is ticked more often than this (a refused proposal is proposed
#: again at most this often; a lagging follower is noticed within this of its deadline).
ISR_TICK_MS_MIN = 100


class Leader(Protocol):
    """What housekeeping reads of its partition leader (jetstream.server.partition)."""

    @property
    def name(self) -> str: ...

    @property
    def log(self) -> Log: ...

    @property
    def high_watermark(self) -> int: ...

    @property
    def isr(self) -> LeaderState | None: ...

    def log_start_moved(self) -> None:
        """Retention deleted segments: followers learn the new log start (and apply their own
        retention below it)."""
        ...


class Housekeeping:
    """One leader's background work (a scheduler Job); `tick` ticks its ISR core;
    `wall_clock`, the clock of record timestamps (retention by age)."""

    def __init__(self, leader: Leader, scheduler: Scheduler, config: BrokerConfig,
                 tick: Callable[[int], Awaitable[None]], *,
                 wall_clock: Callable[[], int] = wall_clock_ms,
                 tier: PartitionTier | None = None) -> None:
        self._leader = leader
        self._tier = tier
        self._wall_clock = wall_clock
        self._scheduler = scheduler
        self._checkpoint_ms = config.checkpoint_interval_ms
        self._retention_check_ms = config.retention_check_ms
        self._tick = tick
        # The scheduler's thread and a stopping leader may both write the checkpoint.
        self._write_lock = threading.Lock()
        #: The HW the checkpoint file holds.
        self._checkpointed_hw = leader.log.read_high_watermark()
        self._stopped = False

    @property
    def name(self) -> str:
        return self._leader.name

    # -- events of the leader -------------------------------------------------------------------

    def start(self) -> None:
        if self._leader.isr is not None:
            # Ticked at once: a single-replica ISR commits what it holds.
            self._scheduler.at(self, Work.ISR_TICK, self._scheduler.now_ms())
        if self._leader.high_watermark > self._checkpointed_hw:
            self.high_watermark_moved()
        self.segments_changed()
        if self._tier is not None:
            self._scheduler.at(self, Work.OFFLOAD, self._scheduler.now_ms())

    def stop(self) -> None:
        """Nothing more is scheduled (a batch under way finishes without effect)."""
        self._stopped = True
        self._scheduler.cancel(self)

    def appended(self) -> None:
        if self._stopped:
            return
        config = self._leader.log.config
        if config.fsync is FsyncPolicy.INTERVAL:
            self._scheduler.at(self, Work.FSYNC,
                               self._scheduler.now_ms() + config.fsync_interval_ms)
        self.segments_changed()

    def high_watermark_moved(self) -> None:
        if self._stopped:
            return
        self._scheduler.at(self, Work.CHECKPOINT, self._scheduler.now_ms() + self._checkpoint_ms)
        self.segments_changed()

    def isr_changed(self) -> None:
        """The ISR core took an input: its next tick may be due sooner."""
        isr = self._leader.isr
        if self._stopped or isr is None:
            return
        due = isr.next_tick_ms()
        if due is not None:
            self._scheduler.at(self, Work.ISR_TICK,
                               max(due, self._scheduler.now_ms() + ISR_TICK_MS_MIN))

    def segments_changed(self) -> None:
        """Retention may have something to delete: the log grew, its HW moved, its limits
        changed or a segment was rolled. Checked `retention_check_ms` from now, if the log has
        a sealed segment and no check is due already."""
        log_ = self._leader.log
        tier = self._tier
        if tier is not None and not self._stopped and tier.wants_pass(
                len(log_.segment_base_offsets), self._leader.high_watermark):
            self._scheduler.at(self, Work.OFFLOAD, self._scheduler.now_ms()
                               + tier.offload_delay_ms)
        if (self._stopped or not retention.has_limits(log_.config)
                or self._scheduler.due_at(self, Work.RETENTION) is not None
                or len(log_.segment_base_offsets) < 2):
            return
        self._scheduler.at(self, Work.RETENTION,
                           self._scheduler.now_ms() + self._retention_check_ms)

    def checkpoint(self) -> None:
        """Write the HW checkpoint now, if the HW moved past it (blocking: the leader stops)."""
        self._write_checkpoint(self._leader.high_watermark)

    # -- the work (a scheduler Job) ------------------------------------------------------------

    def prepare(self, work: Work, now_ms: int) -> Callable[[], Outcome] | None:
        if self._stopped:
            return None
        log_ = self._leader.log
        if work is Work.CHECKPOINT:
            hw = self._leader.high_watermark
            return partial(self._write_checkpoint, hw) if hw > self._checkpointed_hw else None
        if work is Work.FSYNC:
            return LogFsync(log_, log_.log_end_offset)
        if work is Work.RETENTION:
            return partial(_retention_pass, log_, self._leader.high_watermark, self._wall_clock)
        if work is Work.OFFLOAD and self._tier is not None:
            cfg = log_.config
            return self._tier.prepare(
                log_, self._leader.high_watermark,
                TotalRetention(cfg.retention_ms, cfg.retention_bytes, cfg.retention_messages),
                now_ms, self._wall_clock(), replicas_hold(self._leader.isr))
        return None  # the ISR tick runs on the loop, in `finish`

    async def finish(self, work: Work, outcome: Outcome, now_ms: int) -> None:
        if self._stopped:
            return
        if isinstance(outcome, Exception):
            log.warning("%s of %s failed (again later): %s", work.value, self.name, outcome)
        if work is Work.ISR_TICK:
            await self._tick(now_ms)
        elif work is Work.CHECKPOINT:
            if isinstance(outcome, Exception):
                self._scheduler.at(self, work, now_ms + self._checkpoint_ms)
        elif work is Work.FSYNC:
            log_ = self._leader.log
            if log_.durable_offset < log_.log_end_offset:  # it failed
                self._scheduler.at(self, work, now_ms + log_.config.fsync_interval_ms)
        elif work is Work.RETENTION:
            self._retention_done(outcome, now_ms)
        elif work is Work.OFFLOAD and self._tier is not None:
            due, deleted = self._tier.finish(outcome, now_ms)
            self._scheduler.at(self, Work.OFFLOAD, due)
            if deleted:
                self._leader.log_start_moved()

    def _retention_done(self, outcome: Outcome, now_ms: int) -> None:
        if not isinstance(outcome, tuple):  # it failed
            self._scheduler.at(self, Work.RETENTION, now_ms + self._retention_check_ms)
            return
        deleted, expires_in = outcome
        if deleted:
            log.info("retention deleted %d segments of %s", len(deleted), self.name)
            self._leader.log_start_moved()
        if expires_in is not None:
            self._scheduler.at(self, Work.RETENTION,
                               now_ms + max(expires_in, self._retention_check_ms))

    def _write_checkpoint(self, high_watermark: int) -> None:
        with self._write_lock:
            if high_watermark > self._checkpointed_hw:
                log_ = self._leader.log
                log_.write_high_watermark(min(high_watermark, log_.log_end_offset))
                self._checkpointed_hw = high_watermark


def replicas_hold(isr: LeaderState | None) -> int | None:
    """The least log end offset among the other members of the ISR (0 while one has not
    fetched in this leader epoch); None without replication. Offload keeps local segments
    from there: a follower copies only from the leader's disk. A replica out of the ISR holds
    nothing back (a dead one would stop local deletion until it came back): once it finds
    the leader's log start past its own end, it restarts there."""
    if isr is None:
        return None
    ends = [isr.follower_state(r).log_end_offset for r in isr.isr if r != isr.leader_id]
    return min((0 if end is None else end for end in ends), default=None)


def _retention_pass(log_: Log, high_watermark: int, wall_clock: Callable[[], int]
                    ) -> tuple[list[int], int | None]:
    """In the executor: apply retention below the HW. Returns the base offsets deleted, and
    how long until the oldest sealed segment left is older than `retention_ms`."""
    now = wall_clock()
    deleted = log_.apply_retention(now_ms=now, max_offset=high_watermark)
    return deleted, expires_in_ms(log_.sealed_segments(), log_.config.retention_ms, now)


def expires_in_ms(sealed: Sequence[retention.SegmentFacts], retention_ms: int | None,
                  now_ms: int) -> int | None:
    """How long from `now_ms` (wall clock) until the oldest of the sealed segments `sealed`
    is older than `retention_ms`, so retention by age deletes it (0: it is already). None
    when age deletes none of them: no age limit, no sealed segment, or no timestamp."""
    if retention_ms is None or not sealed or sealed[0].max_timestamp < 0:
        return None
    return max(0, sealed[0].max_timestamp + retention_ms + 1 - now_ms)
