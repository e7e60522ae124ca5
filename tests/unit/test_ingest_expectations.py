"""What a publish asks, read from NATS headers, envelopes and HTTP (jetstream.server.guarded),
and an ingest batch judged by the guard (jetstream.server.ingest_batch)."""

from __future__ import annotations

import json

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jetstream.errors import NotEnoughReplicas, OffsetMismatch, ProtocolError
from jetstream.idempotence import headers as h
from jetstream.idempotence.dedupe import GuardLimits
from jetstream.idempotence.guard import Expectations, Guard, ProducerSequence
from jetstream.protocol.ack import AckEncoder
from jetstream.protocol.envelope import PREFIX_BYTES as ENVELOPE_PREFIX
from jetstream.protocol.envelope import AckPolicy, decode_envelope, encode_envelope
from jetstream.raft_meta.model import StreamConfig
from jetstream.server import ingest_batch
from jetstream.server.guarded import from_envelope, from_http, from_nats_headers
from jetstream.server.ingest_batch import apply_verdicts, encode_acks, take_messages
from jetstream.server.nats_wire import NatsMsg
from jetstream.stream.format import Record

T0 = 1_700_000_000_000
STREAM = StreamConfig("s", "s.in")


def test_nats_headers() -> None:
    assert from_nats_headers({"Content-Type": "text/plain"}) is None
    expect = from_nats_headers({
        "Nats-Msg-Id": "m", "Nats-Expected-Last-Sequence": "5",
        "Jetstream-Check-Registers": "owner=a", "Jetstream-Union-Registers": "x=1,y=2",
        "Jetstream-Producer-Id": "p", "Jetstream-Producer-Epoch": "2",
        "Jetstream-Producer-Sequence": "9"})
    assert expect is not None
    assert (expect.msg_id, expect.expected_offset) == ("m", 5)
    assert expect.producer == ProducerSequence("p", 2, 9)
    resumed = from_nats_headers({"Jetstream-Producer-Id": "p",
                                 "Jetstream-Producer-Sequence": "9",
                                 "Jetstream-Producer-Resume": "true"})
    assert isinstance(resumed, Expectations)
    assert resumed.producer == ProducerSequence("p", 0, 9, resume=True)
    assert str(expect.check_registers) == "owner=a"
    assert dict(expect.union_registers) == {"x": "1", "y": "2"}
    for bad in ({"Jetstream-Expected-Offset": "x"}, {"Jetstream-Registers": "{}"},
                {"Jetstream-Check-Registers": "a in"}, {"Jetstream-Union-Registers": "a"},
                {"Jetstream-Expected-Offset": "1", "Nats-Expected-Last-Sequence": "2"},
                {"Jetstream-Producer-Id": "p", "Jetstream-Producer-Sequence": "1",
                 "Jetstream-Producer-Resume": "yes"}):
        with pytest.raises(ProtocolError):
            from_nats_headers(bad)


def test_envelope_fields_round_trip_and_are_checked() -> None:
    payload = encode_envelope(b"v", key=b"k", msg_id="m", producer=("p", 1, 2),
                              expected_offset=3, expected_last_offset_for_key=-1,
                              check_registers="!lock", union_registers={"lock": "me"},
                              subtract_registers={"x": "y"})
    envelope = decode_envelope(payload)
    assert envelope is not None and envelope.has_expectations
    expect = from_envelope(envelope)
    assert expect is not None and expect.producer == ProducerSequence("p", 1, 2)
    assert (expect.expected_offset, expect.expected_key_offset) == (3, -1)
    plain = decode_envelope(encode_envelope(b"v", headers={"Nats-Msg-Id": b"from-header"}))
    assert plain is not None and not plain.has_expectations
    from_header = from_envelope(plain)
    assert from_header is not None and from_header.msg_id == "from-header"
    with pytest.raises(ProtocolError):
        encode_envelope(b"v", expected_offset=-1)
    with pytest.raises(ProtocolError):
        encode_envelope(b"v", producer=("bad id", 0, 0))
    resumed = decode_envelope(encode_envelope(b"v", producer=("p", 1, 2, True)))
    assert resumed is not None
    assert from_envelope(resumed) == Expectations(producer=ProducerSequence("p", 1, 2, True))
    for bad in (("p", 1, 2, "yes"), ("p", 1, 2, True, 5), ("p", 1)):
        with pytest.raises(ProtocolError):
            encode_envelope(b"v", producer=bad)
    with pytest.raises(ProtocolError):
        encode_envelope(b"v", msg_ids="typo")


