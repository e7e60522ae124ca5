"""wait_event: set -> True, timeout -> False, and a cancellation that arrives as the event is
set stops the waiting loop (asyncio.wait_for, in Python 3.11, returns instead and the loop
runs on: a stop that cancels it would wait forever)."""

from __future__ import annotations

import asyncio

import pytest

from jetstream.tasks import cancel_others, wait_event


async def test_true_when_set_false_after_the_timeout() -> None:
    event = asyncio.Event()
    assert await wait_event(event, 0.01) is False
    asyncio.get_running_loop().call_soon(event.set)
    assert await wait_event(event, 5.0) is True
    assert await wait_event(event, 0.0) is True  # already set


@pytest.mark.parametrize("turns", [0, 1, 2])
async def test_a_cancellation_as_the_event_is_set_ends_the_loop(turns: int) -> None:
    event = asyncio.Event()

    async def loop() -> None:
        while True:
            await wait_event(event, 10.0)
            event.clear()

    task = asyncio.create_task(loop())
    await asyncio.sleep(0)
    event.set()
    for _ in range(turns):
        await asyncio.sleep(0)
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=1.0)
    assert task in done and task.cancelled()


async def test_cancel_others_cancels_again_a_task_that_swallowed_its_cancellation() -> None:
    swallowed = asyncio.Event()

    async def swallows_once() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            swallowed.set()  # as asyncio.wait_for could, in Python 3.11
        await asyncio.sleep(60)

    task = asyncio.create_task(swallows_once())
    await asyncio.sleep(0)
    assert await cancel_others(deadline_s=5.0) == []
    assert swallowed.is_set() and task.cancelled()


async def test_cancel_others_names_a_task_that_never_ends() -> None:
    release = asyncio.Event()

    async def never_ends() -> None:
        while not release.is_set():
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                continue

    task = asyncio.create_task(never_ends(), name="stubborn")
    await asyncio.sleep(0)
    stuck = await cancel_others(deadline_s=0.3)
    assert [t.get_name() for t in stuck] == ["stubborn"]
    release.set()
    task.cancel()  # wakes its sleep; the loop sees the release and returns
    await asyncio.wait({task})
    assert task.done()
