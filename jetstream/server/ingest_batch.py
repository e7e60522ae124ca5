"""One ingest batch of a partition leader: NATS messages in, records, ack targets and
refusals out, with the partition guard's verdicts applied (no IO).

Theory of operation: `take_messages` is the hot loop of ingest. Each message becomes one
record: an envelope is unpacked; anything else is stored as it came (payload as value, NATS
headers as headers, subject kept). A message that asks for something (a message id, an
expected offset, registers: an envelope's fields or a plain message's NATS headers,
jetstream.server.guarded) carries its `Expectations` beside its record. `apply_verdicts` then
keeps the records the guard admitted (adding the headers that put its decisions in the log),
answers duplicates with their original offsets, and turns refusals into error acks; ack
targets are renumbered to the records that remain. Messages without expectations cost one
test of their headers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import cast

from jetstream.errors import JetstreamError, RecordTooLarge
from jetstream.idempotence.guard import Admitted, Duplicate, Expectations, Pass
from jetstream.idempotence.headers import MSG_ID, MSG_ID_CHARS_MAX
from jetstream.protocol import ack as ack_codec
from jetstream.protocol.ack import AckEncoder, Acks, AckTarget
from jetstream.protocol.envelope import PREFIX_BYTES as ENVELOPE_PREFIX
from jetstream.protocol.envelope import AckPolicy, Envelope, Published, decode_published
from jetstream.raft_meta.model import StreamConfig
from jetstream.server.guarded import from_envelope, from_nats_headers
from jetstream.server.nats_wire import NatsMsg
from jetstream.stream.format import NO_HEADERS, Record

_ingest_c: ModuleType | None
try:  # built by setup.py where a C compiler is; the Python loop is the reference
    from jetstream.server import _ingest_c
except ImportError:  # pragma: no cover - no C compiler at install
    _ingest_c = None

#: Whether plain messages are taken by the C loop (jetstream/server/_ingest_c.c).
ACCELERATED = _ingest_c is not None

_NO_ACK = AckPolicy.NONE
_ALL = AckPolicy.ALL
_POLICIES = (AckPolicy.LEADER, AckPolicy.ALL, AckPolicy.NONE)  # as _ingest_c reads them

#: (inbox, correlation id, error) of a message answered with an error.
Refusal = tuple[str, str | None, JetstreamError]


@dataclass(slots=True)
class IngestBatch:
    records: list[Record]
    targets: list[AckTarget]
    errors: list[Refusal]
    #: The expectations of each record (None: none; a str: a message id alone), or None
    #: when no message had any.
    expects: list[Expectations | str | None] | None = None
    #: (inbox, correlation id, policy, original offset, subject) of retries not stored.
    duplicates: list[tuple[str, str | None, AckPolicy, int, str]] = field(
        default_factory=list)


def take_messages(msgs: list[NatsMsg], stream: StreamConfig, refuse_all: bool,
                  not_enough_replicas: Callable[[], JetstreamError]) -> IngestBatch:
    """The records of `msgs` and whom to ack; messages refused outright go to `errors`."""
    batch = IngestBatch([], [], [])
    policy = stream.ack_policy
    if _ingest_c is None or refuse_all:
        _take_python(batch, msgs, stream, refuse_all, not_enough_replicas)
        return batch
    # C takes plain messages and envelopes of the usual fields; each message it declines goes
    # through the Python loop alone.
    take_plain, i, count = _ingest_c.take_plain, 0, len(msgs)
    max_bytes = stream.max_message_bytes
    while True:
        i = take_plain(msgs, i, max_bytes, policy, Record, NO_HEADERS, MSG_ID,
                       MSG_ID_CHARS_MAX, ENVELOPE_PREFIX, batch.records, batch.targets,
                       batch.expects, _POLICIES)
        if i >= count:
            return batch
        _take_python(batch, msgs[i:i + 1], stream, refuse_all, not_enough_replicas)
        i += 1


def _take_python(batch: IngestBatch, msgs: list[NatsMsg], stream: StreamConfig,
                 refuse_all: bool, not_enough_replicas: Callable[[], JetstreamError]) -> None:
    """`take_messages`'s loop in Python, adding to `batch`."""
    records, targets, errors, expects = batch.records, batch.targets, batch.errors, batch.expects
    default_policy = stream.ack_policy
    max_bytes = stream.max_message_bytes
    # The hot loop of ingest: plain tuples, locals, no calls a message can do without.
    new_record = tuple.__new__
    value: bytes | None  # None: a tombstone (an envelope's nil value)
    for subject, reply, nats_headers, data in msgs:
        decoded = decode_published(data) if data.startswith(ENVELOPE_PREFIX) else None
        envelope = decoded if isinstance(decoded, Envelope) else None
        expect: Expectations | str | None = None
        if type(decoded) is Published:  # the usual fields only: no headers, no expectations
            value, key, inbox, corr, policy, batch_ack = decoded
            inbox = inbox or reply
            policy = policy or default_policy
            headers, asks = NO_HEADERS, False
        elif envelope is None:
            value, key, corr, inbox = data, None, None, reply
            policy, batch_ack = default_policy, False
            if not nats_headers:
                headers, asks = NO_HEADERS, False
            elif len(nats_headers) == 1 and (msg_id := nats_headers.get(MSG_ID)) is not None:
                # A NATS publisher's Nats-Msg-Id alone (what from_nats_headers would find).
                headers = {MSG_ID: msg_id.encode()}
                asks = not 0 < len(msg_id) <= MSG_ID_CHARS_MAX  # refused below, field named
                if not asks:
                    expect = msg_id
            else:
                headers, asks = _nats_headers(nats_headers), True
        else:
            value, key, corr = envelope.value, envelope.key, envelope.correlation_id
            inbox = envelope.ack_inbox or reply
            headers = envelope.headers
            policy = envelope.ack_policy or default_policy
            batch_ack = envelope.batch_ack
            asks = envelope.has_expectations or bool(headers)
        if asks:
            try:
                expect = (from_envelope(envelope) if envelope is not None
                          else from_nats_headers(nats_headers or {}))
            except JetstreamError as exc:  # a malformed expectation: refused, never ignored
                if inbox:
                    errors.append((inbox, corr, exc))
                continue
        if value is not None and len(value) > max_bytes:
            if inbox:
                errors.append((inbox, corr, RecordTooLarge(len(value), max_bytes)))
            continue
        if refuse_all and policy is _ALL:
            if inbox:
                errors.append((inbox, corr, not_enough_replicas()))
            continue
        if expect is not None and expects is None:
            expects = [None] * len(records)
        if expects is not None:
            expects.append(expect)
        if inbox and policy is not _NO_ACK:
            targets.append((len(records), inbox, corr, policy, batch_ack))
        records.append(new_record(Record, (value, key, headers, subject, None)))
    batch.expects = expects


