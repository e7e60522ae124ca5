"""This broker's fetch sessions, one per leader broker it follows partitions of (Kafka's
replica fetcher thread with a KIP-227 incremental fetch session).

Theory of operation: each PartitionFollower truncates against its leader, then joins the
ReplicaFetcher of its leader's broker (`follow`), and waits there until the leader refuses
its partition or the session fails. The fetcher runs one task and one connection (shared
with the followers' truncation requests) and loops:
1. Build a request naming only the partitions whose session entry changed since it last
   named them (`PartitionFollower.session_entry`: an append moved the LEO, unfit or verify
   changed, a partition joined) and those that left; a new session (after an error, or at
   the start) names them all, over as many requests as REPLICA_FETCH_CHANGES_MAX takes.
   While changes are left the request does not wait at the leader.
2. Send it; the leader answers the partitions with something to say, or waits up to
   `replica_fetch_wait_ms`. A partition that joins while a request waits sends a `wake`, so
   its first records do not wait out the long poll.
3. Hand each answer to its follower (`take_answer`: append; the appends that run in a
   thread, under fsync `always`, are awaited all at once, with no task each; `end_answer`:
   learn the HW), and mark the answered partitions changed (their LEO moved). A partition
   answered with an error leaves: its follower truncates again and rejoins.
A refused session (lost, wrong epoch) is opened again at once, naming every partition; a
failed connection fails every partition of the session (each backs off, reports a silent
leader, truncates again). The data disk's state is read once per request: when it turns
full or frees up, every partition says so (unfit "disk_full"), and one whose append found
no room is named again after each disk check so that the leader sends its records again.
Nothing here is per partition while nothing happens: an idle session costs one request
per `replica_fetch_wait_ms`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from jetstream.client.connection import BrokerConnection
from jetstream.errors import (
    BrokerUnavailable,
    FetchSessionNotFound,
    InvalidFetchSessionEpoch,
    JetstreamError,
)
from jetstream.protocol import messages as m
from jetstream.security.tls import client_ssl
from jetstream.server.config import BrokerConfig
from jetstream.server.disk import DiskMonitor
from jetstream.server.follower import PartitionFollower
from jetstream.server.gatekeeper import peer_credentials
from jetstream.tasks import cancel_and_wait

log = logging.getLogger(__name__)

PartitionKey = tuple[str, int]
#: The socket API address of a broker ("host:port"), or None when unknown.
AddressOf = Callable[[int], str | None]
#: Most bytes of records one answer carries (each partition's share: replica_fetch_bytes_max).
SESSION_FETCH_BYTES_MAX = 16 * 1024 * 1024
BACKOFF_MS_MIN = 50
BACKOFF_MS_MAX = 1_000


@dataclass(slots=True)
class _Member:
    follower: PartitionFollower
    done: asyncio.Future[None]


class ReplicaFetcher:
    """This broker's session at leader broker `leader_id` (see the module docstring)."""

    def __init__(self, leader_id: int, config: BrokerConfig, address_of: AddressOf,
                 disk: DiskMonitor | None = None) -> None:
        self.leader_id = leader_id
        self._config = config
        self._address_of = address_of
        self._disk = disk
        self._members: dict[PartitionKey, _Member] = {}
        #: What the leader's session holds of each partition, as last named.
        self._sent: dict[PartitionKey, list[Any]] = {}
        self._changed: set[PartitionKey] = set()
        self._forgotten: set[PartitionKey] = set()
        #: Named again after each disk check even if unchanged (an append found no room).
        self._retry: set[PartitionKey] = set()
        #: Followers whose HW moved past its checkpoint, with when it first did (monotonic
        #: seconds), oldest first: each exchange checkpoints the due ones only.
        self._hw_unsaved: dict[PartitionKey, float] = {}
        self._session_id = 0
        self._epoch = 0
        self._disk_full = False
        self._conn: BrokerConnection | None = None
        self._connecting: asyncio.Task[BrokerConnection] | None = None
        self._kick = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        #: The session epoch of the request waiting at the leader (0: none waits).
        self._parked_epoch = 0
        self._woken = False
        self._wakes: set[asyncio.Task[None]] = set()
        self.last_answer_s = time.monotonic()
        #: Counters for /metrics and the structural tests.
        self.requests = 0
        self.sessions_opened = 0

    @property
    def partitions(self) -> int:
        return len(self._members)

    # -- what followers call --------------------------------------------------------------------

    async def connection(self) -> BrokerConnection:
        """The open connection, or the outcome of one attempt to open it that every caller
        waiting meanwhile shares (a dead leader costs one connect timeout, not one per
        partition)."""
        if self._conn is not None and not self._conn.closed:
            return self._conn
        if self._connecting is None or self._connecting.done():
            self._connecting = asyncio.get_running_loop().create_task(self._connect())
        return await asyncio.shield(self._connecting)

    async def _connect(self) -> BrokerConnection:
        address = self._address_of(self.leader_id)
        if address is None:
            raise OSError(f"address of broker {self.leader_id} unknown")
        # A silent leader (a paused process, a network dropping packets) must show up as a
        # timeout within the leader timeout, not the client default of many seconds.
        timeout_s = self._config.replica_leader_timeout_ms / 1000
        conn = BrokerConnection(address, client_id=f"replica-{self._config.broker_id}",
                                connect_timeout_s=timeout_s, request_timeout_s=timeout_s,
                                tls=client_ssl(self._config.peer_tls),
                                credentials=peer_credentials(self._config))
        await conn.open()
        self._conn = conn
        return conn

    async def follow(self, follower: PartitionFollower) -> None:
        key = (follower.stream.name, follower.state.partition)
        old = self._members.get(key)
        if old is not None and not old.done.done():
            old.done.set_exception(JetstreamError(f"{follower.name} joined again"))
        member = _Member(follower, asyncio.get_running_loop().create_future())
        self._members[key] = member
        self._forgotten.discard(key)
        self._touch(key)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name=f"fetch from {self.leader_id}")
        try:
            await member.done
        finally:
            if self._members.get(key) is member:
                del self._members[key]
                self._changed.discard(key)
                self._retry.discard(key)
                self._hw_unsaved.pop(key, None)
                if self._sent.pop(key, None) is not None:
                    self._forgotten.add(key)

    def touch(self, key: PartitionKey) -> None:
        """The partition's session entry may have changed (damage found or healed)."""
        if key in self._members:
            self._touch(key)

    def _touch(self, key: PartitionKey) -> None:
        self._changed.add(key)
        self._kick.set()
        if self._parked_epoch and not self._woken:
            self._woken = True
            task = asyncio.get_running_loop().create_task(self._wake(self._parked_epoch))
            self._wakes.add(task)
            task.add_done_callback(self._wakes.discard)

    async def _wake(self, epoch: int) -> None:
        conn = self._conn
        if conn is None or conn.closed or not self._session_id:
            return
        with contextlib.suppress(JetstreamError, OSError):
            await conn.request(m.ReplicaFetchRequest(
                self._config.broker_id, self._session_id, epoch, 0, 1, 1, wake=True))

    # -- the loop -------------------------------------------------------------------------------

    async def _run(self) -> None:
        backoff_ms = BACKOFF_MS_MIN
        while True:
            if not self._members and not self._forgotten:
                self._kick.clear()
                await self._kick.wait()
                continue
            try:
                conn = await self.connection()
                request = self._next_request()
                await self._exchange(conn, request)
                backoff_ms = BACKOFF_MS_MIN
            except (FetchSessionNotFound, InvalidFetchSessionEpoch) as exc:
                log.info("fetch session at broker %d: %s: opening a new one", self.leader_id,
                         exc)
                self._session_id = 0
            except (JetstreamError, OSError) as exc:
                log.info("fetch session at broker %d failed: %s", self.leader_id, exc)
                await self._fail_all(exc)
                await asyncio.sleep(backoff_ms / 1000)
                backoff_ms = min(2 * backoff_ms, BACKOFF_MS_MAX)

    def _next_request(self) -> m.ReplicaFetchRequest:
        full = self._disk is not None and self._disk.full
        if full != self._disk_full:
            self._disk_full = full
            self._changed.update(self._members)
        if self._session_id == 0:
            self._sent.clear()
            self._forgotten.clear()
            self._changed = set(self._members)
        forced, self._retry = self._retry, set()
        self._changed |= forced
        limit = m.REPLICA_FETCH_CHANGES_MAX
        forgotten: list[list[object]] = []
        while self._forgotten and len(forgotten) < limit:
            forgotten.append(list(self._forgotten.pop()))
        entries: list[list[object]] = []
        while self._changed and len(entries) + len(forgotten) < limit:
            key = self._changed.pop()
            member = self._members.get(key)
            if member is None:
                continue
            try:
                entry = member.follower.session_entry()
            except JetstreamError as exc:
                self._fail(key, exc)
                continue
            if entry != self._sent.get(key) or key in forced:
                entries.append(entry)
                self._sent[key] = entry
        more = bool(self._changed or self._forgotten)
        opening = self._session_id == 0
        self._epoch = 0 if opening else self._epoch + 1
        return m.ReplicaFetchRequest(
            self._config.broker_id, self._session_id, self._epoch,
            0 if more or opening else self._config.replica_fetch_wait_ms,
            SESSION_FETCH_BYTES_MAX,
            min(self._config.replica_fetch_bytes_max, SESSION_FETCH_BYTES_MAX),
            entries, forgotten)

    async def _exchange(self, conn: BrokerConnection, request: m.ReplicaFetchRequest) -> None:
        self.requests += 1
        if request.session_id == 0:
            self.sessions_opened += 1
        timeout_s = (self._config.replica_leader_timeout_ms + request.max_wait_ms) / 1000
        self._parked_epoch = request.session_epoch if request.max_wait_ms else 0
        self._woken = False
        try:
            response, payload = await conn.with_payload(request, m.ReplicaFetchResponse,
                                                        timeout_s=timeout_s)
        finally:
            self._parked_epoch = 0
        self.last_answer_s = time.monotonic()
        if request.session_id == 0:
            self._session_id = response.session_id
        appending: list[tuple[PartitionFollower, m.PartitionAnswer, asyncio.Future[None]]] = []
        retention: list[tuple[PartitionFollower, m.PartitionAnswer]] = []
        for answer, records in m.decode_answers(response, payload):
            member = self._members.get(answer.key)
            if member is None:
                continue  # it left meanwhile
            if answer.error is not None:
                self._sent.pop(answer.key, None)  # the leader dropped it from the session
                self._fail(answer.key, answer.error)
                continue
            follower = member.follower
            try:
                running = follower.take_answer(answer, records)
            except Exception as exc:  # the append failed on the loop
                self._end(follower, answer, exc, retention)
                continue
            if running is None:
                self._end(follower, answer, None, retention)
            else:
                appending.append((follower, answer, running))
        if appending:
            # Not cancelled with this task: an append in its thread lands either way.
            await asyncio.wait([running for _f, _a, running in appending])
            for follower, answer, running in appending:
                self._end(follower, answer, _failure(running), retention)
        if retention:
            results = await asyncio.gather(
                *(follower.follow_retention(answer) for follower, answer in retention),
                return_exceptions=True)
            for (follower, answer), result in zip(retention, results, strict=True):
                if isinstance(result, BaseException):
                    self._failed(follower, answer.key, result)
        self._checkpoint_due()

    def _end(self, follower: PartitionFollower, answer: m.PartitionAnswer,
             failure: Exception | None,
             retention: list[tuple[PartitionFollower, m.PartitionAnswer]]) -> None:
        """The follower's answer is appended (or `failure`): it learns the HW, and its
        partition is named again in the next request (its LEO moved)."""
        key = answer.key
        try:
            if follower.end_answer(answer, failure):
                retention.append((follower, answer))
        except Exception as exc:
            self._failed(follower, key, exc)
            return
        self._changed.add(key)
        if follower.retry_wanted:
            self._retry.add(key)
        if key not in self._hw_unsaved and follower.hw_unsaved:
            self._hw_unsaved[key] = self.last_answer_s

    def _checkpoint_due(self) -> None:
        """Checkpoint the HW of the followers whose HW moved `checkpoint_interval_ms` ago or
        more (as a leader's is: never at once, so that a burst over many partitions writes
        no file in the path of its acks)."""
        due = time.monotonic() - self._config.checkpoint_interval_ms / 1000
        while self._hw_unsaved:
            key, since = next(iter(self._hw_unsaved.items()))
            if since > due:
                return
            del self._hw_unsaved[key]
            member = self._members.get(key)
            if member is not None:
                member.follower.checkpoint()

    def _failed(self, follower: PartitionFollower, key: PartitionKey,
                exc: BaseException) -> None:
        if not isinstance(exc, JetstreamError | OSError):
            log.error("%s: appending what the leader sent failed", follower.name,
                      exc_info=exc)
        self._fail(key, exc if isinstance(exc, Exception) else JetstreamError(str(exc)))

    # -- failures -------------------------------------------------------------------------------

    def _fail(self, key: PartitionKey, exc: Exception) -> None:
        member = self._members.get(key)
        if member is not None and not member.done.done():
            member.done.set_exception(exc)

    async def _fail_all(self, exc: Exception) -> None:
        """The session failed: every partition truncates again and rejoins."""
        self._session_id = 0
        error = exc if isinstance(exc, JetstreamError) else BrokerUnavailable(
            f"broker {self.leader_id}", str(exc))
        for key, member in list(self._members.items()):
            member.follower.heard_from_leader(self.last_answer_s)
            self._fail(key, error)
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close()

    async def close(self) -> None:
        await cancel_and_wait(self._task, self._connecting, *self._wakes)
        self._task = None
        for key in list(self._members):
            self._fail(key, JetstreamError("the broker is stopping"))
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close()


