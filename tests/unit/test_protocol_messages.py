"""Typed requests and responses: round trips through real frames, strict validation, and
every error class through an error frame and back."""

from __future__ import annotations

import contextlib
import inspect
import typing
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jetstream import errors
from jetstream.errors import JetstreamError, ProtocolError, RemoteError
from jetstream.protocol import messages as m
from jetstream.protocol.frames import (
    RESPONSE_HEADER_BYTES_MAX,
    FrameDecoder,
    Kind,
    Op,
    encode_frame,
)

names = st.from_regex(r"[A-Za-z0-9_-]{1,64}", fullmatch=True)
offsets = st.integers(0, m.OFFSET_MAX)
partitions = st.integers(0, m.PARTITION_MAX)
epochs = st.integers(0, m.EPOCH_MAX)
broker_ids = st.integers(0, m.BROKER_ID_MAX)
subjects = st.lists(st.from_regex(r"[a-z0-9_]{1,8}", fullmatch=True), min_size=1,
                    max_size=4).map(".".join)
partition_descriptions = st.fixed_dictionaries({
    "partition": partitions,
    "leader": st.integers(-1, m.BROKER_ID_MAX),
    "leader_epoch": epochs,
    "replicas": st.lists(broker_ids, max_size=5),
    "isr": st.lists(broker_ids, max_size=5),
})
stream_descriptions = st.fixed_dictionaries(
    {"name": names, "subject": subjects,
     "partitions": st.lists(partition_descriptions, max_size=3)},
    optional={"labels": st.dictionaries(names, names, max_size=3), "ingest_group": names},
)
brokers = st.fixed_dictionaries({
    "id": broker_ids,
    "host": st.text(min_size=1, max_size=255),
    "port": st.integers(1, 65535),
})
fetch_responses = st.integers(0, m.OFFSET_MAX).flatmap(
    lambda leo: st.builds(
        m.FetchResponse, stream=names, partition=partitions,
        high_watermark=st.integers(0, leo), log_start_offset=offsets, log_end_offset=st.just(leo),
        next_offset=offsets, leader_epoch=epochs))



@st.composite
def list_segments_responses(draw: st.DrawFn) -> m.ListSegmentsResponse:
    bases = sorted(set(draw(st.lists(offsets, min_size=1, max_size=5))))
    leo = draw(st.integers(bases[-1], m.OFFSET_MAX))
    start = draw(st.integers(bases[0], leo))
    hw = draw(st.integers(start, leo))
    paths = st.from_regex(r"/[a-z0-9/_-]{0,40}", fullmatch=True)
    return m.ListSegmentsResponse(
        draw(names), draw(partitions), hw, start, leo, draw(epochs), draw(broker_ids),
        draw(paths), draw(paths), draw(st.integers(0, 2**63).map(str)),
        [[base, draw(offsets)] for base in bases])


