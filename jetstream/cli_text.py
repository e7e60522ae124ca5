"""How the command line shows bytes: as text when they are UTF-8, else as base64."""

from __future__ import annotations

import base64
from typing import Any


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