def test_http_expectations_from_headers_or_body() -> None:
    records = [Record(b"v")]
    by_header = from_http({"Nats-Msg-Id": "m"}, {}, records)
    assert by_header is not None and by_header.msg_id == "m"
    by_body = from_http({}, {"expected_offset": 4, "producer": ["p", 0, 1]}, records)
    assert by_body is not None and by_body.expected_offset == 4
    assert by_body.producer == ProducerSequence("p", 0, 1)
    resumed = from_http({}, {"producer": ["p", 0, 1, True]}, records)
    assert resumed is not None and resumed.producer == ProducerSequence("p", 0, 1, True)
    with pytest.raises(ProtocolError):
        from_http({}, {"producer": "p"}, records)
    assert from_http({}, {}, records) is None
    with pytest.raises(ProtocolError):
        from_http({"Nats-Msg-Id": "m"}, {"expected_offset": 1}, records)


def test_a_batch_judged_in_order() -> None:
    msgs = [
        ("s.in", "r0", None, b"plain"),
        ("s.in", "r1", {"Nats-Msg-Id": "a"}, b"first"),
        ("s.in", "r2", {"Nats-Msg-Id": "a"}, b"retry"),
        ("s.in", "r3", {"Jetstream-Expected-Offset": "0"}, b"late"),
        ("s.in", "r4", {"Jetstream-Expected-Offset": "x"}, b"bad"),
        ("s.in", "", {"Nats-Msg-Id": "b"}, b"no reply"),
    ]
    batch = take_messages(msgs, STREAM, False, lambda: NotEnoughReplicas(2, 1))
    assert [e[0] for e in batch.errors] == ["r4"]
    guard = Guard(GuardLimits(), track_keys=False)
    guard_pass = guard.begin(10, 0, T0)
    apply_verdicts(batch, guard_pass)
    assert [r.value for r in batch.records] == [b"plain", b"first", b"no reply"]
    assert batch.records[1].headers == {h.MSG_ID: b"a"}
    assert [t[:2] for t in batch.targets] == [(0, "r0"), (1, "r1")]
    assert [(d[0], d[3]) for d in batch.duplicates] == [("r2", 11)]
    (refused,) = [e for e in batch.errors if e[0] == "r3"]
    assert isinstance(refused[2], OffsetMismatch) and refused[2].log_end_offset == 12
    guard_pass.commit()
    assert guard.ids.offset_of("b") == 12
    leader, acked_all, all_targets = encode_acks(AckEncoder("s", 0), 10, batch)
    assert leader == [] and len(acked_all) == 3 and len(all_targets) == 3
    duplicate = json.loads(acked_all[0][1])
    assert (duplicate["offset"], duplicate["duplicate"]) == (11, True)


id_batches = st.lists(st.tuples(st.sampled_from(["", "r"]),
                                st.none() | st.sampled_from(["a", "b", "c", "d", "x" * 257]),
                                st.none() | st.sampled_from([b"k1", b"k2"])),
                      min_size=1, max_size=30)


@settings(max_examples=300, deadline=None)
@given(messages=id_batches, stored=st.lists(st.sampled_from(["a", "b", "c"]), max_size=3),
       track_keys=st.booleans())
def test_ids_alone_are_judged_as_record_by_record(
        messages: list[tuple[str, str | None, bytes | None]], stored: list[str],
        track_keys: bool) -> None:
    def judged(fast: bool) -> tuple[object, ...]:
        # A key comes in an envelope, and the envelope carries the id then.
        msgs = [("s.in", f"{reply}{i}" if reply else "",
                 None if msg_id is None or key else {h.MSG_ID: msg_id},
                 encode_envelope(b"v", key, headers={}, msg_id=msg_id if msg_id and len(
                     msg_id) <= h.MSG_ID_CHARS_MAX else None) if key else b"v")
                for i, (reply, msg_id, key) in enumerate(messages)]
        batch = take_messages(msgs, STREAM, False, lambda: NotEnoughReplicas(2, 1))
        guard = Guard(GuardLimits(), track_keys=track_keys)
        for i, msg_id in enumerate(stored):  # ids stored by earlier appends
            guard.ids.add(msg_id, i, T0)
        guard_pass = guard.begin(10, 0, T0)
        if fast or batch.expects is None:
            apply_verdicts(batch, guard_pass)
        else:
            ingest_batch._apply_each(batch, batch.expects, guard_pass)
        guard_pass.commit()
        return (batch.records, batch.targets, batch.duplicates,
                [(e[0], e[2].code) for e in batch.errors],
                [(m, guard.ids.offset_of(m)) for m in "abcd"], dict(guard.keys))

    fast = judged(fast=True)
    assert fast == judged(fast=False)
    too_long = {f"r{i}" for i, (reply, msg_id, key) in enumerate(messages)
                if reply and msg_id is not None and len(msg_id) > h.MSG_ID_CHARS_MAX and not key}
    assert fast[3] == [(inbox, "BAD_REQUEST") for inbox in sorted(too_long, key=lambda r:
                                                                     int(r[1:]))]


