"""Worker processes for the broker's CPU-heavy background work.

Theory of operation: a Python thread holds the interpreter lock while it runs Python code,
so background work done in threads (the log cleaner's record loops) takes the event loop's
turns: ingest slows and its latency grows by the lock's switch interval at each turn.
`WorkerProcesses` runs such jobs in a pool of spawned processes instead, started by `start`
(when the work shows up) or by the first job: a broker without such work starts none. A job
is a module-level function with plain, picklable arguments and result; an error it raises
comes back as itself (a JetstreamError keeps its code and fields).

Each worker ignores SIGINT (the broker decides when to stop), runs at a lower scheduling
priority than the broker (background work yields the CPU to serving), and is killed by the
kernel when the broker exits, however it exits (PR_SET_PDEATHSIG), so a broker stopped by
SIGKILL leaves no process behind. A worker that dies (killed, out of memory) fails the jobs
it held with WorkerDied; the next job starts a fresh pool.
"""

from __future__ import annotations

import asyncio
import ctypes
import multiprocessing
import os
import signal
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import TypeVar

from jetstream.errors import StorageError

T = TypeVar("T")

#: How much lower than the broker's the workers' scheduling priority is (nice increment),
#: unless a pool asks for another.
WORKER_NICENESS = 5
_PR_SET_PDEATHSIG = 1


class WorkerDied(StorageError):
    """A background worker process died while it held the job (killed, out of memory)."""

    code = "WORKER_DIED"
    retriable = True


def _worker_started(parent_pid: int, niceness: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # the broker exited before the signal was armed
        os._exit(1)
    os.nice(niceness)


class WorkerProcesses:
    """At most `processes` worker processes; jobs run with `await run(function, argument)`.
    Create, use and close it on the event loop's thread: the kernel's parent-death signal
    follows the thread that started a worker, and that thread lives as long as the broker."""

    def __init__(self, processes: int, name: str, niceness: int = WORKER_NICENESS) -> None:
        self._processes = processes
        self._name = name
        self._niceness = niceness
        self._pool: ProcessPoolExecutor | None = None

    @property
    def pids(self) -> list[int]:
        """The workers running now."""
        if self._pool is None:
            return []
        return [p.pid for p in list(getattr(self._pool, "_processes", {}).values())
                if p.pid is not None]

    def start(self) -> None:
        """Start the workers now, if they are not running (a worker takes a moment to start:
        better when the work shows up than at its first job)."""
        self._started()

    def _started(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                self._processes, mp_context=multiprocessing.get_context("spawn"),
                initializer=_worker_started, initargs=(os.getpid(), self._niceness))
            for _ in range(self._processes):  # each finds no idle worker: each starts one
                self._pool.submit(os.getpid)
        return self._pool

    async def run(self, function: Callable[..., T], *args: object) -> T:
        pool = self._started()
        try:
            return await asyncio.get_running_loop().run_in_executor(pool, function, *args)
        except BrokenProcessPool:
            if self._pool is pool:
                self._pool = None
                pool.shutdown(wait=False, cancel_futures=True)
            raise WorkerDied(f"a {self._name} worker process died during the job") from None

    async def close(self) -> None:
        """Wait for the jobs running now, then stop the workers."""
        pool, self._pool = self._pool, None
        if pool is not None:
            await asyncio.to_thread(pool.shutdown, wait=True, cancel_futures=True)
