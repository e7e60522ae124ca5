"""The acks a partition leader publishes for appended messages, declared once.

Theory of operation: a publisher sends through plain NATS, so its ack comes back through NATS
too: to the envelope's ack inbox, else to the message's reply subject, when the ack policy is
reached (`leader`: after the leader's write; `all`: after commit; `none`: no ack). Acks are
compact JSON (UTF-8, ASCII in practice) so that any NATS client in any language can read them.
A message that asked for `batch_ack` is acked together with the other such messages of the
same append that share its ack inbox: one NATS message instead of one per record. When an
append fails, the same destinations get an error ack carrying the error's code, message and
data fields; `decode_ack` raises it as the JetstreamError of that code (wire_errors.py), and
`parse_ack` returns it with the stream, partition and correlation id it concerns.

    single  {"stream": s, "partition": p, "offset": n, "subject": subj,
             "correlation_id": c | null, "ack_policy": "leader" | "all",
             "duplicate": true (only when it is: a retried message id or producer sequence,
             stored earlier at `offset` and not stored again)}
    error   {"stream": s, "partition": p, "correlation_id": c | null,
             "error": {"code": "...", "message": "...", ...data fields}}
    batch   {"stream": s, "partition": p, "ack_policy": "leader" | "all",
             "acks": [{"offset": n, "correlation_id": c | null}, ...]}   1..ACK_ENTRIES_MAX
    Unknown keys are ignored.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, NoReturn

from jetstream.errors import JetstreamError, ProtocolError
from jetstream.protocol import names
from jetstream.protocol.envelope import CORRELATION_ID_CHARS_MAX, AckPolicy
from jetstream.protocol.fields import OFFSET_MAX, PARTITION_MAX
from jetstream.protocol.frames import MiB
from jetstream.protocol.wire_errors import error_from_header, error_header
from jetstream.stream.format import Record

_ack_c: ModuleType | None
try:  # AckEncoder.encode_targets's loop in C, when it was built (optional)
    from jetstream.protocol import _ack_c
except ImportError:  # pragma: no cover - a build without a C compiler
    _ack_c = None

#: Whether `AckEncoder.encode_targets` encodes the common acks in C (the Python loop makes
#: the same acks, slower, without it).
ACCELERATED = _ack_c is not None
# The C loop reads a record's subject as its field 3.
assert Record._fields.index("subject") == 3

#: Most acks in one batch ack: a broker splits a larger batch into several.
ACK_ENTRIES_MAX = 1000
#: Largest ack accepted by `decode_ack`; a full batch ack of the longest correlation ids
#: (escaped) stays below it.
ACK_BYTES_MAX = 4 * MiB
_ACKED_POLICIES = frozenset({AckPolicy.LEADER.value, AckPolicy.ALL.value})
_LEADER = AckPolicy.LEADER
_ALL = AckPolicy.ALL

_Fail = Callable[[str, str], NoReturn]
#: (index in records, inbox, correlation id, policy, batch ack) of a message to ack.
AckTarget = tuple[int, str, str | None, AckPolicy, bool]
#: (inbox, ack) messages to publish.
Acks = list[tuple[str, bytes]]


@dataclass(frozen=True, slots=True)
class Ack:
    stream: str
    partition: int
    offset: int
    correlation_id: str | None
    ack_policy: AckPolicy
    #: The subject the message arrived on; None in a batch ack, which does not carry it.
    subject: str | None = None
    #: True when the message was a retry of one stored earlier at `offset`: not stored again.
    duplicate: bool = False


@dataclass(frozen=True, slots=True)
class ErrorAck:
    """An append failed: `error` says why."""

    stream: str
    partition: int
    correlation_id: str | None
    error: JetstreamError


def _dumps(obj: dict[str, Any]) -> bytes:
    # default=str: an error field JSON cannot carry (bytes, say) is sent as its str().
    return json.dumps(obj, separators=(",", ":"), default=str).encode()


def encode_ack(stream: str, partition: int, offset: int, subject: str,
               correlation_id: str | None, ack_policy: AckPolicy | str,
               duplicate: bool = False) -> bytes:
    """The ack of one message. Raises ProtocolError naming a bad argument."""
    _check_target(stream, partition, correlation_id, _raise_bad)
    _check_offset(offset, "offset", _raise_bad)
    if not names.is_subject(subject, wildcards=False):
        _raise_bad("subject", "must be a NATS subject without wildcards")
    ack = {"stream": stream, "partition": partition, "offset": offset, "subject": subject,
           "correlation_id": correlation_id,
           "ack_policy": _check_policy(ack_policy, _raise_bad)}
    if duplicate:
        ack["duplicate"] = True
    return _dumps(ack)


def encode_error_ack(stream: str, partition: int, correlation_id: str | None,
                     error: JetstreamError) -> bytes:
    """The ack of a failed append: the error's code, message and data fields."""
    _check_target(stream, partition, correlation_id, _raise_bad)
    return _dumps({"stream": stream, "partition": partition, "correlation_id": correlation_id,
                   "error": error_header(error)})


