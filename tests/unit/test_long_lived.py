"""LongLivedObjects: the objects of started roles leave the collector's full collections
every SETTLE_ROLES roles, and come back for one full collection every THAW_ROLES stopped."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from jetstream.server.long_lived import LongLivedObjects


@pytest.fixture(autouse=True)
def thawed() -> Iterator[None]:
    """This test process's heap is not ours to keep frozen."""
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_started_roles_freeze_the_heap_every_settle_roles() -> None:
    heap = LongLivedObjects(settle_roles=4, thaw_roles=100)
    heap.observe(3, 0)
    assert heap.freezes == 0 and gc.get_freeze_count() == 0
    heap.observe(4, 0)
    assert heap.freezes == 1 and gc.get_freeze_count() > 0
    heap.observe(7, 0)  # 3 more since the freeze
    assert heap.freezes == 1
    heap.observe(8, 0)
    assert heap.freezes == 2


def test_stopped_roles_give_their_cycles_back_to_the_collector() -> None:
    class Role:
        def __init__(self) -> None:
            self.me = self  # a cycle: only a collection frees it

    heap = LongLivedObjects(settle_roles=1, thaw_roles=2)
    roles = [Role() for _ in range(3)]
    heap.observe(3, 0)
    assert heap.freezes == 1
    refs = [weakref.ref(role) for role in roles]
    del roles
    gc.collect()  # frozen: the cycles survive a full collection
    assert all(ref() is not None for ref in refs)
    heap.observe(3, 2)
    assert heap.thaws == 1 and heap.freezes == 1
    assert all(ref() is None for ref in refs)


def test_limits_are_checked() -> None:
    with pytest.raises(ValueError):
        LongLivedObjects(settle_roles=0)


async def test_a_reconcile_tells_the_heap_keeper_between_its_waves() -> None:
    """A broker starting thousands of roles in one reconcile settles its heap as it goes,
    not once at the end (jetstream.server.roles._all_of's `between`)."""
    from jetstream.server.roles import ROLES_CHANGED_TOGETHER, _all_of

    started = 0
    seen: list[int] = []

    async def start() -> None:
        nonlocal started
        started += 1

    await _all_of([start() for _ in range(2 * ROLES_CHANGED_TOGETHER + 1)],
                  lambda: seen.append(started))
    assert seen == [ROLES_CHANGED_TOGETHER, 2 * ROLES_CHANGED_TOGETHER,
                    2 * ROLES_CHANGED_TOGETHER + 1]
