"""Socket API framing: round trips, any chunking, limits checked before buffering, garbage."""

from __future__ import annotations

import contextlib
import itertools
import struct
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jetstream.errors import FrameError, ProtocolError, UnsupportedVersion
from jetstream.protocol import frames as fr
from jetstream.protocol.frames import Frame, FrameDecoder, Kind, Op

scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.binary(max_size=20)
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4),
    max_leaves=12,
)
headers = st.dictionaries(st.text(max_size=12), values, max_size=6)
frames = st.builds(
    Frame,
    correlation_id=st.integers(0, fr.U32_MAX),
    kind=st.sampled_from(Kind),
    op=st.integers(0, 255),
    header=headers,
    payload=st.binary(max_size=300),
)


def encode(frame: Frame) -> bytes:
    return fr.encode_frame_with_payload(frame.correlation_id, frame.kind, frame.op,
                                        frame.header, frame.payload)


def decode_all(chunks: list[bytes], **limits: int) -> list[Frame]:
    decoder = FrameDecoder(**limits)
    out: list[Frame] = []
    for chunk in chunks:
        decoder.feed(chunk)
        out.extend(decoder)
    assert decoder.buffered_bytes == 0
    return out


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


@given(st.lists(frames, max_size=6), st.lists(st.integers(0, 10**6), max_size=30))
def test_any_chunking_gives_the_same_frames(batch: list[Frame], cuts: list[int]) -> None:
    data = b"".join(encode(f) for f in batch)
    assert decode_all([data]) == batch
    assert decode_all(split(data, cuts)) == batch


@given(st.lists(frames, min_size=1, max_size=3))
@settings(max_examples=30)
def test_byte_by_byte(batch: list[Frame]) -> None:
    data = b"".join(encode(f) for f in batch)
    assert decode_all([data[i:i + 1] for i in range(len(data))]) == batch


@given(frames)
def test_prefix_then_payload_as_sent_with_sendfile(frame: Frame) -> None:
    head = fr.encode_frame(frame.correlation_id, frame.kind, frame.op, frame.header,
                           len(frame.payload))
    (length,) = fr.LENGTH.unpack_from(head)
    assert length == len(head) - 4 + len(frame.payload)
    assert head + frame.payload == encode(frame)
    assert decode_all([head, frame.payload]) == [frame]


def test_declared_layout() -> None:
    data = fr.encode_frame_with_payload(7, Kind.RESPONSE, Op.FETCH, {"a": 1}, b"xyz")
    header = msgpack.packb({"a": 1})
    assert data == struct.pack(">IIBBI", 10 + len(header) + 3, 7, 2, 2, len(header)) + \
        header + b"xyz"
    assert [int(op) for op in Op][:26] == list(range(1, 27))
    # Authentication and ACLs are numbered from 40.
    assert [int(Op.AUTHENTICATE), int(Op.ACL_LIST), int(Op.ACL_ADD), int(Op.ACL_REMOVE)] == [
        40, 41, 42, 43]
    # Datastreams are numbered from 50.
    assert int(Op.DATASTREAMS) == 50


def test_a_length_of_4_gib_raises_on_the_prefix_alone() -> None:
    decoder = FrameDecoder()
    with pytest.raises(FrameError) as caught:
        decoder.feed(b"\xff\xff\xff\xff")
    assert caught.value.code == "BAD_REQUEST"
    assert caught.value.fields["field"] == "length"
    assert decoder.buffered_bytes == 4  # nothing allocated for the claimed frame
    with pytest.raises(FrameError):  # the decoder stays failed
        decoder.next_frame()
    with pytest.raises(FrameError):
        decoder.feed(b"more")