requests = st.one_of(
    st.builds(m.FetchRequest, stream=names, partition=partitions, offset=offsets,
              max_bytes=st.integers(1, m.FETCH_BYTES_MAX),
              max_wait_ms=st.integers(0, m.FETCH_WAIT_MS_MAX),
              leader_epoch=st.integers(-1, m.EPOCH_MAX),
              replica_id=st.integers(-1, m.BROKER_ID_MAX),
              isolation=st.sampled_from(["committed", "uncommitted"])),
    st.builds(m.FetchRequest, stream=names, partition=partitions, offset=offsets,
              max_bytes=st.integers(1, m.FETCH_BYTES_MAX),
              max_wait_ms=st.integers(0, m.FETCH_WAIT_MS_MAX), read_replica=st.booleans()),
    st.builds(m.MetadataRequest, streams=st.none() | st.lists(names, max_size=5)),
    st.builds(m.CreateStreamRequest, config=st.dictionaries(
        st.text(max_size=10), st.integers(-(2**63), 2**64 - 1) | st.text(max_size=10)
        | st.none(), max_size=5)),
    st.builds(m.DeleteStreamRequest, name=names),
    st.just(m.ListStreamsRequest()),
    st.builds(m.OffsetForTimestampRequest, stream=names, partition=partitions,
              timestamp_ms=st.integers(-2, m.OFFSET_MAX)),
    st.builds(m.EndOffsetForEpochRequest, stream=names, partition=partitions,
              leader_epoch=epochs, current_leader_epoch=st.integers(-1, m.EPOCH_MAX)),
    st.builds(m.CommitOffsetRequest, group=names, offsets=st.lists(
        st.fixed_dictionaries({"stream": names, "partition": partitions, "offset": offsets,
                               "metadata": st.text(max_size=50)}), min_size=1, max_size=3),
              member_id=st.text(max_size=64), member_epoch=st.integers(-1, 2**40)),
    st.builds(m.FetchOffsetRequest, group=names, partitions=st.none() | st.lists(
        st.fixed_dictionaries({"stream": names, "partition": partitions}), max_size=3)),
    st.builds(m.ResetOffsetsRequest, group=names, offsets=st.lists(st.fixed_dictionaries(
        {"stream": names, "partition": partitions, "offset": offsets}), min_size=1,
        max_size=3)),
    st.builds(m.DeleteGroupRequest, group=names),
    st.builds(m.FindCoordinatorRequest, group=names),
    st.builds(m.GroupHeartbeatRequest, group=names, member_id=st.text(max_size=64),
              member_epoch=st.integers(-1, 2**40), streams=st.lists(names, max_size=3),
              selector=st.text(max_size=20), owned=st.lists(st.tuples(names, partitions).map(
                  list), max_size=3),
              session_timeout_ms=st.integers(1, 10**6), max_wait_ms=st.integers(0, 60_000),
              client_id=st.text(max_size=20)),
    st.just(m.ListGroupsRequest()),
    st.builds(m.DescribeGroupRequest, group=names),
    st.builds(m.ListSegmentsRequest, stream=names, partition=partitions),
    st.builds(m.RegistersRequest, stream=names, partition=partitions),
)
register_labels = st.from_regex(r"[a-z]([a-z0-9_.-]{0,20}[a-z0-9])?", fullmatch=True)
responses = st.one_of(
    fetch_responses,
    list_segments_responses(),
    st.builds(m.MetadataResponse, brokers=st.lists(brokers, max_size=3),
              streams=st.lists(stream_descriptions, max_size=3),
              metadata_leader=st.integers(-1, m.BROKER_ID_MAX)),
    st.builds(m.ListStreamsResponse, streams=st.lists(stream_descriptions, max_size=3)),
    st.builds(m.OffsetForTimestampResponse, offset=st.integers(-1, m.OFFSET_MAX)),
    st.builds(m.EndOffsetForEpochResponse, leader_epoch=st.integers(-1, m.EPOCH_MAX),
              end_offset=st.integers(-1, m.OFFSET_MAX),
              log_start_offset=st.integers(0, m.OFFSET_MAX)),
    st.builds(m.FetchOffsetResponse, offsets=st.lists(st.fixed_dictionaries(
        {"stream": names, "partition": partitions, "offset": st.integers(-1, m.OFFSET_MAX),
         "metadata": st.text(max_size=50)}), max_size=3)),
    st.builds(m.CommitOffsetResponse, failed=st.lists(st.fixed_dictionaries(
        {"stream": names, "partition": partitions,
         "error": st.fixed_dictionaries({"code": st.text(min_size=1, max_size=20),
                                         "message": st.text(max_size=20)})}), max_size=2)),
    st.builds(m.GroupHeartbeatResponse, member_id=st.text(max_size=64),
              member_epoch=st.integers(-1, 2**40),
              assignment=st.lists(st.tuples(names, partitions).map(list), max_size=3)),
    st.builds(m.FindCoordinatorResponse, partition=partitions,
              broker_id=st.integers(0, m.BROKER_ID_MAX), host=st.text(min_size=1, max_size=20),
              port=st.integers(1, 65535)),
    st.builds(m.DeleteGroupResponse, deleted_offsets=offsets),
    st.builds(m.RegistersResponse, stream=names, partition=partitions,
              broker_id=st.integers(0, m.BROKER_ID_MAX),
              registers=st.dictionaries(register_labels, register_labels, max_size=5)),
    st.just(m.EmptyResponse()),
)


