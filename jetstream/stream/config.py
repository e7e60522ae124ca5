"""Every limit and policy of one commit log, with its default and its unit."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from jetstream.errors import InvalidConfig

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB


class FsyncPolicy(enum.StrEnum):
    """When appended bytes are forced to stable storage.

    - ALWAYS: before an append returns (group commit: one fsync covers every append that
      arrived while the previous fsync ran). Power loss loses nothing that was appended.
    - INTERVAL: at most `fsync_interval_ms` after the append. Power loss can lose that window;
      a process crash loses nothing (the bytes are in the OS page cache).
    - NEVER: left to the OS (and to a clean close). Power loss can lose whatever the OS had not
      written back, typically up to ~30 s; a process crash loses nothing.
    """

    ALWAYS = "always"
    INTERVAL = "interval"
    NEVER = "never"


@dataclass(frozen=True, slots=True)
class LogConfig:
    #: A new segment starts when the active one would grow past this many bytes.
    segment_bytes_max: int = 64 * MiB
    #: ... or when a batch's newest record is this much newer than the segment's first record.
    segment_ms_max: int = 7 * 24 * 3600 * 1000
    #: An offset/time index entry at most every this many bytes of log.
    index_interval_bytes: int = 4 * KiB
    #: Largest encoded record (key + value + subject + headers + 28 bytes of framing).
    record_bytes_max: int = 1 * MiB
    #: Largest batch accepted in one append, in bytes and in records.
    batch_bytes_max: int = 16 * MiB
    batch_records_max: int = 100_000
    fsync: FsyncPolicy = FsyncPolicy.ALWAYS
    fsync_interval_ms: int = 1000
    #: Retention: whole segments are deleted once all their records are older than this,
    #: once the log holds more than this many bytes, or more than this many records.
    #: None means no limit.
    retention_ms: int | None = None
    retention_bytes: int | None = None
    retention_messages: int | None = None

    def __post_init__(self) -> None:
        # Relative offsets and file positions are stored as u32 in the index.
        _check_range("segment_bytes_max", self.segment_bytes_max, 4 * KiB, 2 * GiB)
        _check_range("segment_ms_max", self.segment_ms_max, 1, 10 * 365 * 24 * 3600 * 1000)
        _check_range("index_interval_bytes", self.index_interval_bytes, 1, 64 * MiB)
        _check_range("record_bytes_max", self.record_bytes_max, 64, 512 * MiB)
        _check_range("batch_bytes_max", self.batch_bytes_max, 64, 1 * GiB)
        _check_range("batch_records_max", self.batch_records_max, 1, 10_000_000)
        _check_range("fsync_interval_ms", self.fsync_interval_ms, 1, 3600 * 1000)
        if not isinstance(self.fsync, FsyncPolicy):
            raise InvalidConfig(f"fsync must be one of {[p.value for p in FsyncPolicy]}",
                                field="fsync")
        for name in ("retention_ms", "retention_bytes", "retention_messages"):
            value = getattr(self, name)
            if value is not None:
                _check_range(name, value, 1, 2**62)


def _check_range(name: str, value: object, low: int, high: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise InvalidConfig(f"{name} must be an integer in [{low}, {high}], got {value!r}",
                            field=name)
