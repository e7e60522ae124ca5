"""Worker processes: jobs run in another process and hand back results and coded errors, a
dead worker fails its job with WORKER_DIED and the next job gets a fresh one, workers die
with the process that started them, and a cleaning pass crosses the process boundary."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jetstream.compaction import checkpoint as cleaner_checkpoint
from jetstream.compaction.cleaner import prepare, rewrite, swap
from jetstream.compaction.planner import CompactionConfig
from jetstream.errors import CorruptRecord
from jetstream.server.process_pool import WorkerDied, WorkerProcesses
from tests.unit.log_helpers import Clock
from tests.unit.test_compaction_cleaner import T0, append, everything, latest, open_log, whole_plan

DEADLINE_S = 30.0


def refuse(path: str) -> None:
    raise CorruptRecord("bad batch", path=path, position=7)


def exit_hard() -> None:
    os._exit(3)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_jobs_run_elsewhere_and_errors_keep_their_code() -> None:
    async def main() -> None:
        workers = WorkerProcesses(1, "test")
        try:
            assert await workers.run(os.getpid) != os.getpid()
            assert workers.pids and os.getpid() not in workers.pids
            with pytest.raises(CorruptRecord) as caught:
                await workers.run(refuse, "/x.log")
            assert caught.value.to_dict() == {"code": "CORRUPT_RECORD", "message": "bad batch",
                                               "path": "/x.log", "position": 7,
                                               "first_offset": -1, "end_offset": -1}
        finally:
            await workers.close()
        assert workers.pids == []

    asyncio.run(main())


def test_a_dead_worker_fails_its_job_and_the_next_job_runs() -> None:
    async def main() -> None:
        workers = WorkerProcesses(1, "test")
        try:
            first = await workers.run(os.getpid)
            with pytest.raises(WorkerDied) as caught:
                await workers.run(exit_hard)
            assert caught.value.code == "WORKER_DIED"
            second = await workers.run(os.getpid)
            assert second != first
        finally:
            await workers.close()

    asyncio.run(main())


OWNER = """
import asyncio, os, sys
from jetstream.server.process_pool import WorkerProcesses
async def main():
    workers = WorkerProcesses(2, "test")
    workers.start()
    pids = {await workers.run(os.getpid) for _ in range(8)}
    print(" ".join(map(str, workers.pids)), flush=True)
    await asyncio.sleep(3600)
asyncio.run(main())
"""


def test_workers_die_with_the_process_that_started_them() -> None:
    owner = subprocess.Popen([sys.executable, "-c", OWNER], stdout=subprocess.PIPE, text=True,
                             cwd=Path(__file__).parents[2])
    try:
        assert owner.stdout is not None
        pids = [int(p) for p in owner.stdout.readline().split()]
        assert len(pids) == 2 and all(alive(p) for p in pids)
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    deadline = time.monotonic() + DEADLINE_S
    while any(alive(p) for p in pids):
        assert time.monotonic() < deadline, f"workers {pids} outlived their owner"
        time.sleep(0.05)  # polling /proc under a deadline


def test_a_pass_rewritten_in_a_worker_swaps_in(tmp_path: Path) -> None:
    log = open_log(tmp_path, Clock(T0))
    append(log, [(b"key-%d" % (i % 5), b"%d" % i) for i in range(600)])
    before = latest(everything(log))
    segments = len(log.sealed_segments())
    ends: list[int] = []

    async def main() -> None:
        workers = WorkerProcesses(1, "test")
        try:
            prepared = prepare(log, whole_plan(log), CompactionConfig(segment_bytes_max=1 << 20),
                               1 << 20, now_ms=T0)
            rewritten = await workers.run(rewrite, prepared.job)
            result = swap(log, prepared, rewritten)
            assert result.segments_before == segments and result.segments_after == 1
            ends.append(result.end_offset)
        finally:
            await workers.close()

    asyncio.run(main())
    assert latest(everything(log)) == before
    assert len([r for r in everything(log) if r.offset < ends[0]]) == 5  # one per key
    assert cleaner_checkpoint.read(log.directory).first_dirty_offset == ends[0] > 0
    log.close()