def one_frame(data: bytes) -> Any:
    decoder = FrameDecoder()
    decoder.feed(data)
    frame = decoder.next_frame()
    assert frame is not None and decoder.buffered_bytes == 0
    return frame


@given(requests, st.integers(0, 2**32 - 1))
def test_requests_round_trip_through_frames(request: m.Request, correlation_id: int) -> None:
    assert type(request).from_header(request.to_header()) == request
    frame = one_frame(m.encode_request(correlation_id, request))
    assert (frame.kind, frame.op, frame.correlation_id) == (Kind.REQUEST, request.op,
                                                            correlation_id)
    assert m.decode_request(frame) == request


@given(responses)
def test_responses_round_trip_through_frames(response: m.Response) -> None:
    op = next(op for op, t in m.RESPONSE_TYPES.items() if isinstance(response, t))
    assert type(response).from_header(response.to_header()) == response
    payload = b"records"
    frame = one_frame(m.encode_response(5, op, response, len(payload)) + payload)
    assert frame.payload == payload
    assert m.decode_response(frame) == response


def test_every_op_has_a_request_and_a_response_type() -> None:
    for op in Op:
        if op is not Op.HELLO:
            assert m.REQUEST_TYPES[op].op is op
            assert m.RESPONSE_TYPES[op] is m.REQUEST_TYPES[op].response_type


def test_the_namespace_names_every_registered_message() -> None:
    exported = {value for value in map(m.__dict__.get, m.__all__) if isinstance(value, type)}
    assert set(m.REQUEST_TYPES.values()) <= exported
    assert set(m.RESPONSE_TYPES.values()) <= exported


def test_expect_response_narrows_or_rejects_the_wrong_answer() -> None:
    response = m.OffsetForTimestampResponse(7)
    assert m.expect_response(response, m.OffsetForTimestampResponse) is response
    with pytest.raises(ProtocolError) as caught:
        m.expect_response(m.EmptyResponse(), m.MetadataResponse)
    assert "MetadataResponse" in str(caught.value) and "EmptyResponse" in str(caught.value)


FETCH = {"stream": "orders", "partition": 0, "offset": 10, "max_bytes": 1024,
         "max_wait_ms": 500}


def with_(base: dict[str, Any], **changes: Any) -> dict[str, Any]:
    out = {**base, **changes}
    return {k: v for k, v in out.items() if v is not DROP}


DROP = object()


@pytest.mark.parametrize(
    ("header", "field"),
    [
        (with_(FETCH, stream=DROP), "stream"),
        (with_(FETCH, offset=DROP), "offset"),
        (with_(FETCH, stream="bad name"), "stream"),
        (with_(FETCH, stream="x" * 65), "stream"),
        (with_(FETCH, stream=7), "stream"),
        (with_(FETCH, partition=-1), "partition"),
        (with_(FETCH, partition=True), "partition"),
        (with_(FETCH, offset=-1), "offset"),
        (with_(FETCH, offset=2**63), "offset"),
        (with_(FETCH, offset="10"), "offset"),
        (with_(FETCH, offset=1.0), "offset"),
        (with_(FETCH, offset=False), "offset"),
        (with_(FETCH, max_bytes=0), "max_bytes"),
        (with_(FETCH, max_bytes=64 * 1024 * 1024 + 1), "max_bytes"),
        (with_(FETCH, max_wait_ms=-1), "max_wait_ms"),
        (with_(FETCH, max_wait_ms=60_001), "max_wait_ms"),
        (with_(FETCH, max_wait_ms=None), "max_wait_ms"),
        (with_(FETCH, leader_epoch=-2), "leader_epoch"),
        (with_(FETCH, replica_id=-2), "replica_id"),
        (with_(FETCH, isolation="dirty"), "isolation"),
        (with_(FETCH, isolation=1), "isolation"),
        (with_(FETCH, read_replica=1), "read_replica"),
        (with_(FETCH, read_replica=True, replica_id=2), "read_replica"),
        (with_(FETCH, read_replica=True, isolation="uncommitted"), "read_replica"),
    ],
)
def test_fetch_request_validation(header: dict[str, Any], field: str) -> None:
    with pytest.raises(ProtocolError) as caught:
        m.FetchRequest.from_header(header)
    assert caught.value.code == "BAD_REQUEST"
    assert caught.value.fields["field"] == field
    assert field in str(caught.value)


