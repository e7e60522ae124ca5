"""Damage in this broker's replicas: found, served around, healed, reported.

Theory of operation (the rules are jetstream.isr.damage's; the checks the log's own,
jetstream.stream.log_integrity)
- Found: a read of bytes not checked since they were written or opened checks them first
  (a leader serving a consumer or a follower, a follower serving `read_isr_replica`); the
  scrubber re-reads every segment of every replica here at `scrub_bytes_per_s`, one pass at
  start and then every `scrub_interval_ms`, off the event loop (one thread of its own);
  `jetstream scrub` runs one pass on demand at full speed. A consumer or follower that meets
  a CRC mismatch in bytes sent as checked (damage since the check) asks again with `verify`.
- Isolated: a follower whose log holds damage says `unfit: corrupt` with every fetch, so the
  leader removes it from the ISR at once and keeps it out until it is healed: it cannot be
  elected with a damaged copy.
- Served around: a leader whose read meets damage at or below its HW asks the other in-sync
  replicas for their checked copy of those offsets (REPLICA_RANGE) and heals from it before
  serving; when the copy cannot be written in place it serves that copy and hands its
  leadership to a replica that has one. A reader sees the right data, or a retriable
  RANGE_REPAIRING while no copy can be had, or RANGE_LOST when every replica's copy is
  damaged — never a wrong record and never a silent gap.
- Healed: the healthy copy is written over the damage in place (same bytes, offsets,
  epochs, indexes), or a follower drops its log from the damage and fetches it again.
- Reported: each damage is logged with its file, byte range and offsets, counted in
  /metrics, and listed per partition in `stream info` until healed; lost ranges stay listed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from jetstream.client.connection import BrokerConnection
from jetstream.errors import CorruptRecord, JetstreamError, LogClosed, RangeLost, RangeRepairing
from jetstream.isr.damage import Action, CopyAnswer, decide, peers_to_ask
from jetstream.protocol import messages as m
from jetstream.security.tls import client_ssl
from jetstream.server.config import BrokerConfig
from jetstream.server.epoch_fence import PartitionKey
from jetstream.server.gatekeeper import peer_credentials
from jetstream.server.roles import Roles
from jetstream.stream import format as fmt
from jetstream.stream.file_slice import FileSlice
from jetstream.stream.log import Log
from jetstream.stream.verified import Damage, batches_span

log = logging.getLogger(__name__)

#: Most bytes of a healthy copy held in memory for one repair.
REPAIR_BYTES_MAX = 64 * 1024 * 1024
#: Bytes asked for per REPLICA_RANGE request.
REPLICA_RANGE_BYTES = 4 * 1024 * 1024
#: A range found lost is asked for again at most this often (each reader meanwhile gets
#: RANGE_LOST at once).
LOST_RETRY_S = 10.0
#: Lost ranges remembered per partition.
LOST_MAX = 64
#: A heal that found no healthy copy tries again this often, at most this many times.
HEAL_RETRY_S = 1.0
HEAL_ROUNDS_MAX = 60

AddressOf = Callable[[int], str | None]
HandOver = Callable[[str, int, tuple[int, ...]], Awaitable[None]]


class _Stopped(Exception):
    """The scrubber's pace: the broker is stopping, end the check under way."""


@dataclass(slots=True)
class IntegrityTotals:
    damage_found: int = 0
    repaired: int = 0
    read_repairs: int = 0
    hand_overs: int = 0
    truncations: int = 0
    scrub_bytes: int = 0
    scrub_segments: int = 0
    scrub_passes: int = 0


@dataclass(slots=True)
class _PartitionRecord:
    lost: list[tuple[int, int]] = field(default_factory=list)
    lost_checked_s: float = 0.0
    repaired: int = 0


@dataclass(frozen=True, slots=True)
class _Copy:
    answers: dict[int, CopyAnswer]
    copies: dict[int, bytes]


