"""A thread pool whose threads all run before its first job.

`ThreadPoolExecutor` starts a thread on a submit that finds none idle, and `Thread.start`
waits until the new thread runs. On a virtual machine a start costs a few milliseconds, so a
pool started lazily makes the first burst of work (the first publish to each of many
streams: each partition's fsync is a job) wait on the event loop while the threads come up,
where later bursts do not. `started_pool` pays that once, when the broker starts.
"""

from __future__ import annotations

import contextlib
import threading
from concurrent.futures import ThreadPoolExecutor, wait

START_TIMEOUT_S = 5.0


def started_pool(threads: int, name_prefix: str,
                 timeout_s: float = START_TIMEOUT_S) -> ThreadPoolExecutor:
    """A pool of `threads` threads, every one of them already running: each of `threads`
    jobs waits until all are running, so no job finds an idle thread and each starts one."""
    pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix=name_prefix)
    barrier = threading.Barrier(threads)
    wait([pool.submit(_meet, barrier, timeout_s) for _ in range(threads)], timeout_s)
    return pool


def _meet(barrier: threading.Barrier, timeout_s: float) -> None:
    # Broken: a thread did not come up in time; the rest start lazily, as they would have.
    with contextlib.suppress(threading.BrokenBarrierError):
        barrier.wait(timeout_s)
