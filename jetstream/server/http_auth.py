"""Authentication and authorization of the HTTP API, and its /acls routes.

Theory of operation: with the broker's `authentication` on, every route but `GET /health`
runs `guard` first (a FastAPI dependency of the whole app, so it sees the matched route,
its path parameters and the body FastAPI already read). It takes the principal from the
`Authorization` header — `Basic base64(user:password)` or `Bearer user:secret` (a token),
the same users as the socket API — and answers 401 UNAUTHENTICATED (with
`WWW-Authenticate`) without one that checks. With `authorization` on it then checks the
(operation, resource) pairs the route needs (`_NEEDS`, by method and path template; a route
not in the table needs `cluster_admin`), answering 403 NOT_AUTHORIZED. The principal is
kept in `request.state.principal`: `GET /streams` lists only the streams it may describe.
While the route runs the request holds one of the principal's in-flight slots (shared with
the socket API: `principal_requests_max`; 429 TOO_MANY_IN_FLIGHT past it).

A client certificate the HTTP listener verified (`http_tls_verify_client`) names the
principal too, as on the socket API (its CN), when the request carries no `Authorization`
header: uvicorn hands no certificate to the application, so `PeerPrincipalProtocol` (the
HTTP protocol uvicorn runs) reads it from the connection's TLS transport once the handshake
is done and puts it in each request's scope.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
from collections.abc import AsyncIterator, Callable
from typing import Any, ClassVar

from fastapi import Body, FastAPI, Query, Request
from starlette.routing import BaseRoute
from uvicorn.protocols.http.auto import AutoHTTPProtocol

from jetstream.errors import InvalidAcl, Unauthenticated
from jetstream.protocol import messages as m
from jetstream.security.acl import CLUSTER
from jetstream.security.auth import certificate_principal
from jetstream.server.acl_admin import AclAdmin
from jetstream.server.gatekeeper import ANONYMOUS, Gatekeeper, Need

#: Routes anyone may call, authenticated or not.
OPEN_ROUTES = frozenset({("GET", "/health")})
#: Routes every authenticated principal may call (what they show is filtered or public).
AUTHENTICATED_ROUTES = frozenset({("GET", "/streams"), ("GET", "/docs"),
                                  ("GET", "/openapi.json"), ("GET", "/docs/oauth2-redirect")})
_DESCRIBE_CLUSTER: Need = ("describe", "cluster", CLUSTER)
_CLUSTER_ADMIN: Need = ("cluster_admin", "cluster", CLUSTER)
_NEEDS: dict[tuple[str, str], tuple[str, str]] = {
    # (method, path template): (operation, resource type); the resource is the path's
    # {name} or {group}, the body's name for POST /streams, the cluster for cluster.
    ("GET", "/metrics"): ("describe", "cluster"),
    ("GET", "/cluster"): ("describe", "cluster"),
    ("POST", "/streams"): ("create", "stream"),
    ("GET", "/streams/{name}"): ("describe", "stream"),
    ("PATCH", "/streams/{name}"): ("alter", "stream"),
    ("DELETE", "/streams/{name}"): ("delete", "stream"),
    ("GET", "/streams/{name}/keys"): ("read", "stream"),
    ("GET", "/streams/{name}/keys/{key}"): ("read", "stream"),
    ("GET", "/streams/{name}/partitions/{partition}/fragments"): ("describe", "stream"),
    ("POST", "/streams/{name}/partitions/{partition}/fragments/prune"): ("alter", "stream"),
    ("GET", "/streams/{name}/partitions/{partition}/messages"): ("read", "stream"),
    ("POST", "/streams/{name}/partitions/{partition}/messages"): ("write", "stream"),
    ("GET", "/streams/{name}/partitions/{partition}/registers"): ("read", "stream"),
    ("GET", "/groups"): ("describe", "cluster"),
    ("GET", "/groups/{group}"): ("describe", "group"),
    ("GET", "/groups/{group}/offsets"): ("group", "group"),
    ("POST", "/groups/{group}/offsets"): ("group", "group"),
    ("POST", "/groups/{group}/offsets/reset"): ("group", "group"),
    ("DELETE", "/groups/{group}/offsets"): ("delete", "group"),
    ("GET", "/acls"): ("describe", "cluster"),
    ("POST", "/acls"): ("cluster_admin", "cluster"),
    ("POST", "/acls/delete"): ("cluster_admin", "cluster"),
    # Datastreams: reading them is describing the cluster; changing them (create, delete,
    # update, pause, resume, batch update) is administering it (not in the table).
    ("GET", "/datastreams"): ("describe", "cluster"),
    ("POST", "/datastreams/batch/get"): ("describe", "cluster"),
    ("GET", "/datastreams/{name}"): ("describe", "cluster"),
    ("GET", "/diagnostics/datastreams/{name}"): ("describe", "cluster"),
}


def credentials_of(header: str) -> m.Credentials:
    """The credentials of an `Authorization` header; Unauthenticated when it holds none."""
    scheme, _, value = header.strip().partition(" ")
    value = value.strip()
    if scheme.lower() == "bearer" and value:
        try:
            return m.Credentials.from_token(value)
        except ValueError:
            raise Unauthenticated("a bearer token is 'user:secret'") from None
    if scheme.lower() == "basic" and value:
        try:
            user, sep, password = base64.b64decode(value, validate=True).decode().partition(":")
        except (binascii.Error, ValueError):
            raise Unauthenticated("Basic credentials are base64(user:password)") from None
        if sep and user and password:
            return m.Credentials(user, password)
    raise Unauthenticated("send Authorization: Basic base64(user:password) or "
                          "Bearer user:secret")


async def _body(request: Request) -> Any:
    try:
        return json.loads(await request.body() or b"null")
    except ValueError:
        return None  # the route answers BAD_REQUEST


async def needs(request: Request, method: str, path: str) -> list[Need]:
    """What the route at `path` (its template) needs for this request."""
    need = _NEEDS.get((method, path))
    if need is None:
        return [_CLUSTER_ADMIN]
    operation, resource_type = need
    params = request.path_params
    if resource_type == "cluster":
        return [(operation, "cluster", CLUSTER)]
    if resource_type == "group":
        found: list[Need] = [(operation, "group", str(params.get("group", "")))]
        if method == "POST":  # commits and resets read the streams they name
            body = await _body(request)
            items = body.get("offsets") if isinstance(body, dict) else None
            streams = [body.get("stream")] if isinstance(body, dict) else []
            streams += [i.get("stream") for i in items or () if isinstance(i, dict)]
            found += [("read", "stream", s) for s in dict.fromkeys(streams)
                      if isinstance(s, str)]
        return found
    if "name" in params:
        return [(operation, "stream", str(params["name"]))]
    body = await _body(request)
    name = body.get("name") if isinstance(body, dict) else None
    return [(operation, "stream", name if isinstance(name, str) else "")]


#: The scope key under which a verified client certificate's principal travels.
PEER_PRINCIPAL = "jetstream.peer_principal"


class PeerPrincipalProtocol(AutoHTTPProtocol):  # type: ignore[misc,valid-type]
    """uvicorn's HTTP protocol, which adds the principal of a verified client certificate
    (its CN) to the scope of every request of the connection, and closes a connection whose
    next request's headers are not all in within `headers_timeout_s` of the connection, or
    of that request's first byte, or whose request body is not all in within
    `headers_timeout_s` of its headers (slowloris clients; uvicorn only times out idle
    keep-alive connections). `on_stalled` counts each one closed."""

    headers_timeout_s: ClassVar[float] = 30.0
    on_stalled: ClassVar[Callable[[], None] | None] = None

    def connection_made(self, transport: asyncio.Transport) -> None:
        principal = certificate_principal(transport.get_extra_info("peercert"))
        if principal is not None:
            app: Any = getattr(self, "app")  # noqa: B009 (set by uvicorn; untyped here)

            async def tagged(scope: dict[str, Any], receive: Any, send: Any) -> None:
                scope[PEER_PRINCIPAL] = principal
                await app(scope, receive, send)

            self.app = tagged
        super().connection_made(transport)
        self._headers_timer: asyncio.TimerHandle | None = None
        self._awaited: Any = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._await_headers(transport)

    def data_received(self, data: bytes) -> None:
        cycle = getattr(self, "cycle", None)  # uvicorn's cycle of the last request's headers
        if self._headers_timer is None and (cycle is None or cycle.response_complete):
            self._await_headers(self.transport)  # the first byte of the next request
        super().data_received(data)
        cycle = getattr(self, "cycle", None)
        if self._headers_timer is not None and cycle is not self._awaited:
            self._headers_timer.cancel()  # its headers are all in: a new cycle began
            self._headers_timer = None
            if cycle is not None and cycle.more_body:  # and its body is still to come
                self._body_timer = asyncio.get_running_loop().call_later(
                    self.headers_timeout_s, self._body_stalled, cycle)
        if self._body_timer is not None and (cycle is None or not cycle.more_body):
            self._body_timer.cancel()
            self._body_timer = None

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in (self._headers_timer, self._body_timer):
            if timer is not None:
                timer.cancel()
        self._headers_timer = self._body_timer = None
        super().connection_lost(exc)

    def _await_headers(self, transport: asyncio.Transport) -> None:
        self._awaited = getattr(self, "cycle", None)
        self._headers_timer = asyncio.get_running_loop().call_later(
            self.headers_timeout_s, self._stalled, transport)

    def _stalled(self, transport: asyncio.Transport) -> None:
        self._headers_timer = None
        if getattr(self, "cycle", None) is self._awaited:
            self._close_stalled(transport)

    def _body_stalled(self, cycle: Any) -> None:
        self._body_timer = None
        if getattr(self, "cycle", None) is cycle and cycle is not None and cycle.more_body:
            self._close_stalled(self.transport)

    def _close_stalled(self, transport: asyncio.Transport) -> None:
        if not transport.is_closing():
            count = type(self).on_stalled
            if count is not None:
                count()
            transport.close()


def guard(gate: Gatekeeper) -> Callable[[Request], AsyncIterator[None]]:
    """The app-wide dependency: authenticate, then authorize, each request, and hold one
    of its principal's in-flight slots while the route runs."""

    async def check(request: Request) -> AsyncIterator[None]:
        route: BaseRoute | None = request.scope.get("route")
        path = getattr(route, "path", request.url.path)
        method = request.method
        request.state.principal = ANONYMOUS
        if (method, path) in OPEN_ROUTES or not gate.authentication:
            yield
            return
        header = request.headers.get("authorization")
        peer = request.scope.get(PEER_PRINCIPAL)
        if header:
            principal = await gate.authenticate(credentials_of(header), "HTTP API")
        elif isinstance(peer, str):
            principal = peer
        else:
            raise Unauthenticated("this broker needs credentials: Authorization: Basic "
                                  "base64(user:password) or Bearer user:secret, or a client "
                                  "certificate it verifies")
        request.state.principal = principal
        if (method, path) not in AUTHENTICATED_ROUTES:
            for operation, resource_type, name in await needs(request, method, path):
                gate.check_one(principal, operation, resource_type, name)
        with gate.admit(principal):
            yield

    return check


