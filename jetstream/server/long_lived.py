"""Keep the cyclic garbage collector's full collections short on a broker that holds
thousands of partitions.

Theory of operation: each partition role a broker starts (a leader or a follower, its open
log, its tasks) leaves thousands of objects that live as long as the role. CPython runs a
full collection whenever the objects that survived the young generations grow by a quarter,
and a full collection walks every tracked object: on a broker creating its 3,000th stream
that was 100-400 ms with the event loop stopped (measured on the bench machine), the tail
of create, publish and fetch latencies, and growing with the partition count. So after
every SETTLE_ROLES roles started, the process moves what it holds now out of the
collector's reach (a young collection, then `gc.freeze()`), as it does once after start-up
(jetstream.cli): full collections then walk only what came after.

Frozen objects are still freed by reference counting; only reference cycles among them wait
for a full collection that includes them. Roles that stop leave such cycles (tasks and their
owners), so after every THAW_ROLES roles stopped the frozen objects go back to the collector
for one full collection (`gc.unfreeze()`, `gc.collect()`) and are frozen again: one long
pause per that many stopped roles, and memory that stopped roles held comes back.

Young collections: CPython collects the youngest generation every 700 net allocations of
tracked objects, and ingest allocates several per message (records, header dicts, ack
tuples), so a busy broker ran one every hundred-odd messages. `tune_young_collections` raises
that to YOUNG_OBJECTS: a young collection of that many objects takes about 0.05 ms on the
bench machine, and they run 14 times less often (ingest of messages with ids: 11 % more
messages per second, ack p99 19 -> 11 ms). The older generations keep their thresholds, in
collections of the next younger one, so full collections come no more often than before.

Only the broker process owns its heap (`jetstream server`, `jetstream dev`): a broker run
inside another program (the tests) leaves the collector alone.
"""

from __future__ import annotations

import gc
from typing import Final

#: Roles started between two freezes.
SETTLE_ROLES: Final = 256
#: Roles stopped between two full collections of the frozen objects.
THAW_ROLES: Final = 1024
#: Net allocations of tracked objects between two young collections (CPython: 700).
YOUNG_OBJECTS: Final = 10_000


def tune_young_collections(young_objects: int = YOUNG_OBJECTS) -> None:
    """Collect the youngest generation every `young_objects` allocations (see the module
    docstring); the older generations' thresholds stay."""
    _young, middle, old = gc.get_threshold()
    gc.set_threshold(young_objects, middle, old)


class LongLivedObjects:
    """Freezes and thaws by the roles started and stopped (see the module docstring)."""

    def __init__(self, settle_roles: int = SETTLE_ROLES, thaw_roles: int = THAW_ROLES) -> None:
        if settle_roles < 1 or thaw_roles < 1:
            raise ValueError("settle_roles and thaw_roles must be >= 1")
        self._settle_roles = settle_roles
        self._thaw_roles = thaw_roles
        self._started_seen = 0
        self._stopped_seen = 0
        #: Freezes and thaws done (`jetstream_roles_gc_freezes_total`, `..._thaws_total`).
        self.freezes = 0
        self.thaws = 0

    def observe(self, started: int, stopped: int) -> None:
        """Roles started and stopped so far (running totals): freeze or thaw when due."""
        if stopped - self._stopped_seen >= self._thaw_roles:
            self._stopped_seen = stopped
            self._started_seen = started
            gc.unfreeze()
            gc.collect()
            gc.freeze()
            self.thaws += 1
        elif started - self._started_seen >= self._settle_roles:
            self._started_seen = started
            gc.collect(1)
            gc.freeze()
            self.freezes += 1
