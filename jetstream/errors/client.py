"""What the client reports about brokers it cannot reach and acks it did not get."""

from __future__ import annotations

from jetstream.errors.base import JetstreamError


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
