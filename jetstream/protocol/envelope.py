"""The envelope a publisher may wrap a NATS message payload in, declared once.

Theory of operation: publishers use plain NATS, and a plain payload is stored as is (value =
payload, the NATS headers kept). A publisher that wants more — a key for partitioning and
compaction, record headers, acks sent to an inbox of its choice with a correlation id, an ack
policy other than the stream's default, or one ack for many messages — wraps the value in an
envelope. The broker tells the two apart by the magic cookie, and by nothing else being wrong:
`decode_envelope` returns None for any payload that is not a valid envelope (no magic, another
version, bad msgpack, a wrong type, a value out of range), and the broker then stores the
payload as a plain message. So it never raises on arbitrary bytes; a publisher that builds its
envelopes with `encode_envelope` gets its mistakes reported on its side instead.

    Envelope:
      magic     4 bytes  b"JSEV"
      version   u8       1
      body      msgpack map, the rest of the payload:
        "value"           bin                  required
        "key"             bin | nil            partition key, compaction key
        "headers"         map str -> bin       record headers: at most 256, names of
                                               1..256 characters
        "ack_inbox"       str | nil            subject to send the ack to (no wildcards,
                                               <= 255 characters); else the reply subject
        "correlation_id"  str | nil            echoed in the ack, <= 256 characters
        "ack_policy"      "leader" | "all" | "none" | nil   nil: the stream's default
        "batch_ack"       bool                 one ack for the envelopes of an append that
                                               share this ack inbox (default false)
        "msg_id"          str | nil            deduplicated within the stream's
                                               duplicate_window_ms (1..256 characters)
        "producer"        [id, epoch, seq] | [id, epoch, seq, resume] | nil   an idempotent
                                               producer's stamp: id of 1..64 of
                                               A-Z a-z 0-9 . _ -, epoch u31, seq u63; resume
                                               (bool, default false): every earlier seq of
                                               the epoch was acked to the sender
        "expected_offset" int | nil            the record must land at this offset
        "expected_last_offset_for_key"  int | nil   the key's latest record must be at
                                               this offset; -1: the key has no record
        "check_registers" str | nil            a label selector the partition's registers
                                               must match
        "union_registers", "subtract_registers"   map str -> str | nil   register labels
                                               set / removed (when equal) with the record
      Absent and nil mean the same; unknown keys are ignored. The encoder omits defaults.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import msgpack

from jetstream.errors import ProtocolError
from jetstream.idempotence import headers as idem
from jetstream.protocol import names

MAGIC = b"JSEV"
VERSION = 1
PREFIX = struct.Struct(">4sB")
assert PREFIX.size == len(MAGIC) + 1
#: The first bytes of every envelope: magic and version.
PREFIX_BYTES = PREFIX.pack(MAGIC, VERSION)
_PREFIX_BYTES = PREFIX_BYTES

CORRELATION_ID_CHARS_MAX = 256
#: The envelope fields that carry expectations (all optional).
EXPECTATION_FIELDS = ("msg_id", "producer", "expected_offset", "expected_last_offset_for_key",
                      "check_registers", "union_registers", "subtract_registers")
HEADERS_MAX = 256
HEADER_NAME_CHARS_MAX = 256


class AckPolicy(enum.StrEnum):
    """When the broker acks: after the leader's own write, after commit (every in-sync
    replica has the message), or never."""

    LEADER = "leader"
    ALL = "all"
    NONE = "none"


#: Each ack policy by its wire name.
_POLICIES = {p.value: p for p in AckPolicy}


@dataclass(frozen=True, slots=True)
class Envelope:
    """`value` None (msgpack nil) is a null value: with a key, a tombstone that deletes the
    key from a compacted stream."""

    value: bytes | None
    key: bytes | None = None
    headers: Mapping[str, bytes] = field(default_factory=dict)
    ack_inbox: str | None = None
    correlation_id: str | None = None
    ack_policy: AckPolicy | None = None
    batch_ack: bool = False
    msg_id: str | None = None
    #: (producer id, epoch, sequence[, resume]) of an idempotent producer.
    producer: tuple[str, int, int] | tuple[str, int, int, bool] | None = None
    expected_offset: int | None = None
    expected_last_offset_for_key: int | None = None
    check_registers: str | None = None
    union_registers: Mapping[str, str] | None = None
    subtract_registers: Mapping[str, str] | None = None

    @property
    def has_expectations(self) -> bool:
        return (self.msg_id is not None or self.producer is not None
                or self.expected_offset is not None
                or self.expected_last_offset_for_key is not None
                or self.check_registers is not None or bool(self.union_registers)
                or bool(self.subtract_registers))

    def __post_init__(self) -> None:
        # Raises ProtocolError naming the field; decode_envelope turns that into None.
        if self.value is not None and not isinstance(self.value, bytes):
            raise _bad("value", "must be bytes or None (a tombstone)")
        if self.key is not None and not isinstance(self.key, bytes):
            raise _bad("key", "must be bytes or None")
        headers = self.headers
        if not isinstance(headers, Mapping) or len(headers) > HEADERS_MAX:
            raise _bad("headers", f"must be a map of at most {HEADERS_MAX} names to bytes")
        for name, value in headers.items():
            if not isinstance(name, str) or not 0 < len(name) <= HEADER_NAME_CHARS_MAX:
                raise _bad("headers", f"names must be 1..{HEADER_NAME_CHARS_MAX} characters")
            if not isinstance(value, bytes):
                raise _bad("headers", f"value of {name!r} must be bytes")
        object.__setattr__(self, "headers", dict(headers))
        if self.ack_inbox is not None and not names.is_subject(self.ack_inbox, wildcards=False):
            raise _bad("ack_inbox", "must be a NATS subject without wildcards")
        if self.correlation_id is not None and (
                not isinstance(self.correlation_id, str)
                or len(self.correlation_id) > CORRELATION_ID_CHARS_MAX):
            raise _bad("correlation_id", f"must be a string of at most "
                                         f"{CORRELATION_ID_CHARS_MAX} characters")
        object.__setattr__(self, "ack_policy", _ack_policy(self.ack_policy))
        if not isinstance(self.batch_ack, bool):
            raise _bad("batch_ack", "must be a bool")
        self._check_expectations()

    def _check_expectations(self) -> None:
        if self.msg_id is not None:
            idem.check_msg_id(self.msg_id)
        if self.producer is not None:
            idem.check_stamp(self.producer)
            object.__setattr__(self, "producer", tuple(self.producer))
        for name, low in (("expected_offset", 0), ("expected_last_offset_for_key", -1)):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or not low <= value < 2**63):
                raise _bad(name, f"must be an integer of at least {low}")
        if self.check_registers is not None and not isinstance(self.check_registers, str):
            raise _bad("check_registers", "must be a label selector")
        for name in ("union_registers", "subtract_registers"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, idem.check_registers(value, name))


def _bad(name: str, why: str) -> ProtocolError:
    return ProtocolError(f"envelope {name} {why}", field=name)


def _ack_policy(value: object) -> AckPolicy | None:
    if value is None or isinstance(value, AckPolicy):
        return value
    if isinstance(value, str) and value in _POLICIES:
        return _POLICIES[value]
    raise _bad("ack_policy", f"must be one of {sorted(_POLICIES)}, got {value!r}")


def encode_envelope(
    value: bytes | None,
    key: bytes | None = None,
    headers: Mapping[str, bytes] | None = None,
    ack_inbox: str | None = None,
    correlation_id: str | None = None,
    ack_policy: AckPolicy | str | None = None,
    batch_ack: bool = False,
    **expectations: Any,
) -> bytes:
    """A NATS payload holding `value` in an envelope; `expectations` are the envelope's
    expectation fields (msg_id, producer, expected_offset, ...). Raises ProtocolError naming a
    bad argument."""
    unknown = sorted(set(expectations) - set(EXPECTATION_FIELDS))
    if unknown:
        raise ProtocolError(f"unknown envelope field {unknown[0]!r}", field=unknown[0])
    envelope = Envelope(value, key, headers if headers is not None else {}, ack_inbox,
                        correlation_id, _ack_policy(ack_policy), batch_ack, **expectations)
    body: dict[str, Any] = {"value": envelope.value}
    if envelope.key is not None:
        body["key"] = envelope.key
    if envelope.headers:
        body["headers"] = envelope.headers
    if envelope.ack_inbox is not None:
        body["ack_inbox"] = envelope.ack_inbox
    if envelope.correlation_id is not None:
        body["correlation_id"] = envelope.correlation_id
    if envelope.ack_policy is not None:
        body["ack_policy"] = envelope.ack_policy.value
    if envelope.batch_ack:
        body["batch_ack"] = True
    for name in EXPECTATION_FIELDS:
        if (field_value := getattr(envelope, name)) is not None:
            body[name] = list(field_value) if name == "producer" else field_value
    packed: bytes = msgpack.packb(body, use_bin_type=True)
    return _PREFIX_BYTES + packed


def is_envelope(payload: bytes | bytearray | memoryview) -> bool:
    """True when the payload starts with the magic and version (it may still not decode)."""
    return bytes(payload[:PREFIX.size]) == _PREFIX_BYTES


def _reject_ext(code: int, data: bytes) -> Any:
    raise ValueError("extension types are not allowed")


def _unpacked(payload: bytes | bytearray | memoryview) -> Any:
    """The msgpack body after the prefix (raises on anything malformed)."""
    with memoryview(payload) as view, view[PREFIX.size:] as body_bytes:
        return msgpack.unpackb(body_bytes, raw=False, strict_map_key=True, max_ext_len=0,
                               ext_hook=_reject_ext)


def _from_body(body: Any) -> Envelope | None:
    """The envelope of an unpacked body, None when it is not one; raises ProtocolError for a
    bad field."""
    if not isinstance(body, dict) or "value" not in body:
        return None
    batch_ack = body.get("batch_ack")
    return Envelope(
        value=body["value"],
        key=body.get("key"),
        headers=_or(body.get("headers"), {}),
        ack_inbox=body.get("ack_inbox"),
        correlation_id=body.get("correlation_id"),
        ack_policy=body.get("ack_policy"),
        batch_ack=False if batch_ack is None else batch_ack,
        **{name: body[name] for name in EXPECTATION_FIELDS if name in body},
    )


def decode_envelope(payload: bytes | bytearray | memoryview) -> Envelope | None:
    """The envelope in `payload`, or None when it is a plain message. Never raises."""
    try:
        return _from_body(_unpacked(payload)) if is_envelope(payload) else None
    except Exception:  # whatever is wrong, the payload is a plain message
        return None


class Published(NamedTuple):
    """An envelope of the usual publish, with no headers and no expectations: its value and
    key, and where and how to ack. (A named tuple: ingest decodes one per message.)"""

    value: bytes | None
    key: bytes | None = None
    ack_inbox: str | None = None
    correlation_id: str | None = None
    ack_policy: AckPolicy | None = None
    batch_ack: bool = False


_PUBLISHED_FIELDS = frozenset(("value", "key", "ack_inbox", "correlation_id", "ack_policy",
                               "batch_ack"))


def decode_published(payload: bytes | bytearray | memoryview) -> Published | Envelope | None:
    """`decode_envelope` for ingest, of a payload that starts with the envelope prefix,
    unpacked once: an envelope of the usual fields (`Published`: a keyed put or tombstone,
    the hot path of compacted streams; the client's publish) comes back without building an
    Envelope, after the same checks of those fields. Never raises."""
    try:
        body = _unpacked(payload)
        if type(body) is dict and "value" in body and body.keys() <= _PUBLISHED_FIELDS:
            published = _published(body)
            if published is not None:
                return published
        return _from_body(body)
    except Exception:  # whatever is wrong, the payload is a plain message
        return None


def _published(body: dict[str, Any]) -> Published | None:
    """The envelope of `body` (only _PUBLISHED_FIELDS, "value" among them) when each field
    passes the Envelope's check; None sends it to the Envelope, which names what is wrong."""
    value, key = body["value"], body.get("key")
    inbox, corr = body.get("ack_inbox"), body.get("correlation_id")
    policy, batch_ack = body.get("ack_policy"), body.get("batch_ack")
    if (value is None or type(value) is bytes) and (key is None or type(key) is bytes) and (
            inbox is None or (type(inbox) is str and names.is_subject(inbox, wildcards=False))
    ) and (corr is None or (type(corr) is str and len(corr) <= CORRELATION_ID_CHARS_MAX)) and (
            policy is None or (type(policy) is str and policy in _POLICIES)) and (
            batch_ack is None or type(batch_ack) is bool):
        return Published(value, key, inbox, corr, None if policy is None else _POLICIES[policy],
                         bool(batch_ack))
    return None


def _or(value: Any, default: Any) -> Any:
    return default if value is None else value
