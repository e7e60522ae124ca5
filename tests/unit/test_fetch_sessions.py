"""A leader broker's fetch sessions (jetstream.server.fetch_sessions) against stand-in
partition leaders: what a request is answered with, when it waits, and how sessions are
refused, replaced and woken."""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from jetstream.errors import FetchSessionNotFound, InvalidFetchSessionEpoch, NotLeader
from jetstream.protocol import messages as m
from jetstream.server.fetch_sessions import FetchSessions
from jetstream.server.partition import PartitionLeader
from jetstream.stream.file_slice import FileSlice

Key = tuple[str, int]
BROKER = 2


@dataclass
class _State:
    leader_epoch: int = 1


@dataclass
class _Log:
    log_end_offset: int = 0
    log_start_offset: int = 0


@dataclass
class FakeLeader:
    """Offsets are bytes: record i is byte i of `data`."""

    path: str
    state: _State = field(default_factory=_State)
    log: _Log = field(default_factory=_Log)
    high_watermark: int = 0
    serving: bool = True
    fetched: list[tuple[int, int, str]] = field(default_factory=list)

    async def follower_fetched(self, replica_id: int, offset: int, leader_epoch: int,
                               unfit: str = "") -> None:
        self.fetched.append((replica_id, offset, unfit))

    async def replica_read(self, offset: int, max_bytes: int, *, verify: bool = False
                           ) -> FileSlice:
        length = min(max_bytes, self.log.log_end_offset - offset)
        fd = os.open(self.path, os.O_RDONLY)
        return FileSlice(fd, offset, length, offset, offset + length)

    def append(self, count: int) -> None:
        with open(self.path, "ab") as f:
            f.write(b"x" * count)
        self.log.log_end_offset += count


@pytest.fixture
def leaders() -> Iterator[dict[Key, FakeLeader]]:
    with tempfile.TemporaryDirectory() as tmp:
        out = {}
        for i in range(3):
            path = os.path.join(tmp, f"p{i}")
            open(path, "wb").close()
            out[("s", i)] = FakeLeader(path)
        yield out


def sessions_of(leaders: dict[Key, FakeLeader]) -> FetchSessions:
    return FetchSessions(lambda key: cast(PartitionLeader | None, leaders.get(key)))


def request(session_id: int = 0, epoch: int = 0, *, wait_ms: int = 0,
            changed: list[tuple[int, int]] = (), forgotten: list[int] = (),  # type: ignore[assignment]
            max_bytes: int = 1 << 20, wake: bool = False) -> m.ReplicaFetchRequest:
    return m.ReplicaFetchRequest(
        BROKER, session_id, epoch, wait_ms, max_bytes, 1 << 20,
        [m.SessionPartition("s", p, offset, 1).to_wire() for p, offset in changed],
        [["s", p] for p in forgotten], wake=wake)


async def fetch(sessions: FetchSessions, req: m.ReplicaFetchRequest
                ) -> tuple[m.ReplicaFetchResponse, list[tuple[int, int, int, Any]]]:
    """The response and (partition, hw, length, error code) per answer; slices closed."""
    response, pieces = await sessions.fetch(req)
    for piece in pieces:
        piece.close()
    assert sum(p.length for p in pieces) == sum(a.length for a in response.answers())
    return response, [(a.partition, a.high_watermark, a.length,
                       a.error.code if a.error else None) for a in response.answers()]


async def test_a_new_session_answers_what_each_partition_has(
        leaders: dict[Key, FakeLeader]) -> None:
    leaders[("s", 0)].append(10)
    leaders[("s", 0)].high_watermark = 4
    sessions = sessions_of(leaders)
    response, answers = await fetch(sessions, request(changed=[(0, 0), (1, 0)]))
    # Partition 1 has no records and HW 0, never told: it is answered too (its HW).
    assert sorted(answers) == [(0, 4, 10, None), (1, 0, 0, None)]
    assert leaders[("s", 0)].fetched == [(BROKER, 0, "")]
    assert sessions.count == 1 and sessions.partitions() == 2
    assert response.session_id > 0


