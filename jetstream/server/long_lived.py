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
