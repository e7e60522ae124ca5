"""The tiered storage of one partition led here: its fragment index, offload and store reads.

Theory of operation: a partition leader whose stream has a `fragment_store` owns one
PartitionTier. It holds the fragment index (jetstream.tiered.index), the set of fragments
verified by this broker, the offload's metrics and the store's health as the last pass saw
it. The leader's housekeeping asks it for the blocking part of an offload pass (`prepare`,
jetstream.tiered.offload) and hands it the outcome (`finish`), which says when the next pass
is due: after a listing interval, at once while uploads remain, or after a backoff doubling
up to `backoff_ms_max` while the store fails. Reads below the local log start come here
(`read`) and are served from the fragment cache (jetstream.tiered.reader). A read of an
offset the index does not cover lists the store once before it is refused (at most every
LIST_ON_MISS_MS): a leader that took over, say from a preferred-leader rebalance, knows the
fragments its follower's last listing saw, not those the old leader uploaded since.

A leader that starts on an empty log (a broker given an empty disk) must not take offsets the
store already holds: `open_log` lists the store first (retrying while it is down) and starts
the log at the end of what the store holds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from functools import partial
from typing import Any

from obstore.exceptions import NotFoundError

from jetstream.errors import FragmentStoreUnavailable, OffsetOutOfRange
from jetstream.stream.file_slice import FileSlice
from jetstream.stream.log import Log
from jetstream.stream.segment import Segment
from jetstream.tiered import offload
from jetstream.tiered.index import FragmentIndex, StoredFragment
from jetstream.tiered.names import FragmentName
from jetstream.tiered.offload import PassInput, PassResult, StepHook, TierMetrics
from jetstream.tiered.planner import (
    LocalRetention,
    TotalRetention,
    cut_for_time,
    fragments_below,
    plan_offload,
)
from jetstream.tiered.reader import FragmentCache
from jetstream.tiered.settings import TieredSettings
from jetstream.tiered.store import FragmentStore, StoreRegistry

log = logging.getLogger(__name__)

#: Fragments fetched ahead of a reader catching up from the store.
READ_AHEAD_FRAGMENTS = 2
#: A read the index does not cover lists the store again at most this often.
LIST_ON_MISS_MS = 1000


@dataclass(frozen=True, slots=True)
class TierConfig:
    """The broker's tiered-storage settings (jetstream.server.config)."""

    list_interval_ms: int = 60_000
    backoff_ms_min: int = 500
    backoff_ms_max: int = 30_000
    #: A pass soon after a segment is sealed, so uploads follow rolls closely.
    offload_delay_ms: int = 200


