"""`jetstream scrub STREAM [--partition N]`: check every byte of a stream's replicas now, on
every broker, heal what can be, and print what each replica holds: damage still there,
repairs made, ranges lost (damaged on every replica). Exits 1 while any replica still holds
damage or any range is lost (or a broker did not answer)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from jetstream.cli_text import emit, table

if TYPE_CHECKING:
    from jetstream.client import Client


def _ranges(entries: list[dict[str, Any]]) -> str:
    return ", ".join(f"[{e['first_offset']}, {e['end_offset']})" for e in entries) or "-"


async def scrub(js: Client, args: argparse.Namespace) -> int:
    found = await js.scrub(args.stream, args.partition)
    rows = [(e.get("partition"), e["broker_id"], e.get("role"), e.get("checked_segments"),
             _ranges(e.get("damage", [])), e.get("repaired"), _ranges(e.get("lost", [])),
             e.get("error"))
            for e in found]
    emit(args, {"stream": args.stream, "replicas": found},
         table(["PARTITION", "BROKER", "ROLE", "SEGMENTS", "DAMAGE", "REPAIRED", "LOST",
                "ERROR"], rows))
    bad = any(e.get("damage") or e.get("lost") or "error" in e for e in found)
    return 1 if bad else 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("stream")
    parser.add_argument("--partition", type=int, default=-1,
                        help="only this partition (default: every one)")
