"""How the command line reads its arguments and shows its results: times and `--from`,
`k=v` pairs, tables, messages, and bytes (as text when they are UTF-8, else as base64). Pure
functions, shared by the client commands."""

from __future__ import annotations

import argparse
import base64
import json
import re
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jetstream.client import Message, Start

_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_RELATIVE = re.compile(r"-(?:\d+(?:ms|s|m|h|d))+")
_RELATIVE_PART = re.compile(r"(\d+)(ms|s|m|h|d)")
FROM_HELP = ("earliest (default), latest (the newest message), new (only what comes next), "
              "an OFFSET, an ISO-8601 time (2024-05-01T12:00:00Z; no zone: local time) or a "
              "time relative to now (-30s, -5m, -2h, -1d, -1h30m)")


class UsageError(Exception):
    """The command line is wrong: `main` prints the message and exits 2."""


def parse_from(text: str, now_ms: int) -> tuple[Start, int | None, int | None]:
    """`--from` as (start, offset, timestamp_ms). Raises UsageError."""
    from jetstream.client import Start

    word = text.strip().lower()
    named = {"earliest": Start.EARLIEST, "latest": Start.LATEST, "new": Start.NEW_ONLY}
    if word in named:
        return named[word], None, None
    if word.isascii() and word.isdigit():
        return Start.OFFSET, int(word), None
    if _RELATIVE.fullmatch(word):
        ago_ms = sum(int(n) * _UNITS_MS[unit] for n, unit in _RELATIVE_PART.findall(word))
        return Start.TIMESTAMP, None, max(now_ms - ago_ms, 0)
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise UsageError(f"--from {text!r}: expected {FROM_HELP}") from None
    return Start.TIMESTAMP, None, max(int(moment.astimezone().timestamp() * 1000), 0)


def parse_pairs(items: Sequence[str] | None, flag: str) -> dict[str, str]:
    """`k=v` items (repeated `--label`/`--header`) as a dict. Raises UsageError."""
    pairs: dict[str, str] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"{flag} {item!r}: expected KEY=VALUE")
        pairs[key] = value
    return pairs


def normalize_argv(argv: list[str]) -> list[str]:
    """Join `--from -5m` into `--from=-5m` (and `--to`): argparse would take `-5m` for an
    option."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] in ("--from", "--to") and i + 1 < len(argv) \
                and _RELATIVE.fullmatch(argv[i + 1]):
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


def iso_time(timestamp_ms: int) -> str:
    moment = datetime.fromtimestamp(timestamp_ms / 1000, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def message_json(msg: Message) -> dict[str, Any]:
    """A message as JSON: key, value and header values as text when UTF-8, else under
    `<name>_base64`."""
    out: dict[str, Any] = {"stream": msg.stream, "partition": msg.partition,
                           "offset": msg.offset, "timestamp_ms": msg.timestamp_ms,
                           "time": iso_time(msg.timestamp_ms), "subject": msg.subject}
    out.update(bytes_fields("key", msg.key))
    out.update(bytes_fields("value", msg.value))
    headers: dict[str, str] = {}
    binary: dict[str, str] = {}
    for name, value in msg.headers.items():
        for field, shown in bytes_fields(name, value).items():
            (headers if field == name else binary)[name] = shown
    out["headers"] = headers
    if binary:
        out["headers_base64"] = binary
    return out


def message_text(msg: Message) -> str:
    """`OFFSET  TIME  KEY  VALUE`: text when UTF-8 (control characters escaped), else
    `base64:...`; KEY is `-` when the message has none."""
    return f"{msg.offset}  {iso_time(msg.timestamp_ms)}  {text(msg.key)}  {text(msg.value)}"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [list(headers)] + [["-" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
                     for row in cells)


def emit(args: argparse.Namespace, document: Any, human: str) -> None:
    print(json.dumps(document) if args.json else human, flush=True)


def bytes_fields(name: str, data: bytes | None) -> dict[str, Any]:
    """`{name: text}` when `data` is UTF-8, else `{name_base64: ...}`."""
    if data is None:
        return {name: None}
    try:
        return {name: data.decode()}
    except UnicodeDecodeError:
        return {f"{name}_base64": base64.b64encode(data).decode()}


# Control characters would break the one-message-per-line layout.
_ESCAPES = {i: f"\\x{i:02x}" for i in [*range(32), 127]} | {
    ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t"}


def text(data: bytes | None) -> str:
    if data is None:
        return "-"
    try:
        return data.decode().translate(_ESCAPES)
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(data).decode()