def test_unknown_fields_are_ignored_and_defaults_apply() -> None:
    request = m.FetchRequest.from_header({**FETCH, "from_the_future": [1, 2]})
    assert request == m.FetchRequest("orders", 0, 10, 1024, 500, -1, -1, "committed")
    assert request.to_header() == {**FETCH, "leader_epoch": -1, "replica_id": -1,
                                   "isolation": "committed", "read_replica": False,
                                   "verify": False, "unfit": ""}
    assert m.MetadataResponse.from_header({"brokers": [], "streams": []}).metadata_leader == -1
    # A peer from before current_leader_epoch leaves it out: unchecked.
    assert m.EndOffsetForEpochRequest.from_header(
        {"stream": "s", "partition": 0, "leader_epoch": 3}).current_leader_epoch == -1
    assert m.FetchRequest.from_header({**FETCH, "max_bytes": 64 * 1024 * 1024,
                                       "max_wait_ms": 60_000}).max_bytes == 64 * 1024 * 1024


@pytest.mark.parametrize(
    ("cls", "header", "field"),
    [
        (m.FetchResponse, {"stream": "s", "partition": 0, "high_watermark": 5,
                           "log_start_offset": 0, "log_end_offset": 4, "next_offset": 4,
                           "leader_epoch": 0}, "high_watermark"),
        (m.FetchRequest, {**FETCH, "replica_id": 2, "unfit": "tired"}, "unfit"),
        (m.FetchRequest, {**FETCH, "unfit": "corrupt"}, "unfit"),  # consumers are not replicas
        (m.MetadataRequest, {"streams": "orders"}, "streams"),
        (m.MetadataRequest, {"streams": ["ok", "not ok"]}, "streams[1]"),
        (m.MetadataResponse, {"brokers": [], "streams": [{"name": "s"}]}, "streams[0]"),
        (m.MetadataResponse, {"brokers": [{"id": 1, "host": "h", "port": 0}], "streams": []},
         "brokers[0].port"),
        (m.MetadataResponse, {"brokers": [{"id": 1, "host": "", "port": 1}], "streams": []},
         "brokers[0].host"),
        (m.MetadataResponse, {"brokers": [], "streams": [
            {"name": "s", "subject": "a.>", "partitions": [
                {"partition": 0, "leader": 1, "leader_epoch": 0, "replicas": [1],
                 "isr": [True]}]}]}, "streams[0].partitions[0].isr[0]"),
        (m.MetadataResponse, {"brokers": [], "streams": [
            {"name": "s", "subject": "a..b", "partitions": []}]}, "streams[0].subject"),
        (m.MetadataResponse, {"brokers": [], "streams": [], "metadata_leader": -2},
         "metadata_leader"),
        (m.CreateStreamRequest, {"config": [1]}, "config"),
        (m.CreateStreamRequest, {"config": {1: 2}}, "config"),
        (m.DeleteStreamRequest, {}, "name"),
        (m.OffsetForTimestampRequest, {"stream": "s", "partition": 0, "timestamp_ms": -3},
         "timestamp_ms"),
        (m.EndOffsetForEpochRequest, {"stream": "s", "partition": 0, "leader_epoch": -1},
         "leader_epoch"),
        (m.EndOffsetForEpochRequest, {"stream": "s", "partition": 0, "leader_epoch": 0,
                                      "current_leader_epoch": -2}, "current_leader_epoch"),
        (m.EndOffsetForEpochResponse, {"leader_epoch": -1, "end_offset": -2,
                                       "log_start_offset": 0}, "end_offset"),
        (m.EndOffsetForEpochResponse, {"leader_epoch": -1, "end_offset": -1},
         "log_start_offset"),
        (m.CommitOffsetRequest, {"group": "g g", "offsets": [
            {"stream": "s", "partition": 0, "offset": 0}]}, "group"),
        (m.CommitOffsetRequest, {"group": "g", "offsets": [
            {"stream": "s", "partition": 0, "offset": 0, "metadata": "x" * 4097}]},
         "offsets[0].metadata"),
        (m.CommitOffsetRequest, {"group": "g", "offsets": [
            {"stream": "s", "partition": 0, "offset": -1}]}, "offsets[0].offset"),
        (m.CommitOffsetRequest, {"group": "g", "offsets": []}, "offsets"),
        (m.CommitOffsetRequest, {"group": "g", "offsets": [{"stream": "s", "partition": 0,
                                                            "offset": 1}],
                                 "member_epoch": -2}, "member_epoch"),
        (m.FetchOffsetRequest, {"group": "g", "partitions": [{"stream": "s"}]}, "partitions[0]"),
        (m.FetchOffsetResponse, {"offsets": [{"stream": "s", "partition": 0, "offset": -2}]},
         "offsets[0].offset"),
        (m.ResetOffsetsRequest, {"group": "g", "offsets": []}, "offsets"),
        (m.GroupHeartbeatRequest, {"group": "g", "member_id": "", "member_epoch": 0,
                                   "owned": [["s"]]}, "owned[0]"),
        (m.GroupHeartbeatRequest, {"group": "g", "member_id": "", "member_epoch": 0,
                                   "session_timeout_ms": 0}, "session_timeout_ms"),
        (m.OffsetForTimestampResponse, {}, "offset"),
    ],
)
def test_validation_names_the_field(cls: type[m.Message], header: dict[str, Any],
                                    field: str) -> None:
    with pytest.raises(ProtocolError) as caught:
        cls.from_header(header)
    assert caught.value.fields["field"] == field