class Integrity:
    """See the module docstring. `hand_over(stream, partition, successors)` moves a
    partition's leadership to the first of `successors` it can (None: a single broker)."""

    def __init__(self, config: BrokerConfig, roles: Roles, address_of: AddressOf | None,
                 hand_over: HandOver | None) -> None:
        self._config = config
        self._roles = roles
        self._address_of = address_of
        self._hand_over = hand_over
        self.totals = IntegrityTotals()
        self._records: dict[PartitionKey, _PartitionRecord] = {}
        self._locks: dict[PartitionKey, asyncio.Lock] = {}
        self._healing: dict[PartitionKey, asyncio.Task[None]] = {}
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="jetstream-scrub")
        self._stopping = threading.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self._config.scrub_bytes_per_s > 0:
            self._task = asyncio.create_task(self._scrub_loop(), name="scrubber")

    async def stop(self) -> None:
        self._stopping.set()
        tasks = [t for t in (self._task, *self._healing.values()) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._pool.shutdown(wait=True)

    # -- the scrubber --------------------------------------------------------------------------

    async def _scrub_loop(self) -> None:
        rate = self._config.scrub_bytes_per_s
        loop = asyncio.get_running_loop()
        while True:
            for key, _stream, log_, _hw in list(self._roles.replicas()):
                for base in log_.segment_base_offsets:
                    try:
                        damage = await loop.run_in_executor(
                            self._pool, self._check, log_, base, rate)
                    except (LogClosed, FileNotFoundError):
                        break  # the replica went away meanwhile
                    except _Stopped:
                        return
                    if damage is not None:
                        self.found(key)
            self.totals.scrub_passes += 1
            await asyncio.sleep(self._config.scrub_interval_ms / 1000)

    def _check(self, log_: Log, base: int, rate: int) -> Damage | None:
        """One segment's check (in the scrub thread), at `rate` bytes a second (0: full)."""
        started = time.monotonic()
        done = 0

        def pace(n: int) -> None:
            nonlocal done
            if self._stopping.is_set():
                raise _Stopped
            done += n
            self.totals.scrub_bytes += n
            if rate:
                ahead = done / rate - (time.monotonic() - started)
                if ahead > 0:
                    time.sleep(ahead)

        damage = log_.check_segment(base, pace)
        self.totals.scrub_segments += 1
        return damage

    async def scrub_now(self, stream: str, partition: int) -> list[dict[str, Any]]:
        """Check every segment of this broker's replicas of `stream` (one `partition`, or
        -1 for all) at full speed, heal what can be, and describe each replica."""
        loop = asyncio.get_running_loop()
        out = []
        for key, _config, log_, _hw in list(self._roles.replicas()):
            if key[0] != stream or partition not in (-1, key[1]):
                continue
            checked = 0
            for base in log_.segment_base_offsets:
                with contextlib.suppress(LogClosed, FileNotFoundError):
                    await loop.run_in_executor(self._pool, self._check, log_, base, 0)
                    checked += 1
            if log_.damage:
                await self._heal_all(key, rounds=1)
            out.append({**self.describe(key), "stream": key[0], "partition": key[1],
                        "role": "leader" if key in self._roles.leaders else "follower",
                        "checked_segments": checked})
        return out

    # -- healing -------------------------------------------------------------------------------

    def found(self, key: PartitionKey) -> None:
        """Damage was recorded in the replica `key`: heal it in the background (a follower
        says it is unfit from its next fetch on: it reads its log's damage)."""
        self.totals.damage_found += 1
        self._roles.touch_follower(key)  # it is unfit now: its leader must hear of it
        running = self._healing.get(key)
        if running is None or running.done():
            self._healing[key] = asyncio.get_running_loop().create_task(
                self._heal_all(key), name=f"heal {key[0]}/{key[1]}")

    async def _heal_all(self, key: PartitionKey, rounds: int = HEAL_ROUNDS_MAX) -> None:
        """Heal every damage of the replica, trying again every HEAL_RETRY_S while a healthy
        copy cannot be had (`rounds` in all; the next scrub pass starts again)."""
        for round_ in range(rounds):
            if round_:
                await asyncio.sleep(HEAL_RETRY_S)
            log_ = self._roles.log_of(key)
            if log_ is None or not log_.damage:
                self._roles.touch_follower(key)  # fit again, once the damage is gone
                return
            if key in self._roles.followers:
                await self._leave_isr(key)
            waiting = False
            for damage in log_.damage:
                try:
                    await self._heal(key, log_, damage)
                except RangeLost:
                    pass  # reported; nothing to wait for
                except JetstreamError as exc:
                    waiting = True
                    log.warning("%s/%d: healing %s failed: %s", *key, damage.describe(), exc)
            if not waiting:
                self._roles.touch_follower(key)
                return

    async def _leave_isr(self, key: PartitionKey) -> None:
        """A damaged follower first leaves the ISR (it says `unfit` from its next fetch;
        the leader proposes the change), so that it is never elected with a damaged copy;
        it waits at most `replica_lag_ms_max` for the metadata to show it."""
        me = self._config.broker_id
        deadline = time.monotonic() + self._config.replica_lag_ms_max / 1000
        while time.monotonic() < deadline:
            state = self._roles.partition_state(key)
            if state is None or me not in state.isr or key not in self._roles.followers:
                return
            await asyncio.sleep(0.05)

    async def _heal(self, key: PartitionKey, log_: Log, damage: Damage) -> bytes | None:
        """Heal one damage (see jetstream.isr.damage); the healthy copy when one was found
        but could not be written in place (a leader serves it meanwhile). Raises
        RangeLost or RangeRepairing when there is no healthy copy."""
        async with self._locks.setdefault(key, asyncio.Lock()):
            if damage not in log_.damage:
                return None  # healed meanwhile
            state = self._roles.partition_state(key)
            if state is None:
                return None
            me = self._config.broker_id
            copy = await self._ask_copies(
                key, damage, peers_to_ask(me, state.leader, state.isr, state.replicas))
            fits = {r: len(c) == damage.end_position - damage.position
                    for r, c in copy.copies.items()}
            verdict = decide(me=me, leader=state.leader, replicas=state.replicas,
                             isr=state.isr, answers=copy.answers, fits=fits)
            record = self._records.setdefault(key, _PartitionRecord())
            if verdict.action is Action.WRITE_OVER:
                why = await asyncio.get_running_loop().run_in_executor(
                    self._pool, log_.repair, damage, copy.copies[verdict.source])
                if why is None:
                    record.repaired += 1
                    self.totals.repaired += 1
                    return None
                log.warning("%s/%d: %s", *key, why)
                verdict = decide(me=me, leader=state.leader, replicas=state.replicas,
                                 isr=state.isr, answers=copy.answers,
                                 fits=dict.fromkeys(copy.copies, False))
            if verdict.action is Action.TRUNCATE:
                follower = self._roles.followers.get(key)
                if follower is not None:
                    self.totals.truncations += 1
                    follower.truncate_for_repair(damage.first_offset)
                return None
            if verdict.action is Action.HAND_OVER:
                if self._hand_over is not None:
                    self.totals.hand_overs += 1
                    log.warning("%s/%d: leadership goes to broker %d, which holds a healthy "
                                "copy of %s", *key, verdict.successors[0], damage.describe())
                    await self._hand_over(key[0], key[1], verdict.successors)
                return copy.copies[verdict.source]
            if verdict.action is Action.LOST:
                span = (damage.first_offset, damage.end_offset)
                if span not in record.lost:
                    record.lost = [*record.lost, span][-LOST_MAX:]
                    log.error("%s/%d: offsets [%d, %d) are damaged on every replica: lost",
                              *key, *span)
                record.lost_checked_s = time.monotonic()
                raise RangeLost(key[0], key[1], *span)
            raise RangeRepairing(key[0], key[1], damage.first_offset, damage.end_offset,
                                 "no in-sync replica could supply a healthy copy yet")

    async def _ask_copies(self, key: PartitionKey, damage: Damage,
                          peers: list[int]) -> _Copy:
        answers: dict[int, CopyAnswer] = {}
        copies: dict[int, bytes] = {}
        for peer in peers:
            try:
                data = await self._copy_from(peer, key, damage)
            except CorruptRecord:
                answers[peer] = CopyAnswer.DAMAGED
                continue
            except (JetstreamError, OSError) as exc:
                log.info("%s/%d: no copy from broker %d: %s", *key, peer, exc)
                answers[peer] = CopyAnswer.UNREACHABLE
                continue
            why = batches_span(data, damage.first_offset, damage.end_offset)
            if why is not None:
                log.info("%s/%d: broker %d's copy does not hold [%d, %d): %s", *key, peer,
                         damage.first_offset, damage.end_offset, why)
                answers[peer] = CopyAnswer.UNREACHABLE
                continue
            answers[peer], copies[peer] = CopyAnswer.HEALTHY, data
            if len(data) == damage.end_position - damage.position:
                break  # one that fits is all a repair needs
        return _Copy(answers, copies)

    async def _copy_from(self, peer: int, key: PartitionKey, damage: Damage) -> bytes:
        address = None if self._address_of is None else self._address_of(peer)
        if address is None:
            raise OSError(f"address of broker {peer} unknown")
        timeout_s = self._config.replica_leader_timeout_ms / 1000 + 5.0
        conn = BrokerConnection(address, client_id=f"repair-{self._config.broker_id}",
                                connect_timeout_s=timeout_s, request_timeout_s=timeout_s,
                                tls=client_ssl(self._config.peer_tls),
                                credentials=peer_credentials(self._config))
        await conn.open()
        try:
            data = bytearray()
            offset = damage.first_offset
            while offset < damage.end_offset:
                response, payload = await conn.with_payload(
                    m.ReplicaRangeRequest(key[0], key[1], offset, damage.end_offset,
                                          REPLICA_RANGE_BYTES), m.ReplicaRangeResponse)
                if not payload or response.next_offset <= offset:
                    break
                data += payload
                if len(data) > REPAIR_BYTES_MAX:
                    raise OSError(f"the damaged range is over {REPAIR_BYTES_MAX} bytes")
                offset = response.next_offset
            return bytes(data)
        finally:
            await conn.close()

    # -- serving around damage -------------------------------------------------------------------

    async def read_around(self, key: PartitionKey, log_: Log, exc: CorruptRecord,
                          offset: int, bound: int) -> FileSlice | None:
        """A leader's read at `offset` met damage (`exc`): heal it, then None (read again),
        or a healthy copy to serve (a slice of an in-memory file). Raises RangeLost or
        RangeRepairing."""
        damage = await self._damage_at(log_, exc, offset)
        if damage is None:
            return None  # the check passed (damaged indexes are rebuilt by it): read again
        self.totals.damage_found += 1
        self._roles.touch_follower(key)  # it is unfit now: its leader must hear of it
        record = self._records.get(key)
        if record is not None and time.monotonic() - record.lost_checked_s < LOST_RETRY_S:
            span = (damage.first_offset, damage.end_offset)
            if span in record.lost:
                raise RangeLost(key[0], key[1], *span)
        good = await self._heal(key, log_, damage)
        if good is None:
            return None
        self.totals.read_repairs += 1
        return _memory_slice(good, damage, bound)

    async def _damage_at(self, log_: Log, exc: CorruptRecord, offset: int) -> Damage | None:
        """The recorded damage `exc` names, or (damage found while locating a batch: the
        error names no offsets) what a check of the segment holding `offset` finds."""
        if exc.first_offset >= 0:
            for damage in log_.damage:
                if damage.first_offset == exc.first_offset:
                    return damage
        base = log_.base_offset_of_segment_for(offset)
        return await asyncio.get_running_loop().run_in_executor(
            self._pool, log_.check_segment, base, None)

    # -- answering other replicas ----------------------------------------------------------------

    async def replica_range(self, request: m.ReplicaRangeRequest
                            ) -> tuple[m.ReplicaRangeResponse, FileSlice]:
        key = (request.stream, request.partition)
        log_ = self._roles.log_of(key)
        if log_ is None:
            self._roles.leader_for(*key)  # raises the right error: unknown, not a replica
            raise JetstreamError(f"{key[0]}/{key[1]} has no replica here")
        try:
            piece = log_.read(request.first_offset, request.max_bytes,
                              upper_bound=request.end_offset, verify=True)
        except CorruptRecord:
            self.found(key)  # this copy is damaged too: heal it as well
            raise
        return m.ReplicaRangeResponse(request.stream, request.partition,
                                      self._config.broker_id, piece.next_offset), piece

    # -- reporting -----------------------------------------------------------------------------

    def describe(self, key: PartitionKey) -> dict[str, Any]:
        log_ = self._roles.log_of(key)
        record = self._records.get(key, _PartitionRecord())
        return {"damage": [d.to_dict() for d in (log_.damage if log_ is not None else [])],
                "repaired": record.repaired,
                "lost": [{"first_offset": a, "end_offset": b} for a, b in record.lost]}

    def render_metrics(self) -> list[str]:
        t = self.totals
        unhealed = sum(len(log_.damage) for _k, _s, log_, _hw in self._roles.replicas())
        lost = sum(len(r.lost) for r in self._records.values())
        lines: list[str] = []
        for name, kind, value, text in (
            ("damage_found", "counter", t.damage_found, "Damage found in stored batches."),
            ("damage_repaired", "counter", t.repaired, "Damage healed from a healthy copy."),
            ("damage_unhealed", "gauge", unhealed, "Damage known and not healed yet."),
            ("lost_ranges", "gauge", lost, "Offset ranges damaged on every replica."),
            ("read_repairs", "counter", t.read_repairs,
             "Reads served from another replica's copy."),
            ("damage_hand_overs", "counter", t.hand_overs,
             "Leaderships handed over for damage that could not be healed in place."),
            ("damage_truncations", "counter", t.truncations,
             "Follower logs cut at damage to fetch it again."),
            ("scrub_bytes", "counter", t.scrub_bytes, "Bytes the scrubber checked."),
            ("scrub_segments", "counter", t.scrub_segments, "Segments the scrubber checked."),
            ("scrub_passes", "counter", t.scrub_passes, "Scrub passes finished."),
        ):
            full = f"jetstream_{name}" + ("_total" if kind == "counter" else "")
            lines += [f"# HELP {full} {text}", f"# TYPE {full} {kind}", f"{full} {value}"]
        return lines


def _memory_slice(good: bytes, damage: Damage, bound: int) -> FileSlice:
    """`good` (checked batches from damage.first_offset), cut before the first batch that
    reaches `bound`, as a slice of an in-memory file the socket API can sendfile."""
    position = 0
    next_offset = damage.first_offset
    while position < len(good):
        header = fmt.parse_header(good, position)
        if header.last_offset >= bound:
            break
        position += header.size
        next_offset = header.next_offset
    fd = os.memfd_create("jetstream-repair", os.MFD_CLOEXEC)
    try:
        view = memoryview(good)[:position]
        while view:
            view = view[os.write(fd, view):]
    except BaseException:
        os.close(fd)
        raise
    return FileSlice(fd, 0, position, damage.first_offset, next_offset)