def _envelope(value: bytes | None, key: bytes | None, corr: str | None, policy: str | None,
              batch_ack: bool, extra: dict[str, object]) -> bytes:
    """An envelope as encode_envelope writes it, or with fields it would not write."""
    body: dict[str, object] = {"value": value}
    if key is not None:
        body["key"] = key
    if corr is not None:
        body["correlation_id"] = corr
    if policy is not None:
        body["ack_policy"] = policy
    if batch_ack:
        body["batch_ack"] = True
    body.update(extra)
    return ENVELOPE_PREFIX + msgpack.packb(body, use_bin_type=True)


envelopes = st.builds(
    _envelope, st.none() | st.binary(max_size=3) | st.sampled_from([b"v" * 65, b"v" * 300]),
    st.none() | st.sampled_from([b"k", b""]),
    st.none() | st.sampled_from(["c", "é", "x" * 256, "x" * 257, ""]),
    st.none() | st.sampled_from(["leader", "all", "none", "LEADER"]), st.booleans(),
    st.dictionaries(st.sampled_from(["ack_inbox", "headers", "msg_id", "batch_ack", "value",
                                     "other", "key", "correlation_id", "ack_policy"]),
                    st.sampled_from([None, "_INBOX.x", "*", {}, {"h": b"1"}, "m", 1, False,
                                     True, b"b", "s"]), max_size=2),
) | st.sampled_from([  # encodings encode_envelope does not write, and broken bodies
    ENVELOPE_PREFIX + b"\x81\xd9\x05value\xc4\x01v",  # a str8 key
    ENVELOPE_PREFIX + b"\x81\xa5value\xc5\x00\x01v",  # a bin16 value
    ENVELOPE_PREFIX + b"\x81\xa5value\xc6\x00\x00\x00\x01v",  # a bin32 value
    ENVELOPE_PREFIX + b"\x81\xa5value\xc4\x01v\x00",  # a byte after the map
    ENVELOPE_PREFIX + b"\x81\xa5value\xc4\x02v",  # cut short
    ENVELOPE_PREFIX + b"\x82\xa5value\xc4\x01v\xa5value\xc0",  # a key twice
    ENVELOPE_PREFIX + b"\x82\xa5value\xc4\x01v\xaecorrelation_id\xa2\xff\xfe",  # not UTF-8
    ENVELOPE_PREFIX + b"\x82\xa5value\xc4\x01v\xa9batch_ack\xc0",  # batch_ack nil
    ENVELOPE_PREFIX + b"\x80",  # no value
])
header_values = st.sampled_from(["a", "é", "", "x" * 256, "x" * 257, "\ud800", "0", "z"])
nats_messages = st.lists(st.tuples(
    st.sampled_from(["s.in", "s.é", ""]),
    st.none() | st.sampled_from(["", "r", "_INBOX.é"]),
    st.none() | st.just({}) | st.builds(lambda i: {h.MSG_ID: i}, header_values)
    | st.dictionaries(st.sampled_from([h.MSG_ID, "Nats-Msg-ID", "Jetstream-Expected-Offset",
                                       "X"]), header_values, max_size=2),
    st.binary(max_size=6) | st.sampled_from([b"", b"x" * 65]) | envelopes
    | st.builds(lambda tail: ENVELOPE_PREFIX + tail, st.binary(max_size=4))),
    max_size=12)


@settings(max_examples=400, deadline=None)
@given(msgs=nats_messages, policy=st.sampled_from(list(AckPolicy)),
       max_bytes=st.sampled_from([64, 1024]), refuse_all=st.booleans())
def test_the_c_loop_takes_messages_as_the_python_loop_does(
        msgs: list[NatsMsg], policy: AckPolicy, max_bytes: int, refuse_all: bool) -> None:
    """Records (their headers' types too), targets, expectations and refusals with their
    codes and messages, for plain messages, ids valid or not, other headers and envelopes."""
    if not ingest_batch.ACCELERATED:
        pytest.skip("the C loop is not built here")
    stream = StreamConfig("s", "s.in", ack_policy=policy, max_message_bytes=max_bytes)

    def taken(c: bool) -> tuple[object, ...]:
        refuse = lambda: NotEnoughReplicas(2, 1)  # noqa: E731
        if c:
            batch = take_messages(msgs, stream, refuse_all, refuse)
        else:
            batch = ingest_batch.IngestBatch([], [], [])
            ingest_batch._take_python(batch, msgs, stream, refuse_all, refuse)
        return (batch.records, [type(r.headers) for r in batch.records], batch.targets,
                batch.expects, [(e[0], e[1], e[2].code, str(e[2])) for e in batch.errors])

    try:
        want = taken(c=False)
    except UnicodeEncodeError:  # a lone surrogate in an id: both raise
        with pytest.raises(UnicodeEncodeError):
            taken(c=True)
        return
    assert taken(c=True) == want