async def test_an_idle_session_waits_and_answers_nothing(leaders: dict[Key, FakeLeader]
                                                         ) -> None:
    sessions = sessions_of(leaders)
    response, _ = await fetch(sessions, request(changed=[(0, 0), (1, 0), (2, 0)]))
    sid = response.session_id
    _, answers = await fetch(sessions, request(sid, 1, wait_ms=50))
    assert answers == []
    assert sessions.waits == 1
    # Nothing was asked of the leaders: an idle request names no partition.
    assert all(len(leader.fetched) == 1 for leader in leaders.values())


async def test_a_waiting_request_returns_when_a_partition_changes(
        leaders: dict[Key, FakeLeader]) -> None:
    sessions = sessions_of(leaders)
    response, _ = await fetch(sessions, request(changed=[(0, 0), (1, 0)]))
    sid = response.session_id
    waiting = asyncio.create_task(fetch(sessions, request(sid, 1, wait_ms=10_000)))
    await asyncio.sleep(0.01)
    assert not waiting.done()
    leaders[("s", 1)].append(3)
    sessions.changed(("s", 1))
    _, answers = await asyncio.wait_for(waiting, 5)
    assert answers == [(1, 0, 3, None)]
    # The follower appends and names its new offset; the HW moves after it: told alone.
    _, answers = await fetch(sessions, request(sid, 2, changed=[(1, 3)]))
    assert answers == []
    leaders[("s", 1)].high_watermark = 3
    sessions.changed(("s", 1))
    _, answers = await fetch(sessions, request(sid, 3))
    assert answers == [(1, 3, 0, None)]


async def test_a_partition_no_longer_led_here_is_answered_with_an_error_and_dropped(
        leaders: dict[Key, FakeLeader]) -> None:
    sessions = sessions_of(leaders)
    response, _ = await fetch(sessions, request(changed=[(0, 0), (1, 0)]))
    sid = response.session_id
    leaders[("s", 0)].serving = False
    sessions.changed(("s", 0))
    _, answers = await fetch(sessions, request(sid, 1))
    assert answers == [(0, 0, 0, NotLeader.code)]
    assert sessions.partitions() == 1
    del leaders[("s", 1)]
    sessions.changed(("s", 1))
    _, answers = await fetch(sessions, request(sid, 2))
    assert answers == [(1, 0, 0, NotLeader.code)]
    assert sessions.partitions() == 0


async def test_lost_or_out_of_step_sessions_are_refused(leaders: dict[Key, FakeLeader]
                                                        ) -> None:
    sessions = sessions_of(leaders)
    response, _ = await fetch(sessions, request(changed=[(0, 0)]))
    sid = response.session_id
    with pytest.raises(FetchSessionNotFound):
        await sessions.fetch(request(sid + 1, 1))
    with pytest.raises(InvalidFetchSessionEpoch):
        await sessions.fetch(request(sid, 5))
    # The session is gone: its entries can no longer be trusted.
    with pytest.raises(FetchSessionNotFound):
        await sessions.fetch(request(sid, 1))
    assert sessions.count == 0 and sessions.partitions() == 0


async def test_a_new_session_of_the_same_broker_replaces_the_old(
        leaders: dict[Key, FakeLeader]) -> None:
    sessions = sessions_of(leaders)
    first, _ = await fetch(sessions, request(changed=[(0, 0)]))
    waiting = asyncio.create_task(fetch(sessions, request(first.session_id, 1,
                                                          wait_ms=10_000)))
    await asyncio.sleep(0.01)
    second, _ = await fetch(sessions, request(changed=[(1, 0)]))
    await asyncio.wait_for(waiting, 5)  # the replaced session's request returned
    assert second.session_id != first.session_id
    assert sessions.count == 1 and sessions.partitions() == 1


async def test_a_wake_returns_the_waiting_request_at_once(leaders: dict[Key, FakeLeader]
                                                          ) -> None:
    sessions = sessions_of(leaders)
    response, _ = await fetch(sessions, request(changed=[(0, 0)]))
    sid = response.session_id
    waiting = asyncio.create_task(fetch(sessions, request(sid, 1, wait_ms=10_000)))
    await asyncio.sleep(0.01)
    _, woke = await fetch(sessions, request(sid, 1, wake=True))
    assert woke == []
    _, answers = await asyncio.wait_for(waiting, 5)
    assert answers == []
    # The next request goes on at the next epoch: a wake does not count as one.
    _, answers = await fetch(sessions, request(sid, 2, changed=[(2, 0)]))
    assert answers == [(2, 0, 0, None)]


