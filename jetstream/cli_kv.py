"""`jetstream get` and `jetstream keys`: reads by key of compacted streams from the command
line. Keys are given as text (UTF-8), or as base64 with `--base64`; values print as text when
they are UTF-8, else as `base64:...` (and under `value_base64` in `--json`)."""

from __future__ import annotations

import argparse
import base64
import binascii
import json
from typing import TYPE_CHECKING

from jetstream.cli_text import bytes_fields, text

if TYPE_CHECKING:
    from jetstream.client import Client


class KeyArgumentError(ValueError):
    """A key given with --base64 that is not base64."""


def _key(text: str, encoded: bool) -> bytes:
    if not encoded:
        return text.encode()
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise KeyArgumentError(f"{text!r} is not base64") from None


async def get(js: Client, args: argparse.Namespace) -> int:
    """Print the key's newest committed value; exit 1 when it has none."""
    key = _key(args.key, args.base64)
    entry = await js.get(args.stream, key, min_offset=args.min_offset,
                         read_isr_replica=args.read_replica)
    if entry is None:
        if args.json:
            print(json.dumps({"stream": args.stream, **bytes_fields("key", key), "found": False}))
        else:
            print(f"{text(key)}: not found", flush=True)
        return 1
    if args.json:
        print(json.dumps({"stream": args.stream, "partition": entry.partition,
                          "offset": entry.offset, "timestamp_ms": entry.timestamp_ms,
                          **bytes_fields("key", key), **bytes_fields("value", entry.value),
                          "found": True}), flush=True)
    else:
        print(text(entry.value), flush=True)
    return 0


async def keys(js: Client, args: argparse.Namespace) -> int:
    found = await js.keys(args.stream, prefix=_key(args.prefix, args.base64),
                          after=None if args.after is None else _key(args.after, args.base64),
                          limit=args.limit)
    if args.json:
        print(json.dumps({"stream": args.stream,
                          "keys": [bytes_fields("key", k) for k in found]}), flush=True)
    else:
        for key in found:
            print(text(key), flush=True)
    return 0


def add_arguments(get_parser: argparse.ArgumentParser,
                  keys_parser: argparse.ArgumentParser) -> None:
    get_parser.add_argument("stream")
    get_parser.add_argument("key")
    get_parser.add_argument("--min-offset", type=int,
                            help="wait until the stream's records up to this offset are indexed")
    get_parser.add_argument("--read-replica", action="store_true",
                            help="read from any in-sync replica")
    keys_parser.add_argument("stream")
    keys_parser.add_argument("--prefix", default="")
    keys_parser.add_argument("--after", help="the last key of the previous page")
    keys_parser.add_argument("--limit", type=int, default=1000)
    for parser in (get_parser, keys_parser):
        parser.add_argument("--base64", action="store_true",
                            help="keys (and --prefix/--after) are given as base64")
