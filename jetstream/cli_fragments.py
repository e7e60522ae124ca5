"""`jetstream fragments list|prune STREAM`: a stream's history in its fragment store.

`list` prints each fragment of each partition (or of `--partition N`): its offsets, format
(segment or parquet), size, compression and URL, and whether a longer overlapping fragment
makes it redundant; then each partition's extents: what a consumer reads from the store and
from the leader's disk.
`prune --before WHERE` deletes the history ending at or before an offset (digits) or written
before a time (ISO 8601, or an age such as 7d), from the store and from the leaders' disks.
"""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING, Any

from jetstream.cli_text import UsageError, emit, parse_from, table

if TYPE_CHECKING:
    from jetstream.client import Client


def _range(begin: Any, end: Any) -> str:
    return "-" if begin is None or end is None or begin == end else f"[{begin}, {end})"


def extents_text(entries: list[dict[str, Any]]) -> str:
    rows = [(e["partition"], _range(e.get("stored_start_offset"), e.get("stored_end_offset")),
             _range(e.get("local_log_start_offset"), e.get("log_end_offset")),
             e.get("high_watermark"), e.get("stored_fragments", 0), e.get("stored_bytes", 0),
             e.get("backlog_bytes", 0), (e.get("store_error") or {}).get("code", "-"))
            for e in entries]
    return table(["PARTITION", "STORED", "LOCAL", "HW", "FRAGMENTS", "STORED BYTES",
                  "BACKLOG", "STORE"], rows)


def _fragment_rows(entries: list[dict[str, Any]], key: str) -> list[tuple[Any, ...]]:
    return [(e["partition"], f["begin"], f["end"], f.get("format", "segment"),
             f.get("size_bytes", "-"),
             f.get("compression", "-"), "redundant" if f.get("redundant") else "stored",
             f["url"]) for e in entries for f in e[key]]


async def fragments_list(js: Client, args: argparse.Namespace) -> int:
    found = await js.fragments(args.stream, args.partition)
    text = table(["PARTITION", "BEGIN", "END", "FORMAT", "SIZE", "COMPRESSION", "STATE", "URL"],
                 _fragment_rows(found, "fragments"))
    emit(args, {"stream": args.stream, "partitions": found},
         text + "\n\n" + extents_text(found))
    return 0


async def fragments_prune(js: Client, args: argparse.Namespace) -> int:
    from jetstream.client import Start

    start, offset, timestamp_ms = parse_from(args.before, int(time.time() * 1000))
    if start is Start.OFFSET and offset is not None:
        found = await js.fragments(args.stream, args.partition, prune=True,
                                   before_offset=offset)
    elif start is Start.TIMESTAMP and timestamp_ms is not None:
        found = await js.fragments(args.stream, args.partition, prune=True,
                                   before_ms=timestamp_ms)
    else:
        raise UsageError(f"--before {args.before!r}: an offset, a time or an age (7d)")
    rows = [(p, begin, end, "pruned", url) for p, begin, end, url in (
        (e["partition"], f["begin"], f["end"], f["url"]) for e in found for f in e["pruned"])]
    emit(args, {"stream": args.stream, "partitions": found},
         table(["PARTITION", "BEGIN", "END", "STATE", "URL"], rows) + "\n\n"
         + extents_text(found))
    return 0


def add_arguments(listing: argparse.ArgumentParser, prune: argparse.ArgumentParser) -> None:
    for parser in (listing, prune):
        parser.add_argument("stream")
        parser.add_argument("--partition", type=int, default=-1,
                            help="only this partition (default: every one)")
    prune.add_argument("--before", required=True, metavar="OFFSET|TIME",
                       help="an offset, an ISO 8601 time, or an age such as 7d or 1h30m")
