"""What a Spark read asks of the cluster at planning: streams, segment listings, start offsets.

Theory of operation: the async shell around jetstream.spark.planning. One client connects to
the brokers, resolves the streams (by name, or by label selector over the stream labels),
asks every partition's leader for its committed range and segment files (LIST_SEGMENTS), the
consumer group's committed offsets (option group) and the offsets of startingTimestamp and
endingTimestamp, then hands everything to the pure planner. Segment files are read where the
planner can reach them (readFrom auto: the leader's stream-version marker exists at the path
the broker reports, or under option dataDir); otherwise tasks Fetch from the leaders.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any, TypeVar

import jetstream.spark.planning as planning
from jetstream.client.client import Client, connect
from jetstream.client.types import SegmentListing, StreamInfo
from jetstream.errors import InvalidSparkOption
from jetstream.protocol.names import parse_selector
from jetstream.spark.options import ReadOptions
from jetstream.spark.planning import OffsetBounds, PartitionListing, Ranges, ReadTask
from jetstream.stream.segment import log_file_name

#: Partition listings asked for at once.
LISTINGS_IN_FLIGHT = 64

_T = TypeVar("_T")


def run_sync(coro: Coroutine[Any, Any, _T]) -> _T:
    """Run `coro` to completion from synchronous code: on a new event loop, in a thread of
    its own when this thread already runs one (a notebook, an async test)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="jetstream-spark") as pool:
        return pool.submit(asyncio.run, coro).result()


@dataclass(frozen=True, slots=True)
class Plan:
    tasks: list[ReadTask]
    ranges: Ranges
    #: What planning knew of each partition.
    listings: tuple[PartitionListing, ...] = ()


async def resolve_streams(client: Client, options: ReadOptions) -> list[StreamInfo]:
    """The streams a read covers. Raises UnknownStream for a name the cluster lacks, and
    InvalidSparkOption when a selector matches no stream."""
    if options.selector is None:
        return [await client.stream_info(name) for name in options.streams]
    selector = parse_selector(options.selector)
    streams = [info for info in await client.list_streams() if selector(info.labels)]
    if not streams:
        raise InvalidSparkOption(f"selector {options.selector!r} matches no stream",
                                 field="selector")
    return sorted(streams, key=lambda info: info.name)


def _exists(path: str) -> bool:
    if "://" not in path:
        return os.path.exists(path)
    import fsspec
    fs, inner = fsspec.url_to_fs(path)
    return fs.exists(inner)


def partition_listing(listing: SegmentListing, options: ReadOptions,
                      stored_start: int | None = None) -> PartitionListing:
    """What planning needs of a leader's LIST_SEGMENTS answer, with the segment files the
    read may open (none when it goes to the brokers). `stored_start`: where the history
    readable from Parquet fragments starts, when it reaches below the leader's log start
    (jetstream.spark.store_read)."""
    files, version_path = file_locations(listing, options)
    start = listing.log_start_offset if stored_start is None else min(
        stored_start, listing.log_start_offset)
    return PartitionListing(listing.stream, listing.partition, listing.high_watermark,
                            start, files, version_path,
                            listing.stream_version if files else None)


async def committed_offsets(client: Client, group: str | None,
                            keys: Sequence[tuple[str, int]]) -> dict[tuple[str, int], int]:
    """The group's committed offsets of `keys` (none without a group)."""
    if group is None or not keys:
        return {}
    found = await client.fetch_offsets(group, keys)
    return {key: value.offset for key, value in found.items()}


