"""The broker's log cleaner: picks the filthiest compacted partition replica and cleans it in
a worker process, one pass at a time per worker.

Theory of operation: every `cleaner_backoff_ms` (and after each pass) the service builds a
view of each compacted partition this broker holds — its sealed segments, active segment,
high watermark (the leader's, or the one a follower last learned) and cleaner checkpoint —
and asks the pure planner (jetstream.compaction.planner) for the next pass. A pass's rewrite
runs in one of `cleaner_threads` worker processes (jetstream.server.process_pool: its record
loops in a thread would hold the interpreter lock the event loop needs), its short prepare
and swap steps on a thread; never on the event loop, and never two passes on one
partition. A pass that meets a corrupt batch logs it, counts it and leaves that partition
alone until the broker restarts or the stream is updated; segments changed underneath a pass
(retention, truncation) just make the planner look again. Leaders and followers clean their
own copies independently, as Kafka's replicas do.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Hashable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from jetstream.compaction import checkpoint as cleaner_checkpoint
from jetstream.compaction.cleaner import PassResult, prepare, rewrite, segment_info, swap
from jetstream.compaction.planner import CleaningPlan, PartitionView, choose, dirty_ratio
from jetstream.errors import CorruptRecord, JetstreamError, LogClosed, SegmentsChanged
from jetstream.raft_meta.model import StreamConfig
from jetstream.server.process_pool import WorkerDied, WorkerProcesses
from jetstream.stream.log import Log
from jetstream.tasks import cancel_and_wait

log = logging.getLogger(__name__)

PartitionKey = tuple[str, int]
#: The cleaner's workers run at the lowest priority (nice 19): a pass takes what CPU
#: serving leaves, and gets a sliver of a busy one (never starved: compaction lags stay
#: bounded), so ingest latency barely moves while it runs.
CLEANER_NICENESS = 19
#: (partition, stream config, open log, high watermark) of each partition replica held here.
Replicas = Callable[[], Iterator[tuple[PartitionKey, StreamConfig, Log, int]]]


@dataclass(frozen=True, slots=True)
class _Candidate:
    view: PartitionView
    stream: StreamConfig
    log: Log


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(slots=True)
class PartitionCleaning:
    """What the cleaner did for one partition replica (stream info and metrics show it)."""

    passes: int = 0
    last_clean_ms: int | None = None
    records_removed: int = 0
    tombstones_removed: int = 0
    bytes_read: int = 0
    bytes_removed: int = 0
    last_pass_s: float = 0.0
    failed: str | None = None
    stream_config: StreamConfig | None = field(default=None, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {"passes": self.passes, "last_clean_ms": self.last_clean_ms,
                "records_removed": self.records_removed,
                "tombstones_removed": self.tombstones_removed,
                "bytes_removed": self.bytes_removed, "last_pass_s": round(self.last_pass_s, 3),
                "failed": self.failed}


@dataclass(slots=True)
class CleanerTotals:
    passes: int = 0
    errors: int = 0
    records_read: int = 0
    records_removed: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    pass_seconds: float = 0.0


class CleanerService:
    def __init__(self, replicas: Replicas, *, threads: int, buffer_bytes: int,
                 backoff_ms: int, rolled: Callable[[PartitionKey], None] = lambda key: None
                 ) -> None:
        self._replicas = replicas
        #: Told of each partition whose active segment this service rolled.
        self._rolled = rolled
        self._threads = threads
        self._buffer_bytes = buffer_bytes
        self._backoff_s = backoff_ms / 1000
        self._executor: ThreadPoolExecutor | None = None
        self._workers = WorkerProcesses(threads, "cleaner", CLEANER_NICENESS)
        self._task: asyncio.Task[None] | None = None
        self._in_flight: set[asyncio.Future[None]] = set()
        self._running: set[Hashable] = set()
        self._wake = asyncio.Event()
        #: By partition key, (stream, partition).
        self.partitions: dict[Hashable, PartitionCleaning] = {}
        self.totals = CleanerTotals()

    def start(self) -> None:
        self._executor = ThreadPoolExecutor(self._threads, thread_name_prefix="cleaner")
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="cleaner")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
        # A pass in flight finishes (its swap is atomic either way); no new one starts.
        await asyncio.gather(*self._in_flight, return_exceptions=True)
        await self._workers.close()
        if self._executor is not None:
            await asyncio.to_thread(self._executor.shutdown, wait=True, cancel_futures=True)
            self._executor = None

    def wake(self) -> None:
        self._wake.set()

    # -- what the planner sees --------------------------------------------------------------

    def _candidates(self, now_ms: int) -> dict[Hashable, _Candidate]:
        views: dict[Hashable, _Candidate] = {}
        for key, stream, log_, hw in self._replicas():
            if not stream.cleanup_policy.compacts:
                continue
            if self._roll_if_idle(stream, log_, hw, now_ms):
                self._rolled(key)
            self._workers.start()
            state = self.partitions.setdefault(key, PartitionCleaning())
            if state.failed is not None and state.stream_config == stream:
                continue  # left alone until the stream is updated (or a restart)
            state.stream_config = stream
            state.failed = None
            try:
                sealed = log_.sealed_segments()
                active = log_.segment_base_offsets[-1]
            except LogClosed:
                continue
            checkpoint = cleaner_checkpoint.read(log_.directory)
            config = stream.compaction_config()
            views[key] = _Candidate(PartitionView(
                key, tuple(segment_info(s) for s in sealed), active, hw,
                checkpoint.first_dirty_offset, config,
                checkpoint.tombstones_due_ms(config.delete_retention_ms)), stream, log_)
        return views

    @staticmethod
    def _roll_if_idle(stream: StreamConfig, log_: Log, hw: int, now_ms: int) -> bool:
        """A compacted partition whose active segment never fills would never be cleaned:
        once all of it is committed and its first record is `segment_ms_max` old (or
        `max_compaction_lag_ms`, if sooner), it is rolled so the cleaner can take it. True
        when it rolled."""
        age_ms = stream.segment_ms_max
        if stream.max_compaction_lag_ms is not None:
            age_ms = min(age_ms, stream.max_compaction_lag_ms)
        try:
            return log_.roll_if_older(now_ms - age_ms, hw)
        except LogClosed:
            return False

    def dirty_ratio(self, stream: StreamConfig, log_: Log, hw: int) -> float:
        """The partition's dirty ratio now (for stream info)."""
        checkpoint = cleaner_checkpoint.read(log_.directory)
        view = PartitionView("", tuple(segment_info(s) for s in log_.sealed_segments()),
                             log_.segment_base_offsets[-1], hw, checkpoint.first_dirty_offset,
                             stream.compaction_config())
        return dirty_ratio(view, wall_ms())

    # -- the loop ---------------------------------------------------------------------------

    async def _loop(self) -> None:
        in_flight = self._in_flight
        while True:
            while len(in_flight) < self._threads:
                now = wall_ms()
                candidates = self._candidates(now)
                plan = choose([c.view for c in candidates.values()], now,
                              skip=frozenset(self._running))
                if plan is None:
                    break
                chosen = candidates[plan.key]
                self._running.add(plan.key)
                in_flight.add(asyncio.ensure_future(
                    self._clean(plan.key, plan, chosen.stream, chosen.log)))
            self._wake.clear()
            waiters: set[asyncio.Future[Any]] = {asyncio.ensure_future(self._wake.wait()),
                                                  *in_flight}
            done, _pending = await asyncio.wait(waiters, timeout=self._backoff_s,
                                                return_when=asyncio.FIRST_COMPLETED)
            in_flight -= done
            for waiter in waiters - in_flight:
                waiter.cancel()

    async def _clean(self, key: Hashable, plan: CleaningPlan, stream: StreamConfig,
                     log_: Log) -> None:
        state = self.partitions.setdefault(key, PartitionCleaning())
        loop = asyncio.get_running_loop()
        try:
            prepared = await loop.run_in_executor(
                self._executor, prepare, log_, plan, stream.compaction_config(),
                self._buffer_bytes)
            rewritten = await self._workers.run(rewrite, prepared.job)
            result: PassResult = await loop.run_in_executor(
                self._executor, swap, log_, prepared, rewritten)
        except (SegmentsChanged, LogClosed):
            return  # planned again on the next round
        except WorkerDied as exc:
            self.totals.errors += 1
            log.error("%s: %s; the pass runs again", key, exc)
            return
        except CorruptRecord as exc:
            self.totals.errors += 1
            state.failed = f"{exc.code}: {exc}"
            log.error("%s: compaction stopped for this partition: %s", key, exc)
            return
        except (JetstreamError, OSError) as exc:
            self.totals.errors += 1
            state.failed = f"{type(exc).__name__}: {exc}"
            log.error("%s: compaction failed: %s", key, exc)
            return
        finally:
            self._running.discard(key)
        stats = result.stats
        state.passes += 1
        state.last_clean_ms = wall_ms()
        state.records_removed += stats.records_removed
        state.tombstones_removed += stats.tombstones_removed
        state.bytes_read += stats.bytes_read
        state.bytes_removed += stats.bytes_read - stats.bytes_written
        state.last_pass_s = result.duration_s
        totals = self.totals
        totals.passes += 1
        totals.records_read += stats.records_read
        totals.records_removed += stats.records_removed
        totals.bytes_read += stats.bytes_read
        totals.bytes_written += stats.bytes_written
        totals.pass_seconds += result.duration_s
        log.info("%s: cleaned to offset %d: %d of %d records removed, %d -> %d segments, "
                 "%.3f s", key, result.end_offset, stats.records_removed,
                 stats.records_read, result.segments_before, result.segments_after,
                 result.duration_s)

    def describe(self, key: PartitionKey, stream: StreamConfig, log_: Log, hw: int
                 ) -> dict[str, Any]:
        """What stream info shows of a compacted partition replica."""
        state = self.partitions.get(key, PartitionCleaning())
        try:
            ratio = round(self.dirty_ratio(stream, log_, hw), 4)
        except LogClosed:
            ratio = None
        return {"dirty_ratio": ratio, **state.to_dict()}

    def render_metrics(self) -> list[str]:
        """Prometheus lines of the cleaner's totals."""
        t = self.totals
        lines: list[str] = []
        for name, kind, value, text in (
            ("passes", "counter", t.passes, "Cleaning passes finished."),
            ("errors", "counter", t.errors, "Passes that failed (a corrupt batch, IO)."),
            ("records_read", "counter", t.records_read, "Records read by passes."),
            ("records_removed", "counter", t.records_removed, "Records compaction removed."),
            ("bytes_read", "counter", t.bytes_read, "Bytes of segments read by passes."),
            ("bytes_written", "counter", t.bytes_written, "Bytes of cleaned segments written."),
            ("pass_seconds", "counter", round(t.pass_seconds, 6), "Seconds spent in passes."),
            ("backlog", "gauge", self.backlog(), "Compacted partitions due for a pass."),
        ):
            full = f"jetstream_cleaner_{name}" + ("_total" if kind == "counter" else "")
            lines += [f"# HELP {full} {text}", f"# TYPE {full} {kind}", f"{full} {value}"]
        return lines

    def backlog(self) -> int:
        """Compacted partitions due for a pass now."""
        now = wall_ms()
        return sum(1 for c in self._candidates(now).values()
                   if c.view.key not in self._running and choose([c.view], now) is not None)