class PartitionTier:
    """See the module docstring."""

    def __init__(self, stream: str, partition: int, settings: TieredSettings,
                 stores: StoreRegistry, cache: FragmentCache, config: TierConfig,
                 executor: Executor | None, hook: StepHook | None = None) -> None:
        self.stream = stream
        self.partition = partition
        self.settings = settings
        self._stores = stores
        self._cache = cache
        self._config = config
        self._executor = executor
        self._hook = hook
        self.index = FragmentIndex()
        self.verified: set[FragmentName] = set()
        self.metrics = TierMetrics()
        self.listed = False
        self._next_list_ms = 0
        self._generation = 0
        #: What the last pass saw: the log's segment count, and the end of its newest sealed
        #: segment while that was not yet committed (a pass is due once it is).
        self._segments_seen = 0
        self._sealed_end_waiting: int | None = None
        self._failures = 0
        #: When a read the index did not cover last listed the store (monotonic ms).
        self._listed_on_miss_ms: int | None = None
        #: The store's last error (None: the last pass went through).
        self.store_error: FragmentStoreUnavailable | None = None

    @property
    def key(self) -> tuple[str, int]:
        return self.stream, self.partition

    def store(self) -> FragmentStore:
        return self._stores.get(self.settings.fragment_store)

    # -- offload (driven by housekeeping) ----------------------------------------------------

    @property
    def offload_delay_ms(self) -> int:
        return self._config.offload_delay_ms

    def wants_pass(self, segment_count: int, high_watermark: int) -> bool:
        """Whether a pass may have work since the last one: a segment was sealed (or
        deleted), or the HW passed the end of a sealed segment that was not committed."""
        waiting = self._sealed_end_waiting
        return segment_count != self._segments_seen or (
            waiting is not None and high_watermark >= waiting)

    def prepare(self, log_: Log, high_watermark: int, total: TotalRetention, now_ms: int,
                wall_ms: int, keep_from: int | None = None) -> Callable[[], PassResult]:
        """The blocking part of the next pass (`now_ms`: the scheduler's clock, for the
        listing interval; `wall_ms`: the wall clock, for retention by age; `keep_from`: see
        offload.PassInput)."""
        bases = log_.segment_base_offsets
        self._segments_seen = len(bases)
        sealed_end = bases[-1]  # the active segment's base: where the sealed ones end
        self._sealed_end_waiting = sealed_end if sealed_end > high_watermark else None
        self._generation = self.index.generation
        # The backlog as of now, whether the store answers this pass or not.
        sealed, active_bytes = offload.sealed_infos(log_)
        plan = plan_offload(sealed, active_bytes, high_watermark, self.index,
                            LocalRetention(None, None), wall_ms)
        # (a compacted stream's dirty part is counted until the pass, which reads the
        # cleaner's checkpoint off the loop, says better)
        self.metrics.backlog_bytes = offload.backlog_bytes(self.settings, plan, sealed,
                                                           high_watermark, self.index, None)
        task = PassInput(self.settings, self.stream, self.partition, high_watermark,
                         self.index.snapshot(), frozenset(self.verified),
                         list_now=not self.listed or now_ms >= self._next_list_ms,
                         generation=self.index.generation, total_retention=total,
                         now_ms=wall_ms, keep_from=keep_from)
        return partial(self._run, log_, task)

    def _run(self, log_: Log, task: PassInput) -> PassResult:
        return offload.run_pass(self.store(), log_, task, self._hook)

    def finish(self, outcome: object, now_ms: int) -> tuple[int, bool]:
        """Apply a pass's outcome: (when the next pass is due, whether local segments were
        deleted)."""
        if not isinstance(outcome, PassResult):
            self._failed(outcome)
            self.metrics.failed_passes += 1
            return self._back_off(now_ms), False
        self._failures = 0
        self.store_error = None
        self.apply(outcome, self._generation, now_ms)
        uploads_left = outcome.backlog_bytes > 0
        due = now_ms + (self._config.offload_delay_ms if uploads_left
                        else self._config.list_interval_ms)
        return due, bool(outcome.local_deleted)

    def apply(self, result: PassResult, generation: int, now_ms: int) -> None:
        if result.listed is not None:
            self.index.replace_listing(result.listed, generation)
            self.verified &= {f.name for f in result.listed} | {f.name for f in
                                                                result.uploaded}
            self.listed = True
            self.metrics.listings += 1
            self._next_list_ms = now_ms + self._config.list_interval_ms
        for fragment in result.uploaded:
            self.index.add(fragment)
            self.metrics.uploaded_fragments += 1
            self.metrics.uploaded_bytes += fragment.size_bytes
        self.verified |= {f.name for f in result.uploaded} | result.verified
        if result.deleted_fragments:
            self.index.remove(f.name for f in result.deleted_fragments)
            self.verified -= {f.name for f in result.deleted_fragments}
            self.metrics.store_fragments_deleted += len(result.deleted_fragments)
        self.metrics.local_segments_deleted += len(result.local_deleted)
        self.metrics.backlog_bytes = max(0, result.backlog_bytes)

    def _back_off(self, now_ms: int) -> int:
        """When to try the store again after one more failure in a row."""
        backoff = min(self._config.backoff_ms_max,
                      self._config.backoff_ms_min << min(self._failures, 16))
        self._failures += 1
        return now_ms + backoff

    def _failed(self, outcome: object) -> None:
        if isinstance(outcome, FragmentStoreUnavailable):
            self.store_error = outcome
        else:
            self.store_error = FragmentStoreUnavailable(self.settings.fragment_store,
                                                        f"offload failed: {outcome}")
        # (housekeeping logs the failure)

    # -- a leader on an empty log ----------------------------------------------------------------

    async def open_log(self, log_: Log, stopping: Callable[[], bool]) -> bool:
        """List the store until it answers; when the log is empty and the store holds
        offsets at or past its end, start the log at the store's end. True when it moved."""
        loop = asyncio.get_running_loop()
        delay_ms = self._config.backoff_ms_min
        while not stopping():
            if not await self.list_once(monotonic_ms()):
                log.warning("%s/%d waits for its fragment store to start: %s", self.stream,
                            self.partition, self.store_error)
                await asyncio.sleep(delay_ms / 1000)
                delay_ms = min(self._config.backoff_ms_max, delay_ms * 2)
                continue
            end = self.index.any_end_offset
            if (end is not None and log_.log_start_offset == log_.log_end_offset
                    and end > log_.log_end_offset):
                await loop.run_in_executor(self._executor, log_.truncate_fully_and_start_at,
                                           end)
                log.info("%s/%d: empty log starts at %d, after the store's history",
                         self.stream, self.partition, end)
                return True
            return False
        return False

    # -- a follower's index --------------------------------------------------------------------

    def listing_due_ms(self) -> int:
        """When the index should be listed again (0 until the first listing: at once)."""
        return self._next_list_ms

    async def list_once(self, now_ms: int) -> bool:
        """List the store into the index (off the loop). False when the store failed: its
        error is kept, and the next listing is due after a backoff doubling up to
        `backoff_ms_max`."""
        generation = self.index.generation
        try:
            listed = await asyncio.get_running_loop().run_in_executor(
                self._executor, partial(self.store().list_partition, self.stream,
                                        self.partition))
        except FragmentStoreUnavailable as exc:
            self.store_error = exc
            self._next_list_ms = self._back_off(now_ms)
            return False
        self._failures = 0
        self.store_error = None
        self.apply(PassResult(listed=listed), generation, now_ms)
        return True

    # -- reads --------------------------------------------------------------------------------

    def start_offset(self, log_: Log) -> int:
        """The first offset readable: the start of the stored history contiguous with the
        local log, else the local log start."""
        return self.index.start_offset(log_.log_start_offset)

    async def read(self, offset: int, max_bytes: int, upper_bound: int, log_: Log
                   ) -> FileSlice:
        """Whole batches from `offset` (below the local log start) out of the store."""
        fragment = self.index.covering(offset)
        if fragment is None and self._may_list_on_miss():
            await self.list_once(monotonic_ms())  # uploaded since the last listing?
            fragment = self.index.covering(offset)
        if fragment is None:
            raise OffsetOutOfRange(offset, self.start_offset(log_), upper_bound)
        store = self.store()
        # The next fragments download while this one does (and while it is read).
        self._read_ahead(store, fragment, log_.log_start_offset)
        try:
            segment = await self._cache.segment(store, fragment.name, fragment.size_bytes)
        except (NotFoundError, FileNotFoundError):
            # Gone from the store since the last listing (a prune, a lifecycle rule).
            self.index.remove([fragment.name])
            raise OffsetOutOfRange(offset, self.start_offset(log_), upper_bound) from None
        piece = self._cache.read(segment, offset, max_bytes, min(upper_bound, fragment.end))
        self.metrics.store_reads += 1
        self.metrics.store_read_bytes += piece.length
        return piece

    def _may_list_on_miss(self) -> bool:
        now = monotonic_ms()
        if self._listed_on_miss_ms is not None and now - self._listed_on_miss_ms < LIST_ON_MISS_MS:
            return False
        self._listed_on_miss_ms = now
        return True

    async def offset_for_timestamp(self, timestamp_ms: int, log_: Log) -> int | None:
        """The first offset below the local log start whose record is at least as recent as
        `timestamp_ms`, from the stored history (None: no stored record is; the local log
        answers). The fragments' newest timestamps are taken to rise with their offsets (the
        broker stamps records as they arrive), so a binary search finds the fragment with a
        download per step; within it the segment's time index finds the offset."""
        chain = self._stored_chain(log_.log_start_offset)
        low, high = 0, len(chain)
        while low < high:
            middle = (low + high) // 2
            segment = await self._load(chain[middle], log_)
            if segment.max_timestamp >= timestamp_ms:
                high = middle
            else:
                low = middle + 1
        loop = asyncio.get_running_loop()
        for fragment in chain[low:]:
            segment = await self._load(fragment, log_)
            found = await loop.run_in_executor(self._executor, segment.offset_for_timestamp,
                                               timestamp_ms)
            if found is not None:
                return max(found, fragment.begin)
        return None

    def _stored_chain(self, local_start: int) -> list[StoredFragment]:
        """The fragments from the stored start up to the local log start, in order."""
        chain: list[StoredFragment] = []
        at = self.index.start_offset(local_start)
        while at < local_start:
            fragment = self.index.covering(at)
            if fragment is None:
                break
            chain.append(fragment)
            at = fragment.end
        return chain

    async def _load(self, fragment: StoredFragment, log_: Log) -> Segment:
        """The fragment as a segment from the cache (downloaded when not there); a fragment
        gone from the store since the last listing leaves the index: OFFSET_OUT_OF_RANGE."""
        try:
            return await self._cache.segment(self.store(), fragment.name,
                                             fragment.size_bytes)
        except (NotFoundError, FileNotFoundError):
            self.index.remove([fragment.name])
            raise OffsetOutOfRange(fragment.begin, self.start_offset(log_),
                                   log_.log_end_offset) from None

    def _read_ahead(self, store: FragmentStore, fragment: StoredFragment, local_start: int
                    ) -> None:
        """Fetch the next READ_AHEAD_FRAGMENTS fragments below the local log start."""
        names: list[tuple[FragmentName, int]] = []
        at = fragment.end
        while len(names) < READ_AHEAD_FRAGMENTS and at < local_start:
            following = self.index.covering(at)
            if following is None:
                break
            names.append((following.name, following.size_bytes))
            at = following.end
        if names:
            self._cache.prefetch(self.key, partial(self._cache.load_all, store, names))

    # -- listing and pruning (admin) ---------------------------------------------------------

    def describe_fragments(self) -> list[dict[str, Any]]:
        store = self.store()
        useful = self.index.useful()
        return [_fragment_dict(store, f, f.name in useful) for f in self.index.all()]

    async def prune(self, log_: Log, before_offset: int | None, before_ms: int | None
                    ) -> PassResult:
        """Delete the fragments ending at or before `before_offset` (or all of the oldest
        modified before `before_ms`) and the local segments below the same cut."""
        cut = before_offset if before_offset is not None else cut_for_time(
            self.index, before_ms if before_ms is not None else 0)
        result = PassResult()
        if cut is None:
            return result
        store = self.store()
        index = FragmentIndex(self.index.all())
        doomed = fragments_below(index, cut)
        await asyncio.get_running_loop().run_in_executor(
            self._executor, offload.delete_through, store, log_, index, doomed, cut, result)
        self.apply(result, self.index.generation, monotonic_ms())
        return result

    def describe(self, log_: Log) -> dict[str, Any]:
        end = self.index.end_offset
        out: dict[str, Any] = {
            "fragment_store": self.settings.fragment_store,
            "stored_start_offset": self.start_offset(log_) if end is not None else None,
            "stored_end_offset": end,
            "stored_fragments": len(self.index),
            "stored_bytes": self.index.size_bytes,
            "backlog_bytes": self.metrics.backlog_bytes,
            "listed": self.listed,
        }
        if self.store_error is not None:
            out["store_error"] = self.store_error.to_dict()
        return out


def _fragment_dict(store: FragmentStore, fragment: StoredFragment, useful: bool
                   ) -> dict[str, Any]:
    name = fragment.name
    return {"begin": name.begin, "end": name.end, "leader_epoch": name.leader_epoch,
            "sha256": name.sha256, "compression": name.compression.value,
            "format": name.kind.value,
            "size_bytes": fragment.size_bytes, "modified_ms": fragment.modified_ms,
            "url": store.url_of(name), "redundant": not useful}


def monotonic_ms() -> int:
    return int(time.monotonic() * 1000)
