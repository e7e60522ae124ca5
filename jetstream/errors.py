"""The error tree: every failure a caller can act on, each with a stable code.

Codes cross the wire (socket API, HTTP, acks), so they never change once published. Each class
says when it happens and what the caller should do. Data travels in attributes, never only in
the message text. Local protocol errors and errors reported by a remote broker are distinct:
a remote error arrives as `RemoteError` subclasses in the client (see jetstream.client).
"""

from __future__ import annotations

from typing import Any, ClassVar


class JetstreamError(Exception):
    """Base of every error Jetstream raises on purpose."""

    code: ClassVar[str] = "INTERNAL"
    #: True when the same request may succeed if simply retried later.
    retriable: ClassVar[bool] = False

    def __init__(self, message: str = "", **fields: Any) -> None:
        self.fields = fields
        for name, value in fields.items():
            setattr(self, name, value)
        super().__init__(message or self.__class__.__doc__ or self.code)

    def to_dict(self) -> dict[str, Any]:
        """The wire form: code, message and the data fields."""
        return {"code": self.code, "message": str(self), **self.fields}


# -- storage -----------------------------------------------------------------------------------


class StorageError(JetstreamError):
    """The commit log could not do what was asked."""

    code = "STORAGE_ERROR"


class OffsetOutOfRange(StorageError):
    """The offset is below the log start offset or above the newest readable offset.

    Resume from `oldest` (data was removed by retention) or wait for `newest` to grow.
    """

    code = "OFFSET_OUT_OF_RANGE"

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

    def __init__(self, message: str, *, path: str = "", position: int = -1) -> None:
        super().__init__(message, path=path, position=position)


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


class InvalidConfig(JetstreamError):
    """A configuration value is missing, of the wrong type or out of its range."""

    code = "INVALID_CONFIG"
