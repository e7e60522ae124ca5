"""The base of every socket-API message: a frozen dataclass whose fields are its header.

Theory of operation: a frame's msgpack header carries the fields of one request or response
(frames.py). Each message type is a frozen dataclass of those fields: `to_header()` is the
header, `from_header(header)` takes the fields it knows and ignores the others (so a newer
peer can add fields), and `__post_init__` checks every field strictly (fields.py), locally
built or decoded alike. A request type names its op and the response type that answers it,
which is all the codec (codec.py) needs to register it; the records of a Fetch response ride
in the frame's payload, never in the header.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields
from typing import Any, ClassVar, Self

from jetstream.errors import ProtocolError
from jetstream.protocol.frames import Op


@dataclass(frozen=True, slots=True)
class Message:
    """Base of requests and responses: the header is the dataclass's fields."""

    def to_header(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_header(cls, header: Mapping[str, Any]) -> Self:
        """Build from a decoded header, ignoring unknown fields. Raises ProtocolError."""
        if not isinstance(header, Mapping):
            raise ProtocolError(f"{cls.__name__} header must be a map", field="header")
        kwargs: dict[str, Any] = {}
        for f in fields(cls):
            if f.name in header:
                kwargs[f.name] = header[f.name]
            elif f.default is MISSING and f.default_factory is MISSING:
                raise ProtocolError(f"{cls.__name__} lacks field {f.name!r}", field=f.name)
        return cls(**kwargs)


@dataclass(frozen=True, slots=True)
class Response(Message):
    """A response's frame echoes the op of the request it answers."""


@dataclass(frozen=True, slots=True)
class Request(Message):
    """`op` is the frame's op; `response_type` is what a broker answers it with (Kafka's
    RESPONSE_TYPE), so a requester can tell a wrong answer from a right one."""

    op: ClassVar[Op]
    response_type: ClassVar[type[Response]]

    def with_payload(self, payload: bytes) -> Self:
        """This request with the frame's payload (only MIRROR_APPEND carries one; the
        others ignore it)."""
        return self


@dataclass(frozen=True, slots=True)
class EmptyResponse(Response):
    """The answer of a request that only says "done" (CREATE_STREAM, COMMIT_OFFSET, ...)."""
