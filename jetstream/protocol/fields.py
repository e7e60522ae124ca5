"""The limits of socket-API message fields and the checks every message runs on them.

Theory of operation: a message checks each field when it is built (`__post_init__`), whether
it was decoded from a peer's header or made locally, so what is sent is valid and what is
received is checked once, at the edge. A field is checked for its type first (a bool is not
an int, though Python says it is) and then for its range; a failure raises ProtocolError
(BAD_REQUEST) naming the field, so a peer's error says exactly what it got wrong. The limits
here are the wire's: each message module uses them, and the server and client size their own
values to them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jetstream.errors import ProtocolError
from jetstream.protocol import names
from jetstream.protocol.frames import I32_MAX, U32_MAX, MiB

OFFSET_MAX = 2**63 - 1
PARTITION_MAX = I32_MAX
BROKER_ID_MAX = I32_MAX
#: Leader epochs are stored as u32 in record batches.
EPOCH_MAX = U32_MAX
FETCH_BYTES_MAX = 64 * MiB
FETCH_WAIT_MS_MAX = 60_000
#: Longest metadata string stored with a committed offset (Kafka's default too).
OFFSET_METADATA_CHARS_MAX = 4096
HOST_CHARS_MAX = 255
PORT_MAX = 65535
#: Most streams named in one MetadataRequest.
METADATA_STREAMS_MAX = 10_000
ERROR_CODE_CHARS_MAX = 64


def bad(name: str, why: str) -> ProtocolError:
    """The error of field `name`, to raise: "<name> <why>"."""
    return ProtocolError(f"{name} {why}", field=name)


def check_int(name: str, value: object, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad(name, f"must be an integer, got {type(value).__name__}")
    if not low <= value <= high:
        raise bad(name, f"must be in [{low}, {high}], got {value}")


def check_bool(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise bad(name, f"must be a boolean, got {type(value).__name__}")


def check_str(name: str, value: object, chars_max: int) -> None:
    if not isinstance(value, str):
        raise bad(name, f"must be a string, got {type(value).__name__}")
    if len(value) > chars_max:
        raise bad(name, f"must have at most {chars_max} characters")


def check_stream(value: object, name: str = "stream") -> None:
    if not names.is_stream_name(value):
        raise bad(name, f"must be a stream name ([A-Za-z0-9_-]{{1,64}}), got {value!r}")


def check_group(value: object) -> None:
    if not names.is_group_name(value):
        raise bad("group", f"must be a group name ([A-Za-z0-9_-]{{1,64}}), got {value!r}")


def as_map(name: str, value: object) -> dict[str, Any]:
    """`value`, checked to be a map with string keys."""
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise bad(name, "must be a map with string keys")
    return value


def as_list(name: str, value: object) -> list[Any]:
    """`value`, checked to be a list."""
    if not isinstance(value, list):
        raise bad(name, f"must be a list, got {type(value).__name__}")
    return value


def required(name: str, value: Mapping[str, Any], key: str) -> Any:
    """`value[key]`; raises the error of field `name` when it lacks `key`."""
    if key not in value:
        raise bad(name, f"lacks {key!r}")
    return value[key]
