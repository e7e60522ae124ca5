"""The broker's HTTP API (FastAPI, served by uvicorn inside the broker's event loop).

Stream CRUD, health, cluster view, Prometheus metrics, reading and appending messages, and
consumer groups (jetstream.server.http_groups). The stream routes call the broker only
through `HttpServices` (jetstream.server.api; the broker passes its stream admin), the same
services the socket API's handlers use, so both behave alike; the group routes go through
the broker's own client. OpenAPI docs are served at /docs, the document at /openapi.json.

Errors: every error answer, whatever raised it, has one body, `{"error": {"code", "message",
...}}` (the `ErrorResponse` model, declared in every route's responses), with the stable
code of the error tree and an HTTP status that fits the code (`_STATUS`):
- a JetstreamError keeps its code and data fields (UNKNOWN_STREAM -> 404, ...);
- a request FastAPI cannot validate (a query or path parameter of the wrong type or out of
  range, a body that is not a JSON object) is BAD_REQUEST, 400, with `field` naming the
  first parameter at fault (`messages[0].value` style) and every problem in the message;
- an unknown path is UNKNOWN_ROUTE (404), a method the route does not take
  METHOD_NOT_ALLOWED (405, with the Allow header); anything else INTERNAL (500).

Message bodies are JSON: keys, values and header values are base64 (standard alphabet)
because they are bytes. `GET .../messages?format=ndjson` streams one JSON object per line.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import socket
import zlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import uvicorn
from fastapi import Body, Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException
from starlette.routing import Match, Route

from jetstream.datastreams.http import STATUS as DATASTREAM_STATUS
from jetstream.datastreams.http import add_datastream_routes
from jetstream.errors import (
    JetstreamError,
    KeyNotFound,
    MethodNotAllowed,
    ProtocolError,
    Unauthenticated,
    UnknownRoute,
)
from jetstream.protocol import messages as m
from jetstream.protocol.envelope import AckPolicy
from jetstream.security.tls import server_ssl
from jetstream.server.acl_admin import AclAdmin
from jetstream.server.api import HttpServices
from jetstream.server.config import BrokerConfig
from jetstream.server.gatekeeper import Gatekeeper
from jetstream.server.guarded import from_http
from jetstream.server.http_auth import (
    PeerPrincipalProtocol,
    add_acl_routes,
    guard,
    principal_of,
)
from jetstream.server.http_groups import BrokerClient, add_group_routes
from jetstream.server.metrics import BrokerMetrics
from jetstream.stream.format import Record, StoredRecord, decode_batches

#: Most messages one GET returns and one POST appends.
READ_MESSAGES_MAX = 10_000
APPEND_MESSAGES_MAX = 10_000
READ_BYTES_MAX = 16 * 1024 * 1024
READ_WAIT_MS_MAX = 30_000
START_TIMEOUT_S = 10.0

_STATUS = {
    "UNKNOWN_STREAM": 404,
    "FRAGMENT_STORE_UNAVAILABLE": 503,
    "CORRUPT_FRAGMENT": 502,
    "KEY_NOT_FOUND": 404,
    "NOT_COMPACTED": 400,
    "OFFSET_NOT_INDEXED": 503,
    "KEY_INDEX_FULL": 507,
    "UNKNOWN_PARTITION": 404,
    "UNKNOWN_ROUTE": 404,
    "METHOD_NOT_ALLOWED": 405,
    "BAD_REQUEST": 400,
    "INVALID_CONFIG": 400,
    "INVALID_STREAM_CONFIG": 400,
    "STREAM_EXISTS": 409,
    "MESSAGE_TOO_LARGE": 413,
    "BATCH_TOO_LARGE": 413,
    "OFFSET_OUT_OF_RANGE": 416,
    "NOT_LEADER": 503,
    "NOT_ENOUGH_REPLICAS": 503,
    "METADATA_UNAVAILABLE": 503,
    "DISK_FULL": 507,
    "STREAM_PROTECTED": 403,
    "NOT_COORDINATOR": 503,
    "UNKNOWN_MEMBER_ID": 409,
    "FENCED_MEMBER": 409,
    "STALE_MEMBER_EPOCH": 409,
    "PARTITION_NOT_ASSIGNED": 409,
    "OFFSET_BEHIND_COMMITTED": 409,
    "GROUP_NOT_EMPTY": 409,
    "GROUP_FULL": 409,
    "TOO_MANY_GROUPS": 507,
    "NO_COMMITTED_OFFSET": 404,
    "OFFSET_MISMATCH": 412,
    "KEY_OFFSET_MISMATCH": 412,
    "REGISTER_MISMATCH": 412,
    "OUT_OF_ORDER_SEQUENCE": 409,
    "PRODUCER_FENCED": 409,
    "DUPLICATE_SEQUENCE": 409,
    "KEY_NOT_TRACKED": 409,
    "UNAUTHENTICATED": 401,
    "NOT_AUTHORIZED": 403,
    "INVALID_ACL": 400,
    "TOO_MANY_IN_FLIGHT": 429,
    **DATASTREAM_STATUS,
}


class ErrorDetail(BaseModel):
    """An error: its stable code, a message for people, and the error's data fields."""

    model_config = ConfigDict(extra="allow")

    code: str = Field(description="Stable error code (jetstream.errors), e.g. UNKNOWN_STREAM.",
                      examples=["BAD_REQUEST"])
    message: str = Field(description="What went wrong, for people.")
    field: str | None = Field(None, description="The request field at fault, when there is "
                              "one (`messages[0].value` for a nested one).",
                              examples=["offset"])


