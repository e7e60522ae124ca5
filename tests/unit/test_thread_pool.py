"""The broker's IO pool has every thread running before its first job."""

from __future__ import annotations

import threading
import time

from jetstream.server.thread_pool import started_pool


def _pool_threads(prefix: str) -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith(prefix)}


def test_every_thread_runs_before_the_first_job() -> None:
    pool = started_pool(4, "started-pool-test")
    try:
        threads = _pool_threads("started-pool-test")
        assert len(threads) == 4
        assert all(t.is_alive() for t in threads)
        # A burst of jobs, each holding its thread for a while, starts no thread.
        jobs = [pool.submit(time.sleep, 0.05) for _ in range(8)]
        for job in jobs:
            job.result(5)
        assert _pool_threads("started-pool-test") == threads
    finally:
        pool.shutdown(wait=True)
    assert not _pool_threads("started-pool-test")

