"""Frames, routes and versions of the socket and HTTP APIs, and errors of unknown code."""

from __future__ import annotations

from typing import Any

from jetstream.errors.base import JetstreamError


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
