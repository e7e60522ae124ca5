"""Reads by key: the key indexes of the compacted partition replicas held here, kept up with
their high watermarks, and the GET and KEYS handlers.

Theory of operation: one task keeps every compacted replica's key index
(jetstream.compaction.key_index, `<log dir>/keys.lmdb`) up to the replica's high watermark
(the leader's, or what a follower last learned), never past it: each round reads the newly
committed records from the log in an IO thread and applies them in the key index's worker
process (jetstream.server.key_index_worker: indexing's per-record Python there never holds
this process's interpreter lock), one LMDB transaction per read. Rounds run every
`key_index_interval_ms`, and at once when a read waits for an offset (`min_offset`:
read-your-writes after a publish ack). An index that covers more than the log
holds committed (the log lost its unsynced tail in a crash) is reset and rebuilt from the
log; one of another incarnation of the stream is wiped when opened. Lookups run on the event
loop: an LMDB read is a few microseconds.

Each index is an LMDB environment holding descriptors (`ENV_FILES`) and a mapping, so it is
leased from the broker's pool of partition files (jetstream.stream.handles) for each use and
counted in its budget: an index not used for a while is closed, and opened again (on the
event loop for a lookup, in an IO thread for a catch-up) when it is next needed. The worker
process holds its own few open indexes, outside this process's descriptor budget.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable
from concurrent.futures import Executor
from contextlib import AbstractContextManager
from typing import TypeVar

from jetstream.compaction.key_index import (
    CATCH_UP_READ_BYTES,
    ENV_FILES,
    KeyIndex,
    catch_up_from,
)
from jetstream.errors import JetstreamError, NotCompacted, OffsetNotIndexed, UnknownStream
from jetstream.protocol import messages as m
from jetstream.raft_meta.model import StreamConfig
from jetstream.server.epoch_fence import PartitionKey
from jetstream.server.key_index_worker import index_read
from jetstream.server.process_pool import WorkerProcesses
from jetstream.server.roles import Roles
from jetstream.stream.handles import HandlePool
from jetstream.stream.log import Log
from jetstream.tasks import cancel_and_wait, wait_event

log = logging.getLogger(__name__)

INDEX_DIRECTORY = "keys.lmdb"
T = TypeVar("T")


def _compacted(config: StreamConfig) -> bool:
    return config.cleanup_policy.compacts


class KeyValue:
    def __init__(self, roles: Roles, executor: Executor, pool: HandlePool, *,
                 interval_ms: int, map_size_bytes: int, wait_ms_max: int) -> None:
        self._roles = roles
        self._executor = executor
        self._pool = pool
        self._interval_s = interval_ms / 1000
        self._map_size = map_size_bytes
        self._wait_ms_max = wait_ms_max
        #: The log each indexed replica had when its index was opened, and what it covers.
        self._logs: dict[PartitionKey, Log] = {}
        self._covered: dict[PartitionKey, int] = {}
        self._wake = asyncio.Event()
        self._progress = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None
        self._workers = WorkerProcesses(1, "key index")

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="key-index")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
        await self._workers.close()
        for log_ in self._logs.values():
            self._pool.close(_lease_key(log_))
        self._logs.clear()

    async def _loop(self) -> None:
        while True:
            try:
                await self._round()
            except Exception:  # a bad round must not end reads by key for good
                log.exception("key index round failed")
            self._wake.clear()
            await wait_event(self._wake, self._interval_s)

    async def _round(self) -> None:
        loop = asyncio.get_running_loop()
        held: set[PartitionKey] = set()
        for key, _stream, log_, hw in self._roles.replicas(
                self._roles.streams_where(_compacted)):
            held.add(key)
            self._workers.start()
            current = self._logs.get(key)
            if current is not log_:  # new, or its log was reopened: open its index afresh
                if current is not None:
                    self._pool.close(_lease_key(current))
                self._covered[key] = await loop.run_in_executor(
                    self._executor, self._use, key, log_, lambda i: i.covered_offset)
                self._logs[key] = log_
            if self._covered.get(key, 0) != hw:
                self._covered[key] = await self._catch_up(key, log_, hw)
        for key in set(self._logs) - held:
            self._pool.close(_lease_key(self._logs.pop(key)))
            self._covered.pop(key, None)
        async with self._progress:
            self._progress.notify_all()

    def _leased(self, key: PartitionKey, log_: Log) -> AbstractContextManager[KeyIndex]:
        """The replica's index, open inside the block (opened if the pool closed it)."""
        return self._pool.lease(_lease_key(log_), lambda: self._open(log_, key), ENV_FILES)

    def _use(self, key: PartitionKey, log_: Log, use: Callable[[KeyIndex], T]) -> T:
        with self._leased(key, log_) as index:
            return use(index)

    async def _catch_up(self, key: PartitionKey, log_: Log, high_watermark: int) -> int:
        """Index the replica's committed records up to `high_watermark`: each read from the
        log in an IO thread, indexed in the worker process. Returns the covered offset."""
        loop = asyncio.get_running_loop()
        covered = await loop.run_in_executor(
            self._executor, self._use, key, log_,
            lambda index: catch_up_from(index, log_, high_watermark))
        directory = log_.directory / INDEX_DIRECTORY
        while covered < high_watermark:
            data, next_offset = await loop.run_in_executor(
                self._executor, functools.partial(
                    log_.read_bytes, covered, CATCH_UP_READ_BYTES, upper_bound=high_watermark,
                    skip_empty=True))
            if next_offset <= covered:
                break
            # read_bytes checked the bytes' CRCs (or knew them checked): no second pass.
            await self._workers.run(index_read, directory, self._roles.log_version(key),
                                    self._map_size, data, covered, next_offset)
            covered = next_offset
        return covered

    def _open(self, log_: Log, key: PartitionKey) -> KeyIndex:
        index = KeyIndex.open(log_.directory / INDEX_DIRECTORY,
                              created_version=self._roles.log_version(key),
                              map_size_bytes=self._map_size)
        if index.rebuilt_reason is not None:
            log.info("%s/%d: key index built from the log (%s)", key[0], key[1],
                     index.rebuilt_reason)
        return index

    # -- requests ---------------------------------------------------------------------------

    def _compacted(self, stream: str) -> StreamConfig:
        config = self._roles.stream(stream)
        if config is None:
            raise UnknownStream(stream)
        if not config.cleanup_policy.compacts:
            raise NotCompacted(stream)
        return config

    def _check_role(self, stream: str, partition: int, read_replica: bool) -> None:
        key = (stream, partition)
        if read_replica and key not in self._roles.leaders:
            follower = self._roles.followers.get(key)
            if follower is not None and follower.in_sync:
                return
        self._roles.leader_for(stream, partition)  # raises NotLeader & co.

    async def _index(self, key: PartitionKey, until: Callable[[int], bool],
                     wait_ms: int) -> Log:
        """The log of the partition's index once `until(covered)` holds (waiting up to
        `wait_ms`): lease the index with it (`_leased`)."""
        found = self._logs.get(key)
        if found is not None and until(self._covered.get(key, 0)):
            return found  # the usual case: no wait, no lock
        deadline = time.monotonic() + min(wait_ms, self._wait_ms_max) / 1000
        async with self._progress:
            while key not in self._logs or not until(self._covered.get(key, 0)):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._wake.set()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._progress.wait(), remaining)
        found = self._logs.get(key)
        if found is None:
            raise OffsetNotIndexed(key[0], key[1], 0, 0)
        return found

    async def read_covering(self, stream: str, partition: int, offset: int, wait_ms: int,
                            read: Callable[[KeyIndex], T]) -> T:
        """`read` the key index of a compacted partition held here (in a worker thread), once
        it covers every committed record below `offset` (waiting up to `wait_ms`). Raises
        OffsetNotIndexed."""
        key = (stream, partition)
        log_ = await self._index(key, lambda covered: covered >= offset, wait_ms)
        covered = self._covered.get(key, 0)
        if covered < offset:
            raise OffsetNotIndexed(stream, partition, offset, covered)
        return await asyncio.get_running_loop().run_in_executor(
            self._executor, self._use, key, log_, read)

    def get_now(self, request: m.GetRequest) -> m.GetResponse | None:
        """GET without a wait (the socket API's immediate handler): the answer, or None when
        the index does not cover `min_offset` yet and the request may wait for it (`get`)."""
        self._compacted(request.stream)
        self._check_role(request.stream, request.partition, request.read_replica)
        key = (request.stream, request.partition)
        log_ = self._logs.get(key)
        covered = self._covered.get(key, 0)
        if log_ is None or request.min_offset >= covered:
            if request.min_offset >= 0 and request.max_wait_ms > 0:
                return None
            if log_ is None:
                raise OffsetNotIndexed(request.stream, request.partition, 0, 0)
            raise OffsetNotIndexed(request.stream, request.partition, request.min_offset,
                                   covered)
        return self._lookup(key, log_, covered, request.key)

    async def get(self, request: m.GetRequest) -> m.GetResponse:
        answer = self.get_now(request)
        if answer is not None:
            return answer
        key = (request.stream, request.partition)
        log_ = await self._index(key, lambda covered: covered > request.min_offset,
                                 request.max_wait_ms)
        covered = self._covered.get(key, 0)
        if request.min_offset >= covered:
            raise OffsetNotIndexed(request.stream, request.partition, request.min_offset,
                                   covered)
        return self._lookup(key, log_, covered, request.key)

    def readable(self, stream: str, partition: int, read_replica: bool
                 ) -> tuple[PartitionKey, Log, int] | None:
        """The replica's key, log and covered offset when GETs of it may be answered from
        its index here now (jetstream.server.bulk_gets); None when they must go the usual
        way (`get_now`, which refuses or waits as it must)."""
        config = self._roles.stream(stream)
        if config is None or not config.cleanup_policy.compacts:
            return None
        try:
            self._check_role(stream, partition, read_replica)
        except JetstreamError:
            return None
        key = (stream, partition)
        log_ = self._logs.get(key)
        if log_ is None:
            return None
        return key, log_, self._covered.get(key, 0)

    def raw_entries(self, key: PartitionKey, log_: Log, record_keys: list[bytes]
                    ) -> list[bytes | None]:
        """The encoded index entries of `record_keys` in a replica `readable` gave."""
        with self._leased(key, log_) as index:
            return index.raw_entries(record_keys)

    def _lookup(self, key: PartitionKey, log_: Log, covered: int, record_key: bytes
                ) -> m.GetResponse:
        with self._leased(key, log_) as index:
            entry = index.get(record_key)
        if entry is None:
            return m.GetResponse(False, covered_offset=covered)
        return m.GetResponse(True, entry.value is None, entry.offset, entry.timestamp_ms,
                             entry.value, dict(entry.headers), covered)

    async def keys(self, request: m.KeysRequest) -> m.KeysResponse:
        self._compacted(request.stream)
        self._check_role(request.stream, request.partition, request.read_replica)
        key = (request.stream, request.partition)
        log_ = await self._index(key, lambda c: True, 0)
        with self._leased(key, log_) as index:
            return m.KeysResponse(index.keys(request.prefix, request.after, request.limit))


def _lease_key(log_: Log) -> str:
    """What a replica's index is held under in the pool: its directory."""
    return f"{log_.directory}/{INDEX_DIRECTORY}"  # no Path built: asked on every get
