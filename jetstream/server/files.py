"""The broker's open-file limit and its budget of descriptors for partition files.

Theory of operation: a process may hold at most RLIMIT_NOFILE descriptors, and its soft limit
is often 1,024 while the hard limit is far higher. At start the broker raises the soft limit
to the hard one (`raise_limit`), as Kafka's and NATS's service units do by hand, and logs
both. Files of partitions (segment files, key indexes) are then held in one bounded pool
(jetstream.stream.handles) of `open_files_max` descriptors; 0 (the default) sizes it at half
the limit (`budget`), which leaves the other half for sockets (clients, followers, NATS,
Raft), descriptors lent to reads in flight, and short-lived files (checkpoints, the cleaner).
A partition replica holds no descriptor of its own besides what the pool lends it.

The figures are described for `/health`, the broker's own entry of `cluster status`, and
rendered for `GET /metrics` (`jetstream_files_*`).
"""

from __future__ import annotations

import logging
import os
import resource
from dataclasses import dataclass
from typing import Any

from jetstream.server.config import OPEN_FILES_MIN
from jetstream.stream.handles import HandlePool

log = logging.getLogger(__name__)

#: The share of the open-file limit an automatic budget takes: 1/OPEN_FILES_SHARE_DIVISOR.
OPEN_FILES_SHARE_DIVISOR = 2
#: Where an unlimited hard limit is raised to (Linux refuses more than fs.nr_open, 2^20 by
#: default).
NOFILE_CEILING = 1 << 20

_HELP = {
    "limit": ("gauge", ("The process's open-file limit (RLIMIT_NOFILE, soft), raised at "
                        "start to the hard limit.")),
    "max": ("gauge", ("Descriptors of partition files (segments, key indexes) held open at "
                      "most (open_files_max).")),
    "open": ("gauge", "Descriptors of partition files held open now."),
    "process_open": ("gauge", "Descriptors the process holds open now: files, sockets, pipes."),
    "opens_total": ("counter", ("Partition files opened (a closed one is opened again when "
                                "it is next used).")),
    "evictions_total": ("counter", "Partition files closed to stay within open_files_max."),
}


def raise_limit() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit; returns (soft, hard) as they are
    after. A limit the system refuses to raise is left as it was (and logged)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = NOFILE_CEILING if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open-file limit from %d to %d: %s", soft, target,
                        exc)
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft, hard


def budget(limit: int, configured: int) -> int:
    """Descriptors the partition files may hold: `configured` (open_files_max) when set, else
    a share of the open-file `limit` (RLIM_INFINITY counts as NOFILE_CEILING)."""
    if configured:
        return configured
    if limit == resource.RLIM_INFINITY or limit < 0:
        limit = NOFILE_CEILING
    return max(OPEN_FILES_MIN, limit // OPEN_FILES_SHARE_DIVISOR)


def process_open_files() -> int | None:
    """Descriptors this process holds open now; None where /proc is not there."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return None


@dataclass
class OpenFiles:
    """The limit, the budget and the pool that keeps to it."""

    limit: int
    hard_limit: int
    pool: HandlePool

    @classmethod
    def start(cls, configured: int) -> OpenFiles:
        """Raise the limit and size the pool (`configured`: open_files_max, 0 for auto)."""
        soft, hard = raise_limit()
        files_max = budget(soft, configured)
        if soft != resource.RLIM_INFINITY and files_max > soft // OPEN_FILES_SHARE_DIVISOR:
            log.warning("open_files_max %d is over half the open-file limit %d: sockets may "
                        "run out of descriptors", files_max, soft)
        log.info("open-file limit %d (hard %d); partition files held open at most: %d",
                 soft, hard, files_max)
        return cls(soft, hard, HandlePool(files_max))

    def describe(self) -> dict[str, Any]:
        return {"limit": self.limit, "hard_limit": self.hard_limit,
                "open_files_max": self.pool.max_open, "open": self.pool.open_count,
                "process_open": process_open_files()}

    def render_metrics(self) -> list[str]:
        """Prometheus text lines of the open-file figures."""
        pool = self.pool
        values = {"limit": self.limit, "max": pool.max_open, "open": pool.open_count,
                  "process_open": process_open_files(), "opens_total": pool.opens,
                  "evictions_total": pool.evictions}
        lines: list[str] = []
        for name, (kind, text) in _HELP.items():
            value = values[name]
            if value is None:
                continue
            metric = f"jetstream_files_{name}"
            lines += [f"# HELP {metric} {text}", f"# TYPE {metric} {kind}", f"{metric} {value}"]
        return lines
