"""The HTTP API's one error format: every error answer, from the broker's own errors to
FastAPI's request validation and Starlette's routing, is `{"error": {"code", "message",
...}}` with a status that fits the code, and the OpenAPI document describes that body."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from jetstream.server.process import BrokerProcess

DEADLINE_S = 10.0


@pytest.fixture
async def http(broker: BrokerProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=broker.http_url, timeout=DEADLINE_S) as client:
        yield client


def error_of(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error"}, body
    error: dict[str, Any] = body["error"]
    assert isinstance(error["code"], str) and isinstance(error["message"], str), error
    return error


async def test_a_body_that_is_not_json_is_a_bad_request(http: httpx.AsyncClient) -> None:
    response = await http.post("/streams", content=b"{not json",
                               headers={"content-type": "application/json"})
    error = error_of(response)
    assert (response.status_code, error["code"], error["field"]) == (400, "BAD_REQUEST", "body")


async def test_a_body_that_is_not_an_object_is_a_bad_request(http: httpx.AsyncClient) -> None:
    response = await http.post("/streams", json=["orders", "orders.*"])
    error = error_of(response)
    assert (response.status_code, error["code"], error["field"]) == (400, "BAD_REQUEST", "body")


@pytest.mark.parametrize(("path", "params", "field"), [
    ("/streams/s/partitions/first/messages", {}, "partition"),
    ("/streams/s/partitions/0/messages", {"offset": -1}, "offset"),
    ("/streams/s/partitions/0/messages", {"max": 0}, "max"),
    ("/streams/s/partitions/0/messages", {"format": "xml"}, "format"),
])
async def test_bad_parameters_name_their_field(http: httpx.AsyncClient, path: str,
                                               params: dict[str, Any], field: str) -> None:
    response = await http.get(path, params=params)
    error = error_of(response)
    assert (response.status_code, error["code"], error["field"]) == (400, "BAD_REQUEST", field)
    assert error["message"].startswith(f"{field}: ")


async def test_a_bad_stream_config_names_its_field(http: httpx.AsyncClient) -> None:
    response = await http.post("/streams", json={"name": "s", "subject": "s",
                                                 "partitions": "many"})
    error = error_of(response)
    assert (response.status_code, error["code"], error["field"]) == (
        400, "INVALID_STREAM_CONFIG", "partitions")


async def test_a_malformed_append_names_its_field(http: httpx.AsyncClient) -> None:
    assert (await http.post("/streams", json={"name": "s", "subject": "s"})).status_code == 201
    response = await http.post("/streams/s/partitions/0/messages",
                               json={"messages": [{"value": "AA=="}, {"value": 7}]})
    error = error_of(response)
    assert (response.status_code, error["code"], error["field"]) == (
        400, "BAD_REQUEST", "messages[1].value")


async def test_unknown_routes_and_methods_answer_in_the_same_format(
        http: httpx.AsyncClient) -> None:
    missing = await http.get("/no/such/route")
    error = error_of(missing)
    assert (missing.status_code, error["code"], error["path"]) == (
        404, "UNKNOWN_ROUTE", "/no/such/route")

    wrong = await http.put("/streams")
    error = error_of(wrong)
    assert (wrong.status_code, error["code"], error["method"]) == (
        405, "METHOD_NOT_ALLOWED", "PUT")
    assert error["allowed"] == ["GET", "POST"]  # two routes of one path
    assert wrong.headers["allow"] == "GET, POST"


async def test_the_openapi_document_describes_the_error_body(http: httpx.AsyncClient) -> None:
    document = (await http.get("/openapi.json")).json()
    schemas = document["components"]["schemas"]
    assert set(schemas["ErrorResponse"]["properties"]) == {"error"}
    assert {"code", "message", "field"} <= set(schemas["ErrorDetail"]["properties"])
    assert "HTTPValidationError" not in schemas  # FastAPI's 422: never answered here
    ref = "#/components/schemas/ErrorResponse"
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            responses = operation["responses"]
            assert "422" not in responses, (method, path)
            errors = {status: r for status, r in responses.items()
                      if status == "default" or status >= "400"}
            assert "default" in errors, (method, path)
            for status, response in errors.items():
                schema = response["content"]["application/json"]["schema"]
                assert schema == {"$ref": ref}, (method, path, status)
    create = document["paths"]["/streams"]["post"]["responses"]
    assert {"400", "409", "503", "default"} <= set(create)
