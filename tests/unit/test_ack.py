"""Acks: compact JSON round trips, error acks raise their error, malformed acks are refused."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jetstream import errors
from jetstream.errors import ProtocolError
from jetstream.protocol.ack import (
    ACK_BYTES_MAX,
    ACK_ENTRIES_MAX,
    Ack,
    AckEncoder,
    ErrorAck,
    decode_ack,
    encode_ack,
    encode_batch_ack,
    encode_error_ack,
    parse_ack,
)
from jetstream.protocol.envelope import AckPolicy

streams = st.from_regex(r"[A-Za-z0-9_-]{1,64}", fullmatch=True)
partitions = st.integers(0, 2**31 - 1)
offsets = st.integers(0, 2**63 - 1)
correlation_ids = st.none() | st.text(max_size=256)
policies = st.sampled_from([AckPolicy.LEADER, AckPolicy.ALL])
subjects = st.lists(st.from_regex(r"[a-z0-9_]{1,8}", fullmatch=True), min_size=1,
                    max_size=4).map(".".join)


@given(streams, partitions, offsets, subjects, correlation_ids, policies)
def test_single_round_trip(stream: str, partition: int, offset: int, subject: str,
                           correlation_id: str | None, policy: AckPolicy) -> None:
    data = encode_ack(stream, partition, offset, subject, correlation_id, policy)
    assert decode_ack(data) == [Ack(stream, partition, offset, correlation_id, policy, subject)]


@given(streams, partitions, st.lists(st.tuples(offsets, st.sampled_from(["a.b", "c", "a.b.é"]),
                                               correlation_ids, policies), max_size=20))
def test_the_broker_encoder_writes_what_encode_ack_writes(
        stream: str, partition: int,
        acks: list[tuple[int, str, str | None, AckPolicy]]) -> None:
    encoder = AckEncoder(stream, partition)  # its cache carries over from ack to ack
    for ack in acks:
        assert encoder.encode(*ack) == encode_ack(stream, partition, *ack)


@given(streams, partitions, policies,
       st.lists(st.tuples(offsets, correlation_ids), min_size=1, max_size=50))
def test_batch_round_trip(stream: str, partition: int, policy: AckPolicy,
                          acks: list[tuple[int, str | None]]) -> None:
    data = encode_batch_ack(stream, partition, policy.value, acks)
    assert decode_ack(data) == [Ack(stream, partition, o, c, policy) for o, c in acks]


@given(streams, partitions, correlation_ids, st.integers(-1, 2**31 - 1), st.text(max_size=30))
def test_error_round_trip(stream: str, partition: int, correlation_id: str | None,
                          leader_id: int, address: str) -> None:
    error = errors.NotLeader(stream, partition, leader_id, address)
    data = encode_error_ack(stream, partition, correlation_id, error)
    result = parse_ack(data)
    assert isinstance(result, ErrorAck)
    assert (result.stream, result.partition, result.correlation_id) == (stream, partition,
                                                                        correlation_id)
    assert type(result.error) is errors.NotLeader
    assert result.error.to_dict() == error.to_dict()
    with pytest.raises(errors.NotLeader) as caught:
        decode_ack(data)
    assert caught.value.to_dict() == error.to_dict()


def test_declared_json_is_compact() -> None:
    assert encode_ack("orders", 1, 42, "shop.orders", "c-1", "all") == (
        b'{"stream":"orders","partition":1,"offset":42,"subject":"shop.orders",'
        b'"correlation_id":"c-1","ack_policy":"all"}')
    assert encode_batch_ack("orders", 0, AckPolicy.LEADER, [(5, "a"), (6, None)]) == (
        b'{"stream":"orders","partition":0,"ack_policy":"leader",'
        b'"acks":[{"offset":5,"correlation_id":"a"},{"offset":6,"correlation_id":null}]}')
    assert encode_error_ack("orders", 0, None, errors.UnknownStream("orders")) == (
        b'{"stream":"orders","partition":0,"correlation_id":null,"error":{'
        b'"code":"UNKNOWN_STREAM","message":"unknown stream \'orders\'","stream":"orders"}}')


def test_an_error_with_a_field_json_cannot_carry_is_still_sent() -> None:
    error = errors.JetstreamError("odd", blob=b"\x00\x01")
    result = parse_ack(encode_error_ack("s", 0, "c", error))
    assert isinstance(result, ErrorAck) and result.error.code == "INTERNAL"
    assert str(result.error) == "odd"


def test_an_unknown_error_code_raises_a_remote_error() -> None:
    data = (b'{"stream":"s","partition":0,"correlation_id":null,'
            b'"error":{"code":"SOMETHING_NEW","message":"hm"}}')
    with pytest.raises(errors.RemoteError) as caught:
        decode_ack(data)
    assert caught.value.code == "SOMETHING_NEW"


SINGLE = {"stream": "s", "partition": 0, "offset": 1, "subject": "a.b",
          "correlation_id": None, "ack_policy": "all"}


def dumps(obj: Any) -> bytes:
    return json.dumps(obj).encode()


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"not json",
        b"\xff\xfe{}",
        b"[]",
        b'"ack"',
        b'{"stream":"s","partition":0,"offset":NaN,"subject":"a","ack_policy":"all"}',
        b"[" * 100_000 + b"]" * 100_000,
        dumps({**SINGLE, "stream": "bad name"}),
        dumps({**SINGLE, "partition": True}),
        dumps({**SINGLE, "partition": -1}),
        dumps({**SINGLE, "offset": 1.5}),
        dumps({**SINGLE, "offset": 2**63}),
        dumps({**SINGLE, "subject": "a.*"}),
        dumps({**SINGLE, "subject": None}),
        dumps({**SINGLE, "correlation_id": 5}),
        dumps({**SINGLE, "correlation_id": "c" * 257}),
        dumps({**SINGLE, "ack_policy": "none"}),
        dumps({k: v for k, v in SINGLE.items() if k != "offset"}),
        dumps({"stream": "s", "partition": 0, "ack_policy": "all", "acks": []}),
        dumps({"stream": "s", "partition": 0, "ack_policy": "all", "acks": {"offset": 1}}),
        dumps({"stream": "s", "partition": 0, "ack_policy": "all", "acks": [5]}),
        dumps({"stream": "s", "partition": 0, "ack_policy": "all",
               "acks": [{"offset": 1, "correlation_id": None}] * (ACK_ENTRIES_MAX + 1)}),
        dumps({"stream": "s", "partition": 0, "correlation_id": None, "error": "boom"}),
        dumps({"stream": "s", "partition": 0, "correlation_id": None, "error": {"code": 1}}),
        b" " * (ACK_BYTES_MAX + 1),
    ],
)
def test_malformed_acks(data: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode_ack(data)


@given(st.binary(max_size=200))
def test_random_bytes_raise_only_protocol_error(data: bytes) -> None:
    with contextlib.suppress(ProtocolError):
        decode_ack(data)


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda: encode_ack("bad name", 0, 1, "a", None, "all"), "stream"),
        (lambda: encode_ack("s", 0, -1, "a", None, "all"), "offset"),
        (lambda: encode_ack("s", 0, 1, "a.>", None, "all"), "subject"),
        (lambda: encode_ack("s", 0, 1, "a", None, "none"), "ack_policy"),
        (lambda: encode_ack("s", 0, 1, "a", "c" * 257, "all"), "correlation_id"),
        (lambda: encode_batch_ack("s", 0, "all", []), "acks"),
        (lambda: encode_batch_ack("s", 0, "all", [(0, None)] * (ACK_ENTRIES_MAX + 1)), "acks"),
        (lambda: encode_batch_ack("s", 0, "all", [(True, None)]), "offset"),
        (lambda: encode_error_ack("s", -1, None, errors.UnknownStream("s")), "partition"),
    ],
)
def test_encoders_name_the_bad_argument(call: Any, field: str) -> None:
    with pytest.raises(ProtocolError) as caught:
        call()
    assert caught.value.fields["field"] == field
