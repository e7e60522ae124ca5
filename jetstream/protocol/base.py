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

#: Per message type, its fields' names in order, each with whether it must be given: what
#: `dataclasses.fields` says, asked once per type (every request and response needs it).
_SHAPES: dict[type[Any], tuple[tuple[str, bool], ...]] = {}


def _shape(cls: type[Any]) -> tuple[tuple[str, bool], ...]:
    shape = _SHAPES.get(cls)
    if shape is None:
        shape = _SHAPES[cls] = tuple(
            (f.name, f.default is MISSING and f.default_factory is MISSING) for f in fields(cls))
    return shape


@dataclass(frozen=True, slots=True)
class Message:
    """Base of requests and responses: the header is the dataclass's fields."""

    def to_header(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name, _required in _shape(type(self))}

    @classmethod
    def from_header(cls, header: Mapping[str, Any]) -> Self:
        """Build from a decoded header, ignoring unknown fields. Raises ProtocolError."""
        if not isinstance(header, Mapping):
            raise ProtocolError(f"{cls.__name__} header must be a map", field="header")
        kwargs: dict[str, Any] = {}
        for name, required in _shape(cls):
            if name in header:
                kwargs[name] = header[name]
            elif required:
                raise ProtocolError(f"{cls.__name__} lacks field {name!r}", field=name)
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
