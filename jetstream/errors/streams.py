"""Streams, partitions, leadership and fetch sessions."""

from __future__ import annotations

from jetstream.errors.base import InvalidConfig, JetstreamError


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