class ErrorResponse(BaseModel):
    """The body of every error answer of the HTTP API."""

    error: ErrorDetail


_DESCRIPTIONS = {
    400: "Bad request (BAD_REQUEST, INVALID_STREAM_CONFIG)",
    401: "No credentials, or refused ones (UNAUTHENTICATED)",
    403: "An internal stream (STREAM_PROTECTED), or no ACL entry allows it (NOT_AUTHORIZED)",
    404: "Unknown stream, partition or route",
    409: "The stream exists with another config (STREAM_EXISTS); a group's refusal "
         "(GROUP_NOT_EMPTY, OFFSET_BEHIND_COMMITTED, UNKNOWN_MEMBER_ID, ...)",
    413: "A message or batch too large",
    416: "Offset out of range (OFFSET_OUT_OF_RANGE)",
    503: "Not the leader, not enough replicas, or metadata unavailable: retry",
    507: "Disk full (DISK_FULL)",
}


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """A route's error answers for the OpenAPI document: the statuses it may answer and, as
    `default`, any other (an internal error). All have the ErrorResponse body."""
    out: dict[int | str, dict[str, Any]] = {
        status: {"model": ErrorResponse, "description": _DESCRIPTIONS[status]}
        for status in statuses}
    out["default"] = {"model": ErrorResponse, "description": "Any other error (INTERNAL)"}
    return out


def error_response(exc: JetstreamError, headers: Mapping[str, str] | None = None
                   ) -> JSONResponse:
    return JSONResponse({"error": exc.to_dict()}, status_code=_STATUS.get(exc.code, 500),
                        headers=headers)


_PARAMETER_PLACES = ("body", "query", "path", "header", "cookie")


def field_of(loc: Sequence[int | str], error_type: str = "") -> str:
    """A validation error's location as a field name: ("query", "offset") -> "offset",
    ("body", "messages", 0, "value") -> "messages[0].value"; the body itself -> "body"."""
    parts = list(loc)
    place = str(parts.pop(0)) if parts and parts[0] in _PARAMETER_PLACES else "body"
    if not parts or error_type == "json_invalid":  # a JSON error's loc is a char position
        return place
    name = ""
    for part in parts:
        name += f"[{part}]" if isinstance(part, int) else (f".{part}" if name else str(part))
    return name


def validation_error(exc: RequestValidationError) -> ProtocolError:
    problems = [(field_of(e.get("loc", ()), e.get("type", "")), str(e.get("msg", "invalid")))
                for e in exc.errors()]
    if not problems:
        return ProtocolError("invalid request", field="body")
    message = "; ".join(f"{field}: {msg}" for field, msg in problems)
    return ProtocolError(message, field=problems[0][0])


def allowed_methods(request: Request) -> list[str]:
    """Every method some route of this path takes. (Starlette's 405 names only the first
    route that matched the path; GET and POST /streams are two routes.)"""
    methods: set[str] = set()
    for route in request.app.router.routes:
        if isinstance(route, Route) and route.methods:
            match, _scope = route.matches(request.scope)
            if match is Match.PARTIAL:
                methods |= route.methods
    return sorted(methods)


