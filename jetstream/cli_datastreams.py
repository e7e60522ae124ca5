"""`jetstream datastreams create|list|describe|update|pause|resume|delete|diagnostics`: managed
pipes from a source to a destination (jetstream.datastreams)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from jetstream.cli_text import UsageError, emit, parse_pairs, table

if TYPE_CHECKING:
    from jetstream.client import Client


def _partitions(args: argparse.Namespace) -> list[int] | None:
    if not args.partitions:
        return None
    try:
        return [int(p) for p in args.partitions.split(",")]
    except ValueError:
        raise UsageError(f"--partitions {args.partitions!r}: numbers separated by commas"
                         ) from None


def _human(d: dict[str, Any]) -> str:
    source = d["source"]["settings"]
    destination = d["destination"]["settings"]
    lines = [(f"{d['name']}: {d['status']}  {d['source']['type']} {source} -> "
             f"{d['destination']['type']} {destination}")]
    if d["paused_partitions"]:
        lines.append(f"paused partitions: {d['paused_partitions']}")
    if d["tasks"]:
        lines.append(table(["TASK", "PARTITIONS", "BROKER", "EPOCH"],
                           [(t["task"], ",".join(map(str, t["partitions"])),
                             "-" if t["broker"] is None else t["broker"], t["epoch"])
                            for t in d["tasks"]]))
    return "\n".join(lines)


async def create(js: Client, args: argparse.Namespace) -> int:
    options: dict[str, Any] = {"max_tasks": args.max_tasks,
                               "partition_mapping": args.partition_mapping}
    for name in ("batch_records_max", "in_flight_max", "rate_limit_records_per_s"):
        if getattr(args, name) is not None:
            options[name] = getattr(args, name)
    if args.label:
        options["labels"] = parse_pairs(args.label, "--label")
    described = await js.create_datastream(
        args.name, {"type": args.source_type, "settings": parse_pairs(args.source, "--source")},
        {"type": args.destination_type,
         "settings": parse_pairs(args.destination, "--destination")}, **options)
    emit(args, described, ("created " if described["created"] else "exists: ") +
         _human(described))
    return 0


async def update(js: Client, args: argparse.Namespace) -> int:
    changes: dict[str, Any] = {name: getattr(args, name) for name in (
        "max_tasks", "batch_records_max", "in_flight_max", "rate_limit_records_per_s")
        if getattr(args, name) is not None}
    if args.label is not None:
        changes["labels"] = parse_pairs(args.label, "--label")
    for end in ("source", "destination"):
        settings: dict[str, Any] = {**parse_pairs(getattr(args, end), f"--{end}")}
        settings.update(dict.fromkeys(getattr(args, f"remove_{end}") or (), None))
        if settings:
            changes[end] = {"settings": settings}
    if not changes:
        raise UsageError("nothing to update: give --max-tasks, --batch-records-max, "
                         "--in-flight-max, --rate-limit-records-per-s, --label, --source, "
                         "--destination or --remove-*")
    described = await js.update_datastream(args.name, changes)
    emit(args, described, "updated " + _human(described))
    return 0


async def listing(js: Client, args: argparse.Namespace) -> int:
    found = await js.list_datastreams()
    emit(args, {"datastreams": found}, table(
        ["NAME", "STATUS", "SOURCE", "DESTINATION", "TASKS"],
        [(d["name"], d["status"], d["source"]["type"], d["destination"]["type"],
          len(d["tasks"])) for d in found]) if found else "(no datastreams)")
    return 0


async def describe(js: Client, args: argparse.Namespace) -> int:
    described = await js.describe_datastream(args.name)
    emit(args, described, _human(described))
    return 0


async def pause(js: Client, args: argparse.Namespace) -> int:
    described = await js.pause_datastream(args.name, _partitions(args))
    emit(args, described, _human(described))
    return 0


async def resume(js: Client, args: argparse.Namespace) -> int:
    described = await js.resume_datastream(args.name, _partitions(args))
    emit(args, described, _human(described))
    return 0


async def delete(js: Client, args: argparse.Namespace) -> int:
    await js.delete_datastream(args.name)
    emit(args, {"name": args.name, "deleted": True}, f"deleted {args.name}")
    return 0


async def diagnostics(js: Client, args: argparse.Namespace) -> int:
    found = await js.datastream_diagnostics(args.name)
    rows = [(t["task"], "-" if t["broker_id"] is None else t["broker_id"], t["status"],
             p["partition"], p["source_position"], p["source_end_position"], p["lag_records"],
             p["records_out"])
            for t in found["tasks"] for p in t["partitions_progress"]]
    emit(args, found, f"{found['name']}: {found['status']}, lag {found['lag_records']}\n" +
         table(["TASK", "BROKER", "STATUS", "PARTITION", "POSITION", "END", "LAG", "OUT"],
               rows))
    return 0


def add_commands(commands: Any, leaf: Any) -> None:
    """The `datastreams` commands; `leaf(subparsers, name, command, help)` makes one
    (jetstream.cli_client)."""
    parser = commands.add_parser("datastreams", help="managed pipes from a source to a "
                                 "destination (mirrors between clusters)")
    sub = parser.add_subparsers(dest="datastreams_command", required=True)
    made = leaf(sub, "create", create, "create a datastream (a no-op when it exists alike)")
    made.add_argument("name")
    made.add_argument("--source-type", default="jetstream", help="source connector")
    made.add_argument("--source", action="append", metavar="KEY=VALUE",
                      help="a source setting, repeatable (jetstream: stream=, brokers=, start=)")
    made.add_argument("--destination-type", default="jetstream",
                      help="destination transport")
    made.add_argument("--destination", action="append", metavar="KEY=VALUE",
                      help="a destination setting, repeatable (jetstream: stream=, brokers=)")
    made.add_argument("--max-tasks", type=int, default=1)
    made.add_argument("--batch-records-max", type=int)
    made.add_argument("--in-flight-max", type=int)
    made.add_argument("--rate-limit-records-per-s", type=int,
                      help="records a second the datastream writes at most, all tasks")
    made.add_argument("--partition-mapping", choices=["same", "key_hash"], default="same")
    made.add_argument("--label", action="append", metavar="KEY=VALUE")
    made = leaf(sub, "update", update, "change a datastream's options or settings (its tasks "
                "restart with them)")
    made.add_argument("name")
    made.add_argument("--max-tasks", type=int)
    made.add_argument("--batch-records-max", type=int)
    made.add_argument("--in-flight-max", type=int)
    made.add_argument("--rate-limit-records-per-s", type=int,
                      help="records a second the datastream writes at most, all tasks")
    made.add_argument("--label", action="append", metavar="KEY=VALUE",
                      help="the new labels (replace all of them), repeatable")
    for end in ("source", "destination"):
        made.add_argument(f"--{end}", action="append", metavar="KEY=VALUE",
                          help=f"set a {end} setting, repeatable")
        made.add_argument(f"--remove-{end}", action="append", metavar="KEY",
                          help=f"remove a {end} setting, repeatable")
    leaf(sub, "list", listing, "list datastreams")
    leaf(sub, "describe", describe, "a datastream's definition, status and tasks"
         ).add_argument("name")
    for name, command, text in (("pause", pause, "pause a datastream or some partitions"),
                                ("resume", resume, "resume a datastream or some partitions")):
        made = leaf(sub, name, command, text)
        made.add_argument("name")
        made.add_argument("--partitions", metavar="P,P", help="only these source partitions")
    leaf(sub, "delete", delete, "delete a datastream (its tasks stop)").add_argument("name")
    leaf(sub, "diagnostics", diagnostics,
         "per task and partition: status, positions, lag").add_argument("name")
