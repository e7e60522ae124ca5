"""The fetch sessions a leader broker holds for its followers' brokers (REPLICA_FETCH).

Theory of operation (Kafka's KIP-227 incremental fetch sessions): a follower broker fetches
every partition it follows here through one session (jetstream.protocol.replica_fetch).
The session keeps, per partition, where the follower fetches from (offset, leader epoch,
unfit, verify) and the high watermark and log start offset it was last told. A request
updates the entries it names (each one is a fetch of that partition: the ISR core hears of
it, `PartitionLeader.follower_fetched`) and marks them dirty; a partition leader marks its key
dirty in every session holding it when its records, its HW or its log start change
(`changed`, called by the leader as it wakes its readers and after retention). A request is
answered with the dirty partitions that have something to say (records at or past their
offset, an HW or a log start not told yet, an error), and waits for one to turn up when none
has: an idle pair of brokers exchanges one request per `max_wait_ms`, and the leader does
work for the partitions that changed only.

A session names a partition only when its entry changes, so the ISR core of an idle
partition would not hear of its followers: a leader asks `standing` before its ISR tick,
and each session holding the partition answers the offset the follower fetches at and when
it last said so (now, while one of its requests waits here).

Bounds: one session per follower broker (a new one replaces the old), at most SESSIONS_MAX
sessions (the least recently used goes), at most SESSION_PARTITIONS_MAX partitions each; a
partition answered with an error leaves the session (the follower names it again once it
follows it anew).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from jetstream.errors import (
    FencedLeaderEpoch,
    FetchSessionNotFound,
    InvalidFetchSessionEpoch,
    JetstreamError,
    NotLeader,
    OffsetOutOfRange,
    ProtocolError,
)
from jetstream.isr.leader import Unfit, as_unfit
from jetstream.protocol import messages as m
from jetstream.protocol.frames import U32_MAX
from jetstream.server.partition import PartitionLeader
from jetstream.server.scheduler import monotonic_ms
from jetstream.stream.file_slice import FileSlice
from jetstream.tasks import wait_event

log = logging.getLogger(__name__)

PartitionKey = tuple[str, int]
#: Most sessions held at once (one per follower broker).
SESSIONS_MAX = 256
#: Most partitions one session holds.
SESSION_PARTITIONS_MAX = 100_000


@dataclass(slots=True)
class _Entry:
    offset: int
    leader_epoch: int
    unfit: Unfit
    verify: bool
    hw_told: int = -1
    log_start_told: int = -1


class FetchSession:
    """One follower broker's partitions here (see the module docstring)."""

    def __init__(self, session_id: int, replica_id: int) -> None:
        self.id = session_id
        self.replica_id = replica_id
        self.epoch = 0
        self.entries: dict[PartitionKey, _Entry] = {}
        self.dirty: set[PartitionKey] = set()
        self.wake = asyncio.Event()
        #: When its last request came (a monotonic ms); a request waiting here: `parked`.
        self.last_request_ms = monotonic_ms()
        self.parked = False
        #: Replaced or evicted: a request waiting on it returns.
        self.closed = False
        #: A wake request came (a partition joined at the follower): a waiting request
        #: returns now, so that the next one names it.
        self.woken = False

    def mark(self, key: PartitionKey) -> None:
        if key in self.entries:
            self.dirty.add(key)
            self.wake.set()