LISTING = {"stream": "s", "partition": 0, "high_watermark": 15, "log_start_offset": 5,
           "log_end_offset": 20, "leader_epoch": 2, "broker_id": 1,
           "directory": "/data/logs/s-0", "version_file": "/data/logs/s-0/stream-version",
           "stream_version": "7", "segments": [[0, 4096], [10, 2048], [20, 0]]}


@pytest.mark.parametrize(
    ("header", "field"),
    [
        (with_(LISTING, segments=DROP), "segments"),
        (with_(LISTING, stream="a b"), "stream"),
        (with_(LISTING, partition=-1), "partition"),
        (with_(LISTING, broker_id=-1), "broker_id"),
        (with_(LISTING, leader_epoch=-1), "leader_epoch"),
        (with_(LISTING, high_watermark=21), "high_watermark"),
        (with_(LISTING, high_watermark=4), "high_watermark"),
        (with_(LISTING, high_watermark="15"), "high_watermark"),
        (with_(LISTING, directory="logs/s-0"), "directory"),
        (with_(LISTING, directory=b"/data"), "directory"),
        (with_(LISTING, version_file="/" + "x" * 4096), "version_file"),
        (with_(LISTING, stream_version=7), "stream_version"),
        (with_(LISTING, stream_version=""), "stream_version"),
        (with_(LISTING, segments=[]), "segments"),
        (with_(LISTING, segments={"0": 1}), "segments"),
        (with_(LISTING, segments=[[0, 1, 2]]), "segments[0]"),
        (with_(LISTING, segments=[0, 1]), "segments[0]"),
        (with_(LISTING, segments=[[0, -1]]), "segments[0].size_bytes"),
        (with_(LISTING, segments=[[0, True]]), "segments[0].size_bytes"),
        (with_(LISTING, segments=[[-1, 0]]), "segments[0].base_offset"),
        (with_(LISTING, segments=[[6, 10]]), "segments[0].base_offset"),
        (with_(LISTING, segments=[[0, 10], [10, 5], [10, 0]]), "segments[2].base_offset"),
        (with_(LISTING, segments=[[0, 10], [21, 0]]), "segments[1].base_offset"),
        (with_(LISTING, segments=[[0, 1]] * 2), "segments[1].base_offset"),
    ],
)
def test_list_segments_response_validation(header: dict[str, Any], field: str) -> None:
    with pytest.raises(ProtocolError) as caught:
        m.ListSegmentsResponse.from_header(header)
    assert caught.value.fields["field"] == field


