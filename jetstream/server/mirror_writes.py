"""A mirror stream refuses every write but its datastream's copy.

Theory of operation: a stream whose `mirror` setting is set holds a copy of another stream,
batch for batch at the source's offsets (jetstream.server.mirror_api appends them). Anything
else written there would take offsets the source's records need, so a partition leader of a
mirror answers every message that reaches it through NATS with STREAM_IS_MIRROR (`refusals`:
the publisher's inbox and correlation id, as any refused publish), and a direct append
(HTTP) raises it.
"""

from __future__ import annotations

from jetstream.errors import JetstreamError, StreamIsMirror
from jetstream.protocol.envelope import PREFIX_BYTES as ENVELOPE_PREFIX
from jetstream.protocol.envelope import Envelope, Published, decode_published
from jetstream.raft_meta.model import StreamConfig
from jetstream.server.nats_wire import NatsMsg


def mirror_error(stream: StreamConfig) -> StreamIsMirror | None:
    """The refusal of a write into `stream` when it is a mirror; None when it is not."""
    return None if stream.mirror is None else StreamIsMirror(stream.name, stream.mirror)


def refusals(msgs: list[NatsMsg], error: JetstreamError
             ) -> list[tuple[str, str | None, JetstreamError]]:
    """(inbox, correlation id, error) of each message that asked for an answer."""
    out: list[tuple[str, str | None, JetstreamError]] = []
    for _subject, reply, _headers, data in msgs:
        decoded = decode_published(data) if data.startswith(ENVELOPE_PREFIX) else None
        if isinstance(decoded, Envelope | Published):
            inbox, corr = decoded.ack_inbox or reply, decoded.correlation_id
        else:
            inbox, corr = reply, None
        if inbox:
            out.append((inbox, corr, error))
    return out
