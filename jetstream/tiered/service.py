"""Tiered storage on one broker: the store clients, the fragment cache, one tier per leader.

Theory of operation: the broker's roles (jetstream.server.roles) own one Tiering. It makes a
PartitionTier (jetstream.tiered.partition_tier) for each partition leader whose stream has a
`fragment_store`, shares one client per store URL and one bounded fragment cache among them,
and reports what the broker's health and metrics show: the offload backlog per partition and
a warning per partition whose store failed its last pass (FRAGMENT_STORE_UNAVAILABLE), or
whose backlog holds sealed segments the store does not have yet.

Followers keep a fragment index too: a follower of a stream with a `fragment_store` gets a
PartitionTier whose index a listing task here refreshes (at once, then every listing
interval, backing off while the store fails). The tier outlives the role: when this broker
becomes the partition's leader it takes the same tier, index and all, so reads below its
local log start are served from the store at once, without waiting for a listing. Tiers of
partitions no longer held here are dropped (`retain`); a change of the tiered settings makes
a new one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

from jetstream.stream.handles import HandlePool
from jetstream.tasks import cancel_and_wait, wait_event
from jetstream.tiered.offload import StepHook, TierMetrics
from jetstream.tiered.partition_tier import PartitionTier, TierConfig, monotonic_ms
from jetstream.tiered.reader import CACHE_DIR, FragmentCache
from jetstream.tiered.settings import settings_of
from jetstream.tiered.store import StoreRegistry

log = logging.getLogger(__name__)

Key = tuple[str, int]

_METRICS = (
    ("fragment_backlog_bytes", "gauge", "backlog_bytes",
     "Bytes of committed sealed segments not yet in the fragment store."),
    ("fragments_uploaded_total", "counter", "uploaded_fragments",
     "Fragments uploaded and verified."),
    ("fragment_uploaded_bytes_total", "counter", "uploaded_bytes",
     "Bytes of fragments uploaded (as stored)."),
    ("fragment_failed_passes_total", "counter", "failed_passes",
     "Offload passes the store failed (retried with backoff)."),
    ("fragment_local_segments_deleted_total", "counter", "local_segments_deleted",
     "Local segments deleted once verified in the store (or pruned)."),
    ("fragment_store_deleted_total", "counter", "store_fragments_deleted",
     "Fragments deleted from the store by retention or prune."),
    ("fragment_store_reads_total", "counter", "store_reads",
     "Reads served from the fragment store."),
    ("fragment_store_read_bytes_total", "counter", "store_read_bytes",
     "Bytes served from the fragment store."),
    ("fragment_listings_total", "counter", "listings",
     "Listings of the fragment store into the partition's index (leader or follower)."),
)


class Tiering:
    def __init__(self, data_dir: Path, cache_bytes_max: int, pool: HandlePool,
                 executor: Executor | None, config: TierConfig,
                 hook: StepHook | None = None) -> None:
        self.stores = StoreRegistry()
        self.cache = FragmentCache(data_dir / CACHE_DIR, cache_bytes_max, pool, executor)
        self._executor = executor
        self._config = config
        self._hook = hook
        self._tiers: dict[Key, PartitionTier] = {}
        #: The partitions followed here whose index the lister keeps.
        self._followed: set[Key] = set()
        self._wake = asyncio.Event()
        self._lister: asyncio.Task[None] | None = None

    def tier_for(self, stream: Any, partition: int) -> PartitionTier | None:
        """The tier of the leader of `stream`/`partition` (a StreamConfig): the one kept
        while following it, if any, else a new one; None when the stream has no fragment
        store."""
        tier = self._tier(stream, partition)
        self._followed.discard((stream.name, partition))
        return tier

    def follow(self, stream: Any, partition: int) -> None:
        """This broker follows `stream`/`partition`: keep its index listed."""
        if self._tier(stream, partition) is None:
            return
        self._followed.add((stream.name, partition))
        self._wake.set()
        if self._lister is None or self._lister.done():
            self._lister = asyncio.create_task(self._list_followed(), name="fragment lister")

    def retain(self, held: Iterable[Key]) -> None:
        """Drop the tiers of partitions not in `held` (no role here any more)."""
        keep = set(held)
        for key in [k for k in self._tiers if k not in keep]:
            del self._tiers[key]
            self._followed.discard(key)

    def held(self) -> list[PartitionTier]:
        """The tiers of the partitions held here, led or followed."""
        return list(self._tiers.values())

    def _tier(self, stream: Any, partition: int) -> PartitionTier | None:
        key = (stream.name, partition)
        settings = settings_of(stream)
        if settings is None:
            self._tiers.pop(key, None)
            return None
        tier = self._tiers.get(key)
        if tier is None or tier.settings != settings:
            tier = self._tiers[key] = PartitionTier(
                stream.name, partition, settings, self.stores, self.cache, self._config,
                self._executor, self._hook)
        return tier

    async def _list_followed(self) -> None:
        """List each followed partition's store when its listing is due, one at a time."""
        while True:
            self._wake.clear()
            now_ms = monotonic_ms()
            tiers = [self._tiers[k] for k in list(self._followed) if k in self._tiers]
            for tier in tiers:
                due = tier.listing_due_ms() <= now_ms and tier.key in self._followed
                if due and not await tier.list_once(now_ms):
                    log.warning("listing the fragment store of follower %s/%d failed "
                                "(again later): %s", tier.stream, tier.partition,
                                tier.store_error)
            tiers = [self._tiers[k] for k in self._followed if k in self._tiers]
            wait_ms = min((t.listing_due_ms() for t in tiers), default=now_ms + 60_000) - now_ms
            await wait_event(self._wake, max(wait_ms, 50) / 1000)

    @staticmethod
    def warnings(tiers: Iterable[PartitionTier]) -> list[dict[str, Any]]:
        return [{"stream": tier.stream, "partition": tier.partition,
                 "backlog_bytes": tier.metrics.backlog_bytes, **tier.store_error.to_dict()}
                for tier in tiers if tier.store_error is not None]

    def render_metrics(self, tiers: Iterable[PartitionTier]) -> list[str]:
        rows = sorted(tiers, key=lambda t: t.key)
        lines: list[str] = []
        for name, kind, attr, text in _METRICS:
            lines += [f"# HELP jetstream_partition_{name} {text}",
                      f"# TYPE jetstream_partition_{name} {kind}"]
            lines += [f'jetstream_partition_{name}{{stream="{t.stream}",partition='
                      f'"{t.partition}"}} {getattr(t.metrics, attr)}' for t in rows]
        cache = self.cache.describe()
        for key in ("cached_bytes", "downloads", "hits"):
            lines += [f"# TYPE jetstream_fragment_cache_{key} gauge",
                      f"jetstream_fragment_cache_{key} {cache[key]}"]
        return lines

    async def close(self) -> None:
        await cancel_and_wait(self._lister)  # again until it ends (jetstream.tasks)
        await self.cache.close()


__all__ = ["PartitionTier", "TierConfig", "TierMetrics", "Tiering"]