class FetchSessions:
    """The sessions of this broker, as a leader (see the module docstring)."""

    def __init__(self, leader_of: Callable[[PartitionKey], PartitionLeader | None],
                 not_leading: Callable[[PartitionKey], NotLeader] = lambda key: NotLeader(*key),
                 hw_delay_ms: int = 0) -> None:
        """`not_leading` is the refusal of a partition no leader role serves here: it names
        the leader the metadata knows, this broker itself while its role starts.
        `hw_delay_ms`: how long a waiting request holds news of a new HW alone (no records,
        no new log start) before it answers with it (see `fetch`)."""
        self._leader_of = leader_of
        self._not_leading = not_leading
        self._hw_delay_s = hw_delay_ms / 1000
        self._sessions: OrderedDict[int, FetchSession] = OrderedDict()
        self._by_replica: dict[int, FetchSession] = {}
        self._by_key: dict[PartitionKey, set[FetchSession]] = {}
        self._next_id = random.randint(1, U32_MAX)
        #: Counters for /metrics and the structural tests.
        self.requests = 0
        self.waits = 0
        self.answers = 0

    # -- what leaders call ----------------------------------------------------------------------

    def changed(self, key: PartitionKey) -> None:
        """The partition's records, HW or leadership changed here."""
        for session in self._by_key.get(key, ()):
            session.mark(key)

    def standing(self, key: PartitionKey) -> list[tuple[int, int, int]]:
        now = monotonic_ms()
        return [(s.replica_id, s.entries[key].offset, now if s.parked else s.last_request_ms)
                for s in self._by_key.get(key, ()) if not s.closed]

    @property
    def count(self) -> int:
        return len(self._sessions)

    def partitions(self) -> int:
        return sum(len(s.entries) for s in self._sessions.values())

    # -- requests -------------------------------------------------------------------------------

    async def fetch(self, request: m.ReplicaFetchRequest
                    ) -> tuple[m.ReplicaFetchResponse, list[FileSlice]]:
        self.requests += 1
        if request.wake:
            session = self._session_of(request)
            session.woken = True
            session.wake.set()
            return m.ReplicaFetchResponse(session.id), []
        session = self._open(request) if request.session_id == 0 else self._next(request)
        session.last_request_ms = monotonic_ms()
        session.woken = False
        for key in request.forgotten_keys():
            self._forget(session, key)
        errors: dict[PartitionKey, JetstreamError] = {}
        for sp in request.changed():
            if sp.key not in session.entries and len(session.entries) >= \
                    SESSION_PARTITIONS_MAX:
                raise ProtocolError(f"a fetch session holds at most {SESSION_PARTITIONS_MAX} "
                                    "partitions", field="partitions")
            try:
                unfit = as_unfit(sp.unfit)
            except ValueError:
                raise ProtocolError(f"unknown unfit reason {sp.unfit!r}",
                                    field="partitions") from None
            entry = session.entries.get(sp.key)
            if entry is None:
                entry = session.entries[sp.key] = _Entry(sp.offset, sp.leader_epoch, unfit,
                                                         sp.verify)
                self._by_key.setdefault(sp.key, set()).add(session)
            else:
                entry.offset, entry.leader_epoch = sp.offset, sp.leader_epoch
                entry.unfit, entry.verify = unfit, sp.verify
            session.dirty.add(sp.key)
            leader = self._leader_of(sp.key)
            try:
                if leader is None:
                    raise self._not_leading(sp.key)
                await leader.follower_fetched(request.replica_id, sp.offset, sp.leader_epoch,
                                              unfit)
            except JetstreamError as exc:
                errors[sp.key] = exc
        # A new HW alone (the follower's own fetch just advanced it) waits `hw_delay_s` for
        # records to ride with: at a steady rate the HW travels with the next records, and a
        # commit costs the follower one round trip instead of two.
        deadline = time.monotonic() + request.max_wait_ms / 1000
        hw_due: float | None = None
        while True:
            session.wake.clear()
            now = time.monotonic()
            hw_now = not self._hw_delay_s or now >= deadline or (
                hw_due is not None and now >= hw_due)
            answers, pieces, hw_held = await self._collect(session, errors, request, hw_now)
            remaining = deadline - now
            if answers or remaining <= 0 or session.closed or session.woken:
                break
            if hw_held and hw_due is None:
                hw_due = now + self._hw_delay_s
            wait_s = min(remaining, hw_due - now) if hw_held and hw_due is not None \
                else remaining
            self.waits += 1
            session.parked = True
            try:
                await wait_event(session.wake, wait_s)
            finally:
                session.parked = False
                session.last_request_ms = monotonic_ms()
        self.answers += len(answers)
        return m.ReplicaFetchResponse(session.id, answers), pieces

    async def _collect(self, session: FetchSession, errors: dict[PartitionKey, JetstreamError],
                       request: m.ReplicaFetchRequest, hw_now: bool
                       ) -> tuple[list[list[Any]], list[FileSlice], bool]:
        """The dirty partitions that have something to say, their records within the
        request's byte limits; and whether news of a new HW alone was held back (unless
        `hw_now`: such partitions stay dirty)."""
        answers: list[list[Any]] = []
        pieces: list[FileSlice] = []
        held: list[tuple[PartitionKey, _Entry, PartitionLeader]] = []
        budget = request.max_bytes
        for key in list(session.dirty):
            if len(answers) >= m.REPLICA_FETCH_ANSWERS_MAX:
                break
            entry = session.entries.get(key)
            if entry is None:
                session.dirty.discard(key)
                continue
            leader = self._leader_of(key)
            error = errors.pop(key, None) or self._refusal(key, leader, entry)
            piece = None
            if error is None:
                assert leader is not None
                if entry.offset < leader.log.log_end_offset and budget > 0:
                    try:
                        piece = await leader.replica_read(
                            entry.offset, min(request.partition_bytes_max, budget),
                            verify=entry.verify)
                    except JetstreamError as exc:
                        error = exc
                elif entry.offset < leader.log.log_end_offset:
                    continue  # no room left in this answer: the next request reads it
            if error is not None:
                answers.append(m.PartitionAnswer(key[0], key[1], error).to_wire())
                self._forget(session, key)
                continue
            assert leader is not None
            length = 0 if piece is None else piece.length
            hw, log_ = leader.high_watermark, leader.log
            if not length and log_.log_start_offset == entry.log_start_told and (
                    hw == entry.hw_told or (not hw_now and entry.hw_told >= 0)):
                if piece is not None:
                    piece.close()
                if hw == entry.hw_told:
                    session.dirty.discard(key)  # nothing to say
                else:
                    held.append((key, entry, leader))  # stays dirty
                continue
            answers.append(self._told(session, key, entry, leader, piece))
            if piece is not None and length:
                pieces.append(piece)
                budget -= length
            elif piece is not None:
                piece.close()
        if answers:  # an answer goes out anyway: held HWs ride with it
            room = m.REPLICA_FETCH_ANSWERS_MAX - len(answers)
            answers.extend(self._told(session, key, entry, leader, None)
                           for key, entry, leader in held[:room])
            held = held[room:]
        return answers, pieces, bool(held)

    @staticmethod
    def _told(session: FetchSession, key: PartitionKey, entry: _Entry,
              leader: PartitionLeader, piece: FileSlice | None) -> list[Any]:
        """The answer for `key` (its records in `piece`, if any; wire form), now told to the
        session."""
        session.dirty.discard(key)
        log_ = leader.log
        entry.hw_told, entry.log_start_told = leader.high_watermark, log_.log_start_offset
        return m.PartitionAnswer.wire_of(
            key[0], key[1], leader.high_watermark, log_.log_start_offset,
            log_.log_end_offset, entry.offset if piece is None else piece.next_offset,
            leader.state.leader_epoch, 0 if piece is None else piece.length)

    def _refusal(self, key: PartitionKey, leader: PartitionLeader | None, entry: _Entry
                 ) -> JetstreamError | None:
        if leader is None or not leader.serving:
            return self._not_leading(key)
        if leader.state.leader_epoch != entry.leader_epoch:
            return FencedLeaderEpoch(key[0], key[1], entry.leader_epoch,
                                     leader.state.leader_epoch)
        if entry.offset > leader.log.log_end_offset:
            return OffsetOutOfRange(entry.offset, leader.log.log_start_offset,
                                    leader.log.log_end_offset)
        return None

    # -- sessions -------------------------------------------------------------------------------

    def _open(self, request: m.ReplicaFetchRequest) -> FetchSession:
        old = self._by_replica.get(request.replica_id)
        if old is not None:
            self._close(old)
        while len(self._sessions) >= SESSIONS_MAX:
            self._close(next(iter(self._sessions.values())))
        session_id = self._next_id
        self._next_id = self._next_id % U32_MAX + 1
        session = FetchSession(session_id, request.replica_id)
        self._sessions[session_id] = session
        self._by_replica[request.replica_id] = session
        log.info("fetch session %d opened for broker %d", session_id, request.replica_id)
        return session

    def _session_of(self, request: m.ReplicaFetchRequest) -> FetchSession:
        session = self._sessions.get(request.session_id)
        if session is None or session.replica_id != request.replica_id:
            raise FetchSessionNotFound(request.session_id)
        return session

    def _next(self, request: m.ReplicaFetchRequest) -> FetchSession:
        session = self._session_of(request)
        if request.session_epoch != session.epoch + 1:
            expected = session.epoch + 1
            self._close(session)  # its entries can no longer be trusted
            raise InvalidFetchSessionEpoch(request.session_id, request.session_epoch, expected)
        session.epoch = request.session_epoch
        self._sessions.move_to_end(session.id)
        return session

    def _forget(self, session: FetchSession, key: PartitionKey) -> None:
        session.entries.pop(key, None)
        session.dirty.discard(key)
        holders = self._by_key.get(key)
        if holders is not None:
            holders.discard(session)
            if not holders:
                del self._by_key[key]

    def _close(self, session: FetchSession) -> None:
        for key in list(session.entries):
            self._forget(session, key)
        session.closed = True
        session.wake.set()
        self._sessions.pop(session.id, None)
        if self._by_replica.get(session.replica_id) is session:
            del self._by_replica[session.replica_id]

    def render_metrics(self) -> list[str]:
        """Prometheus lines: the sessions held here as a leader."""
        return [
            "# TYPE jetstream_fetch_sessions gauge",
            f"jetstream_fetch_sessions {len(self._sessions)}",
            "# TYPE jetstream_fetch_session_partitions gauge",
            f"jetstream_fetch_session_partitions {self.partitions()}",
            "# HELP jetstream_fetch_session_requests_total REPLICA_FETCH requests served.",
            "# TYPE jetstream_fetch_session_requests_total counter",
            f"jetstream_fetch_session_requests_total {self.requests}",
            "# HELP jetstream_fetch_session_waits_total Times a request waited for data.",
            "# TYPE jetstream_fetch_session_waits_total counter",
            f"jetstream_fetch_session_waits_total {self.waits}",
            "# HELP jetstream_fetch_session_answers_total Partitions answered.",
            "# TYPE jetstream_fetch_session_answers_total counter",
            f"jetstream_fetch_session_answers_total {self.answers}",
        ]

    def close_all(self) -> None:
        for session in list(self._sessions.values()):
            self._close(session)