def asks_key_offsets(batch: IngestBatch) -> bool:
    """Whether a publish of the batch expects a key's last offset."""
    return batch.expects is not None and any(
        isinstance(e, Expectations) and e.expected_key_offset is not None
        for e in batch.expects)


def apply_verdicts(batch: IngestBatch, guard_pass: Pass) -> None:
    """Judge the batch's records in order and keep those admitted (see the module doc)."""
    expects = batch.expects
    if expects is None:
        guard_pass.plain([r.key for r in batch.records])
        return
    if all(e is None or type(e) is str for e in expects):
        _apply_ids(batch, expects, guard_pass)
        return
    _apply_each(batch, expects, guard_pass)


def _apply_each(batch: IngestBatch, expects: list[Expectations | str | None],
                guard_pass: Pass) -> None:
    """`apply_verdicts` of any batch, record by record."""
    by_index = {t[0]: t for t in batch.targets}
    records: list[Record] = []
    targets: list[AckTarget] = []
    for i, (record, expect) in enumerate(zip(batch.records, expects, strict=True)):
        target = by_index.get(i)
        if expect is None:
            guard_pass.plain([record.key])
        elif isinstance(expect, str):  # a plain message's Nats-Msg-Id: in its headers already
            original = guard_pass.admit_id(expect, record.key)
            if original >= 0:
                if target is not None:
                    batch.duplicates.append((target[1], target[2], target[3], original,
                                             record.subject))
                continue
        else:
            verdict = guard_pass.admit(expect, [record.key])
            if isinstance(verdict, Duplicate):
                if target is not None:
                    batch.duplicates.append((target[1], target[2], target[3], verdict.offset,
                                             record.subject))
                continue
            if not isinstance(verdict, Admitted):
                if target is not None:
                    batch.errors.append((target[1], target[2], verdict.error))
                continue
            added = verdict.first_headers
            if added and any(record.headers.get(k) != v for k, v in added.items()):
                record = record._replace(headers={**record.headers, **added})
        if target is not None:
            targets.append((len(records), *target[1:]))
        records.append(record)
    batch.records, batch.targets = records, targets