def file_locations(listing: SegmentListing, options: ReadOptions
                   ) -> tuple[tuple[tuple[int, str], ...], str | None]:
    """The segment files' paths or URLs and the version marker's, or ((), None) when the
    read goes to the brokers."""
    if options.read_from == "brokers":
        return (), None
    directory, version_path = listing.directory, listing.version_file
    if options.data_dir is not None:
        # The broker's directory is <data dir>/logs/<stream>-<partition>: keep the last two.
        tail = PurePosixPath(listing.directory)
        root = options.data_dir.replace("{broker_id}", str(listing.broker_id)).rstrip("/")
        directory = f"{root}/{tail.parent.name}/{tail.name}"
        version_path = f"{directory}/{PurePosixPath(listing.version_file).name}"
    if not _exists(version_path):
        if options.read_from == "files":
            raise InvalidSparkOption(
                f"segment files of {listing.stream}/{listing.partition} are not reachable at "
                f"{directory}: set dataDir to where the broker's data dir is mounted, or "
                "readFrom=brokers", field="readFrom")
        return (), None
    files = tuple((base, f"{directory}/{log_file_name(base)}") for base, _size in listing.segments)
    return files, version_path


async def _listings(client: Client, streams: Sequence[StreamInfo], bounds: OffsetBounds
                    ) -> list[SegmentListing]:
    keys = [(info.name, p.partition) for info in streams for p in info.partitions
            if bounds.allows(info.name, p.partition)]
    gate = asyncio.Semaphore(LISTINGS_IN_FLIGHT)

    async def one(stream: str, partition: int) -> SegmentListing:
        async with gate:
            return await client.list_segments(stream, partition)

    return list(await asyncio.gather(*(one(s, p) for s, p in keys)))


async def _offsets_at(client: Client, keys: Sequence[tuple[str, int]], timestamp_ms: int | None
                      ) -> dict[tuple[str, int], int]:
    if timestamp_ms is None:
        return {}
    found = await asyncio.gather(*(client.offset_for_timestamp(s, p, timestamp_ms)
                                   for s, p in keys))
    return dict(zip(keys, found, strict=True))


async def plan_read(client: Client, options: ReadOptions, bounds: OffsetBounds,
                    stored_starts: Mapping[tuple[str, int], int] | None = None, *,
                    tasks: bool = True, streams: Sequence[StreamInfo] | None = None) -> Plan:
    """Plan a batch read (see jetstream.spark.planning); `stored_starts`: see
    partition_listing; `tasks=False`: the ranges only (jetstream.spark.store_read plans
    its own reads of them); `streams`: resolve_streams's answer, when the caller has it."""
    if streams is None:
        streams = await resolve_streams(client, options)
    if bounds.streams is not None:
        streams = [info for info in streams if info.name in bounds.streams]
    listings = await _listings(client, streams, bounds)
    keys = [(listing.stream, listing.partition) for listing in listings]
    committed = await committed_offsets(client, options.group, keys)
    starts_at = await _offsets_at(client, keys, options.starting_timestamp_ms)
    ends_at = await _offsets_at(client, keys, options.ending_timestamp_ms)
    # A pushed-down `timestamp >= t`: no record before this offset is that recent.
    floors = await _offsets_at(client, keys, bounds.timestamp_min_ms)
    planned: list[PartitionListing] = []
    ranges: dict[tuple[str, int], tuple[int, int]] = {}
    for listing, key in zip(listings, keys, strict=True):
        view = partition_listing(listing, options, (stored_starts or {}).get(key))
        planned.append(view)
        start = planning.resolve_start(view, options, committed=committed.get(key),
                                       timestamp_offset=starts_at.get(key))
        end = planning.resolve_end(view, options, timestamp_offset=ends_at.get(key))
        start = max(start, floors.get(key, 0))
        ranges[key] = planning.narrow(start, max(start, end), bounds)
    resolved = Ranges(ranges)
    if not tasks:
        return Plan([], resolved, tuple(planned))
    return Plan(planning.plan_tasks(planned, resolved, options, bounds), resolved,
                tuple(planned))


def run_plan(options: ReadOptions, bounds: OffsetBounds) -> Plan:
    """plan_read on a client of its own, from synchronous code (Spark's planner)."""
    async def run() -> Plan:
        async with connect(options.brokers, **options.tls.connect_options()) as client:
            return await plan_read(client, options, bounds)

    return run_sync(run())
