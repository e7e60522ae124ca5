"""The errors of the broker's own NATS connection (jetstream.server.nats_ingest).

Theory of operation: each failure of the ingest connection that its user can act on is a
JetstreamError with a stable code. Those that a retry can fix once the connection is back
(`NatsConnectFailed`, `NatsNotConnected`) are also ConnectionErrors, so code written for
nats-py's connection errors catches them. `NatsUnsupported` is not a failure of the server:
it tells the broker to use nats-py for that server instead (jetstream.server.nats_port).
Malformed bytes from the server are `nats_wire.NatsProtocolError`.
"""

from __future__ import annotations

from jetstream.errors import JetstreamError


class NatsUnsupported(JetstreamError):
    """The server or URL needs a NATS feature this connection does not implement (TLS,
    WebSocket, ...). Use nats-py for this server: the broker falls back to it."""

    code = "NATS_UNSUPPORTED"


class NatsConnectFailed(JetstreamError, ConnectionError):
    """No server in the list could be connected to (refused, timed out, or rejected the
    CONNECT, e.g. bad credentials: see `reasons`). Check the URLs and credentials; retry."""

    code = "NATS_CONNECT_FAILED"
    retriable = True


class NatsNotConnected(JetstreamError, ConnectionError):
    """The connection is down and reconnecting, and the operation cannot wait: a `flush`, or
    a `publish_many` whose data does not fit the reconnect buffer. Retry after reconnecting."""

    code = "NATS_NOT_CONNECTED"
    retriable = True


class NatsPayloadTooLarge(JetstreamError):
    """A payload handed to `publish_many` is larger than the server's `max_payload` (the
    server would close the connection). Nothing of the batch was sent; send less."""

    code = "NATS_PAYLOAD_TOO_LARGE"

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"payload of {size} bytes exceeds the server's max_payload of {limit}",
                         size=size, limit=limit)


class NatsConnectionClosed(JetstreamError):
    """The connection was closed (by `close()`, or reconnecting gave up after
    `reconnect_attempts_max`); its subscriptions get no more messages. Open a new one."""

    code = "NATS_CONNECTION_CLOSED"