def _apply_ids(batch: IngestBatch, expects: list[Expectations | str | None],
               guard_pass: Pass) -> None:
    """`apply_verdicts` of a batch whose only expectations are message ids (NATS publishers
    setting Nats-Msg-Id): the same verdicts, and the batch is rebuilt only around
    duplicates."""
    records = batch.records
    ids = cast("list[str | None]", expects)  # apply_verdicts saw ids alone
    # record index -> the offset its id was stored at
    originals = guard_pass.admit_ids(ids, [r.key for r in records])
    if not originals:
        return
    moved: dict[int, int] = {}  # index before -> index after
    kept: list[Record] = []
    for i, record in enumerate(records):
        if i not in originals:
            moved[i] = len(kept)
            kept.append(record)
    targets: list[AckTarget] = []
    for target in batch.targets:
        i = target[0]
        if i in originals:
            batch.duplicates.append((target[1], target[2], target[3], originals[i],
                                     records[i].subject))
        else:
            targets.append((moved[i], *target[1:]))
    batch.records, batch.targets = kept, targets


def _nats_headers(headers: dict[str, str] | None) -> dict[str, bytes]:
    if not headers:
        return {}
    return {k: v.encode() for k, v in headers.items()}


def encode_acks(encoder: AckEncoder, base: int,
                batch: IngestBatch) -> tuple[Acks, Acks, list[tuple[str, str | None]]]:
    """The ack messages of a batch appended at `base`, by the stage that releases them
    (`leader`, `all`), and the (inbox, correlation id) of the `all` acks. Retries not stored
    are answered with their original offsets once this batch is."""
    out: dict[AckPolicy, Acks] = {AckPolicy.LEADER: [], AckPolicy.ALL: []}
    stream, partition = encoder.stream, encoder.partition
    for inbox, corr, policy, offset, subject in batch.duplicates:
        out[policy].append((inbox, ack_codec.encode_ack(stream, partition, offset, subject,
                                                        corr, policy, duplicate=True)))
    grouped: dict[tuple[str, AckPolicy], list[tuple[int, str | None]]] = {}
    all_targets: list[tuple[str, str | None]] = []
    encoder.encode_targets(base, batch.targets, batch.records, out[AckPolicy.LEADER],
                           out[AckPolicy.ALL], all_targets, grouped)
    step = ack_codec.ACK_ENTRIES_MAX
    for (inbox, policy), entries in grouped.items():
        for j in range(0, len(entries), step):
            out[policy].append((inbox, ack_codec.encode_batch_ack(
                stream, partition, policy, entries[j:j + step])))
    all_targets.extend((d[0], d[1]) for d in batch.duplicates if d[2] is _ALL)
    return out[AckPolicy.LEADER], out[AckPolicy.ALL], all_targets
