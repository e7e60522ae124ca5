"""Acks: compact JSON round trips, error acks raise their error, malformed acks are refused."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jetstream import errors
from jetstream.errors import ProtocolError
from jetstream.protocol.ack import (
    ACCELERATED,
    ACK_BYTES_MAX,
    ACK_ENTRIES_MAX,
    Ack,
    AckEncoder,
    AckTarget,
    ErrorAck,
    decode_ack,
    encode_ack,
    encode_batch_ack,
    encode_error_ack,
    parse_ack,
)
from jetstream.protocol.envelope import AckPolicy
from jetstream.server.ingest_batch import IngestBatch, encode_acks
from jetstream.stream.format import Record

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


# -- the targets loop of the broker's encoder (in C when built) ---------------------------------

LEADER, ALL = AckPolicy.LEADER, AckPolicy.ALL
#: What encode_targets fills: leader acks, all acks, all targets, grouped batch acks.
Outputs = tuple[list[tuple[str, bytes]], list[tuple[str, bytes]], list[tuple[str, str | None]],
                dict[tuple[str, AckPolicy], list[tuple[int, str | None]]]]

any_subjects = st.sampled_from(["a.b", "a.é", 'q"u\\o', "\u2028"]) | st.text(max_size=6)
inboxes = st.sampled_from(["_INBOX.1", "_INBOX.2"]) | st.text(max_size=4)


@st.composite
def ack_batches(draw: st.DrawFn) -> tuple[list[Record], list[AckTarget]]:
    """Records and targets at them: each target is an index in the records, an inbox, a
    correlation id or None, a policy, and whether it asked for a batch ack."""
    records = [Record(b"v", subject=s) for s in draw(st.lists(any_subjects, min_size=1,
                                                              max_size=12))]
    targets = draw(st.lists(st.tuples(st.integers(0, len(records) - 1), inboxes,
                                      st.none() | st.text(max_size=8), policies,
                                      st.booleans()), max_size=40))
    return records, targets


def run_targets(encoder: AckEncoder, rounds: list[tuple[int, list[Record], list[AckTarget]]]
                ) -> tuple[Outputs, dict[tuple[str, AckPolicy], bytes]]:
    out: Outputs = ([], [], [], {})
    for base, records, targets in rounds:
        encoder.encode_targets(base, targets, records, *out)
    return out, encoder._tails


def filled(accelerated: bool, subjects_cached: int, records: list[Record]) -> AckEncoder:
    """An encoder whose cache holds `subjects_cached` tails (when > 0), those of `records`
    among them."""
    encoder = AckEncoder("orders", 7, accelerated=accelerated)
    if subjects_cached:
        for record in records:
            for policy in (LEADER, ALL):
                encoder.encode(0, record.subject, None, policy)
    for j in range(subjects_cached - len(encoder._tails)):
        encoder.encode(0, f"fill.{j}", None, LEADER)
    return encoder


@settings(max_examples=150, deadline=None)
@given(rounds=st.lists(st.tuples(st.integers(0, 2**62), ack_batches()), min_size=1,
                       max_size=4),
       room=st.none() | st.integers(0, 3))
def test_the_c_loop_encodes_the_acks_the_python_loop_encodes(
        rounds: list[tuple[int, tuple[list[Record], list[AckTarget]]]],
        room: int | None) -> None:
    """The same acks in the same order in all four outputs, and the same tail cache, from
    an empty cache and from one `room` subjects short of full, the first round's tails
    cached (so that C reads a full cache, and Python clears it within the batch); later
    rounds find earlier rounds' tails cached."""
    if not ACCELERATED:
        pytest.skip("the C loop is not built here")
    cached = 0 if room is None else AckEncoder.SUBJECTS_CACHED_MAX - room
    flat = [(base, records, targets) for base, (records, targets) in rounds]
    first_records = flat[0][1]
    got = run_targets(filled(True, cached, first_records), flat)
    want = run_targets(filled(False, cached, first_records), flat)
    assert got == want


