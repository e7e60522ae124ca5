"""Tiered storage on one broker: the store clients, the fragment cache, one tier per leader.

Theory of operation: the broker's roles (jetstream.server.roles) own one Tiering. It makes a
PartitionTier (jetstream.tiered.partition_tier) for each partition leader whose stream has a
`fragment_store`, shares one client per store URL and one bounded fragment cache among them,
and reports what the broker's health and metrics show: the offload backlog per partition and
a warning per partition whose store failed its last pass (FRAGMENT_STORE_UNAVAILABLE), or
whose backlog holds sealed segments the store does not have yet.
"""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

from jetstream.stream.handles import HandlePool
from jetstream.tiered.offload import StepHook, TierMetrics
from jetstream.tiered.partition_tier import PartitionTier, TierConfig
from jetstream.tiered.reader import CACHE_DIR, FragmentCache
from jetstream.tiered.settings import settings_of
from jetstream.tiered.store import StoreRegistry

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

    def tier_for(self, stream: Any, partition: int) -> PartitionTier | None:
        """A new tier for the leader of `stream`/`partition` (a StreamConfig), None when the
        stream has no fragment store."""
        settings = settings_of(stream)
        if settings is None:
            return None
        return PartitionTier(stream.name, partition, settings, self.stores, self.cache,
                             self._config, self._executor, self._hook)

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
        await self.cache.close()


__all__ = ["PartitionTier", "TierConfig", "TierMetrics", "Tiering"]
