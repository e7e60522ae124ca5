"""BatchedCalls: the calls of one loop turn run in a few executor jobs, each call's outcome
(result or exception) reaches its own future, in order within a job."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from jetstream.server.batched_calls import BatchedCalls


def test_one_turn_of_calls_takes_at_most_jobs_max_jobs() -> None:
    threads: list[str] = []

    def work(i: int) -> int:
        threads.append(threading.current_thread().name)
        return i * i

    async def main() -> tuple[list[int], BatchedCalls]:
        with ThreadPoolExecutor(4) as executor:
            calls = BatchedCalls(executor, jobs_max=3)
            futures = [calls.call(lambda i=i: work(i)) for i in range(10)]
            return list(await asyncio.gather(*futures)), calls

    results, calls = asyncio.run(main())
    assert results == [i * i for i in range(10)]
    assert calls.jobs == 3 and calls.calls == 10
    assert all(name != "MainThread" for name in threads)


def test_an_exception_fails_only_its_own_call() -> None:
    def boom() -> int:
        raise OSError("no room")

    async def main() -> list[object]:
        with ThreadPoolExecutor(2) as executor:
            calls = BatchedCalls(executor, jobs_max=1)
            futures = [calls.call(lambda: 1), calls.call(boom), calls.call(lambda: 3)]
            return list(await asyncio.gather(*futures, return_exceptions=True))

    first, second, third = asyncio.run(main())
    assert first == 1 and third == 3
    assert isinstance(second, OSError)


def test_calls_of_later_turns_go_in_later_jobs() -> None:
    async def main() -> BatchedCalls:
        with ThreadPoolExecutor(2) as executor:
            calls = BatchedCalls(executor, jobs_max=4)
            assert await calls.call(lambda: "a") == "a"
            assert await calls.call(lambda: "b") == "b"
            return calls

    calls = asyncio.run(main())
    assert calls.jobs == 2 and calls.calls == 2


def test_a_cancelled_caller_does_not_break_the_others() -> None:
    release = threading.Event()

    async def main() -> int:
        with ThreadPoolExecutor(1) as executor:
            calls = BatchedCalls(executor, jobs_max=1)
            slow = calls.call(lambda: release.wait(5.0))
            other = calls.call(lambda: 7)
            slow.cancel()
            release.set()
            with pytest.raises(asyncio.CancelledError):
                await slow
            return await other

    assert asyncio.run(main()) == 7


def test_a_jobs_thens_run_after_all_its_calls_and_only_after_a_success() -> None:
    """Writes first, fsyncs after: every call of a job runs before the first `then`; a
    failed call skips its `then`, and a failed `then` fails its call."""
    steps: list[str] = []

    def step(name: str) -> str:
        steps.append(name)
        if name in ("write 2", "sync 3"):
            raise OSError(name)
        return name

    async def main() -> list[object]:
        with ThreadPoolExecutor(1) as executor:
            calls = BatchedCalls(executor, jobs_max=1)
            futures = [calls.call(lambda i=i: step(f"write {i}"),
                                  then=lambda i=i: step(f"sync {i}"))
                       for i in (1, 2, 3)]
            return list(await asyncio.gather(*futures, return_exceptions=True))

    one, two, three = asyncio.run(main())
    assert steps == ["write 1", "write 2", "write 3", "sync 1", "sync 3"]
    assert one == "write 1"
    assert isinstance(two, OSError) and str(two) == "write 2"
    assert isinstance(three, OSError) and str(three) == "sync 3"
