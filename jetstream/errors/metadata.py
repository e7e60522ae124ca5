"""The metadata Raft log, and reads of compacted streams by key."""

from __future__ import annotations

from jetstream.errors.base import JetstreamError


class MetadataUnavailable(JetstreamError):
    """The metadata Raft group could not commit a proposal in time: no leader (an election is
    under way, or too few brokers are up to form a majority), leadership moved while the
    proposal was in flight, the proposal queue is full, or this broker's metadata is closed.
    `reason` says which. Retry after a short wait. When `reason` is "timeout" or
    "unknown_outcome" the command may still have been applied: re-read the metadata before
    deciding again (if it was, a repeated create answers "existed", a repeated delete
    UNKNOWN_STREAM and a repeated leader or ISR change STALE_METADATA_EPOCH)."""

    code = "METADATA_UNAVAILABLE"
    retriable = True

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"metadata unavailable ({reason})" + (f": {detail}" if detail else ""),
                         reason=reason, detail=detail)


class NotCompacted(JetstreamError):
    """Reads by key need a compacted stream (`cleanup_policy` compact or compact,delete): this
    one keeps every record. Create the stream compacted, or update its cleanup policy."""

    code = "NOT_COMPACTED"

    def __init__(self, stream: str) -> None:
        super().__init__(f"stream {stream!r} is not compacted: reads by key need "
                         f"cleanup_policy compact", stream=stream)


class OffsetNotIndexed(JetstreamError):
    """A read by key asked for `min_offset` (read-your-writes), but within its wait the
    partition's key index had not reached it (not committed yet, or the index is catching
    up). Retry, or wait longer."""

    code = "OFFSET_NOT_INDEXED"
    retriable = True

    def __init__(self, stream: str, partition: int, min_offset: int, covered: int) -> None:
        super().__init__(f"{stream}/{partition}: offset {min_offset} is not indexed yet "
                         f"(indexed below {covered})", stream=stream, partition=partition,
                         min_offset=min_offset, covered_offset=covered)


class KeyNotFound(JetstreamError):
    """The compacted stream holds no committed value for the key (never written, or deleted
    by a tombstone). The HTTP API answers it with 404; the client's `get` returns None."""

    code = "KEY_NOT_FOUND"

    def __init__(self, stream: str, key: str) -> None:
        super().__init__(f"no value for key {key!r} in stream {stream!r}", stream=stream,
                         key=key)