def test_lengths_are_checked_as_their_bytes_arrive() -> None:
    decoder = FrameDecoder(frame_bytes_max=fr.REQUEST_FRAME_BYTES_MAX)
    decoder.feed(b"\x00\x10")
    assert decoder.next_frame() is None
    with pytest.raises(FrameError):
        decoder.feed(b"\x00\x01")  # 1 MiB + 1: over a broker's request limit
    ok = FrameDecoder(frame_bytes_max=fr.REQUEST_FRAME_BYTES_MAX)
    ok.feed(struct.pack(">I", fr.REQUEST_FRAME_BYTES_MAX))
    assert ok.next_frame() is None  # at the limit: waits for the rest


@pytest.mark.parametrize(
    ("prefix", "field"),
    [
        (struct.pack(">I", 9), "length"),  # shorter than the fixed part
        (struct.pack(">IIBBI", 10, 1, 0, 1, 0), "kind"),
        (struct.pack(">IIBBI", 10, 1, 4, 1, 0), "kind"),
        (struct.pack(">IIBBI", 20, 1, 1, 1, 11), "header_length"),  # past the frame
        (struct.pack(">IIBBI", 70_000, 1, 1, 1, 65_537), "header_length"),  # over the limit
    ],
)
def test_bad_prefixes(prefix: bytes, field: str) -> None:
    decoder = FrameDecoder()
    with pytest.raises(FrameError) as caught:
        decoder.feed(prefix)
        decoder.next_frame()
    assert caught.value.fields["field"] == field


def raw_frame(header: bytes, kind: int = 1, op: int = 1) -> bytes:
    return struct.pack(">IIBBI", 10 + len(header), 1, kind, op, len(header)) + header


@pytest.mark.parametrize(
    "header",
    [
        b"",  # not msgpack
        msgpack.packb([1, 2]),  # not a map
        msgpack.packb({1: 2}),  # int key
        msgpack.packb({b"k": 1}, use_bin_type=True),  # bytes key
        msgpack.packb({"k": 1}) + b"\xc0",  # trailing bytes
        b"\x81\xa1k\xa2\xff\xfe",  # invalid UTF-8
        msgpack.packb({"k": msgpack.ExtType(5, b"x")}),
        msgpack.packb({"k": msgpack.ExtType(5, b"")}),
        msgpack.packb({"k": msgpack.Timestamp(1, 0)}),
        b"\x81\xa1k" + b"\x91" * 5000 + b"\xc0",  # too deep
        b"\x81\xa1k\xdb\xff\xff\xff\xff",  # a str claiming 4 GiB in a 9-byte header
        b"\x81\xa1k\xdd\xff\xff\xff\xff",  # an array claiming 4 G items
    ],
)
def test_bad_headers(header: bytes) -> None:
    decoder = FrameDecoder()
    decoder.feed(raw_frame(header))
    with pytest.raises(FrameError):
        decoder.next_frame()


@given(st.binary(max_size=200), st.lists(st.integers(0, 300), max_size=5))
def test_garbage_raises_only_frame_error(data: bytes, cuts: list[int]) -> None:
    decoder = FrameDecoder()
    try:
        for chunk in split(data, cuts):
            decoder.feed(chunk)
            list(decoder)
    except FrameError:
        pass


@given(st.binary(max_size=100))
def test_garbage_after_a_valid_prefix_raises_only_frame_error(body: bytes) -> None:
    decoder = FrameDecoder()
    decoder.feed(struct.pack(">IIBBI", 10 + len(body), 1, 1, 2, min(len(body), 50)) + body)
    with contextlib.suppress(FrameError):
        list(decoder)