def encode_batch_ack(stream: str, partition: int, ack_policy: AckPolicy | str,
                     acks: Sequence[tuple[int, str | None]]) -> bytes:
    """One ack for several messages of one append: (offset, correlation_id) pairs, at most
    ACK_ENTRIES_MAX (split larger batches)."""
    _check_target(stream, partition, None, _raise_bad)
    policy = _check_policy(ack_policy, _raise_bad)
    if not 0 < len(acks) <= ACK_ENTRIES_MAX:
        _raise_bad("acks", f"must hold 1..{ACK_ENTRIES_MAX} entries, got {len(acks)}")
    entries = []
    for offset, correlation_id in acks:
        _check_offset(offset, "offset", _raise_bad)
        _check_correlation_id(correlation_id, _raise_bad)
        entries.append({"offset": offset, "correlation_id": correlation_id})
    return _dumps({"stream": stream, "partition": partition, "ack_policy": policy,
                   "acks": entries})


def parse_ack(data: bytes | bytearray | memoryview) -> list[Ack] | ErrorAck:
    """The acks in `data`, or the error ack it is. Raises ProtocolError when `data` is not an
    ack."""
    if len(data) > ACK_BYTES_MAX:
        _raise_malformed("ack", f"is larger than {ACK_BYTES_MAX} bytes")
    try:
        obj = json.loads(bytes(data).decode("utf-8"), parse_constant=_reject_constant)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError, JSONDecodeError
        raise ProtocolError(f"ack is not JSON: {e}", field="ack") from None
    if not isinstance(obj, dict):
        _raise_malformed("ack", "must be a JSON object")
    stream, partition = _check_target(obj.get("stream"), obj.get("partition"), None,
                                      _raise_malformed)
    if "error" in obj:
        correlation_id = _check_correlation_id(obj.get("correlation_id"), _raise_malformed)
        if not isinstance(obj["error"], dict):
            _raise_malformed("error", "must be a JSON object")
        return ErrorAck(stream, partition, correlation_id, error_from_header(obj["error"]))
    policy = _check_policy(obj.get("ack_policy"), _raise_malformed)
    if "acks" in obj:
        entries = obj["acks"]
        if not isinstance(entries, list) or not 0 < len(entries) <= ACK_ENTRIES_MAX:
            _raise_malformed("acks", f"must be a list of 1..{ACK_ENTRIES_MAX} entries")
        acks = []
        for entry in entries:
            if not isinstance(entry, dict):
                _raise_malformed("acks", "entries must be JSON objects")
            acks.append(_single(stream, partition, policy, entry, None))
        return acks
    subject = obj.get("subject")
    if not names.is_subject(subject, wildcards=False):
        _raise_malformed("subject", "must be a NATS subject without wildcards")
    return [_single(stream, partition, policy, obj, subject)]


def decode_ack(data: bytes | bytearray | memoryview) -> list[Ack]:
    """The acks in `data`. An error ack raises the error it carries (a JetstreamError); use
    `parse_ack` to learn which correlation id it concerns. Raises ProtocolError when `data`
    is not an ack."""
    result = parse_ack(data)
    if isinstance(result, ErrorAck):
        raise result.error
    return result


def _single(stream: str, partition: int, policy: AckPolicy, obj: dict[str, Any],
            subject: str | None) -> Ack:
    offset = _check_offset(obj.get("offset"), "offset", _raise_malformed)
    correlation_id = _check_correlation_id(obj.get("correlation_id"), _raise_malformed)
    return Ack(stream, partition, offset, correlation_id, policy, subject,
               obj.get("duplicate") is True)


# -- checks ------------------------------------------------------------------------------------
# Encoders and the decoder share the checks; they differ in the words of the error.


def _raise_bad(name: str, why: str) -> NoReturn:
    raise ProtocolError(f"{name} {why}", field=name)


def _raise_malformed(name: str, why: str) -> NoReturn:
    raise ProtocolError(f"malformed ack: {name} {why}", field=name)


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not a JSON number")


def _check_target(stream: object, partition: object, correlation_id: object,
                  fail: _Fail) -> tuple[str, int]:
    if not names.is_stream_name(stream):
        fail("stream", "must be a stream name")
    _check_correlation_id(correlation_id, fail)
    return stream, _check_int(partition, "partition", PARTITION_MAX, fail)


def _check_offset(offset: object, name: str, fail: _Fail) -> int:
    return _check_int(offset, name, OFFSET_MAX, fail)


