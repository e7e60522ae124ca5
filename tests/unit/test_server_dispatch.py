"""The broker's request dispatch table (server.api) and the HTTP API's naming of the field
a validation error is about (server.http_api.field_of). No sockets."""

from __future__ import annotations

import pytest

from jetstream.errors import ProtocolError
from jetstream.protocol import messages as m
from jetstream.server.api import Dispatcher, Result, on
from jetstream.server.http_api import field_of


async def test_each_request_goes_to_the_handler_of_its_type() -> None:
    seen: list[m.Request] = []

    async def metadata(request: m.MetadataRequest) -> Result:
        seen.append(request)
        return m.MetadataResponse([], [], 0)

    async def delete(request: m.DeleteStreamRequest) -> Result:
        seen.append(request)
        return m.EmptyResponse()

    dispatcher = Dispatcher(dict([on(m.MetadataRequest, metadata),
                                  on(m.DeleteStreamRequest, delete)]))
    assert dispatcher.kinds == {m.MetadataRequest, m.DeleteStreamRequest}
    assert await dispatcher.handle(m.DeleteStreamRequest("orders")) == m.EmptyResponse()
    assert await dispatcher.handle(m.MetadataRequest(["orders"])) == m.MetadataResponse(
        [], [], 0)
    assert seen == [m.DeleteStreamRequest("orders"), m.MetadataRequest(["orders"])]


async def test_a_request_without_a_handler_is_a_bad_request_about_the_op() -> None:
    with pytest.raises(ProtocolError, match="ListStreamsRequest is not served") as caught:
        await Dispatcher({}).handle(m.ListStreamsRequest())
    assert caught.value.to_dict()["field"] == "op"


@pytest.mark.parametrize(("loc", "error_type", "field"), [
    (("query", "offset"), "greater_than_equal", "offset"),
    (("path", "partition"), "int_parsing", "partition"),
    (("body",), "dict_type", "body"),
    (("body", 9), "json_invalid", "body"),  # a JSON error's location is a position
    (("body", "messages", 0, "value"), "string_type", "messages[0].value"),
    (("body", "labels", "app"), "string_type", "labels.app"),
    ((), "missing", "body"),
])
def test_field_names_of_validation_errors(loc: tuple[int | str, ...], error_type: str,
                                          field: str) -> None:
    assert field_of(loc, error_type) == field
