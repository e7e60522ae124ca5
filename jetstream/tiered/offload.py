"""The offload of one partition led here: list, upload, verify, delete locally, retention.

Theory of operation: the partition leader's housekeeping (jetstream.server.housekeeping)
runs an offload pass when its segments change and every `fragment_list_interval_ms`, as
scheduler work of its own kind (jetstream.server.scheduler, `Work.OFFLOAD`). A pass is
blocking work in the broker's executor, on a private copy of the fragment index:
1. List the partition's fragments when due (always first after becoming leader: a new leader
   resumes where the last one stopped, from the store's listing alone).
2. Upload what the planner (jetstream.tiered.planner) says: each sealed, committed segment
   not yet covered, read from the log (CRC-checked), compressed, named by the SHA-256 of its
   bytes and the leader epoch of its last batch, so the same content always gets the same
   name whoever uploads it (a put again after a crash stores the same object); after a put,
   a HEAD must show the object with its size.
3. Delete local sealed segments the local retention no longer keeps, only where fragments
   cover them that were verified: uploaded and checked by this pass, or downloaded and found
   to hold what their name says (fragments known from a listing alone).
   With `fragment_format` parquet or both, the pass also writes each sealed, committed
   segment (of a compacted stream: each cleaned one) as a Parquet fragment
   (jetstream.tiered.parquet), read and checked the same way, put and verified by a HEAD;
   with parquet alone no segment fragment is written.
4. Retention past `retention_*` (unless `fragment_store_retention=external`): delete the
   oldest fragments and the local segments below the same cut; Parquet fragments below it
   go too, and by the same rules on their own.
The loop's `finish` merges what the pass learned into the partition's index. A failing store
fails the pass (FragmentStoreUnavailable): nothing local is deleted, the next pass comes after
a backoff doubling up to `fragment_backoff_ms_max`, the backlog (bytes of committed sealed
segments not in the store) is a metric and the broker's health carries a warning.
A crash at any step loses nothing: the local copy goes only after verification, and an upload
done twice yields the same object under the same name.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from jetstream.compaction import checkpoint as cleaner_checkpoint
from jetstream.errors import FragmentStoreUnavailable, SegmentsChanged
from jetstream.stream import format as fmt
from jetstream.stream.log import Log
from jetstream.tiered import codec
from jetstream.tiered.index import FragmentIndex, StoredFragment
from jetstream.tiered.names import Compression, FragmentKind, FragmentName
from jetstream.tiered.planner import (
    LocalRetention,
    OffloadPlan,
    SegmentInfo,
    TotalRetention,
    fragments_below,
    plan_offload,
    plan_parquet,
    retention_cut,
)
from jetstream.tiered.settings import StoreRetention, TieredSettings
from jetstream.tiered.store import FragmentStore

log = logging.getLogger(__name__)

#: Most fragments known from a listing alone one pass downloads to verify before a deletion.
VERIFY_PER_PASS_MAX = 4
#: A step of a pass a test may fail on purpose: "listed", "read", "put", "verified",
#: "deleted_local".
StepHook = Callable[[str], None]


@dataclass(slots=True)
class TierMetrics:
    backlog_bytes: int = 0
    uploaded_fragments: int = 0
    uploaded_bytes: int = 0
    failed_passes: int = 0
    local_segments_deleted: int = 0
    store_fragments_deleted: int = 0
    store_reads: int = 0
    store_read_bytes: int = 0
    listings: int = 0


@dataclass(frozen=True, slots=True)
class PassInput:
    """What a pass starts from (taken on the loop)."""

    settings: TieredSettings
    stream: str
    partition: int
    high_watermark: int
    #: A snapshot of the partition's fragment index (the pass's own: FragmentIndex.snapshot).
    index: FragmentIndex
    verified: frozenset[FragmentName]
    list_now: bool
    generation: int
    total_retention: TotalRetention
    now_ms: int
    #: Local segments at or past this offset stay (the least log end offset among the
    #: partition's other replicas, 0 while one is unknown: a follower copies only from the
    #: leader's disk); None: no other replica.
    keep_from: int | None = None


@dataclass(slots=True)
class PassResult:
    listed: list[StoredFragment] | None = None
    uploaded: list[StoredFragment] = field(default_factory=list)
    verified: set[FragmentName] = field(default_factory=set)
    deleted_fragments: list[StoredFragment] = field(default_factory=list)
    local_deleted: list[int] = field(default_factory=list)
    backlog_bytes: int = 0


def sealed_infos(log_: Log) -> tuple[list[SegmentInfo], int]:
    """The log's sealed segments (oldest first) and the active segment's size."""
    segments = log_.segment_snapshot().segments
    sealed = log_.sealed_segments()
    infos = [SegmentInfo(s.base_offset, s.next_offset, s.size, s.max_timestamp)
             for s in sealed]
    return infos, segments[-1][1] if segments else 0


def run_pass(store: FragmentStore, log_: Log, task: PassInput,
             hook: StepHook | None = None) -> PassResult:
    """One offload pass (blocking: in the executor). See the module docstring."""
    step = hook or (lambda name: None)
    result = PassResult()
    if task.list_now:
        result.listed = store.list_partition(task.stream, task.partition)
        step("listed")
    index = FragmentIndex(result.listed) if result.listed is not None else task.index
    verified = set(task.verified)
    settings = task.settings
    local = LocalRetention(settings.local_retention_ms, settings.local_retention_bytes)
    sealed, active_bytes = sealed_infos(log_)
    plan = plan_offload(sealed, active_bytes, task.high_watermark, index, local, task.now_ms)
    uploads = plan.uploads if settings.fragment_format.segments else ()
    result.backlog_bytes = backlog_bytes(settings, plan, sealed, task.high_watermark, index,
                                         clean_below(settings, log_))
    sizes = {s.base_offset: s.size_bytes for s in uploads}
    for fragment in upload_segments(store, log_, task, uploads, step):
        index.add(fragment)
        verified.add(fragment.name)
        result.uploaded.append(fragment)
        result.backlog_bytes -= sizes[fragment.begin]
    if settings.fragment_format.parquet:
        _write_parquet(store, log_, task, index, sealed, result, step)
    _verify_listed(store, index, verified, sealed, result)
    # What a deletion of local segments may rest on: fragments over the local segments,
    # verified (segment fragments) or any (Parquet, an analytics copy, is never read back).
    local_start = sealed[0].base_offset if sealed else task.high_watermark
    trusted = FragmentIndex(f for f in index.ending_after(local_start) if f.name in verified
                            or f.name.kind is FragmentKind.PARQUET)
    plan = plan_offload(sealed, active_bytes, task.high_watermark, trusted, local, task.now_ms,
                        parquet_too=settings.fragment_format.parquet)
    if plan.delete_below is not None and settings.fragment_format.segments:
        below = plan.delete_below if task.keep_from is None else min(plan.delete_below,
                                                                      task.keep_from)
        result.local_deleted = log_.delete_segments_below(below)
        step("deleted_local")
    if settings.fragment_store_retention is StoreRetention.DELETE:
        _apply_retention(store, log_, index, task, result)
    return result


def clean_below(settings: TieredSettings, log_: Log) -> int | None:
    """A compacted stream's first dirty offset (Parquet waits for the cleaner below it)."""
    if not settings.compacted:
        return None
    return cleaner_checkpoint.read(log_.directory).first_dirty_offset


