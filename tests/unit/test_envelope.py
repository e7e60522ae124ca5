"""The publisher envelope: round trips, and never an exception on arbitrary payloads."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jetstream.errors import ProtocolError
from jetstream.protocol.envelope import (
    MAGIC,
    AckPolicy,
    Envelope,
    Published,
    decode_envelope,
    decode_published,
    encode_envelope,
    is_envelope,
)

PREFIX = MAGIC + b"\x01"
inboxes = st.lists(st.from_regex(r"[A-Za-z0-9_-]{1,10}", fullmatch=True), min_size=1,
                   max_size=4).map(".".join)
envelopes = st.builds(
    Envelope,
    value=st.binary(max_size=200),
    key=st.none() | st.binary(max_size=30),
    headers=st.dictionaries(st.text(min_size=1, max_size=20), st.binary(max_size=20),
                            max_size=4),
    ack_inbox=st.none() | inboxes,
    correlation_id=st.none() | st.text(max_size=256),
    ack_policy=st.none() | st.sampled_from(AckPolicy),
    batch_ack=st.booleans(),
)


def encode(e: Envelope) -> bytes:
    return encode_envelope(e.value, e.key, e.headers, e.ack_inbox, e.correlation_id,
                           e.ack_policy, e.batch_ack)


@given(envelopes)
def test_round_trip(envelope: Envelope) -> None:
    data = encode(envelope)
    assert data.startswith(PREFIX) and is_envelope(data)
    assert decode_envelope(data) == envelope
    assert decode_envelope(bytearray(data)) == envelope
    assert decode_envelope(memoryview(data)) == envelope


def test_declared_layout_and_defaults_omitted() -> None:
    assert encode_envelope(b"v") == PREFIX + msgpack.packb({"value": b"v"}, use_bin_type=True)
    data = encode_envelope(b"v", key=b"k", headers={"h": b"1"}, ack_inbox="_INBOX.x",
                           correlation_id="c1", ack_policy="all", batch_ack=True)
    assert msgpack.unpackb(data[5:]) == {
        "value": b"v", "key": b"k", "headers": {"h": b"1"}, "ack_inbox": "_INBOX.x",
        "correlation_id": "c1", "ack_policy": "all", "batch_ack": True}
    envelope = decode_envelope(data)
    assert envelope is not None and envelope.ack_policy is AckPolicy.ALL


def body(**fields: Any) -> bytes:
    return PREFIX + msgpack.packb(fields, use_bin_type=True)


def test_nil_means_absent_and_unknown_keys_are_ignored() -> None:
    assert decode_envelope(body(value=b"v", key=None, headers=None, ack_inbox=None,
                                correlation_id=None, ack_policy=None, batch_ack=None,
                                future=[1, 2])) == Envelope(b"v")


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"hello world",
        b"JSEV",  # magic, no version
        MAGIC + b"\x02" + msgpack.packb({"value": b"v"}),  # another version
        PREFIX,  # no body
        PREFIX + b"\xc1",  # not msgpack
        PREFIX + msgpack.packb({"value": b"v"}, use_bin_type=True) + b"\x00",  # trailing
        body(),  # no value
        body(key=b"k"),
        PREFIX + msgpack.packb([b"v"], use_bin_type=True),
        PREFIX + msgpack.packb({1: b"v"}, use_bin_type=True),
        body(value="text, not bin"),
        body(value=b"v", key="k"),
        body(value=b"v", headers={"h": "str"}),
        body(value=b"v", headers={"": b"x"}),
        body(value=b"v", headers=[["h", b"x"]]),
        body(value=b"v", headers={f"h{i}": b"" for i in range(257)}),
        body(value=b"v", ack_inbox="a.*"),
        body(value=b"v", ack_inbox="a b"),
        body(value=b"v", ack_inbox=5),
        body(value=b"v", correlation_id="c" * 257),
        body(value=b"v", correlation_id=1),
        body(value=b"v", ack_policy="sometimes"),
        body(value=b"v", ack_policy=["all"]),
        body(value=b"v", batch_ack=1),
        body(value=msgpack.ExtType(1, b"x")),
        PREFIX + b"\x81\xa5value\xc6\xff\xff\xff\xff",  # bin claiming 4 GiB
    ],
)
def test_anything_else_is_a_plain_message(payload: bytes) -> None:
    assert decode_envelope(payload) is None


@given(st.binary(max_size=300))
def test_random_payloads_never_raise(payload: bytes) -> None:
    result = decode_envelope(payload)
    assert result is None or isinstance(result, Envelope)


@given(st.binary(max_size=300))
def test_random_bytes_after_the_magic_never_raise(rest: bytes) -> None:
    result = decode_envelope(PREFIX + rest)
    assert result is None or isinstance(result, Envelope)


msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats()
    | st.text(max_size=10) | st.binary(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.text(max_size=5) | st.binary(max_size=5), inner, max_size=3),
    max_leaves=10,
)
envelope_keys = st.sampled_from(["value", "key", "headers", "ack_inbox", "correlation_id",
                                 "ack_policy", "batch_ack", "other"])


@given(st.dictionaries(envelope_keys, msgpack_values, max_size=8))
def test_random_maps_after_the_magic_never_raise(fields: dict[str, Any]) -> None:
    result = decode_envelope(PREFIX + msgpack.packb(fields, use_bin_type=True))
    assert result is None or isinstance(result, Envelope)


#: Envelopes of the fields the ingest decoder takes itself, each valid or not.
published_maps = st.fixed_dictionaries(
    {"value": st.none() | st.binary(max_size=8) | st.text(max_size=3)},
    optional={
        "key": st.none() | st.binary(max_size=8) | st.text(max_size=3),
        "ack_inbox": st.sampled_from([None, "_INBOX.a.1", "a.b", "bad subject", "a.>", "",
                                      7]),
        "correlation_id": st.sampled_from([None, "c", "1" * 256, "1" * 257, 5]),
        "ack_policy": st.sampled_from([None, "all", "leader", "none", "bogus", 1]),
        "batch_ack": st.sampled_from([None, True, False, 1, "yes"]),
    })


def _agree(fields: dict[str, Any]) -> None:
    data = PREFIX + msgpack.packb(fields, use_bin_type=True)
    fast = decode_published(data)
    full = decode_envelope(data)
    if isinstance(fast, Published):
        assert full is not None
        assert fast == (full.value, full.key, full.ack_inbox, full.correlation_id,
                        full.ack_policy, full.batch_ack)
        assert full == Envelope(**fast._asdict())  # nothing else was in it
    else:  # the full decoder's answer: it held more, or a field it refuses
        assert fast == full
        if full is not None:
            assert set(fields) - set(Published._fields)


@given(st.dictionaries(envelope_keys, msgpack_values, max_size=8))
def test_the_ingest_decoder_agrees_with_the_full_decoder(fields: dict[str, Any]) -> None:
    """It answers the envelopes of the usual fields alone (value, key, ack inbox,
    correlation id, ack policy, batch ack) with what the full decoder finds in them; anything
    else goes to the full decoder."""
    _agree(fields)


@settings(max_examples=400)
@given(published_maps)
def test_the_ingest_decoder_refuses_what_the_envelope_refuses(fields: dict[str, Any]) -> None:
    """The same, over the fields it takes itself, each valid or not: it never lets through
    a field the Envelope refuses."""
    _agree(fields)


@given(st.none() | st.binary(max_size=50), st.none() | st.binary(max_size=30))
def test_a_keyed_put_or_tombstone_takes_the_short_path(value: bytes | None,
                                                       key: bytes | None) -> None:
    assert decode_published(encode_envelope(value, key)) == Published(value, key)
    assert decode_published(encode_envelope(value, key, correlation_id="c",
                                            ack_inbox="_INBOX.x.1")) == Published(
        value, key, "_INBOX.x.1", "c")
    assert decode_published(encode_envelope(value, key, {"h": b"v"})) == Envelope(
        value, key, {"h": b"v"})
    assert decode_published(PREFIX + b"\xc1") is None


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"value": "text"}, "value"),
        ({"key": "text"}, "key"),
        ({"headers": {"h": "text"}}, "headers"),
        ({"ack_inbox": "a.>"}, "ack_inbox"),
        ({"correlation_id": "c" * 257}, "correlation_id"),
        ({"ack_policy": "maybe"}, "ack_policy"),
        ({"batch_ack": "yes"}, "batch_ack"),
    ],
)
def test_encoder_names_the_bad_argument(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ProtocolError) as caught:
        encode_envelope(**{"value": b"v", **kwargs})
    assert caught.value.fields["field"] == field