async def test_the_answer_keeps_to_its_byte_limit_and_the_rest_follows(
        leaders: dict[Key, FakeLeader]) -> None:
    for i in range(3):
        leaders[("s", i)].append(100)
    sessions = sessions_of(leaders)
    response, answers = await fetch(sessions, request(changed=[(0, 0), (1, 0), (2, 0)],
                                                      max_bytes=150))
    assert sum(length for _p, _hw, length, _e in answers) <= 150
    served = {p for p, _hw, length, _e in answers if length}
    assert len(served) < 3
    sid = response.session_id
    _, more = await fetch(sessions, request(sid, 1, max_bytes=1 << 20))
    assert served | {p for p, _hw, length, _e in more if length} == {0, 1, 2}


async def test_standing_tells_where_each_follower_fetches_and_when(
        leaders: dict[Key, FakeLeader]) -> None:
    sessions = sessions_of(leaders)
    leaders[("s", 0)].append(5)
    response, _ = await fetch(sessions, request(changed=[(0, 5)]))
    [(replica, offset, said_ms)] = sessions.standing(("s", 0))
    assert (replica, offset) == (BROKER, 5)
    waiting = asyncio.create_task(fetch(sessions, request(response.session_id, 1,
                                                          wait_ms=10_000)))
    await asyncio.sleep(0.05)
    [(_r, _o, parked_ms)] = sessions.standing(("s", 0))
    assert parked_ms >= said_ms + 40  # a waiting request means it fetches now
    assert sessions.standing(("s", 1)) == []
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting


async def test_a_new_hw_alone_waits_for_records_to_carry_it(
        leaders: dict[Key, FakeLeader]) -> None:
    sessions = FetchSessions(lambda key: cast(PartitionLeader | None, leaders.get(key)),
                             hw_delay_ms=200)
    leader = leaders[("s", 0)]
    leader.append(3)
    response, answers = await fetch(sessions, request(changed=[(0, 0)]))
    assert answers == [(0, 0, 3, None)]  # a request that does not wait is answered at once
    sid = response.session_id
    # The follower names its new offset and waits; its fetch moved the HW.
    leader.high_watermark = 3
    waiting = asyncio.create_task(fetch(sessions, request(sid, 1, wait_ms=10_000,
                                                          changed=[(0, 3)])))
    await asyncio.sleep(0.05)
    assert not waiting.done()  # the HW alone is held back...
    leader.append(2)
    sessions.changed(("s", 0))
    _, answers = await asyncio.wait_for(waiting, 5)
    assert answers == [(0, 3, 2, None)]  # ...and rides with the next records
    # With no records coming, the HW is told once the delay has passed.
    leader.high_watermark = 5
    started = asyncio.get_running_loop().time()
    _, answers = await asyncio.wait_for(
        fetch(sessions, request(sid, 2, wait_ms=10_000, changed=[(0, 5)])), 5)
    assert answers == [(0, 5, 0, None)]
    assert 0.15 <= asyncio.get_running_loop().time() - started < 5


async def test_a_held_hw_rides_with_another_partitions_records(
        leaders: dict[Key, FakeLeader]) -> None:
    sessions = FetchSessions(lambda key: cast(PartitionLeader | None, leaders.get(key)),
                             hw_delay_ms=60_000)
    zero, one = leaders[("s", 0)], leaders[("s", 1)]
    zero.append(3)
    response, _ = await fetch(sessions, request(changed=[(0, 0), (1, 0)]))
    sid = response.session_id
    zero.high_watermark = 3  # the follower's fetch at 3 moved it: news alone, held
    waiting = asyncio.create_task(fetch(sessions, request(sid, 1, wait_ms=10_000,
                                                          changed=[(0, 3)])))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    one.append(2)
    sessions.changed(("s", 1))
    _, answers = await asyncio.wait_for(waiting, 5)
    # Partition 1's records go out, and partition 0's HW with them (never starved).
    assert sorted(answers) == [(0, 3, 0, None), (1, 0, 2, None)]
