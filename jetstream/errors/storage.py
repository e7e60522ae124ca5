"""Failures of the log on disk and of the fragment store."""

from __future__ import annotations

from jetstream.errors.base import JetstreamError


class StorageError(JetstreamError):
    """The commit log could not do what was asked."""

    code = "STORAGE_ERROR"


class SegmentsChanged(StorageError):
    """A log's segments changed (retention, truncation) while the log cleaner rewrote them:
    the pass is dropped and nothing is swapped in. The cleaner plans again later."""

    code = "SEGMENTS_CHANGED"
    retriable = True


class OffsetOutOfRange(StorageError):
    """The offset is below the log start offset or above the newest readable offset.

    Resume from `oldest` (data was removed by retention) or wait for `newest` to grow.
    """

    code = "OFFSET_OUT_OF_RANGE"
    offset: int
    oldest: int
    newest: int

    def __init__(self, offset: int, oldest: int, newest: int) -> None:
        super().__init__(
            f"offset {offset} is outside the readable range [{oldest}, {newest}]",
            offset=offset,
            oldest=oldest,
            newest=newest,
        )


class CorruptRecord(StorageError):
    """Bytes read back from disk fail their CRC or structure check.

    The log refuses to serve them. On a replicated partition, fetch the range from another
    replica; locally, the segment needs repair (reopening runs recovery on unflushed segments).
    """

    code = "CORRUPT_RECORD"
    path: str
    position: int
    #: The damaged offsets [first_offset, end_offset) when known, else -1.
    first_offset: int
    end_offset: int

    def __init__(self, message: str, *, path: str = "", position: int = -1,
                 first_offset: int = -1, end_offset: int = -1) -> None:
        super().__init__(message, path=path, position=position, first_offset=first_offset,
                         end_offset=end_offset)


class RangeRepairing(StorageError):
    """The leader's copy of these offsets is damaged and no in-sync replica could supply a
    checked copy just now (none reachable, or none in sync). Retry shortly: the leader keeps
    trying, or hands its leadership to a replica with a healthy copy."""

    code = "RANGE_REPAIRING"
    retriable = True
    first_offset: int
    end_offset: int

    def __init__(self, stream: str, partition: int, first_offset: int, end_offset: int,
                 why: str = "") -> None:
        super().__init__(
            f"{stream}/{partition}: offsets [{first_offset}, {end_offset}) are damaged on "
            f"the leader and being repaired{': ' + why if why else ''}; retry",
            stream=stream, partition=partition, first_offset=first_offset,
            end_offset=end_offset)


class RangeLost(StorageError):
    """Every replica's copy of these offsets is damaged: the records in
    [first_offset, end_offset) cannot be read. Nothing is served in their place; read on
    from `end_offset`. Operators see the range in `stream info` until it is gone (retention,
    a deleted stream)."""

    code = "RANGE_LOST"
    first_offset: int
    end_offset: int

    def __init__(self, stream: str, partition: int, first_offset: int,
                 end_offset: int) -> None:
        super().__init__(
            f"{stream}/{partition}: offsets [{first_offset}, {end_offset}) are damaged on "
            f"every replica and lost; read on from {end_offset}",
            stream=stream, partition=partition, first_offset=first_offset,
            end_offset=end_offset)


class RecordTooLarge(StorageError):
    """A record is larger than `record_bytes_max`. Split it or raise the stream's limit."""

    code = "MESSAGE_TOO_LARGE"

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"record of {size} bytes exceeds the limit of {limit}", size=size,
                         limit=limit)


class BatchTooLarge(StorageError):
    """A batch has more records or bytes than the log accepts in one append. Send less at once."""

    code = "BATCH_TOO_LARGE"

    def __init__(self, size: int, limit: int, unit: str) -> None:
        super().__init__(f"batch of {size} {unit} exceeds the limit of {limit}", size=size,
                         limit=limit, unit=unit)


class InvalidBatch(StorageError):
    """Raw batch bytes handed to the log (a replica's copy) are malformed or out of sequence."""

    code = "INVALID_BATCH"


class StaleLeaderEpoch(StorageError):
    """A batch carries a leader epoch older than one the log has already seen: the writer was
    deposed. It must stop leading and follow the current leader."""

    code = "STALE_LEADER_EPOCH"

    def __init__(self, epoch: int, latest: int) -> None:
        super().__init__(f"leader epoch {epoch} is older than the latest epoch {latest}",
                         epoch=epoch, latest=latest)


class LogClosed(StorageError):
    """The log was closed (stream deleted or broker stopping). Reopen it or look it up again."""

    code = "LOG_CLOSED"


class DiskFull(StorageError):
    """The disk has no room for the write. Nothing partial was kept; free space and retry."""

    code = "DISK_FULL"
    retriable = True


class FragmentStoreUnavailable(StorageError):
    """The stream's fragment store (`fragment_store`) could not be reached or refused the
    request. Nothing is lost: sealed segments stay on the brokers' disks and offload retries
    with backoff; a read of offloaded offsets may be retried later."""

    code = "FRAGMENT_STORE_UNAVAILABLE"
    retriable = True
    url: str
    reason: str

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"fragment store {url} unavailable: {reason}", url=url, reason=reason)


class CorruptFragment(StorageError):
    """A fragment read from the store does not hold what its name says (its SHA-256 differs,
    or it cannot be decompressed). It is never served. Restore the object (another copy, a
    replica's segment) or prune it."""

    code = "CORRUPT_FRAGMENT"
    url: str

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"fragment {url} is corrupt: {reason}", url=url, reason=reason)