def test_list_segments_request_validation() -> None:
    assert m.ListSegmentsRequest.from_header({"stream": "s", "partition": 3}) == (
        m.ListSegmentsRequest("s", 3))
    for header, field in [({"partition": 0}, "stream"), ({"stream": "s"}, "partition"),
                          ({"stream": "s", "partition": -1}, "partition")]:
        with pytest.raises(ProtocolError) as caught:
            m.ListSegmentsRequest.from_header(header)
        assert caught.value.fields["field"] == field


def test_list_segments_takes_tuples_and_sends_lists() -> None:
    response = m.ListSegmentsResponse.from_header(
        {**LISTING, "segments": ((0, 4096), (10, 2048), [20, 0])})
    assert response.segments == LISTING["segments"]
    assert m.decode_response(one_frame(m.encode_response(1, Op.LIST_SEGMENTS, response))) == (
        m.ListSegmentsResponse.from_header(LISTING))


def test_the_largest_segment_listing_fits_a_response_header() -> None:
    top = m.OFFSET_MAX
    base = top - m.SEGMENTS_MAX
    response = m.ListSegmentsResponse(
        "x" * 64, m.PARTITION_MAX, top, base, top, m.EPOCH_MAX, m.BROKER_ID_MAX,
        "/" + "\u00e9" * 4095, "/" + "\u00e9" * 4095, "9" * 64,
        [[base + i, top] for i in range(m.SEGMENTS_MAX)])
    decoder = FrameDecoder(header_bytes_max=RESPONSE_HEADER_BYTES_MAX)  # as clients do
    decoder.feed(m.encode_response(1, Op.LIST_SEGMENTS, response))
    frame = decoder.next_frame()
    assert frame is not None
    back = m.expect_response(m.decode_response(frame), m.ListSegmentsResponse)
    assert back == response
    with pytest.raises(ProtocolError) as caught:
        m.ListSegmentsResponse.from_header(
            {**LISTING, "log_end_offset": m.OFFSET_MAX, "high_watermark": 5,
             "segments": [[i, 0] for i in range(m.SEGMENTS_MAX + 1)]})
    assert caught.value.fields["field"] == "segments"


def test_registers_that_are_not_labels_are_refused() -> None:
    with pytest.raises(ProtocolError) as caught:
        m.RegistersResponse("jobs", 0, 1, {"owner": "not a label"})
    assert caught.value.fields["field"] == "registers"


def test_local_construction_is_checked_too() -> None:
    with pytest.raises(ProtocolError):
        m.FetchRequest("s", 0, -5, 100, 0)
    assert m.MetadataRequest(("a", "b")).streams == ["a", "b"]  # type: ignore[arg-type]


message_types = [*m.REQUEST_TYPES.values(), *m.RESPONSE_TYPES.values()]


@given(st.sampled_from(message_types), st.dictionaries(st.text(max_size=15), st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5) | st.binary(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                max_size=3),
    max_leaves=8), max_size=8))
def test_garbage_headers_raise_only_protocol_error(cls: type[m.Message],
                                                   header: dict[str, Any]) -> None:
    with contextlib.suppress(ProtocolError):
        cls.from_header(header)


def test_decode_request_rejects_what_is_not_a_known_request() -> None:
    decoder = FrameDecoder()
    decoder.feed(encode_frame(1, Kind.REQUEST, 99, {}) + encode_frame(2, Kind.RESPONSE, 2, {})
                 + encode_frame(3, Kind.REQUEST, Op.HELLO, {"version": 1, "client_id": ""}))
    for frame in decoder:
        with pytest.raises(ProtocolError) as caught:
            m.decode_request(frame)
        assert caught.value.fields["field"] in ("op", "kind")


def test_decode_response_raises_the_error_frame() -> None:
    error = errors.NotLeader("orders", 3, 2, "10.0.0.2:9292")
    frame = one_frame(m.encode_error(8, Op.FETCH, error))
    assert frame.kind is Kind.ERROR
    with pytest.raises(errors.NotLeader) as caught:
        m.decode_response(frame)
    assert caught.value.to_dict() == error.to_dict()
    assert caught.value.retriable


