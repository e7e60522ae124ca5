"""The broker's HTTP API (FastAPI, served by uvicorn inside the broker's event loop).

Stream CRUD, health, cluster view, Prometheus metrics, and reading and appending messages.
Every handler calls the same broker methods as the socket API, so both behave alike; errors
carry the same stable codes, in `{"error": {"code", "message", ...}}` with an HTTP status
that fits the code. OpenAPI docs are served at /docs.

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
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import uvicorn
from fastapi import Body, FastAPI, Query, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from jetstream.errors import JetstreamError, ProtocolError
from jetstream.protocol.envelope import AckPolicy
from jetstream.stream.format import Record, StoredRecord, decode_batches

if TYPE_CHECKING:
    from jetstream.server.broker import Broker

#: Most messages one GET returns and one POST appends.
READ_MESSAGES_MAX = 10_000
APPEND_MESSAGES_MAX = 10_000
READ_BYTES_MAX = 16 * 1024 * 1024
READ_WAIT_MS_MAX = 30_000
START_TIMEOUT_S = 10.0

_STATUS = {
    "UNKNOWN_STREAM": 404,
    "UNKNOWN_PARTITION": 404,
    "BAD_REQUEST": 400,
    "INVALID_CONFIG": 400,
    "INVALID_STREAM_CONFIG": 400,
    "STREAM_EXISTS": 409,
    "MESSAGE_TOO_LARGE": 413,
    "BATCH_TOO_LARGE": 413,
    "OFFSET_OUT_OF_RANGE": 416,
    "NOT_LEADER": 503,
    "NOT_ENOUGH_REPLICAS": 503,
    "DISK_FULL": 507,
}


def error_response(exc: JetstreamError) -> JSONResponse:
    return JSONResponse({"error": exc.to_dict()}, status_code=_STATUS.get(exc.code, 500))


def b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


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
    return Record(
        unb64(item.get("value"), f"messages[{i}].value"),
        None if key is None else unb64(key, f"messages[{i}].key"),
        {str(k): unb64(v, f"messages[{i}].headers.{k}") for k, v in headers.items()},
    )


def build_app(broker: Broker) -> FastAPI:
    app = FastAPI(title="Jetstream broker", version="0.1.0",
                  description="Streams on NATS subjects: CRUD, reads, appends, metrics.")

    @app.exception_handler(JetstreamError)
    async def _on_error(_request: Request, exc: JetstreamError) -> JSONResponse:
        return error_response(exc)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "broker_id": broker.config.broker_id,
                "streams": len(broker.metadata.state.streams)}

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> str:
        return broker.render_metrics()

    @app.get("/cluster")
    async def cluster() -> dict[str, Any]:
        return {"brokers": broker.brokers(), **broker.metadata_status(),
                "streams": broker.describe_streams(), "roles": broker.roles()}

    @app.get("/streams")
    async def list_streams() -> dict[str, Any]:
        return {"streams": broker.describe_streams()}

    @app.post("/streams", status_code=201)
    async def create_stream(config: dict[str, Any] = Body(...)) -> Response:  # noqa: B008
        created = await broker.create_stream(broker.stream_config(config))
        return JSONResponse(broker.describe_stream(config["name"]),
                            status_code=201 if created else 200)

    @app.get("/streams/{name}")
    async def stream_info(name: str) -> dict[str, Any]:
        return broker.describe_stream(name)

    @app.delete("/streams/{name}", status_code=204)
    async def delete_stream(name: str) -> Response:
        await broker.delete_stream(name)
        return Response(status_code=204)

    @app.get("/streams/{name}/partitions/{partition}/messages")
    async def read_messages(
        name: str, partition: int,
        offset: int = Query(0, ge=0),
        max: int = Query(100, ge=1, le=READ_MESSAGES_MAX),
        wait_ms: int = Query(0, ge=0, le=READ_WAIT_MS_MAX),
        format: str = Query("json", pattern="^(json|ndjson)$"),
    ) -> Response:
        leader = broker.leader_for(name, partition)
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

    @app.post("/streams/{name}/partitions/{partition}/messages")
    async def append_messages(name: str, partition: int,
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
        leader = broker.leader_for(name, partition)
        records = [record_from_json(item, i) for i, item in enumerate(items)]
        first, end = await leader.append_direct(records, policy)
        return {"stream": name, "partition": partition, "offsets": list(range(first, end))}

    return app


class _QuietServer(uvicorn.Server):
    """uvicorn inside the broker's loop: the broker, not uvicorn, handles signals."""

    @contextlib.contextmanager
    def capture_signals(self):  # type: ignore[no-untyped-def]
        yield


class HttpServer:
    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        self._server: _QuietServer | None = None
        self._task: Any = None

    async def start(self) -> int:
        config = self._broker.config
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((config.host, config.http_port))
        sock.listen(128)
        sock.setblocking(False)
        port: int = sock.getsockname()[1]
        uv_config = uvicorn.Config(build_app(self._broker), log_level="warning", lifespan="off",
                                   access_log=False)
        self._server = _QuietServer(uv_config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]))
        deadline = asyncio.get_running_loop().time() + START_TIMEOUT_S
        while not self._server.started:
            if self._task.done():
                self._task.result()
            if asyncio.get_running_loop().time() > deadline:
                raise JetstreamError(f"HTTP API did not start within {START_TIMEOUT_S} s")
            await asyncio.sleep(0.01)
        return port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            with contextlib.suppress(Exception):
                await self._task
