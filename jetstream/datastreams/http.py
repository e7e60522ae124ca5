"""Datastreams over HTTP (the Datastream Management Service and diagnostics).

Theory of operation: like the consumer-group routes (jetstream.server.http_groups), these go
through this broker's own client, so the answer is the same whichever broker is asked and the
socket API's DATASTREAMS is the one path that changes datastreams.

    GET    /datastreams                          every datastream (definition, status, tasks)
    POST   /datastreams                          create {name, source, destination, ...}
    GET    /datastreams/{name}                   one datastream
    PATCH  /datastreams/{name}                   update it {max_tasks, ..., source: {settings}}
    POST   /datastreams/batch/get                {names: [...]}: descriptions, unknown in errors
    POST   /datastreams/batch/update             {datastreams: [{name, ...changes}]}: all or none
    DELETE /datastreams/{name}                   delete it (its tasks stop)
    POST   /datastreams/{name}/pause             pause it, or `?partitions=0,3` only those
    POST   /datastreams/{name}/resume            resume it, or `?partitions=0,3` only those
    GET    /diagnostics/datastreams/{name}       per task and partition: status, positions, lag
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import Body, FastAPI, Query
from fastapi.responses import JSONResponse, Response

from jetstream.errors import InvalidDatastreamConfig
from jetstream.server.http_groups import BrokerClient

#: The HTTP status of each datastream error code (jetstream.server.http_api's table).
STATUS = {
    "UNKNOWN_DATASTREAM": 404,
    "DATASTREAM_EXISTS": 409,
    "INVALID_DATASTREAM_CONFIG": 400,
    "UNKNOWN_CONNECTOR": 400,
    "STREAM_IS_MIRROR": 409,
    "MIRROR_MISMATCH": 409,
    "MIRROR_OFFSET_GAP": 409,
    "MIRROR_FENCED": 409,
}


def _partitions(text: str | None) -> list[int] | None:
    if text is None or not text.strip():
        return None
    try:
        return [int(p) for p in text.split(",")]
    except ValueError:
        raise InvalidDatastreamConfig(f"partitions must be numbers separated by commas, got "
                                      f"{text!r}", field="partitions") from None


def _list(body: dict[str, Any], key: str, kind: type) -> list[Any]:
    items = body.get(key)
    if not isinstance(items, list) or not all(isinstance(i, kind) for i in items):
        raise InvalidDatastreamConfig(f"{key} must be a list of {kind.__name__}", field=key)
    return items


def add_datastream_routes(app: FastAPI, broker_client: BrokerClient,
                          errors: Callable[..., dict[int | str, dict[str, Any]]]) -> None:
    """The routes of the module docstring; `errors(*statuses)` declares their error
    answers."""

    @app.get("/datastreams", responses=errors())
    async def list_datastreams() -> dict[str, Any]:
        js = await broker_client.client()
        return {"datastreams": await js.list_datastreams()}

    @app.post("/datastreams", status_code=201, responses=errors(400, 409, 503))
    async def create_datastream(body: dict[str, Any] = Body(...)) -> Response:  # noqa: B008
        js = await broker_client.client()
        name, source, destination = body.get("name"), body.get("source"), \
            body.get("destination")
        options = {k: v for k, v in body.items() if k not in ("name", "source", "destination")}
        described = await js.create_datastream(name, source, destination,  # type: ignore[arg-type]
                                               **options)
        return JSONResponse(described, status_code=201 if described["created"] else 200)

    @app.get("/datastreams/{name}", responses=errors(400, 404))
    async def describe_datastream(name: str) -> dict[str, Any]:
        js = await broker_client.client()
        return await js.describe_datastream(name)

    @app.patch("/datastreams/{name}", responses=errors(400, 404, 503))
    async def update_datastream(name: str, body: dict[str, Any] = Body(...)  # noqa: B008
                                ) -> dict[str, Any]:
        js = await broker_client.client()
        return await js.update_datastream(name, body)

    @app.post("/datastreams/batch/get", responses=errors(400))
    async def batch_get_datastreams(body: dict[str, Any] = Body(...)  # noqa: B008
                                    ) -> dict[str, Any]:
        js = await broker_client.client()
        return await js.batch_get_datastreams(_list(body, "names", str))

    @app.post("/datastreams/batch/update", responses=errors(400, 404, 503))
    async def batch_update_datastreams(body: dict[str, Any] = Body(...)  # noqa: B008
                                       ) -> dict[str, Any]:
        js = await broker_client.client()
        updated = await js.batch_update_datastreams(_list(body, "datastreams", dict))
        return {"datastreams": updated}

    @app.delete("/datastreams/{name}", status_code=204, responses=errors(400, 404, 503))
    async def delete_datastream(name: str) -> Response:
        js = await broker_client.client()
        await js.delete_datastream(name)
        return Response(status_code=204)

    @app.post("/datastreams/{name}/pause", responses=errors(400, 404, 503))
    async def pause_datastream(name: str, partitions: str | None = Query(None)
                               ) -> dict[str, Any]:
        js = await broker_client.client()
        return await js.pause_datastream(name, _partitions(partitions))

    @app.post("/datastreams/{name}/resume", responses=errors(400, 404, 503))
    async def resume_datastream(name: str, partitions: str | None = Query(None)
                                ) -> dict[str, Any]:
        js = await broker_client.client()
        return await js.resume_datastream(name, _partitions(partitions))

    @app.get("/diagnostics/datastreams/{name}", responses=errors(400, 404))
    async def datastream_diagnostics(name: str) -> dict[str, Any]:
        js = await broker_client.client()
        return await js.datastream_diagnostics(name)
