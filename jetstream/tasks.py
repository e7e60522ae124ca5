"""Stopping asyncio tasks without losing the caller's own cancellation.

`task.cancel()` followed by `with suppress(CancelledError): await task` has two faults: if
the caller is cancelled while it waits, the suppress swallows the caller's cancellation (the
caller then runs on as if nothing happened); and a task that swallowed its cancellation
somewhere keeps running while the caller waits forever. `cancel_and_wait` waits with
`asyncio.wait`, which never raises what the tasks raise (so a cancellation that arrives
is the caller's and propagates), and cancels again every RECANCEL_S until the tasks are done.

`wait_event` is the other half: a loop that waits with `asyncio.wait_for(event.wait(), t)`
loses, in Python 3.11, a cancellation that arrives as the event is set (`wait_for` returns
and the loop runs on, so a stop, or `asyncio.run` cancelling what is left, waits forever).
`asyncio.timeout` tells its own timeout from a cancellation that comes from outside.
"""

from __future__ import annotations

import asyncio
from typing import Any, TypeVar

RECANCEL_S = 0.1
_F = TypeVar("_F", bound="asyncio.Future[Any]")


async def cancel_and_wait(*tasks: asyncio.Future[Any] | None) -> None:
    """Cancel every task given (None is skipped) and return once all are done; their results,
    exceptions and cancellations are consumed."""
    await _cancel_until({t for t in tasks if t is not None and t is not asyncio.current_task()},
                        None)


async def _cancel_until(pending: set[_F], deadline: float | None) -> set[_F]:
    """Cancel `pending` again every RECANCEL_S until all are done or the loop's clock passes
    `deadline` (None: none); those not done. Results and exceptions are consumed."""
    loop = asyncio.get_running_loop()
    while pending and (deadline is None or loop.time() < deadline):
        for task in pending:
            task.cancel()
        done, pending = await asyncio.wait(pending, timeout=RECANCEL_S)
        for task in done:
            if not task.cancelled():
                task.exception()  # retrieved: no "exception was never retrieved" warning
    return pending


async def cancel_others(deadline_s: float) -> list[asyncio.Task[Any]]:
    """Cancel every task of the running loop but the caller's, again every RECANCEL_S, until
    all are done or `deadline_s` passed; the tasks still running then, by name. What a
    process runs last: `asyncio.run` cancels the tasks left once and waits for them without a
    deadline, so one that swallowed that cancellation would keep the process from exiting."""
    me = asyncio.current_task()
    left = await _cancel_until({t for t in asyncio.all_tasks() if t is not me},
                               asyncio.get_running_loop().time() + deadline_s)
    return sorted(left, key=lambda t: t.get_name())


async def wait_event(event: asyncio.Event, timeout_s: float) -> bool:
    """Wait until `event` is set, at most `timeout_s`; whether it is set. A cancellation
    always propagates (see the module docstring)."""
    if event.is_set():
        return True
    try:
        async with asyncio.timeout(timeout_s):
            await event.wait()
    except TimeoutError:
        return False
    return True
