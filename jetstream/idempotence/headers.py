"""The record headers that carry a partition's dedupe and register state in its log, declared
once.

Theory of operation: whatever the leader decides about ids, producers and registers travels
inside the records themselves, so it is replicated, fsynced, truncated and recovered exactly
like the data, and a new leader (or a restarted one) rebuilds the same state by reading its
log tail (jetstream.idempotence.replay). Logs written before these headers existed simply
have none: their records are plain appends.

    Nats-Msg-Id           the publisher's message id, UTF-8, 1..MSG_ID_CHARS_MAX characters
                          (first record of a publish; NATS JetStream's header, kept as is)
    Jetstream-Producer    b"<epoch>:<sequence>:<producer id>" ASCII (first record of a publish)
    Jetstream-Registers   the partition's registers after the publish, a JSON object of
                          label -> value sorted by label (last record of a publish that
                          changed them)
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

from jetstream.errors import ProtocolError
from jetstream.protocol.names import LABELS_MAX, check_labels

MSG_ID = "Nats-Msg-Id"
PRODUCER = "Jetstream-Producer"
REGISTERS = "Jetstream-Registers"
#: Every header this package writes; a publisher cannot set them itself.
RESERVED = frozenset({PRODUCER, REGISTERS})

MSG_ID_CHARS_MAX = 256
PRODUCER_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
EPOCH_MAX = 2**31 - 1
SEQUENCE_MAX = 2**63 - 1


def check_msg_id(value: object, field: str = "msg_id") -> str:
    if not isinstance(value, str) or not 0 < len(value) <= MSG_ID_CHARS_MAX:
        raise ProtocolError(f"{field} must be a string of 1..{MSG_ID_CHARS_MAX} characters",
                            field=field)
    return value


def check_producer(producer_id: object, epoch: object, sequence: object,
                   resume: object = False) -> None:
    if not isinstance(producer_id, str) or PRODUCER_ID.fullmatch(producer_id) is None:
        raise ProtocolError("producer_id must be 1..64 characters of A-Z a-z 0-9 . _ -",
                            field="producer_id")
    for name, value, high in (("producer_epoch", epoch, EPOCH_MAX),
                              ("producer_sequence", sequence, SEQUENCE_MAX)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= high:
            raise ProtocolError(f"{name} must be an integer in [0, {high}]", field=name)
    if not isinstance(resume, bool):
        raise ProtocolError("producer_resume must be true or false", field="producer_resume")


def check_stamp(stamp: object) -> None:
    """An idempotent producer's stamp, as given: [producer id, epoch, sequence] or
    [producer id, epoch, sequence, resume] (a list or a tuple), each part checked."""
    if not isinstance(stamp, list | tuple) or len(stamp) not in (3, 4):
        raise ProtocolError("producer must be [producer id, epoch, sequence] or "
                            "[producer id, epoch, sequence, resume]", field="producer")
    check_producer(*stamp)


def check_registers(value: object, field: str) -> dict[str, str]:
    """Register labels from a request (the same rules as stream labels)."""
    try:
        return check_labels(value, field)
    except Exception as exc:
        raise ProtocolError(str(exc), field=field) from exc


def msg_id(headers: Mapping[str, bytes]) -> str | None:
    value = headers.get(MSG_ID)
    if value is None:
        return None
    try:
        return value.decode()
    except UnicodeDecodeError:
        return None


def encode_producer(producer_id: str, epoch: int, sequence: int) -> bytes:
    return f"{epoch}:{sequence}:{producer_id}".encode()


def producer(headers: Mapping[str, bytes]) -> tuple[str, int, int] | None:
    """(producer id, epoch, sequence) of a record, or None (absent or not ours)."""
    value = headers.get(PRODUCER)
    if value is None:
        return None
    try:
        epoch, sequence, producer_id = value.decode().split(":", 2)
        return producer_id, int(epoch), int(sequence)
    except (UnicodeDecodeError, ValueError):
        return None


def encode_registers(registers: Mapping[str, str]) -> bytes:
    assert len(registers) <= LABELS_MAX
    return json.dumps(dict(sorted(registers.items())), separators=(",", ":")).encode()


def registers(headers: Mapping[str, bytes]) -> dict[str, str] | None:
    value = headers.get(REGISTERS)
    if value is None:
        return None
    try:
        decoded = json.loads(value)
    except ValueError:
        return None
    if not isinstance(decoded, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in decoded.items()):
        return None
    return decoded