def principal_of(request: Request) -> str:
    return str(getattr(request.state, "principal", ANONYMOUS))


def add_acl_routes(app: FastAPI, acls: AclAdmin, errors: Callable[..., Any]) -> None:
    """GET /acls (list), POST /acls (add), POST /acls/delete (remove)."""

    @app.get("/acls", responses=errors(400))
    async def list_acls(principal: str | None = None,
                        resource_type: str | None = Query(None)) -> dict[str, Any]:
        """The ACL entries (of one principal, of one resource type) and their version."""
        entries, version = acls.list(principal, resource_type)
        return {"acls": entries, "version": version}

    @app.post("/acls", responses=errors(400, 503))
    async def add_acls(body: dict[str, Any] = Body(...)) -> dict[str, Any]:  # noqa: B008
        """Add entries `{"acls": [{principal, permission, operation, resource_type,
        pattern}]}`; answers how many were new."""
        return {"added": await acls.add(_entries(body))}

    @app.post("/acls/delete", responses=errors(400, 503))
    async def remove_acls(body: dict[str, Any] = Body(...)) -> dict[str, Any]:  # noqa: B008
        """Remove entries (the body of POST /acls); answers how many were there."""
        return {"removed": await acls.remove(_entries(body))}


def _entries(body: dict[str, Any]) -> list[dict[str, Any]]:
    items = body.get("acls")
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise InvalidAcl("acls must be a list of entries (objects)", field="acls")
    return items
