"""Publishing many small NATS messages at once (acks), cheaper than one `publish` each.

nats-py's `publish` validates, builds and queues one PUB command per call, and costs several
microseconds each; a broker acking tens of thousands of messages a second spends most of its
time there. `publish_many` builds the PUB commands of a whole batch itself (the NATS client
protocol: `PUB <subject> <size>\\r\\n<payload>\\r\\n`) and queues them as one write through
the client's pending buffer, then asks its flusher to send. It relies on two members of
nats-py's client (`_send_command`, `_flush_pending`; nats-py is pinned below 3) and falls back
to plain `publish` when they are missing or the client is not connected (during a reconnect
nats-py's own buffering rules apply).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


async def publish_many(nc: Any, messages: Sequence[tuple[str, bytes]]) -> None:
    """Publish (subject, payload) pairs in order. Subjects must be valid NATS subjects (acks
    go to reply subjects NATS delivered or to validated envelope inboxes)."""
    if not messages:
        return
    send = getattr(nc, "_send_command", None)
    flush = getattr(nc, "_flush_pending", None)
    if send is None or flush is None or not nc.is_connected:
        for subject, payload in messages:
            await nc.publish(subject, payload)
        return
    command = b"".join(
        b"PUB %s %d\r\n%s\r\n" % (subject.encode(), len(payload), payload)
        for subject, payload in messages
    )
    await send(command)
    await flush()