@pytest.mark.parametrize("accelerated", [True, False])
def test_the_common_case_and_what_c_declines(accelerated: bool) -> None:
    """Offsets at the top of the range (past 2**63 - 1 C declines), subjects that are not
    exact str, policies that are not the members: the acks of the Python loop."""
    class Subject(str):
        pass

    records = [Record(b"v", subject="a.b"), Record(b"w", subject=Subject("a.b"))]
    targets: list[AckTarget] = [(0, "i", None, LEADER, False), (1, "i", None, LEADER, False),
                                (0, "j", None, ALL, False), (0, "k", None, ALL, True),
                                (1, "m", "c-1", ALL, False)]
    encoder = AckEncoder("orders", 7, accelerated=accelerated)
    out: Outputs = ([], [], [], {})
    for base in (0, 0, 2**63 - 2):
        encoder.encode_targets(base, targets, records, *out)
    leader, all_, all_targets, grouped = out

    def single(inbox: str, offset: int, policy: AckPolicy, cid: str | None = None
               ) -> tuple[str, bytes]:
        return (inbox, encode_ack("orders", 7, offset, "a.b", cid, policy))

    top = 2**63 - 2
    assert leader == [single("i", 0, LEADER), single("i", 1, LEADER)] * 2 + [
        single("i", top, LEADER), single("i", top + 1, LEADER)]
    assert all_ == [single("j", 0, ALL), single("m", 1, ALL, "c-1")] * 2 + [
        single("j", top, ALL), single("m", top + 1, ALL, "c-1")]
    assert all_targets == [("j", None), ("k", None), ("m", "c-1")] * 3
    assert grouped == {("k", ALL): [(0, None), (0, None), (top, None)]}
    # A plain tuple is no Record: both loops raise the same error on it.
    with pytest.raises(AttributeError):
        encoder.encode_targets(0, targets[:1], [("v", None, {}, "a.b", None)],  # type: ignore[list-item]
                               *out)


@pytest.mark.parametrize("accelerated", [True, False])
def test_encode_acks_of_a_small_batch(accelerated: bool) -> None:
    """Retries' acks first, then the singles in target order, then the batch acks (split
    at ACK_ENTRIES_MAX); the all targets in target order, then the retries'."""
    records = [Record(b"v", subject=f"s.{i}") for i in range(ACK_ENTRIES_MAX + 5)]
    targets: list[AckTarget] = [(0, "a", None, LEADER, False), (1, "b", "c-1", ALL, False),
                                (2, "a", None, ALL, False)]
    targets += [(i, "g", None, ALL, True) for i in range(3, len(records))]
    batch = IngestBatch(records, targets, [], duplicates=[("d", "c-d", ALL, 4, "s.x"),
                                                          ("e", None, LEADER, 5, "s.y")])
    encoder = AckEncoder("orders", 7, accelerated=accelerated)
    leader, all_, all_targets = encode_acks(encoder, 100, batch)

    def single(inbox: str, offset: int, subject: str, cid: str | None, policy: AckPolicy,
               duplicate: bool = False) -> tuple[str, bytes]:
        return (inbox, encode_ack("orders", 7, offset, subject, cid, policy, duplicate))

    grouped = [(100 + i, None) for i in range(3, len(records))]
    assert leader == [single("e", 5, "s.y", None, LEADER, True),
                      single("a", 100, "s.0", None, LEADER)]
    assert all_ == [single("d", 4, "s.x", "c-d", ALL, True),
                    single("b", 101, "s.1", "c-1", ALL), single("a", 102, "s.2", None, ALL),
                    ("g", encode_batch_ack("orders", 7, ALL, grouped[:ACK_ENTRIES_MAX])),
                    ("g", encode_batch_ack("orders", 7, ALL, grouped[ACK_ENTRIES_MAX:]))]
    assert all_targets == [("b", "c-1"), ("a", None)] + [("g", None)] * len(grouped) + [
        ("d", "c-d")]