def http_error(request: Request, exc: HTTPException) -> JetstreamError:
    """Starlette's own errors (routing) as errors of the tree."""
    path = request.url.path
    if exc.status_code == 404:
        return UnknownRoute(path)
    if exc.status_code == 405:
        return MethodNotAllowed(request.method, path, allowed_methods(request))
    if 400 <= exc.status_code < 500:
        return ProtocolError(str(exc.detail))
    return JetstreamError(str(exc.detail))


def b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


def _key_param(text: str, encoded: bool, field: str) -> bytes:
    return unb64(text, field) if encoded else text.encode()


def unb64(text: object, field: str) -> bytes:
    if not isinstance(text, str):
        raise ProtocolError(f"{field} must be a base64 string", field=field)
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ProtocolError(f"{field} is not valid base64", field=field) from None


def message_json(record: StoredRecord) -> dict[str, Any]:
    return {"offset": record.offset, "timestamp_ms": record.timestamp_ms,
            "subject": record.subject, "key": b64(record.key), "value": b64(record.value),
            "headers": {k: b64(v) for k, v in record.headers.items()}}


def record_from_json(item: object, i: int) -> Record:
    if not isinstance(item, Mapping):
        raise ProtocolError(f"messages[{i}] must be an object", field=f"messages[{i}]")
    key = item.get("key")
    headers = item.get("headers") or {}
    if not isinstance(headers, Mapping):
        raise ProtocolError(f"messages[{i}].headers must be an object", field="headers")
    value = item.get("value")
    return Record(
        None if value is None else unb64(value, f"messages[{i}].value"),  # null: a tombstone
        None if key is None else unb64(key, f"messages[{i}].key"),
        {str(k): unb64(v, f"messages[{i}].headers.{k}") for k, v in headers.items()},
    )