class ReplicaFetchers:
    """This broker's ReplicaFetcher per leader broker, made on first use."""

    def __init__(self, config: BrokerConfig, address_of: AddressOf,
                 disk: DiskMonitor | None = None) -> None:
        self._config = config
        self._address_of = address_of
        self._disk = disk
        self._fetchers: dict[int, ReplicaFetcher] = {}

    def for_leader(self, leader_id: int) -> ReplicaFetcher:
        fetcher = self._fetchers.get(leader_id)
        if fetcher is None:
            fetcher = self._fetchers[leader_id] = ReplicaFetcher(
                leader_id, self._config, self._address_of, self._disk)
        return fetcher

    def touch(self, leader_id: int, key: PartitionKey) -> None:
        fetcher = self._fetchers.get(leader_id)
        if fetcher is not None:
            fetcher.touch(key)

    def render_metrics(self) -> list[str]:
        """Prometheus lines: this broker's sessions as a follower."""
        fetchers = self._fetchers.values()
        return [
            "# HELP jetstream_replica_fetchers Fetch sessions of this broker at leaders.",
            "# TYPE jetstream_replica_fetchers gauge",
            f"jetstream_replica_fetchers {len(self._fetchers)}",
            "# TYPE jetstream_replica_fetcher_partitions gauge",
            f"jetstream_replica_fetcher_partitions {sum(f.partitions for f in fetchers)}",
            "# HELP jetstream_replica_fetch_requests_total REPLICA_FETCH requests sent.",
            "# TYPE jetstream_replica_fetch_requests_total counter",
            f"jetstream_replica_fetch_requests_total {sum(f.requests for f in fetchers)}",
            "# TYPE jetstream_replica_fetch_sessions_opened_total counter",
            ("jetstream_replica_fetch_sessions_opened_total "
             f"{sum(f.sessions_opened for f in fetchers)}"),
        ]

    async def close(self) -> None:
        for fetcher in self._fetchers.values():
            await fetcher.close()
        self._fetchers.clear()


def _failure(done: asyncio.Future[None]) -> Exception | None:
    """How a finished append failed (a cancelled one: it may not have landed)."""
    if done.cancelled():
        return JetstreamError("the append was cancelled")
    exc = done.exception()
    return exc if exc is None or isinstance(exc, Exception) else JetstreamError(str(exc))
