"""Frames of typed messages: the registry of request types, encoders and decoders.

Theory of operation: a frame's op says which request type its header holds, and a response
frame echoes its request's op, so the op alone picks the type to decode either. The
registry is built from each concern module's REQUESTS (every request type names its op and
its response type), so a new message type is added in its concern's module; a new concern
module adds one entry to `_CONCERNS`. Decoding a request raises ProtocolError (the server
answers it with an error frame and carries on); decoding an error frame raises the error it
carries (wire_errors.py), so a requester sees the broker's exception as if raised locally.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from jetstream.errors import JetstreamError, ProtocolError
from jetstream.protocol import (
    admin,
    auth,
    datastreams,
    fragments,
    groups,
    integrity,
    kv,
    mirror,
    offsets,
    reads,
    registers,
    replica_fetch,
    replication,
)
from jetstream.protocol.base import Request, Response
from jetstream.protocol.frames import (
    RESPONSE_HEADER_BYTES_MAX,
    Frame,
    Kind,
    Op,
    encode_frame,
    parse_op,
)
from jetstream.protocol.wire_errors import error_from_header, error_header

_R = TypeVar("_R", bound=Response)

_CONCERNS = (reads, admin, replication, offsets, groups, kv, integrity, replica_fetch,
             fragments, registers, auth, datastreams, mirror)

REQUEST_TYPES: Mapping[Op, type[Request]] = {
    request_type.op: request_type for concern in _CONCERNS for request_type in concern.REQUESTS}
RESPONSE_TYPES: Mapping[Op, type[Response]] = {
    op: request_type.response_type for op, request_type in REQUEST_TYPES.items()}
assert len(REQUEST_TYPES) == sum(len(concern.REQUESTS) for concern in _CONCERNS), \
    "two request types declare one op"


def encode_request(correlation_id: int, request: Request) -> bytes:
    return encode_frame(correlation_id, Kind.REQUEST, request.op, request.to_header())


def encode_response(correlation_id: int, op: Op, response: Response,
                    payload_length: int = 0) -> bytes:
    """The prefix and header of a response; the caller sends `payload_length` bytes after."""
    return encode_frame(correlation_id, Kind.RESPONSE, op, response.to_header(), payload_length,
                        header_bytes_max=RESPONSE_HEADER_BYTES_MAX)


def encode_error(correlation_id: int, op: int, exc: JetstreamError) -> bytes:
    """An error frame answering the request `correlation_id` (whose op may be unknown)."""
    return encode_frame(correlation_id, Kind.ERROR, op, error_header(exc))


def decode_request(frame: Frame) -> Request:
    """The typed request a frame carries. Raises ProtocolError (answer it with an error frame):
    not a request, an unknown op, HELLO (see frames.parse_hello_request) or a bad header."""
    if frame.kind != Kind.REQUEST:
        raise ProtocolError(f"expected a request frame, got {frame.kind.name}", field="kind")
    op = parse_op(frame.op)
    request_type = REQUEST_TYPES.get(op)
    if request_type is None:
        raise ProtocolError(f"op {op.name} has no request type here", field="op")
    request = request_type.from_header(frame.header)
    return request.with_payload(frame.payload) if frame.payload else request


def decode_response(frame: Frame) -> Response:
    """The typed response a frame carries; an error frame raises the error it carries."""
    if frame.kind == Kind.ERROR:
        raise error_from_header(frame.header)
    if frame.kind != Kind.RESPONSE:
        raise ProtocolError(f"expected a response frame, got {frame.kind.name}", field="kind")
    response_type = RESPONSE_TYPES.get(parse_op(frame.op))
    if response_type is None:
        raise ProtocolError(f"op {frame.op} has no response type here", field="op")
    return response_type.from_header(frame.header)


def expect_response(response: Response, response_type: type[_R]) -> _R:
    """`response` as the `response_type` a request expects. Raises ProtocolError when the
    peer answered with another type: the peer's fault, not ours, so not an assert."""
    if not isinstance(response, response_type):
        raise ProtocolError(f"expected {response_type.__name__}, got "
                            f"{type(response).__name__}", field="op")
    return response