def build_app(services: HttpServices, broker_client: BrokerClient,
              gate: Gatekeeper | None = None, acls: AclAdmin | None = None) -> FastAPI:
    app = FastAPI(title="Jetstream broker", version="0.1.0",
                  description="Streams on NATS subjects: CRUD, reads, appends, metrics. "
                  "Every error answer has the ErrorResponse body.",
                  dependencies=[] if gate is None else [Depends(guard(gate))])

    @app.exception_handler(JetstreamError)
    async def _on_error(_request: Request, exc: JetstreamError) -> JSONResponse:
        if isinstance(exc, Unauthenticated):
            return error_response(exc, {"WWW-Authenticate": 'Basic realm="jetstream", '
                                                            'Bearer realm="jetstream"'})
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _on_invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(validation_error(exc))

    @app.exception_handler(HTTPException)
    async def _on_http(request: Request, exc: HTTPException) -> JSONResponse:
        error = http_error(request, exc)
        headers = dict(exc.headers or {})
        if isinstance(error, MethodNotAllowed):
            headers["Allow"] = ", ".join(error.allowed)
        return error_response(error, headers=headers)

    @app.exception_handler(Exception)
    async def _on_bug(request: Request, exc: Exception) -> JSONResponse:
        # Starlette logs the exception after this answer: the body is all this adds.
        return error_response(JetstreamError(f"internal error: {exc}"))

    @app.get("/health", responses=_errors())
    async def health() -> dict[str, Any]:
        return services.health()

    # response_class=Response: errors are JSON, only the 200 answer is text.
    @app.get("/metrics", response_class=Response, responses={
        200: {"description": "Prometheus text format",
              "content": {"text/plain": {"schema": {"type": "string"}}}}, **_errors()})
    async def metrics() -> Response:
        wanted = services.group_partitions()
        hws = await broker_client.high_watermarks(wanted, services.high_watermarks()) \
            if wanted else {}
        return PlainTextResponse(services.render_metrics(hws))

    @app.get("/cluster", responses=_errors())
    async def cluster() -> dict[str, Any]:
        return services.cluster_view()

    @app.get("/streams", responses=_errors())
    async def list_streams(
            request: Request, internal: bool = Query(False, alias="all")) -> dict[str, Any]:
        streams = services.describe_streams(internal=internal)
        if gate is not None:  # only the streams the principal may describe
            streams = gate.visible(principal_of(request), streams)
        return {"streams": streams}

    @app.post("/streams", status_code=201, responses=_errors(400, 409, 503))
    async def create_stream(config: dict[str, Any] = Body(...)) -> Response:  # noqa: B008
        created = await services.create_stream(services.stream_config(config))
        return JSONResponse(services.describe_stream(config["name"]),
                            status_code=201 if created else 200)

    @app.get("/streams/{name}", responses=_errors(400, 404))
    async def stream_info(name: str) -> dict[str, Any]:
        return services.describe_stream(name)

    @app.patch("/streams/{name}", responses=_errors(400, 404, 503))
    async def update_stream(name: str,
                            changes: dict[str, Any] = Body(...)) -> dict[str, Any]:  # noqa: B008
        """Change settings of a stream (retention, cleanup policy and compaction settings,
        segment size and age, ack policy, fsync, largest message); answers its description."""
        await services.update_stream(name, changes)
        return services.describe_stream(name)

    @app.get("/streams/{name}/keys", responses=_errors(400, 404, 503))
    async def list_keys(name: str, prefix: str = "", after: str | None = None,
                        limit: int = Query(1000, ge=1, le=10_000),
                        partition: int = Query(0, ge=0),
                        encoded: bool = Query(False, alias="base64")) -> dict[str, Any]:
        """Live keys of a compacted stream's partition (text, or base64 with `base64=true`
        for the query's keys and the answer's)."""
        request = m.KeysRequest(name, partition, _key_param(prefix, encoded, "prefix"),
                                None if after is None else _key_param(after, encoded, "after"),
                                limit)
        found = (await services.list_keys(request)).keys
        return {"keys": [b64(k) if encoded else k.decode(errors="replace") for k in found]}

    @app.get("/streams/{name}/keys/{key}", responses=_errors(400, 404, 503))
    async def get_key(name: str, key: str, min_offset: int = Query(-1, ge=-1),
                      wait_ms: int = Query(0, ge=0, le=60_000),
                      encoded: bool = Query(False, alias="base64")) -> dict[str, Any]:
        """A key's newest committed value (404 KEY_NOT_FOUND when it has none). `key` is
        text, or base64 with `base64=true`; the value comes as base64."""
        raw = _key_param(key, encoded, "key")
        count = len(services.describe_stream(name)["partitions"])
        request = m.GetRequest(name, zlib.crc32(raw) % count, raw, min_offset, wait_ms)
        answer = await services.get_key(request)
        if not answer.found or answer.deleted:
            raise KeyNotFound(name, raw.decode(errors="replace"))
        return {"stream": name, "partition": request.partition, "offset": answer.offset,
                "timestamp_ms": answer.timestamp_ms, "key": b64(raw), "value": b64(answer.value),
                "headers": {k: b64(v) for k, v in answer.headers.items()}}

    @app.delete("/streams/{name}", status_code=204, responses=_errors(400, 404, 503))
    async def delete_stream(name: str) -> Response:
        await services.delete_stream(name)
        return Response(status_code=204)

    @app.get("/streams/{name}/partitions/{partition}/fragments",
             responses=_errors(400, 404, 503))
    async def list_fragments(name: str, partition: int) -> dict[str, Any]:
        answer = await services.on_fragments(m.FragmentsRequest(name, partition))
        return {"extents": answer.extents, "fragments": answer.fragments}

    @app.post("/streams/{name}/partitions/{partition}/fragments/prune",
              responses=_errors(400, 404, 503))
    async def prune_fragments(name: str, partition: int,
                              before_offset: int = Query(-1, ge=-1),
                              before_ms: int = Query(-1, ge=-1)) -> dict[str, Any]:
        answer = await services.on_fragments(m.FragmentsRequest(
            name, partition, prune=True, before_offset=before_offset, before_ms=before_ms))
        return {"pruned": answer.pruned, "extents": answer.extents,
                "fragments": answer.fragments}

    @app.get("/streams/{name}/partitions/{partition}/messages",
             responses=_errors(400, 404, 416, 503))
    async def read_messages(
        name: str, partition: int,
        offset: int = Query(0, ge=0),
        max: int = Query(100, ge=1, le=READ_MESSAGES_MAX),
        wait_ms: int = Query(0, ge=0, le=READ_WAIT_MS_MAX),
        format: str = Query("json", pattern="^(json|ndjson)$"),
    ) -> Response:
        leader = services.leader_for(name, partition)
        records: list[StoredRecord] = []
        next_offset = offset
        with await leader.read(offset, READ_BYTES_MAX, wait_ms) as piece:
            data = piece.read()
        if data:
            records = decode_batches(data, min_offset=offset)[:max]
            next_offset = records[-1].offset + 1 if records else piece.next_offset
        leader.metrics.fetched_records += len(records)
        leader.metrics.fetched_bytes += len(data)
        items = [message_json(r) for r in records]
        if format == "ndjson":
            body = "".join(json.dumps(i, separators=(",", ":")) + "\n" for i in items)
            return Response(body, media_type="application/x-ndjson",
                            headers={"Jetstream-Next-Offset": str(next_offset),
                                     "Jetstream-High-Watermark": str(leader.high_watermark)})
        return JSONResponse({"stream": name, "partition": partition, "messages": items,
                             "next_offset": next_offset,
                             "high_watermark": leader.high_watermark})

    @app.post("/streams/{name}/partitions/{partition}/messages",
              responses=_errors(400, 404, 413, 503, 507))
    async def append_messages(name: str, partition: int, request: Request,
                              body: dict[str, Any] = Body(...)) -> dict[str, Any]:  # noqa: B008
        items = body.get("messages")
        if not isinstance(items, list) or not 0 < len(items) <= APPEND_MESSAGES_MAX:
            raise ProtocolError(f"messages must be a list of 1..{APPEND_MESSAGES_MAX} objects",
                                field="messages")
        policy_name = body.get("ack_policy") or "all"
        try:
            policy = AckPolicy(policy_name)
        except ValueError:
            raise ProtocolError(f"ack_policy must be one of {[p.value for p in AckPolicy]}",
                                field="ack_policy") from None
        leader = services.leader_for(name, partition)
        records = [record_from_json(item, i) for i, item in enumerate(items)]
        expect = from_http(request.headers, body, records)
        first, end, duplicate = await leader.append_expecting(records, policy, expect)
        return {"stream": name, "partition": partition, "offsets": list(range(first, end)),
                "duplicate": duplicate}

    @app.get("/streams/{name}/partitions/{partition}/registers", responses=_errors(404, 503))
    async def read_registers(name: str, partition: int) -> dict[str, Any]:
        answer = await services.on_registers(m.RegistersRequest(name, partition))
        return {"stream": name, "partition": partition, "broker_id": answer.broker_id,
                "registers": answer.registers}

    add_group_routes(app, broker_client, _errors)
    if acls is not None:
        add_acl_routes(app, acls, _errors)
    add_datastream_routes(app, broker_client, _errors)
    return app