def backlog_bytes(settings: TieredSettings, plan: OffloadPlan, sealed: list[SegmentInfo],
                  high_watermark: int, index: FragmentIndex, clean_below_offset: int | None
                  ) -> int:
    """Bytes of sealed, committed segments not yet in the store in every format asked."""
    total = plan.backlog_bytes if settings.fragment_format.segments else 0
    if settings.fragment_format.parquet:
        total += plan_parquet(sealed, high_watermark, index.parquet, clean_below_offset)[1]
    return total


def _write_parquet(store: FragmentStore, log_: Log, task: PassInput, index: FragmentIndex,
                   sealed: list[SegmentInfo], result: PassResult, step: StepHook) -> None:
    """Write the segments Parquet does not cover yet as Parquet fragments, each verified."""
    from jetstream.tiered import parquet  # pyarrow: imported by brokers that write Parquet
    uploads, _backlog = plan_parquet(sealed, task.high_watermark, index.parquet,
                                     clean_below(task.settings, log_))
    for segment in uploads:
        data = _read_segment(log_, task, segment)
        step("read")
        name = FragmentName(segment.base_offset, segment.next_offset, task.stream,
                            task.partition, _last_epoch(data), codec.sha256_hex(data),
                            Compression.NONE, FragmentKind.PARQUET)
        payload = parquet.segment_parquet(data, task.stream, task.partition,
                                          segment.base_offset, segment.next_offset,
                                          task.settings.fragment_compression)
        prepared = Prepared(segment, name, store.key(name), payload)
        store.put(prepared.key, payload)
        fragment = verify_upload(store, prepared, step)
        index.add(fragment)
        result.uploaded.append(fragment)
        result.backlog_bytes -= segment.size_bytes


def _read_segment(log_: Log, task: PassInput, segment: SegmentInfo) -> bytes:
    """The bytes of one sealed segment, CRC-checked; SegmentsChanged when it changed."""
    try:
        return log_.read_segment(segment.base_offset, segment.size_bytes, segment.next_offset)
    except SegmentsChanged:
        raise SegmentsChanged(f"segment {segment.base_offset} of {task.stream}/"
                              f"{task.partition} changed while it was offloaded") from None