def test_unknown_ops_decode_and_are_rejected_without_framing_error() -> None:
    decoder = FrameDecoder()
    decoder.feed(fr.encode_frame(9, Kind.REQUEST, 200, {}))
    frame = decoder.next_frame()
    assert frame is not None and frame.op == 200
    with pytest.raises(ProtocolError) as caught:
        fr.parse_op(frame.op)
    assert not isinstance(caught.value, FrameError)
    assert caught.value.code == "BAD_REQUEST"
    assert fr.parse_op(3) is Op.METADATA


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"correlation_id": -1}, "correlation_id"),
        ({"correlation_id": 2**32}, "correlation_id"),
        ({"correlation_id": True}, "correlation_id"),
        ({"op": 256}, "op"),
        ({"kind": 4}, "kind"),
        ({"header": {1: 2}}, "header"),
        ({"header": {"x": object()}}, "header"),
        ({"header": {"x": "y" * 70_000}}, "header_length"),
        ({"payload_length": 2**32 - 10}, "length"),
    ],
)
def test_encoder_refuses_what_does_not_fit(kwargs: dict[str, Any], field: str) -> None:
    args: dict[str, Any] = {"correlation_id": 1, "kind": Kind.REQUEST, "op": Op.FETCH,
                            "header": {}, "payload_length": 0}
    args.update(kwargs)
    with pytest.raises(FrameError) as caught:
        fr.encode_frame(**args)
    assert caught.value.fields["field"] == field


def test_buffer_is_compacted_while_pipelining() -> None:
    one = fr.encode_frame_with_payload(1, Kind.REQUEST, Op.FETCH, {"i": 1}, b"x" * 1000)
    decoder = FrameDecoder()
    count = 0
    for _ in range(300):
        decoder.feed(one + one[:500])  # always a partial frame left over
        count += len(list(decoder))
        decoder.feed(one[500:])
        count += len(list(decoder))
    assert count == 600
    assert decoder.buffered_bytes == 0
    assert len(decoder._buf) < 2 * fr._COMPACT_BYTES


def test_a_large_payload_in_small_chunks() -> None:
    payload = bytes(range(256)) * 16 * 1024  # 4 MiB
    data = fr.encode_frame_with_payload(3, Kind.RESPONSE, Op.FETCH, {"n": 1}, payload)
    frames_out = decode_all(split(data, list(range(0, len(data), 4096))))
    assert frames_out == [Frame(3, Kind.RESPONSE, Op.FETCH, {"n": 1}, payload)]


def test_hello_round_trip() -> None:
    request = fr.hello_request("cli-1")
    assert request == {"version": 1, "client_id": "cli-1"}
    assert fr.parse_hello_request(request) == fr.Hello("cli-1")
    response = fr.hello_response(2, fr.REQUEST_FRAME_BYTES_MAX)
    assert response == {"version": 1, "broker_id": 2, "max_frame_bytes": 1024 * 1024}
    assert fr.parse_hello_response(response) == fr.HelloReply(2, 1024 * 1024)


@pytest.mark.parametrize(
    ("header", "error", "field"),
    [
        ({"version": 2, "client_id": "c"}, UnsupportedVersion, None),
        ({"version": 0, "client_id": "c"}, UnsupportedVersion, None),
        ({"client_id": "c"}, ProtocolError, "version"),
        ({"version": True, "client_id": "c"}, ProtocolError, "version"),
        ({"version": "1", "client_id": "c"}, ProtocolError, "version"),
        ({"version": 1}, ProtocolError, "client_id"),
        ({"version": 1, "client_id": 5}, ProtocolError, "client_id"),
        ({"version": 1, "client_id": "c" * 257}, ProtocolError, "client_id"),
    ],
)
def test_bad_hello_requests(header: dict[str, Any], error: type[Exception],
                            field: str | None) -> None:
    with pytest.raises(error) as caught:
        fr.parse_hello_request(header)
    if isinstance(caught.value, UnsupportedVersion):
        assert caught.value.code == "UNSUPPORTED_VERSION"
        assert caught.value.fields == {"version": header["version"], "supported": 1}
    else:
        assert caught.value.fields["field"] == field  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "header",
    [
        {"version": 2, "broker_id": 1, "max_frame_bytes": 1000},
        {"version": 1, "broker_id": -1, "max_frame_bytes": 1000},
        {"version": 1, "broker_id": 1, "max_frame_bytes": 5},
        {"version": 1, "broker_id": 1},
        {"version": 1, "broker_id": False, "max_frame_bytes": 1000},
    ],
)
def test_bad_hello_responses(header: dict[str, Any]) -> None:
    with pytest.raises(ProtocolError):
        fr.parse_hello_response(header)
