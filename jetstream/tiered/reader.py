"""Reads of offloaded offsets: fragments downloaded into a bounded cache of segment files.

Theory of operation: a read below a partition's local log start finds the fragment covering
the offset in the partition's fragment index (jetstream.tiered.index), downloads it (async,
on the event loop), checks it against its name (decompression and SHA-256 in the executor:
a corrupt object raises CorruptFragment naming its URL, never serves) and writes the bytes
as a segment file under `<data_dir>/fragment-cache/`. The segment is then opened with the
log's own segment code (jetstream.stream.segment), which checks every batch's CRC as it
indexes them, and the read is answered like a local one: whole batches as a slice of that
file, sent with sendfile. So one reader serves local and stored data.

The cache holds at most `cache_bytes_max` bytes of fragments and drops the least recently
used first (a slice already handed out keeps its own descriptor). A read starts fetching the
next fragments in the background as it starts its own (read-ahead, one per partition at a
time), so a reader catching up sequentially rarely waits for the store. Two reads of one
fragment share one download, and a fragment larger than GET_PART_BYTES
(jetstream.tiered.store) is downloaded in parts requested at once.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from pathlib import Path

from jetstream.errors import CorruptFragment
from jetstream.stream.file_slice import FileSlice
from jetstream.stream.handles import HandlePool
from jetstream.stream.segment import Segment, log_file_name
from jetstream.tiered import codec
from jetstream.tiered.names import FragmentName
from jetstream.tiered.store import FragmentStore

log = logging.getLogger(__name__)

#: Index entries of cached fragments: as a log's default.
INDEX_INTERVAL_BYTES = 4096
CACHE_DIR = "fragment-cache"


class FragmentCache:
    """See the module docstring."""

    def __init__(self, directory: Path, cache_bytes_max: int, pool: HandlePool,
                 executor: Executor | None) -> None:
        self.directory = directory
        shutil.rmtree(directory, ignore_errors=True)  # a cache: nothing to keep over restarts
        directory.mkdir(parents=True, exist_ok=True)
        self._bytes_max = cache_bytes_max
        self._pool = pool
        self._executor = executor
        self._segments: OrderedDict[FragmentName, Segment] = OrderedDict()
        self._loading: dict[FragmentName, asyncio.Future[Segment]] = {}
        self._prefetching: set[tuple[str, int]] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.cached_bytes = 0
        self.downloads = 0
        self.downloaded_bytes = 0
        self.hits = 0

    async def segment(self, store: FragmentStore, name: FragmentName, size_bytes: int = 0
                      ) -> Segment:
        """The fragment `name` (of `size_bytes` in the store, 0: unknown) as an open,
        checked segment file (downloaded if need be)."""
        segment = self._segments.get(name)
        if segment is not None:
            self._segments.move_to_end(name)
            self.hits += 1
            return segment
        loading = self._loading.get(name)
        if loading is None:
            loading = asyncio.get_running_loop().create_future()
            self._loading[name] = loading
            try:
                segment = await self._download(store, name, size_bytes)
            except BaseException as exc:
                loading.set_exception(exc)
                loading.exception()  # retrieved: a waiter may not exist
                raise
            finally:
                del self._loading[name]
            loading.set_result(segment)
            return segment
        return await asyncio.shield(loading)

    async def load_all(self, store: FragmentStore, names: list[tuple[FragmentName, int]]
                       ) -> None:
        """Download `names` (with their sizes) into the cache, one after another
        (read-ahead)."""
        for name, size_bytes in names:
            await self.segment(store, name, size_bytes)

    async def _download(self, store: FragmentStore, name: FragmentName, size_bytes: int
                        ) -> Segment:
        parts = await store.get_async(store.key(name), size_bytes)
        segment = await asyncio.get_running_loop().run_in_executor(
            self._executor, self._install, store.url_of(name), name, parts)
        self.downloads += 1
        self.downloaded_bytes += sum(part.nbytes for part in parts)
        self._segments[name] = segment
        self.cached_bytes += segment.size
        self._evict()
        return segment

    def _install(self, url: str, name: FragmentName, parts: list[memoryview]) -> Segment:
        """In the executor: check, write and open one fragment."""
        data = codec.decode_parts(name, parts, url)
        directory = self.directory / f"{name.stream}-{name.partition}" / name.file_name
        directory.mkdir(parents=True, exist_ok=True)
        # A cache, wiped at start: no fsync (the checks below run on what was written).
        with open(directory / log_file_name(name.begin), "wb") as out:
            for part in data:
                out.write(part)
        segment = Segment(directory, name.begin, self._pool, INDEX_INTERVAL_BYTES)
        cut = segment.recover()
        if cut or segment.next_offset != name.end:
            segment.delete()
            raise CorruptFragment(url, f"its batches end at offset {segment.next_offset} "
                                       f"({cut} bytes unreadable), its name says {name.end}")
        return segment

    def _evict(self) -> None:
        while self.cached_bytes > self._bytes_max and len(self._segments) > 1:
            _name, segment = self._segments.popitem(last=False)
            self.cached_bytes -= segment.size
            segment.delete()
            shutil.rmtree(segment.log_path.parent, ignore_errors=True)

    def read(self, segment: Segment, offset: int, max_bytes: int, upper_bound: int
             ) -> FileSlice:
        """Whole batches of a cached fragment from `offset`, none reaching `upper_bound`."""
        span = segment.span(offset, max(1, max_bytes), upper_bound)
        if not span.length:
            return FileSlice(-1, 0, 0, offset, offset)
        return FileSlice(self._pool.dup(segment.log_path), span.position, span.length,
                         span.first_offset, span.next_offset)

    def prefetch(self, key: tuple[str, int], load: Callable[[], Awaitable[object]]) -> None:
        """Run `load` (a next fragment's download) in the background, one per partition."""
        if key in self._prefetching:
            return
        self._prefetching.add(key)

        async def run() -> None:
            try:
                await load()
            except Exception as exc:  # the read that needs it will meet the error itself
                log.debug("read-ahead of %s/%d failed: %s", key[0], key[1], exc)
            finally:
                self._prefetching.discard(key)

        task = asyncio.get_running_loop().create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def describe(self) -> dict[str, int]:
        return {"cached_fragments": len(self._segments), "cached_bytes": self.cached_bytes,
                "cache_bytes_max": self._bytes_max, "downloads": self.downloads,
                "downloaded_bytes": self.downloaded_bytes, "hits": self.hits}

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for segment in self._segments.values():
            segment.close()
        self._segments.clear()
