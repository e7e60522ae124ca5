"""A consumer-group member: an async iterator of the messages of whatever partitions the
group's coordinator gives it.

Theory of operation
- Membership: a heartbeat task joins the group (member epoch 0), then heartbeats for as
  long as the subscription is open, each heartbeat reporting the partitions the member is
  consuming. The coordinator holds a heartbeat with nothing new for up to the heartbeat
  interval and answers at once when the member's assignment changes (long poll), so the
  next heartbeat goes out as soon as an answer came back.
- Reconciling an answer: partitions no longer assigned are revoked first — their messages
  stop being handed out at once, the member waits (up to `rebalance_timeout_ms`) until the
  consumer is done with the message it is processing (it asked for the next one), commits
  (with auto-commit) and calls `on_revoke`; only then does the next heartbeat report them
  gone, which is what lets the coordinator give them to another member. Newly assigned
  partitions start at the group's committed offset, or by the `reset` policy where it has
  none (`earliest`, `latest`, or `error`: iterating raises NoCommittedOffset); a committed
  offset that retention has passed is reset the same way. Each partition is read by a
  pump task through a partition Subscription, into one bounded queue.
- The lease: a member hands out messages only while its last answered heartbeat is less than
  a session timeout old (counted from when that heartbeat was sent, so always within the
  coordinator's own session). A member cut off from its coordinator (or paused: SIGSTOP)
  stops delivering when its lease ends, drops its partitions without committing, and joins
  again as a new member; the coordinator has given those partitions away by then. So no
  partition is consumed by two live members at once.
- Commits: `done` positions count a message once the consumer asked for the next one;
  auto-commit commits them every `auto_commit_interval_ms`, on revoke and on close.
  `commit()` commits what was handed out so far, `msg.commit()` one message's position.
  A commit carries the member id and epoch; STALE_MEMBER_EPOCH is retried with the newest.
- At least once: a message is redelivered after a rebalance or a crash when it was handed
  out but its position not committed yet — at most what was consumed since the last
  commit of that partition (the auto-commit interval's worth), plus, after a lost lease,
  the message in hand.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from jetstream.client.subscription import Subscription
from jetstream.client.types import Message, Start
from jetstream.errors import (
    FencedMember,
    JetstreamError,
    NoCommittedOffset,
    OffsetOutOfRange,
    StaleMemberEpoch,
    UnknownMemberId,
)
from jetstream.protocol import messages as m
from jetstream.tasks import cancel_and_wait, wait_event

log = logging.getLogger(__name__)

RESET_POLICIES = ("earliest", "latest", "error")
#: Batches waiting to be handed out, over all partitions.
QUEUE_BATCHES_MAX = 64
#: How long the member waits before retrying a heartbeat that failed (doubling, bounded).
RETRY_S = 0.05
RETRY_MAX_S = 1.0

Partition = tuple[str, int]
Callback = Callable[[frozenset[Partition]], Awaitable[None] | None]


class GroupClient(Protocol):
    """What a member needs of the client."""

    async def coordinator_request(self, group: str, request: m.Request,
                                  response_type: Any, *, attempts: int = ...,
                                  timeout_s: float | None = None) -> Any: ...

    async def fetch_offsets(self, group: str, partitions: Sequence[tuple[str, int]] | None = ...
                            ) -> Mapping[tuple[str, int], Any]: ...

    async def commit_offsets(self, group: str, offsets: Mapping[tuple[str, int], int], *,
                             metadata: str = "", member_id: str = "",
                             member_epoch: int = -1) -> dict[tuple[str, int], JetstreamError]:
        ...

    def forget_coordinator(self, group: str) -> None: ...


#: Opens the reader of one partition: (stream, partition, start, offset, max_bytes,
#: max_wait_ms) -> an unstarted Subscription.
OpenPartition = Callable[[str, int, Start, int | None, int, int], Subscription]


class GroupMessage(Message):
    """A Message handed out by a group member: `await msg.commit()` commits its position."""

    async def commit(self) -> None:
        member: GroupSubscription = self.__dict__["_member"]
        await member.commit({(self.stream, self.partition): self.offset + 1})


@dataclass(eq=False, slots=True)
class Feed:
    """One partition the member consumes."""

    stream: str
    partition: int
    subscription: Subscription | None = None
    pump: asyncio.Task[None] | None = None
    #: Next offset to hand out; every offset below `done` the consumer has finished.
    delivered: int = -1
    done: int = -1
    committed: int = -1
    revoked: bool = False
    error: JetstreamError | None = None


@dataclass(slots=True)
class MemberSettings:
    reset: str = "earliest"
    auto_commit: bool = True
    auto_commit_interval_ms: int = 5_000
    session_timeout_ms: int = 10_000
    heartbeat_interval_ms: int = 1_000
    rebalance_timeout_ms: int = 30_000
    max_bytes: int = 1 << 20
    max_wait_ms: int = 500
    client_id: str = ""
    on_assign: Callback | None = None
    on_revoke: Callback | None = None


class GroupSubscription:
    """`async with js.subscribe(streams, group=...) as sub: async for msg in sub: ...`."""

    def __init__(self, client: GroupClient, open_partition: OpenPartition, group: str,
                 streams: Sequence[str], selector: str, settings: MemberSettings) -> None:
        if settings.reset not in RESET_POLICIES:
            raise ValueError(f"reset must be one of {RESET_POLICIES}, got {settings.reset!r}")
        m.GroupHeartbeatRequest(group, "", 0, list(streams), selector)  # checks the names
        self._client = client
        self._open_partition = open_partition
        self.group = group
        self._streams = list(streams)
        self._selector = selector
        self._settings = settings
        self.member_id = ""
        self.member_epoch = 0
        self._lease_until = 0.0
        self._feeds: dict[Partition, Feed] = {}
        self._queue: asyncio.Queue[tuple[Feed, list[Message]]] = asyncio.Queue(
            QUEUE_BATCHES_MAX)
        self._batch: list[Message] = []
        self._batch_feed: Feed | None = None
        self._index = 0
        self._in_hand: tuple[Feed, int] | None = None
        self._idle = asyncio.Event()
        self._idle.set()
        self._tasks: list[asyncio.Task[None]] = []
        self._commit_lock = asyncio.Lock()
        #: Held while the partitions change: a rebalance (heartbeat task) and a lost lease
        #: (consumer task) must not interleave.
        self._membership_lock = asyncio.Lock()
        self._error: JetstreamError | None = None
        self._closed = False
        self._joined = asyncio.Event()
        #: How many rebalances reached this member, and messages handed out.
        self.rebalances = 0
        self.delivered = 0

    def __repr__(self) -> str:
        return (f"<GroupSubscription {self.group} member={self.member_id!r} "
                f"epoch={self.member_epoch} partitions={sorted(self._feeds)}>")

    @property
    def assignment(self) -> frozenset[Partition]:
        """The partitions this member consumes now."""
        return frozenset(p for p, feed in self._feeds.items() if not feed.revoked)

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> GroupSubscription:
        """Join the group (waits for the first answer)."""
        if not self._tasks:
            loop = asyncio.get_running_loop()
            self._tasks.append(loop.create_task(self._heartbeat_loop(),
                                                name=f"heartbeat {self.group}"))
            if self._settings.auto_commit:
                self._tasks.append(loop.create_task(self._auto_commit_loop(),
                                                    name=f"auto-commit {self.group}"))
            joined = loop.create_task(self._joined.wait())
            try:
                await asyncio.wait([joined, self._tasks[0]],
                                   return_when=asyncio.FIRST_COMPLETED)
            finally:
                await cancel_and_wait(joined)
            if self._error is not None:
                raise self._error
        return self

    async def __aenter__(self) -> GroupSubscription:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Commit what was consumed (auto-commit), leave the group, stop. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._in_hand = None
        tasks, self._tasks = self._tasks, []
        await cancel_and_wait(*tasks)
        if self._settings.auto_commit and self._lease_valid():
            with contextlib.suppress(JetstreamError):
                await self._commit_done(list(self._feeds.values()))
        await self._stop_feeds(list(self._feeds))
        if self.member_id:
            with contextlib.suppress(JetstreamError):
                await self._client.coordinator_request(
                    self.group, m.GroupHeartbeatRequest(self.group, self.member_id, -1),
                    m.GroupHeartbeatResponse, attempts=2)
        self.member_id = ""

    # -- iteration ------------------------------------------------------------------------------

    def __aiter__(self) -> GroupSubscription:
        return self

    async def __anext__(self) -> GroupMessage:
        self._finish_in_hand()
        if not self._tasks and not self._closed:
            await self.start()
        while True:
            if self._error is not None:
                raise self._error
            if self._closed:
                raise StopAsyncIteration
            if self.member_id and not self._lease_valid():
                await self._lose_all("its lease ended", unless_renewed=True)
                continue
            feed = self._batch_feed
            while feed is not None and self._index < len(self._batch):
                message = self._batch[self._index]
                self._index += 1
                if feed.revoked or self._feeds.get((feed.stream, feed.partition)) is not feed \
                        or message.offset < feed.delivered:
                    continue
                feed.delivered = message.offset + 1
                self._in_hand = (feed, message.offset + 1)
                self._idle.clear()
                self.delivered += 1
                out = tuple.__new__(GroupMessage, message)
                out.__dict__["_member"] = self
                return out
            self._batch_feed, self._batch, self._index = None, [], 0
            await self._next_batch()

    async def _next_batch(self) -> None:
        """Take the next batch from the queue, waiting at most until the lease needs a look
        (or briefly, while not a member)."""
        wait_s = max(0.01, min(1.0, self._lease_until - time.monotonic()))
        getter = asyncio.ensure_future(self._queue.get())
        try:
            done, _ = await asyncio.wait([getter], timeout=wait_s)
        except asyncio.CancelledError:
            getter.cancel()
            raise
        if getter not in done:
            getter.cancel()
            await asyncio.wait({getter})  # a cancellation of this task still propagates
            if getter.cancelled():
                return
        feed, batch = getter.result()
        if feed.error is not None and not feed.revoked \
                and self._feeds.get((feed.stream, feed.partition)) is feed:
            raise feed.error
        self._batch_feed, self._batch = feed, batch

    def _finish_in_hand(self) -> None:
        if self._in_hand is not None:
            feed, position = self._in_hand
            feed.done = max(feed.done, position)
            self._in_hand = None
        self._idle.set()

    def _lease_valid(self) -> bool:
        return time.monotonic() < self._lease_until

    # -- commits --------------------------------------------------------------------------------

    async def commit(self, offsets: Mapping[Partition, int] | None = None) -> None:
        """Commit `offsets` ((stream, partition) -> next offset to read), or the positions of
        everything handed out so far. Raises the first partition's error (a partition this
        member no longer holds: PartitionNotAssigned)."""
        if offsets is None:
            offsets = {p: f.delivered for p, f in self._feeds.items()
                       if not f.revoked and f.delivered > f.committed}
        failed = await self._commit(offsets)
        if failed:
            raise next(iter(failed.values()))

    async def _commit_done(self, feeds: list[Feed]) -> None:
        offsets = {(f.stream, f.partition): f.done for f in feeds if f.done > f.committed}
        failed = await self._commit(offsets)
        for partition, exc in failed.items():
            log.warning("group %s: commit of %s/%d failed: %s", self.group, *partition, exc)

    async def _commit(self, offsets: Mapping[Partition, int]
                      ) -> dict[Partition, JetstreamError]:
        if not offsets:
            return {}
        async with self._commit_lock:
            failed: dict[Partition, JetstreamError] = {}
            for attempt in range(3):
                answer = await self._client.commit_offsets(
                    self.group, offsets, member_id=self.member_id,
                    member_epoch=self.member_epoch)
                for partition, offset in offsets.items():
                    feed = self._feeds.get(partition)
                    if partition not in answer and feed is not None:
                        feed.committed = max(feed.committed, offset)
                stale = {p for p, exc in answer.items() if isinstance(exc, StaleMemberEpoch)}
                failed.update((p, exc) for p, exc in answer.items() if p not in stale)
                if not stale or attempt == 2:
                    failed.update((p, answer[p]) for p in stale)
                    break
                offsets = {p: offsets[p] for p in stale}
                await asyncio.sleep(RETRY_S)  # the heartbeat answer with the new epoch
            return failed

    async def _auto_commit_loop(self) -> None:
        interval = self._settings.auto_commit_interval_ms / 1000
        while not self._closed:
            await asyncio.sleep(interval)
            if self.member_id and self._lease_valid():
                try:
                    await self._commit_done([f for f in self._feeds.values() if not f.revoked])
                except JetstreamError as exc:
                    log.warning("group %s: auto-commit failed: %s", self.group, exc)

    # -- membership -----------------------------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        delay = RETRY_S
        interval_ms = self._settings.heartbeat_interval_ms
        # `_closed`, not only the cancellation: asyncio.wait_for (3.11) may swallow a
        # cancellation that lands as its answer arrives, and this loop would go on.
        while not self._closed:
            try:
                interval_ms = await self._heartbeat(interval_ms)
                delay = RETRY_S
                continue
            except (UnknownMemberId, FencedMember) as exc:
                await self._lose_all(str(exc))
                continue
            except JetstreamError as exc:
                if not exc.retriable:
                    self._fail(exc)
                    return
                self._client.forget_coordinator(self.group)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a bug must surface in the consumer, not vanish
                log.exception("group %s: the member's heartbeat failed", self.group)
                self._fail(JetstreamError(f"group {self.group}: member failed: {exc!r}"))
                return
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX_S)

    def _fail(self, exc: JetstreamError) -> None:
        self._error = exc  # the consumer raises it
        self._joined.set()

    async def _heartbeat(self, interval_ms: int) -> int:
        """One heartbeat and the reconciliation of its answer; the next interval. A failure
        to reconcile (offsets not fetched) is retried with the next heartbeat: what the
        member reports holding is what it holds."""
        settings = self._settings
        request = m.GroupHeartbeatRequest(
            self.group, self.member_id, self.member_epoch, self._streams, self._selector,
            [[s, p] for s, p in sorted(self.assignment)], settings.session_timeout_ms,
            interval_ms if self.member_id else 0, settings.client_id)
        sent = time.monotonic()
        response: m.GroupHeartbeatResponse = await self._client.coordinator_request(
            self.group, request, m.GroupHeartbeatResponse, attempts=1,
            timeout_s=interval_ms / 1000 + 5.0)
        self._lease_until = sent + response.session_timeout_ms / 1000
        self.member_id, self.member_epoch = response.member_id, response.member_epoch
        await self._reconcile(frozenset((s, p) for s, p in response.assignment))
        self._joined.set()
        return response.heartbeat_interval_ms

    async def _reconcile(self, assignment: frozenset[Partition]) -> None:
        async with self._membership_lock:
            held = self.assignment
            revoked, added = held - assignment, assignment - held
            if revoked or added:
                self.rebalances += 1
            if revoked:
                for partition in revoked:
                    self._feeds[partition].revoked = True
                await wait_event(self._idle, self._settings.rebalance_timeout_ms / 1000)
                feeds = [self._feeds[p] for p in revoked]
                if self._settings.auto_commit:
                    try:
                        await self._commit_done(feeds)
                    except JetstreamError as exc:
                        log.warning("group %s: commit on revoke failed: %s", self.group, exc)
                await self._stop_feeds(list(revoked))
                await _call(self._settings.on_revoke, frozenset(revoked))
            if added:
                await self._start_feeds(sorted(added))
                await _call(self._settings.on_assign, frozenset(added))

    async def _lose_all(self, why: str, *, unless_renewed: bool = False) -> None:
        """The member lost its membership (lease ended, fenced, unknown): stop consuming
        everything without committing, and join again as a new member. `unless_renewed`:
        not if a heartbeat answered while this waited for a rebalance to finish."""
        async with self._membership_lock:
            if unless_renewed and self._lease_valid():
                return
            lost = frozenset(self._feeds)
            self._batch_feed, self._batch, self._index, self._in_hand = None, [], 0, None
            if self.member_id:
                log.warning("group %s: member %s lost its partitions (%s)", self.group,
                            self.member_id, why)
            self.member_id, self.member_epoch, self._lease_until = "", 0, 0.0
            await self._stop_feeds(list(lost))
            if lost:
                self.rebalances += 1
                await _call(self._settings.on_revoke, lost)

    # -- partitions -----------------------------------------------------------------------------

    async def _start_feeds(self, partitions: list[Partition]) -> None:
        committed = await self._client.fetch_offsets(self.group, partitions)
        for stream, partition in partitions:
            feed = Feed(stream, partition)
            found = committed.get((stream, partition))
            if found is not None:
                feed.delivered = feed.done = feed.committed = found.offset
            self._feeds[(stream, partition)] = feed
            feed.pump = asyncio.get_running_loop().create_task(
                self._pump(feed), name=f"group {self.group} {stream}/{partition}")

    async def _stop_feeds(self, partitions: list[Partition]) -> None:
        feeds = [self._feeds.pop(p) for p in partitions if p in self._feeds]
        for feed in feeds:
            feed.revoked = True
        # Cancelled again until done: a cancellation a fetch swallowed (asyncio.wait_for in
        # 3.11) would leave a pump blocked on the full queue.
        await cancel_and_wait(*(f.pump for f in feeds))
        for feed in feeds:
            if feed.subscription is not None:
                await feed.subscription.close()

    def _subscription(self, feed: Feed, *, reset: bool) -> Subscription:
        settings = self._settings
        if feed.delivered >= 0 and not reset:
            start, offset = Start.OFFSET, feed.delivered
        elif settings.reset == "error":
            raise NoCommittedOffset(self.group, feed.stream, feed.partition)
        else:
            start = Start.EARLIEST if settings.reset == "earliest" else Start.NEW_ONLY
            offset = None
        return self._open_partition(feed.stream, feed.partition, start, offset,
                                    settings.max_bytes, settings.max_wait_ms)

    async def _pump(self, feed: Feed) -> None:
        reset = False
        while not feed.revoked:
            try:
                feed.subscription = self._subscription(feed, reset=reset)
                while not feed.revoked:
                    batch = await feed.subscription.next_batch()
                    if batch is None:
                        return
                    await self._queue.put((feed, batch))
            except OffsetOutOfRange:  # the committed offset is gone (retention): reset
                log.warning("group %s: %s/%d offset %d out of range: reset %s", self.group,
                            feed.stream, feed.partition, feed.delivered, self._settings.reset)
                if feed.subscription is not None:
                    await feed.subscription.close()
                reset = True
                feed.delivered = -1
            except JetstreamError as exc:
                feed.error = exc
                await self._queue.put((feed, []))  # the consumer raises it
                return


async def _call(callback: Callback | None, partitions: frozenset[Partition]) -> None:
    if callback is None:
        return
    result = callback(partitions)
    if result is not None:
        await result