# -- errors ------------------------------------------------------------------------------------

SAMPLES: dict[Any, Any] = {str: "sample", int: 7, int | None: 7, bool: True,
                           list[str]: ["a", "b"], dict[str, str]: {"owner": "a"}}


def sample_error(cls: type[JetstreamError]) -> JetstreamError:
    """An instance of `cls` with a value in every constructor argument."""
    hints = typing.get_type_hints(cls.__init__)
    kwargs: dict[str, Any] = {}
    for name, parameter in inspect.signature(cls).parameters.items():
        if parameter.kind is parameter.VAR_KEYWORD:
            kwargs["detail"] = "extra"
        elif name == "message":
            kwargs[name] = f"{cls.__name__} happened"
        elif name == "code":
            kwargs[name] = "SOME_NEW_CODE"
        else:
            kwargs[name] = SAMPLES[hints[name]]
    return cls(**kwargs)


def over_the_wire(exc: JetstreamError) -> JetstreamError:
    data = m.encode_error(1, Op.FETCH, exc)
    return m.error_from_header(msgpack.unpackb(data[14:]))


def all_error_classes() -> list[type[JetstreamError]]:
    found, stack = [], [JetstreamError]
    while stack:
        cls = stack.pop()
        found.append(cls)
        stack.extend(cls.__subclasses__())
    return found


@pytest.mark.parametrize("cls", sorted(m.error_registry().values(), key=lambda c: c.code),
                         ids=lambda c: c.__name__)
def test_every_registered_error_round_trips(cls: type[JetstreamError]) -> None:
    exc = sample_error(cls)
    back = over_the_wire(exc)
    assert type(back) is cls
    assert back.to_dict() == exc.to_dict()
    assert str(back) == str(exc)
    assert back.retriable == exc.retriable
    for name, value in exc.fields.items():
        assert getattr(back, name) == value


def test_registry_has_every_code_of_the_tree_once() -> None:
    registry = m.error_registry()
    for cls in all_error_classes():
        if cls.__module__ != errors.__name__:
            continue
        assert issubclass(cls, registry[cls.code])  # FrameError -> ProtocolError
        if "code" in vars(cls):
            assert registry[cls.code] is cls, f"{cls.__name__} repeats code {cls.code}"
    for code in ("UNKNOWN_STREAM", "UNKNOWN_PARTITION", "NOT_LEADER", "STREAM_EXISTS",
                 "INVALID_STREAM_CONFIG", "NOT_ENOUGH_REPLICAS", "BAD_REQUEST",
                 "UNSUPPORTED_VERSION"):
        assert code in registry
    assert errors.NotLeader.retriable and errors.NotEnoughReplicas.retriable
    assert not errors.StreamExists.retriable


def test_a_frame_error_arrives_as_a_protocol_error() -> None:
    back = over_the_wire(errors.FrameError("bad length", field="length"))
    assert type(back) is ProtocolError
    assert back.to_dict() == {"code": "BAD_REQUEST", "message": "bad length",
                              "field": "length"}


def test_unknown_codes_become_remote_errors_with_their_fields() -> None:
    back = m.error_from_header({"code": "QUOTA_EXCEEDED", "message": "slow down",
                                "limit": 10})
    assert type(back) is RemoteError
    assert back.code == "QUOTA_EXCEEDED"
    assert back.to_dict() == {"code": "QUOTA_EXCEEDED", "message": "slow down", "limit": 10}
    assert over_the_wire(back).to_dict() == back.to_dict()


def test_a_known_code_with_other_fields_keeps_its_class() -> None:
    back = m.error_from_header({"code": "NOT_LEADER", "message": "moved", "epoch": 3})
    assert type(back) is errors.NotLeader and back.retriable
    assert back.to_dict() == {"code": "NOT_LEADER", "message": "moved", "epoch": 3}
    back = m.error_from_header({"code": "UNKNOWN_STREAM", "stream": ["not", "a", "str"]})
    assert type(back) is errors.UnknownStream


