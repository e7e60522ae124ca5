"""Consumer-group members as processes of their own: a killed member's partitions move to
the others within its session timeout (+ 1 s), and a paused member (SIGSTOP) that wakes
after its session ended can no longer commit: its commits are refused and the progress of
the member that took over stays.

Every wait has a deadline (lines are read with select()); every member process is stopped by
its PID when the test ends."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jetstream.client import Client
from jetstream.server.process import BrokerProcess

REPO = Path(__file__).resolve().parents[2]
SESSION_MS = 3_000
DEADLINE_S = 30.0


class Member:
    def __init__(self, broker: BrokerProcess, group: str, stream: str, *extra: str) -> None:
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 (closed by stop())
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.group_member", "--brokers",
             broker.address, "--group", group, "--stream", stream, "--session-timeout-ms",
             str(SESSION_MS), *extra],
            cwd=REPO, stdout=subprocess.PIPE, stderr=self._stderr)
        self.seen: collections.deque[dict[str, Any]] = collections.deque(maxlen=10)
        self._pending = b""
        self.partitions: list[tuple[str, int]] = []
        #: When it last reported a change of its partitions (its clock: CLOCK_MONOTONIC).
        self.changed_at = 0.0

    def events(self, timeout_s: float) -> Iterator[dict[str, Any]]:
        """The events it prints within `timeout_s`."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        fd = self.proc.stdout.fileno()
        while (remaining := deadline - time.monotonic()) > 0:
            while b"\n" in self._pending:
                line, self._pending = self._pending.split(b"\n", 1)
                event = json.loads(line)
                self.seen.append(event)
                if event["event"] == "assigned":
                    self.partitions = [tuple(p) for p in event["partitions"]]
                    self.changed_at = event["t"]
                yield event
            ready, _, _ = select.select([fd], [], [], remaining)
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    return
                self._pending += chunk

    def wait(self, predicate: Any, what: str, timeout_s: float = DEADLINE_S
             ) -> dict[str, Any]:
        for event in self.events(timeout_s):
            if predicate(event):
                return event
        self._stderr.seek(0)
        raise AssertionError(
            f"no {what} within {timeout_s} s; its last events: {list(self.seen)}; exit code "
            f"{self.proc.poll()}; its stderr ends: {self._stderr.read()[-2000:]!r}")

    def drain(self) -> None:
        for _event in self.events(0.2):
            pass

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
        self.proc.wait(10)
        self._stderr.close()


@pytest.fixture
def members() -> Iterator[list[Member]]:
    started: list[Member] = []
    try:
        yield started
    finally:
        for member in started:
            member.stop()


def shares(members: list[Member]) -> list[int]:
    """Each member's partition count, after reading what the members printed."""
    for member in members:
        member.drain()
    return sorted(len(m.partitions) for m in members)


async def test_a_killed_members_partitions_move_within_its_session(
        js: Client, broker: BrokerProcess, members: list[Member]) -> None:
    await js.create_stream("work", "work", partitions=6)
    members.extend(Member(broker, "crew", "work") for _ in range(3))
    deadline = time.monotonic() + DEADLINE_S
    while shares(members) != [2, 2, 2]:
        assert time.monotonic() < deadline, f"no 2/2/2 split: {shares(members)}"
    victim, survivors = members[0], members[1:]
    lost = set(victim.partitions)
    os.kill(victim.proc.pid, signal.SIGKILL)
    killed = time.monotonic()
    while shares(survivors) != [3, 3]:
        assert time.monotonic() - killed < DEADLINE_S, "the survivors never took over"
    assert lost <= set(survivors[0].partitions) | set(survivors[1].partitions)
    elapsed = max(m.changed_at for m in survivors) - killed
    assert elapsed <= SESSION_MS / 1000 + 1.0, f"took {elapsed:.2f} s"


async def test_a_paused_member_that_wakes_cannot_commit(
        js: Client, broker: BrokerProcess, members: list[Member]) -> None:
    await js.create_stream("ledger", "ledger", partitions=2)
    zombie = Member(broker, "auditors", "ledger", "--zombie-commit")
    members.append(zombie)
    zombie.wait(lambda e: e["event"] == "assigned" and len(e["partitions"]) == 2,
                "the first member holding both partitions")
    zombie.wait(lambda e: e["event"] == "commit" and not e["failed"], "a commit of its own")
    os.kill(zombie.proc.pid, signal.SIGSTOP)
    paused = time.monotonic()
    async with js.subscribe("ledger", group="auditors", session_timeout_ms=SESSION_MS,
                            auto_commit=False) as successor:
        while len(successor.assignment) < 2:
            assert time.monotonic() - paused < DEADLINE_S, "the successor never took over"
            await asyncio.sleep(0.05)
        await successor.commit({("ledger", 0): 1_000_000, ("ledger", 1): 1_000_000})
        zombie.drain()  # what it printed before it was paused
        os.kill(zombie.proc.pid, signal.SIGCONT)
        woke = zombie.wait(lambda e: e["event"] == "commit", "a commit after waking")
        assert set(woke["failed"]) == {"ledger/0", "ledger/1"}
        assert set(woke["failed"].values()) <= {"UNKNOWN_MEMBER_ID", "FENCED_MEMBER",
                                                "STALE_MEMBER_EPOCH",
                                                "PARTITION_NOT_ASSIGNED"}
        committed = await js.fetch_offsets("auditors")
        assert {k: v.offset for k, v in committed.items()} == {
            ("ledger", 0): 1_000_000, ("ledger", 1): 1_000_000}
