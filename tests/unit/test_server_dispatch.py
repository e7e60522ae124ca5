"""The broker's request dispatch table (server.api) and the HTTP API's naming of the field
a validation error is about (server.http_api.field_of). No sockets."""

from __future__ import annotations

import pytest

from jetstream.errors import ProtocolError
from jetstream.protocol import messages as m
from jetstream.server.api import Dispatcher, Result, at_once, on
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


async def test_an_immediate_handler_answers_first_and_leaves_waits_to_the_async_one() -> None:
    async def get(request: m.GetRequest) -> Result:
        return m.GetResponse(True, offset=7, value=b"after a wait", covered_offset=8)

    def get_now(request: m.GetRequest) -> Result | None:
        if request.min_offset >= 8:
            return None  # not indexed yet: must wait
        return m.GetResponse(True, offset=7, value=b"at once", covered_offset=8)

    async def metadata(request: m.MetadataRequest) -> Result:
        return m.MetadataResponse([], [], 0)

    dispatcher = Dispatcher(dict([on(m.GetRequest, get), on(m.MetadataRequest, metadata)]),
                            immediate=dict([at_once(m.GetRequest, get_now)]))
    assert dispatcher.immediate_kinds == {m.GetRequest}
    at_once_answer = dispatcher.handle_now(m.GetRequest("t", 0, b"k"))
    assert isinstance(at_once_answer, m.GetResponse) and at_once_answer.value == b"at once"
    assert dispatcher.handle_now(m.GetRequest("t", 0, b"k", min_offset=8)) is None
    assert dispatcher.handle_now(m.MetadataRequest(None)) is None  # no immediate handler
    waited = await dispatcher.handle(m.GetRequest("t", 0, b"k", min_offset=8))
    assert isinstance(waited, m.GetResponse) and waited.value == b"after a wait"


def test_an_immediate_handler_needs_an_async_one_beside_it() -> None:
    def get_now(request: m.GetRequest) -> Result | None:
        return None

    with pytest.raises(ValueError, match="without an async one"):
        Dispatcher({}, immediate=dict([at_once(m.GetRequest, get_now)]))


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