@dataclass(frozen=True, slots=True)
class Prepared:
    """A segment read, checked and encoded, ready to put."""

    segment: SegmentInfo
    name: FragmentName
    key: str
    payload: bytes


def prepare_segment(store: FragmentStore, log_: Log, task: PassInput, segment: SegmentInfo,
                    step: StepHook) -> Prepared:
    """Read one sealed segment (CRC-checked), name it by its bytes and encode it."""
    data = _read_segment(log_, task, segment)
    step("read")
    encoded = codec.encode(data, task.settings.fragment_compression)
    name = FragmentName(segment.base_offset, segment.next_offset, task.stream, task.partition,
                        _last_epoch(data), encoded.sha256, task.settings.fragment_compression)
    return Prepared(segment, name, store.key(name), encoded.payload)


def verify_upload(store: FragmentStore, prepared: Prepared, step: StepHook) -> StoredFragment:
    """After the put: the object must be there, whole."""
    step("put")
    there = store.head(prepared.key)
    size = len(prepared.payload)
    if there is None or there.size_bytes != size:
        raise FragmentStoreUnavailable(
            store.url, f"{prepared.key} did not verify after upload: the store holds "
            f"{there.size_bytes if there else 'nothing'}, {size} bytes were put")
    step("verified")
    return StoredFragment(prepared.name, there.size_bytes, there.modified_ms)


def upload_segments(store: FragmentStore, log_: Log, task: PassInput,
                    segments: Sequence[SegmentInfo], step: StepHook) -> Iterator[StoredFragment]:
    """Upload sealed segments in order (idempotent), each verified: the next segment is read
    and encoded while the previous one is being put (one put at a time). No HEAD before a
    put: the planner uploads only what the listing and this leader's uploads do not cover,
    and a put of the same name holds the same bytes (a put again after a crash between put
    and verification changes nothing)."""
    with ThreadPoolExecutor(1, thread_name_prefix="offload-put") as putter:
        pending: tuple[Future[None], Prepared] | None = None
        for segment in segments:
            prepared = prepare_segment(store, log_, task, segment, step)
            if pending is not None:
                pending[0].result()
                yield verify_upload(store, pending[1], step)
            pending = (putter.submit(store.put, prepared.key, prepared.payload), prepared)
        if pending is not None:
            pending[0].result()
            yield verify_upload(store, pending[1], step)


def _last_epoch(data: bytes) -> int:
    last = fmt.last_batch_position(data)
    return 0 if last is None else fmt.parse_header(data, last).leader_epoch


def _verify_listed(store: FragmentStore, index: FragmentIndex, verified: set[FragmentName],
                   sealed: list[SegmentInfo], result: PassResult) -> None:
    """Download and check a few fragments known from a listing alone that cover the oldest
    local segments (what local deletion would need)."""
    budget = VERIFY_PER_PASS_MAX
    for segment in sealed:
        at = segment.base_offset
        while at < segment.next_offset and budget > 0:
            fragment = index.covering(at)
            if fragment is None:
                return
            if fragment.name not in verified:
                budget -= 1
                codec.decode(fragment.name, store.get(store.key(fragment.name)),
                             store.url_of(fragment.name))
                verified.add(fragment.name)
                result.verified.add(fragment.name)
            at = fragment.end
        if budget <= 0:
            return


def _apply_retention(store: FragmentStore, log_: Log, index: FragmentIndex, task: PassInput,
                     result: PassResult) -> None:
    snapshot = log_.segment_snapshot()
    local_bytes = sum(size for _base, size in snapshot.segments)
    cut = retention_cut(index, local_bytes, snapshot.log_end_offset, task.total_retention,
                        task.now_ms)
    if cut is not None:
        delete_through(store, log_, index, fragments_below(index, cut), cut, result)
    parquet_cut = retention_cut(index.parquet, local_bytes, snapshot.log_end_offset,
                                task.total_retention, task.now_ms)
    if parquet_cut is not None:
        doomed = [f for f in index.all()
                  if f.name.kind is FragmentKind.PARQUET and f.end <= parquet_cut]
        store.delete([store.key(f.name) for f in doomed])
        index.remove(f.name for f in doomed)
        result.deleted_fragments.extend(doomed)


def delete_through(store: FragmentStore, log_: Log, index: FragmentIndex,
                   doomed: list[StoredFragment], cut: int, result: PassResult) -> None:
    """Delete `doomed` from the store and the local sealed segments ending at or before
    `cut` (the history below it is gone everywhere)."""
    store.delete([store.key(f.name) for f in doomed])
    index.remove(f.name for f in doomed)
    result.deleted_fragments.extend(doomed)
    result.local_deleted.extend(log_.delete_segments_below(min(cut, log_.log_end_offset)))