@pytest.mark.parametrize(
    "header",
    [
        {"code": "NOT_LEADER", "message": "m", "__class__": 1, "args": 2, "fields": 3,
         "self": 4, "to_dict": 5, "with_traceback": 6, "1x": 7},
        {"code": "X", "message": "m", "code_": 1, "__dict__": 2, "retriable": True},
        {"code": "INTERNAL", "message": "m", "add_note": 1},
    ],
)
def test_hostile_error_fields_do_not_break_the_error(header: dict[str, Any]) -> None:
    back = m.error_from_header(header)
    assert back.code == header["code"]
    assert str(back) == "m"
    assert "retriable" not in vars(back)  # a field cannot make an error retriable
    assert back.to_dict()["code"] == header["code"]


@pytest.mark.parametrize(
    "header",
    [[], {}, {"code": 5}, {"code": ""}, {"code": "X" * 65}, {"code": "X", "message": 3}],
)
def test_malformed_error_headers(header: Any) -> None:
    with pytest.raises(ProtocolError):
        m.error_from_header(header)


def test_error_header_sends_non_wire_fields_as_text() -> None:
    exc = JetstreamError("boom", where=object, items=("a", 1), nested={"k": {1, 2}.__class__})
    header = m.error_header(exc)
    assert header["items"] == ["a", 1]
    assert isinstance(header["where"], str) and isinstance(header["nested"]["k"], str)
    msgpack.packb(header)


def test_mirror_append_carries_its_batches_in_the_payload() -> None:
    from jetstream.protocol.frames import encode_frame_with_payload

    request = m.MirrorAppendRequest("orders", 1, "a:1/orders", "orders-dr", 12, "", b"batches")
    assert "data" not in request.to_header()
    frame = one_frame(encode_frame_with_payload(5, Kind.REQUEST, Op.MIRROR_APPEND,
                                                request.to_header(), request.data))
    assert m.decode_request(frame) == request
    with pytest.raises(ProtocolError) as bad:
        m.MirrorAppendRequest("orders", 1, "a:1/orders", "orders-dr", 12, "sometimes")
    assert bad.value.fields["field"] == "ack_policy"


GOOD_ANSWER = ["s", 0, None, 15, 5, 20, 15, 2, 100]
GOOD_CHANGE = ["s", 0, 15, 2, "", False]


@pytest.mark.parametrize(("index", "value", "field"), [
    (0, "s s", "stream"), (0, 7, "stream"), (1, -1, "partition"), (1, True, "partition"),
    (3, -1, "high_watermark"), (3, 1.5, "high_watermark"), (4, -1, "log_start_offset"),
    (5, "20", "log_end_offset"), (6, -1, "next_offset"), (7, -1, "leader_epoch"),
    (8, -1, "length"), (8, 1 << 32, "length"),
])
def test_a_bad_session_answer_names_its_field(index: int, value: Any, field: str) -> None:
    """Each field of an answer entry, wrong in turn (a well-formed entry passes a shorter
    check first), is refused by name."""
    assert m.ReplicaFetchResponse(1, [GOOD_ANSWER]).answers()[0].high_watermark == 15
    entry = list(GOOD_ANSWER)
    entry[index] = value
    with pytest.raises(ProtocolError) as caught:
        m.ReplicaFetchResponse(1, [entry]).answers()
    assert caught.value.fields["field"] == field


@pytest.mark.parametrize(("index", "value", "field"), [
    (0, "", "stream"), (1, -1, "partition"), (2, -1, "offset"), (2, False, "offset"),
    (3, -1, "leader_epoch"), (4, "x" * 17, "unfit"), (4, None, "unfit"), (5, 1, "verify"),
])
def test_a_bad_session_change_names_its_field(index: int, value: Any, field: str) -> None:
    request = m.ReplicaFetchRequest(1, 0, 0, 500, 1 << 20, 1 << 20, [GOOD_CHANGE])
    assert request.changed()[0].offset == 15
    entry = list(GOOD_CHANGE)
    entry[index] = value
    with pytest.raises(ProtocolError) as caught:
        m.ReplicaFetchRequest(1, 0, 0, 500, 1 << 20, 1 << 20, [entry]).changed()
    assert caught.value.fields["field"] == field