class _QuietServer(uvicorn.Server):
    """uvicorn inside the broker's loop: the broker, not uvicorn, handles signals."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class HttpServer:
    def __init__(self, config: BrokerConfig, services: HttpServices,
                 broker_client: BrokerClient, gate: Gatekeeper | None = None,
                 acls: AclAdmin | None = None, *, metrics: BrokerMetrics | None = None
                 ) -> None:
        self._gate = gate
        self._metrics = metrics
        self._acls = acls
        self._config = config
        self._services = services
        self._broker_client = broker_client
        self._server: _QuietServer | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> int:
        config = self._config
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((config.host, config.http_port))
        sock.listen(128)
        sock.setblocking(False)
        port: int = sock.getsockname()[1]
        context = server_ssl(config.http_tls)
        metrics = self._metrics

        def stalled() -> None:
            if metrics is not None:
                metrics.stalled_requests_total += 1

        protocol = type("BrokerHTTPProtocol", (PeerPrincipalProtocol,), {
            "headers_timeout_s": config.request_timeout_ms / 1000,
            "on_stalled": staticmethod(stalled)})
        uv_config = uvicorn.Config(
            build_app(self._services, self._broker_client, self._gate, self._acls),
            log_level="warning", lifespan="off", access_log=False, http=protocol,
            limit_concurrency=config.http_connections_max,
            # The process's live context, which SIGHUP reloads (jetstream.security.tls).
            ssl_context_factory=None if context is None else lambda *_: context)
        server = self._server = _QuietServer(uv_config)
        task = self._task = asyncio.create_task(server.serve(sockets=[sock]))
        deadline = asyncio.get_running_loop().time() + START_TIMEOUT_S
        while not server.started:
            if task.done():
                task.result()
            if asyncio.get_running_loop().time() > deadline:
                raise JetstreamError(f"HTTP API did not start within {START_TIMEOUT_S} s")
            await asyncio.sleep(0.01)
        return port

    async def stop(self) -> None:
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            with contextlib.suppress(Exception):
                await self._task