def _check_int(value: object, name: str, high: int, fail: _Fail) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= high:
        fail(name, f"must be an integer in [0, {high}], got {value!r}")
    return value


def _check_correlation_id(correlation_id: object, fail: _Fail) -> str | None:
    if correlation_id is None:
        return None
    if not isinstance(correlation_id, str) or len(correlation_id) > CORRELATION_ID_CHARS_MAX:
        fail("correlation_id", f"must be null or a string of at most "
                               f"{CORRELATION_ID_CHARS_MAX} characters")
    return correlation_id


def _check_policy(policy: object, fail: _Fail) -> AckPolicy:
    if not isinstance(policy, str) or policy not in _ACKED_POLICIES:
        fail("ack_policy", f"must be one of {sorted(_ACKED_POLICIES)}, got {policy!r}")
    return AckPolicy(policy)


class AckEncoder:
    """Single acks of one partition at ingest speed: the same bytes as `encode_ack`, with the
    fixed parts built once and each (subject, policy)'s tail cached, and no argument checks
    (the broker passes offsets it assigned and subjects NATS delivered)."""

    SUBJECTS_CACHED_MAX = 4096

    def __init__(self, stream: str, partition: int, *, accelerated: bool = True) -> None:
        """`accelerated`: `encode_targets` in C when it was built (`ACCELERATED`); False: in
        Python."""
        _check_target(stream, partition, None, _raise_bad)
        self.stream = stream
        self.partition = partition
        self._prefix = (f'{{"stream":{json.dumps(stream)},"partition":{partition},'
                        '"offset":').encode()
        #: (subject, policy) -> the ack after its offset, correlation id null.
        self._tails: dict[tuple[str, AckPolicy], bytes] = {}
        #: The C loop in use, or None: the Python loop alone.
        self._accelerated = _ack_c if accelerated else None

    def encode_targets(self, base: int, targets: list[AckTarget], records: Sequence[Record],
                       leader: Acks, all_: Acks, all_targets: list[tuple[str, str | None]],
                       grouped: dict[tuple[str, AckPolicy], list[tuple[int, str | None]]]
                       ) -> None:
        """The acks of `targets`, in order, for `records` appended at `base`: single acks to
        `leader` or `all_` by policy, batch acks' (offset, correlation id) to `grouped` by
        (inbox, policy), and the (inbox, correlation id) of each `all` target to
        `all_targets`."""
        accelerated = self._accelerated
        if accelerated is None or type(targets) is not list:
            self._encode_targets(base, targets, records, leader, all_, all_targets, grouped)
            return
        # C encodes the common acks and declines the rest: Python then encodes the target C
        # declined (caching its tail) and those after it that C would decline as surely (a
        # batch ack, a correlation id), before C goes on.
        at, count = 0, len(targets)
        while True:
            at, end = accelerated.encode_targets(targets, at, base, records, Record,
                                                 self._prefix, self._tails, _LEADER, leader,
                                                 _ALL, all_, all_targets)
            if at >= count:
                return
            self._encode_targets(base, targets[at:end], records, leader, all_, all_targets,
                                 grouped)
            at = end

    def _encode_targets(self, base: int, targets: list[AckTarget], records: Sequence[Record],
                        leader: Acks, all_: Acks, all_targets: list[tuple[str, str | None]],
                        grouped: dict[tuple[str, AckPolicy], list[tuple[int, str | None]]]
                        ) -> None:
        """`encode_targets` in Python: the reference the C loop makes the same acks as."""
        for i, inbox, corr, policy, batch_ack in targets:
            if policy is _ALL:
                all_targets.append((inbox, corr))
            if batch_ack:
                grouped.setdefault((inbox, policy), []).append((base + i, corr))
            else:
                (leader if policy is _LEADER else all_).append(
                    (inbox, self.encode(base + i, records[i].subject, corr, policy)))

    def encode(self, offset: int, subject: str, correlation_id: str | None,
               ack_policy: AckPolicy) -> bytes:
        if correlation_id is None:
            tail = self._tails.get((subject, ack_policy))
            if tail is None:
                if len(self._tails) >= self.SUBJECTS_CACHED_MAX:
                    self._tails.clear()
                tail = self._tails[subject, ack_policy] = self._tail(subject, None, ack_policy)
        else:
            tail = self._tail(subject, correlation_id, ack_policy)
        return b"%s%d%s" % (self._prefix, offset, tail)

    @staticmethod
    def _tail(subject: str, correlation_id: str | None, ack_policy: AckPolicy) -> bytes:
        cid = "null" if correlation_id is None else json.dumps(correlation_id)
        return (f',"subject":{json.dumps(subject)},"correlation_id":{cid},'
                f'"ack_policy":"{ack_policy.value}"}}').encode()
