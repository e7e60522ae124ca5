"""Retention: how many of a log's oldest segments its limits no longer keep.

Theory of operation: retention deletes whole sealed segments, oldest first, by age (every
record older than `retention_ms`), by size (the log over `retention_bytes`) and by record
count (more than `retention_messages` records from the segment's base offset to the log end).
It never takes the active segment, nor a segment holding offsets at or past a limit (the high
watermark: consumers may not have seen those yet). The decision is pure; the log deletes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from jetstream.stream.config import LogConfig


class SegmentFacts(Protocol):
    @property
    def base_offset(self) -> int: ...
    @property
    def next_offset(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def max_timestamp(self) -> int: ...


def has_limits(config: LogConfig) -> bool:
    return not (config.retention_ms is None and config.retention_bytes is None
                and config.retention_messages is None)


def expired_count(segments: Sequence[SegmentFacts], config: LogConfig, now_ms: int,
                  log_end_offset: int, max_offset: int) -> int:
    """How many of `segments` (oldest first, the active one last) retention deletes."""
    total_bytes = sum(s.size for s in segments)
    count = 0
    while count < len(segments) - 1:
        oldest = segments[count]
        if oldest.next_offset > max_offset:
            break
        records = log_end_offset - oldest.base_offset
        expired = (
            (config.retention_ms is not None and oldest.max_timestamp >= 0
             and oldest.max_timestamp < now_ms - config.retention_ms)
            or (config.retention_bytes is not None and total_bytes > config.retention_bytes)
            or (config.retention_messages is not None and records > config.retention_messages)
        )
        if not expired:
            break
        total_bytes -= oldest.size
        count += 1
    return count
