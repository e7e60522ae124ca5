"""Consumer groups from the command line: `jetstream groups list|describe`, `jetstream
offsets reset|delete`, and `jetstream sub STREAM --group G` (a member that prints what it
is given until Ctrl-C or `--max`, then commits and leaves)."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
from typing import TYPE_CHECKING, Any

from jetstream.cli_text import UsageError, emit, message_json, message_text, parse_from, table

if TYPE_CHECKING:
    from jetstream.client import Client

RESET_HELP = ("earliest (the log start), latest (the high watermark: only what comes next), "
              "an OFFSET, an ISO-8601 time or a time relative to now (-1h)")


def parse_reset(text: str, now_ms: int) -> tuple[str, int | None, int | None]:
    """`--to` as (to, offset, timestamp_ms) for Client.reset_offsets. Raises UsageError."""
    from jetstream.client import Start

    word = text.strip().lower()
    if word in ("earliest", "latest"):
        return word, None, None
    start, offset, timestamp_ms = parse_from(text, now_ms)
    if start is Start.OFFSET:
        return "offset", offset, None
    if start is Start.TIMESTAMP:
        return "timestamp", None, timestamp_ms
    raise UsageError(f"--to {text!r}: expected {RESET_HELP}")


async def groups_list(js: Client, args: argparse.Namespace) -> int:
    groups = await js.list_groups()
    rows = [(g.group, g.state, g.members, g.coordinator) for g in groups]
    human = table(["GROUP", "STATE", "MEMBERS", "COORDINATOR"], rows) if groups \
        else "no consumer groups"
    emit(args, {"groups": [{"group": g.group, "state": g.state, "members": g.members,
                            "coordinator": g.coordinator} for g in groups]}, human)
    return 0


def describe_text(d: dict[str, Any]) -> str:
    coordinator = d.get("coordinator") or {}
    where = (f"broker {coordinator.get('broker_id', '-')} "
             f"(__offsets/{coordinator.get('partition', '-')})")
    lines = [f"group               {d['group']}", f"state               {d['state']}",
             f"group epoch         {d.get('group_epoch', 0)}",
             f"coordinator         {where}", ""]
    members = d.get("members", [])
    lines.append(table(
        ["MEMBER", "CLIENT", "EPOCH", "PARTITIONS", "REVOKING", "LAST HEARTBEAT"],
        [(m["member_id"], m.get("client_id") or "-", m["member_epoch"],
          ",".join(m["assigned"]) or "-", ",".join(m["revoking"]) or "-",
          f"{m['last_heartbeat_ms_ago']} ms ago") for m in members])
        if members else "no members")
    lines.append("")
    offsets = d.get("offsets", [])
    holder = {p: m["member_id"] for m in members for p in m["assigned"]}
    lines.append(table(
        ["STREAM", "PARTITION", "COMMITTED", "HW", "LAG", "MEMBER"],
        [(o["stream"], o["partition"], o["offset"], o.get("high_watermark"), o.get("lag"),
          holder.get(f"{o['stream']}/{o['partition']}", "-")) for o in offsets])
        if offsets else "no committed offsets")
    return "\n".join(lines)


async def groups_describe(js: Client, args: argparse.Namespace) -> int:
    description = await js.describe_group(args.group)
    emit(args, description, describe_text(description))
    return 0


async def offsets_reset(js: Client, args: argparse.Namespace) -> int:
    to, offset, timestamp_ms = parse_reset(args.to, int(time.time() * 1000))
    partitions = args.partition or None
    moved = await js.reset_offsets(args.group, args.stream, to=to, offset=offset,
                                   timestamp_ms=timestamp_ms, partitions=partitions)
    emit(args, {"group": args.group, "stream": args.stream,
                "offsets": {str(p): o for p, o in sorted(moved.items())}},
         table(["PARTITION", "OFFSET"], sorted(moved.items())))
    return 0


async def offsets_delete(js: Client, args: argparse.Namespace) -> int:
    deleted = await js.delete_group(args.group)
    emit(args, {"group": args.group, "deleted_offsets": deleted},
         f"group {args.group}: {deleted} committed offset(s) deleted")
    return 0


async def sub_group(js: Client, args: argparse.Namespace) -> int:
    """`sub --group`: print the messages this member is given until Ctrl-C/SIGTERM or
    `--max`, then commit and leave the group (status 0)."""
    if args.max is not None and args.max < 1:
        raise UsageError(f"--max must be at least 1, got {args.max}")
    as_json = args.json or args.format == "json"
    member = js.subscribe(args.stream, group=args.group, reset=args.reset)
    done = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, done.set)

    async def consume() -> None:
        printed = 0
        async for msg in member:
            line = json.dumps(message_json(msg)) if as_json else \
                f"{msg.stream}/{msg.partition}  {message_text(msg)}"
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
            printed += 1
            if args.max is not None and printed >= args.max:
                await member.commit()
                return

    try:
        await member.start()
        consumer = asyncio.ensure_future(consume())
        stopper = asyncio.ensure_future(done.wait())
        await asyncio.wait({consumer, stopper}, return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        if consumer.done():
            consumer.result()  # its error, if it failed
        else:
            consumer.cancel()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        await member.close()
    return 0


def add_commands(commands: Any, leaf: Any) -> None:
    """The `groups` and `offsets` commands; `leaf(subparsers, name, command, help)` makes
    one (jetstream.cli_client)."""
    groups = commands.add_parser("groups", help="list and describe consumer groups")
    group_commands = groups.add_subparsers(dest="groups_command", required=True)
    leaf(group_commands, "list", groups_list, "list consumer groups")
    leaf(group_commands, "describe", groups_describe,
         "a group's state, members and their partitions, committed offsets, HW and lag"
         ).add_argument("group")
    offsets = commands.add_parser("offsets", help="reset or delete a group's committed offsets")
    offset_commands = offsets.add_subparsers(dest="offsets_command", required=True)
    reset = leaf(offset_commands, "reset", offsets_reset,
                 "move a group's offsets of a stream (the group must have no members)")
    reset.add_argument("group")
    reset.add_argument("stream")
    reset.add_argument("--to", required=True, metavar="WHERE", help=RESET_HELP)
    reset.add_argument("--partition", type=int, action="append",
                       help="only this partition (repeatable; default: all)")
    leaf(offset_commands, "delete", offsets_delete,
         "delete a group's committed offsets (the group must have no members)"
         ).add_argument("group")
