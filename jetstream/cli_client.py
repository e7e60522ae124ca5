"""The client commands of the `jetstream` command line: `stream`, `pub`, `sub`, `cluster`.

Theory of operation: each command is a coroutine run by `asyncio.run` with one client
(jetstream.client) connected to the brokers of `--brokers host:port,...`, else of the
JETSTREAM_BROKERS environment variable. It prints a human view on stdout, or with `--json` one
JSON document (`sub --format json`: one JSON object per message, one per line). Errors the
client or a broker raises (JetstreamError) reach `jetstream.cli.main`, which prints
`error [CODE]: message` on stderr and exits 1; bad usage (no brokers, a bad `--from`, a
malformed `k=v`) raises UsageError, which exits 2 as argparse's own errors do. Progress
displays go to stderr, and only when stderr is a terminal, so pipes and scripts see results
only.

Exit status: 0 done, 1 a JetstreamError, 2 bad usage, 130 interrupted (Ctrl-C). `sub` is the
exception: Ctrl-C (SIGINT) or SIGTERM is how one stops following, so it ends with 0.

The pure helpers (parsing `--from` and `k=v`, tables, messages) live in jetstream.cli_text.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import ssl
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from jetstream import (
    cli_datastreams,
    cli_demo,
    cli_fragments,
    cli_groups,
    cli_kv,
    cli_registers,
    cli_scrub,
)
from jetstream.cli_acl import add_security_commands, auth_options
from jetstream.cli_text import (
    FROM_HELP,
    UsageError,
    emit,
    message_json,
    message_text,
    parse_from,
    parse_pairs,
    table,
)

if TYPE_CHECKING:  # the client (and nats-py) load only when a client command runs
    from jetstream.client import Ack, Client, StreamInfo, Subscription
    from jetstream.security.tls import TlsArguments

BROKERS_ENV = "JETSTREAM_BROKERS"
#: How long `pub` waits for an ack.
ACK_TIMEOUT_S = 5.0
#: Messages `pub --count` keeps un-acked at once.
PUBLISH_WINDOW = 1000
#: How long `cluster status` waits for each broker to describe its own NATS connection
#: and data disk.
SELF_REPORT_TIMEOUT_S = 2.0
#: A progress display is redrawn at most this often.
PROGRESS_REDRAW_S = 0.2



#: The default of `stream update` flags: a setting left as it is (None means "no limit").
_UNSET = object()


# -- pure helpers ------------------------------------------------------------------------------


def brokers_from(args: argparse.Namespace, environ: dict[str, str] | os._Environ[str]) -> str:
    """The bootstrap addresses from --brokers, else JETSTREAM_BROKERS. Raises UsageError."""
    from jetstream.client import parse_brokers
    from jetstream.errors import ProtocolError

    text = getattr(args, "brokers", None) or environ.get(BROKERS_ENV, "")
    if not text.strip():
        raise UsageError(f"no brokers: pass --brokers HOST:PORT,... or set {BROKERS_ENV}")
    try:
        parse_brokers(text)  # checks them; the jetstreams:// scheme stays for connect
        return ",".join(item.strip() for item in text.split(",") if item.strip())
    except ProtocolError as exc:
        raise UsageError(f"--brokers {text!r}: {exc}") from None


def tls_options(args: argparse.Namespace,
                environ: dict[str, str] | os._Environ[str]) -> TlsArguments:
    """The client's TLS files from --tls-ca/--tls-cert/--tls-key, else the
    JETSTREAM_CLIENT_TLS_* environment variables (a `jetstreams://` broker asks for TLS on
    its own)."""
    def one(name: str) -> str | None:
        return getattr(args, name, None) or environ.get(f"JETSTREAM_CLIENT_{name.upper()}")

    found: TlsArguments = {"tls_ca": one("tls_ca"), "tls_cert": one("tls_cert"),
                           "tls_key": one("tls_key")}
    return found


class Progress:
    """A one-line progress display on stderr, redrawn at most every PROGRESS_REDRAW_S; it
    draws nothing unless stderr is a terminal."""

    def __init__(self, what: str, total: int | None, out: TextIO | None = None) -> None:
        self.out = out or sys.stderr
        self.enabled = self.out.isatty()
        self.what = what
        self.total = total
        self._started = time.monotonic()
        self._drawn_at = self._started

    def update(self, done: int) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._drawn_at < PROGRESS_REDRAW_S:
            return
        self._drawn_at = now
        rate = done / max(now - self._started, 1e-6)
        of = f"/{self.total} ({100 * done // max(self.total, 1)}%)" if self.total else ""
        self.out.write(f"\r{self.what} {done}{of}  {rate:,.0f} msgs/s\x1b[K")
        self.out.flush()

    def close(self) -> None:
        if self.enabled:
            self.out.write("\r\x1b[K")
            self.out.flush()


# -- stream commands ---------------------------------------------------------------------------


def stream_json(info: StreamInfo) -> dict[str, Any]:
    partitions = [{k: v for k, v in asdict(p).items() if k != "stream"}
                  for p in info.partitions]
    return {**info.config, "partitions": partitions}


def _labels_text(labels: Any) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or "-"


def stream_text(info: StreamInfo) -> str:
    config = dict(info.config)
    config["labels"] = _labels_text(info.labels)
    first = ["name", "subject", "ingest_group", "labels", "replication_factor", "min_isr",
             "ack_policy", "fsync"]
    keys = [k for k in first if k in config] + sorted(k for k in config if k not in first)
    lines = [f"{k.replace('_', ' '):<20}{'-' if config[k] is None else config[k]}"
             for k in keys]
    rows = [(p.partition, p.subject, p.leader, p.leader_epoch, _ids(p.replicas), _ids(p.isr),
             p.log_start_offset, p.high_watermark, p.log_end_offset) for p in info.partitions]
    lines += ["", table(["PARTITION", "SUBJECT", "LEADER", "EPOCH", "REPLICAS", "ISR", "START",
                         "HW", "LEO"], rows)]
    return "\n".join(lines)


def _ids(ids: Sequence[int]) -> str:
    return ",".join(map(str, ids))


def _percent(value: float | None) -> str | None:
    return None if value is None else f"{value:.1f}%"


def _of(value: int | None, most: int | None) -> str | None:
    return None if value is None or most is None else f"{value}/{most}"


def _yes_no(value: bool | None) -> str | None:
    return None if value is None else ("yes" if value else "no")


async def stream_create(js: Client, args: argparse.Namespace) -> int:
    if args.deprecated_group is not None:
        print("jetstream: --group is deprecated: use --ingest-group", file=sys.stderr)
        args.ingest_group = args.ingest_group or args.deprecated_group
    info = await js.create_stream(
        args.name, args.subject, partitions=args.partitions,
        ingest_group=args.ingest_group,
        labels=parse_pairs(args.label, "--label") or None, ack_policy=args.ack_policy,
        fsync=args.fsync, retention_ms=args.retention_ms, retention_bytes=args.retention_bytes,
        retention_messages=args.retention_messages, max_message_bytes=args.max_message_bytes,
        replication_factor=args.replication_factor, min_isr=args.min_isr,
        **{k: getattr(args, k) for k in _COMPACTION_FLAGS if getattr(args, k) is not None},
        tiered={k: getattr(args, k) for k in _TIERED_FLAGS})
    count = info.partition_count
    emit(args, stream_json(info),
          f"stream {info.name} ready: subject {info.subject!r}, {count} "
          f"partition{'s' if count != 1 else ''}, ack policy {info.ack_policy}")
    return 0


#: Flags of `stream create` and `stream update` for the compaction, segment and message id
#: dedupe settings.
_COMPACTION_FLAGS = {
    "cleanup_policy": str, "min_cleanable_dirty_ratio": float, "min_compaction_lag_ms": int,
    "max_compaction_lag_ms": int, "delete_retention_ms": int, "segment_bytes_max": int,
    "segment_ms_max": int, "duplicate_window_ms": int,
}
#: Flags of `stream create` and `stream update` for tiered storage.
_TIERED_FLAGS = {"fragment_store": str, "fragment_compression": str, "local_retention_ms": int,
                 "local_retention_bytes": int, "fragment_store_retention": str,
                 "fragment_format": str}
#: What `stream update` may change, and how a flag's text is read ("none": no limit).
_UPDATE_FLAGS = {
    **_COMPACTION_FLAGS, "ack_policy": str, "fsync": str, "fsync_interval_ms": int,
    "retention_ms": int, "retention_bytes": int, "retention_messages": int,
    "max_message_bytes": int, **_TIERED_FLAGS,
}


def _setting(kind: type) -> Callable[[str], object]:
    def parse(text: str) -> object:
        return None if text.lower() == "none" else kind(text)
    return parse


async def stream_update(js: Client, args: argparse.Namespace) -> int:
    changes = {k: getattr(args, k) for k in _UPDATE_FLAGS if getattr(args, k) is not _UNSET}
    if not changes:
        raise UsageError("name at least one setting to change, e.g. --retention-ms 60000")
    info = await js.update_stream(args.name, **changes)
    emit(args, stream_json(info), f"stream {info.name} updated: " + ", ".join(
        f"{k}={v if v is not None else 'none'}" for k, v in changes.items()))
    return 0


async def stream_list(js: Client, args: argparse.Namespace) -> int:
    from jetstream.protocol.names import parse_selector

    selector = parse_selector(args.selector or "")
    streams = [s for s in await js.list_streams(internal=args.all) if selector(s.labels)]
    rows = [(s.name, s.subject, s.partition_count, s.replication_factor, s.ack_policy,
             s.ingest_group, _labels_text(s.labels)) for s in streams]
    human = table(["NAME", "SUBJECT", "PARTITIONS", "RF", "ACK", "INGEST_GROUP", "LABELS"], rows) \
        if streams else "no streams"
    emit(args, {"streams": [stream_json(s) for s in streams]}, human)
    return 0


async def stream_info(js: Client, args: argparse.Namespace) -> int:
    info = await js.stream_info(args.name)
    data, text = stream_json(info), stream_text(info)
    if info.config.get("fragment_store"):  # local and stored extents, from the leaders
        data["extents"] = extents = await js.fragments(info.name)
        text += "\n\n" + cli_fragments.extents_text(extents)
    emit(args, data, text)
    return 0


async def stream_delete(js: Client, args: argparse.Namespace) -> int:
    await js.delete_stream(args.name)
    emit(args, {"deleted": args.name}, f"stream {args.name} deleted")
    return 0


async def _own_entry(address: str, broker_id: int, tls: ssl.SSLContext | None,
                     credentials: Any = None) -> dict[str, Any]:
    """A broker's entry of the broker list as that broker gives it: only it knows its NATS
    connection (URL and state). {} when it cannot be asked in SELF_REPORT_TIMEOUT_S."""
    from jetstream.client import BrokerConnection
    from jetstream.errors import JetstreamError
    from jetstream.protocol import messages as m

    conn = BrokerConnection(address, client_id="jetstream-cli",
                            connect_timeout_s=SELF_REPORT_TIMEOUT_S,
                            request_timeout_s=SELF_REPORT_TIMEOUT_S, tls=tls,
                            credentials=credentials)
    try:
        await conn.open()
        response = await conn.request(m.MetadataRequest([]))  # no streams: brokers only
    except (JetstreamError, OSError):
        return {}
    finally:
        await conn.close()
    if not isinstance(response, m.MetadataResponse):
        return {}
    return next((b for b in response.brokers if b.get("id") == broker_id), {})


async def cluster_status(js: Client, args: argparse.Namespace) -> int:
    from jetstream.errors import JetstreamError

    streams = await js.list_streams()
    await js.refresh_metadata()  # brokers and the metadata leader
    # Each broker is asked for its own NATS connection and data disk, as a partition's leader
    # is for its offsets below; one that does not answer shows "-" (null).
    own = await asyncio.gather(*(_own_entry(b.address, b.id, js.tls, js.credentials)
                                 for b in js.brokers))
    brokers = [{**asdict(b), "address": b.address,
                "nats_url": entry.get("nats_url") or b.nats_url or None,
                "nats_state": entry.get("nats_state"),
                "disk_used_percent": entry.get("disk_used_percent"),
                "disk_full": entry.get("disk_full"),
                "open_files": entry.get("open_files"),
                "open_files_max": entry.get("open_files_max"),
                "open_files_limit": entry.get("open_files_limit")}
               for b, entry in zip(js.brokers, own, strict=True)]
    partitions = []
    for stream in streams:
        for p in stream.partitions:
            if p.log_end_offset is None:  # the answering broker does not lead it: ask the leader
                with contextlib.suppress(JetstreamError):  # else they stay unknown: "-", null
                    p = await js.partition_status(stream.name, p.partition)
            row = asdict(p)
            leos = row.pop("replica_end_offsets") or {}
            row["replica_end_offsets"] = {str(k): v for k, v in leos.items()}
            partitions.append(row)
    leader = js.metadata_leader
    human = "\n".join([
        f"metadata leader: {'unknown' if leader is None else f'broker {leader}'}",
        "",
        f"brokers ({len(brokers)})",
        table(["ID", "ADDRESS", "HTTP", "NATS", "NATS STATE", "DISK USED", "DISK FULL",
               "OPEN FILES"],
              [(b["id"], b["address"], b["http_port"] or None, b["nats_url"], b["nats_state"],
                _percent(b["disk_used_percent"]), _yes_no(b["disk_full"]),
                _of(b["open_files"], b["open_files_max"])) for b in brokers]),
        "", f"partitions ({len(partitions)})",
        table(["STREAM", "PARTITION", "LEADER", "EPOCH", "ISR", "REPLICAS", "HW", "LEO"],
              [(p["stream"], p["partition"], p["leader"], p["leader_epoch"], _ids(p["isr"]),
                _ids(p["replicas"]), p["high_watermark"], p["log_end_offset"])
               for p in partitions]),
    ])
    emit(args, {"metadata_leader": leader, "brokers": brokers, "partitions": partitions},
          human)
    return 0


# -- pub -----------------------------------------------------------------------------------------


def _publish_value(args: argparse.Namespace) -> bytes:
    if args.file is not None:
        if args.value is not None:
            raise UsageError("give either VALUE or --file, not both")
        try:
            return Path(args.file).read_bytes()
        except OSError as exc:
            raise UsageError(f"--file {args.file!r}: {exc.strerror}") from None
    if args.value is None:
        raise UsageError("no value: give VALUE, '-' to read standard input, or --file PATH")
    text: str = args.value
    return sys.stdin.buffer.read() if text == "-" else text.encode()


def _ack_json(ack: Ack) -> dict[str, Any]:
    return {"stream": ack.stream, "partition": ack.partition, "offset": ack.offset,
            "subject": ack.subject, "ack_policy": str(ack.ack_policy),
            **({"duplicate": True} if ack.duplicate else {})}


async def pub(js: Client, args: argparse.Namespace) -> int:

    value = _publish_value(args)
    key = args.key.encode() if args.key is not None else None
    headers = {k: v.encode() for k, v in parse_pairs(args.header, "--header").items()} or None
    if args.count < 1:
        raise UsageError(f"--count must be at least 1, got {args.count}")
    if args.count > 1:
        return await _pub_many(js, args, value, key, headers)
    ack = await js.publish(args.subject, value, key=key, headers=headers,
                           ack_policy=args.ack_policy, partition=args.partition,
                           timeout=ACK_TIMEOUT_S, **_expectations(args))
    if ack is None:  # ack policy none
        emit(args, {"sent": 1, "acked": False},
              "sent 1 message (ack policy none: the broker sends no ack)")
        return 0
    emit(args, _ack_json(ack),
          f"acked: stream {ack.stream}, partition {ack.partition}, offset {ack.offset}"
          + (" (a duplicate: stored before, not again)" if ack.duplicate else ""))
    return 0


def _expectations(args: argparse.Namespace) -> dict[str, Any]:
    """The expectation flags of `pub` that were given."""
    out: dict[str, Any] = {name: getattr(args, name) for name in (
        "msg_id", "expected_offset", "expected_last_offset_for_key", "check_registers")
        if getattr(args, name) is not None}
    for name in ("union_registers", "subtract_registers"):
        flag = "--" + name.replace("_registers", "-register")
        if getattr(args, name):
            out[name] = parse_pairs(getattr(args, name), flag)
    if out and args.count > 1:
        raise UsageError("expectations apply to one message: not with --count")
    return out


async def _pub_many(js: Client, args: argparse.Namespace, template: bytes, key: bytes | None,
                    headers: dict[str, bytes] | None) -> int:
    """`--count N` messages, pipelined; `{i}` (1..N) in VALUE or --key is the message's
    number."""
    from jetstream.client import PublishMessage

    count, no_ack = args.count, args.ack_policy == "none"
    numbered = args.value not in (None, "-") and b"{i}" in template
    numbered_key = key is not None and b"{i}" in key
    progress = Progress(f"publishing to {args.subject}:", count)

    def messages() -> Iterator[PublishMessage]:
        for i in range(1, count + 1):
            number = str(i).encode()
            yield PublishMessage(args.subject,
                                 template.replace(b"{i}", number) if numbered else template,
                                 key.replace(b"{i}", number) if numbered_key and key else key,
                                 headers, args.partition)
            progress.update(i)

    started = time.monotonic()
    try:
        # With ack policy none nothing comes back: the client sends and returns [].
        acks = await js.publish_batch(messages(), window=PUBLISH_WINDOW,
                                      ack_policy=args.ack_policy, timeout=ACK_TIMEOUT_S)
    finally:
        progress.close()
    seconds = max(time.monotonic() - started, 1e-3)
    spans: dict[tuple[str, int], tuple[int, int, int]] = {}  # first, last offset; count
    for ack in acks:
        first, last, acked = spans.get((ack.stream, ack.partition), (ack.offset, ack.offset, 0))
        spans[ack.stream, ack.partition] = (min(first, ack.offset), max(last, ack.offset),
                                            acked + 1)
    rate = count / seconds
    document = {"count": count, "acked": len(acks), "seconds": round(seconds, 6),
                "msgs_per_s": round(rate, 1),
                "partitions": [{"stream": s, "partition": p, "first_offset": lo,
                                "last_offset": hi, "count": n}
                               for (s, p), (lo, hi, n) in sorted(spans.items())]}
    lines = [f"published {count} messages to {args.subject} in {seconds:.2f} s: "
             f"{rate:,.0f} msgs/s" + (" (ack policy none: not acked)" if no_ack else "")]
    lines += [f"  {s}/{p}  offsets {lo}..{hi}" for (s, p), (lo, hi, _) in sorted(spans.items())]
    emit(args, document, "\n".join(lines))
    return 0


# -- sub -----------------------------------------------------------------------------------------


async def sub(js: Client, args: argparse.Namespace) -> int:
    """Print messages until caught up (or forever with --follow); SIGINT/SIGTERM end it
    with status 0."""
    if args.group is not None:
        return await cli_groups.sub_group(js, args)
    start, offset, timestamp_ms = parse_from(args.start, int(time.time() * 1000))
    if args.max is not None and args.max < 1:
        raise UsageError(f"--max must be at least 1, got {args.max}")
    subscription = js.subscribe(args.stream, args.partition, start=start, offset=offset,
                                timestamp_ms=timestamp_ms,
                                stop=None if args.follow else "latest",
                                read_isr_replica=args.read_replica)
    consumer = asyncio.ensure_future(_print_messages(subscription, args))
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, consumer.cancel)
    try:
        await asyncio.wait({consumer})
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        await subscription.close()
    return 0 if consumer.cancelled() else consumer.result()  # result() raises its error


async def _print_messages(subscription: Subscription, args: argparse.Namespace) -> int:
    as_json = args.json or args.format == "json"
    render = (lambda m: json.dumps(message_json(m))) if as_json else message_text
    await subscription.start()
    total = None
    if subscription.stop_offset is not None and subscription.position is not None:
        total = max(subscription.stop_offset - subscription.position, 0)
        if args.max is not None:
            total = min(total, args.max)
    # Progress only when the messages themselves go elsewhere (a file, a pipe).
    progress = Progress(f"reading {args.stream}/{args.partition}:", total) \
        if not sys.stdout.isatty() else None
    remaining = args.max
    printed = 0
    out = sys.stdout
    try:
        while remaining is None or remaining > 0:
            batch = await subscription.next_batch()
            if batch is None:
                break
            if remaining is not None:
                batch = batch[:remaining]
                remaining -= len(batch)
            out.write("".join(render(m) + "\n" for m in batch))
            out.flush()
            printed += len(batch)
            if progress is not None:
                progress.update(printed)
    finally:
        if progress is not None:
            progress.close()
    return 0


# -- wiring ------------------------------------------------------------------------------------

Command = Callable[["Client", argparse.Namespace], Awaitable[int]]


def _runner(command: Command) -> Callable[[argparse.Namespace], int]:
    """Run `command` with a client of the command line's brokers."""
    def run(args: argparse.Namespace) -> int:
        brokers = brokers_from(args, os.environ)

        async def with_client() -> int:
            import jetstream.client

            async with jetstream.client.connect(brokers, **tls_options(args, os.environ),
                                                **auth_options(args, os.environ)) as js:
                return await command(js, args)

        return asyncio.run(with_client())

    return run


def add_commands(commands: Any, client_flags: argparse.ArgumentParser) -> None:
    """Add the client commands to the `jetstream` subparsers; `client_flags` is the parent
    parser of --brokers and --json."""
    def leaf(group: Any, name: str, command: Command, help: str) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = group.add_parser(name, parents=[client_flags],
                                                           help=help, description=help)
        parser.set_defaults(func=_runner(command), prog=parser.prog)
        return parser

    streams = commands.add_parser("stream", help="create, list, describe and delete streams")
    group = streams.add_subparsers(dest="stream_command", required=True)
    create = leaf(group, "create", stream_create,
                  "create a stream (a no-op when it exists with the same config)")
    create.add_argument("name")
    create.add_argument("--subject", required=True, help="NATS subject (wildcards allowed)")
    create.add_argument("--partitions", type=int, default=1,
                        help="partition p > 0 reads SUBJECT.p (default 1)")
    create.add_argument("--ingest-group", help="a load-balance group: the subject's messages are "
                        "spread over the streams of this group")
    create.add_argument("--group", dest="deprecated_group", help=argparse.SUPPRESS)
    create.add_argument("--label", action="append", metavar="KEY=VALUE", help="repeatable")
    create.add_argument("--ack-policy", choices=["leader", "all", "none"])
    create.add_argument("--fsync", choices=["always", "interval", "never"])
    for flag in ("retention-ms", "retention-bytes", "retention-messages", "max-message-bytes",
                 "replication-factor", "min-isr"):
        create.add_argument(f"--{flag}", type=int, metavar="N")
    create.add_argument("--cleanup-policy", choices=["delete", "compact", "compact,delete"])
    for name, kind in _COMPACTION_FLAGS.items():
        if name != "cleanup_policy":
            create.add_argument("--" + name.replace("_", "-"), type=kind, metavar="N")
    for name, kind in _TIERED_FLAGS.items():
        create.add_argument("--" + name.replace("_", "-"), type=kind,
                            metavar="URL" if name == "fragment_store" else "VALUE")
    update = leaf(group, "update", stream_update,
                  "change settings of a stream (retention, cleanup policy, compaction, "
                  "segments, ack policy, fsync, largest message)")
    update.add_argument("name")
    for name, kind in _UPDATE_FLAGS.items():
        update.add_argument("--" + name.replace("_", "-"), type=_setting(kind), default=_UNSET,
                            metavar="VALUE", help="'none' for no limit" if kind is int else None)
    listing = leaf(group, "list", stream_list, "list streams")
    listing.add_argument("--selector", help="label selector, e.g. 'app=shop,env in (prod,stage)'")
    listing.add_argument("--all", action="store_true",
                         help="internal streams too (__offsets: committed offsets)")
    leaf(group, "info", stream_info, "describe a stream and its partitions").add_argument("name")
    leaf(group, "delete", stream_delete, "delete a stream and its data").add_argument("name")

    cli_groups.add_commands(commands, leaf)
    cli_datastreams.add_commands(commands, leaf)
    cli_kv.add_arguments(
        leaf(commands, "get", cli_kv.get, "print a key's latest value (compacted streams)"),
        leaf(commands, "keys", cli_kv.keys, "list live keys (compacted streams)"))
    cli_registers.add_arguments(leaf(
        commands, "registers", cli_registers.registers,
        "print a partition's registers (the labels publishes check and change)"))
    cli_scrub.add_arguments(leaf(
        commands, "scrub", cli_scrub.scrub,
        "check every byte of a stream's replicas now, heal what can be, print what is left"))
    fragments = commands.add_parser("fragments", help="a stream's history in its fragment "
                                    "store (tiered storage)")
    fragment_commands = fragments.add_subparsers(dest="fragments_command", required=True)
    cli_fragments.add_arguments(
        leaf(fragment_commands, "list", cli_fragments.fragments_list,
             "list fragments in the store and each partition's stored and local extents"),
        leaf(fragment_commands, "prune", cli_fragments.fragments_prune,
             "delete the history before an offset or a time, in the store and on disk"))
    cli_demo.add_arguments(leaf(commands, "demo", cli_demo.demo, "create the demo streams "
                                "(orders, customers, orders-enriched) and publish data for "
                                "the Spark jobs in spark/jobs"))
    publish = leaf(commands, "pub", pub, "publish a message (or --count N) and print the ack")
    publish.add_argument("subject")
    publish.add_argument("value", nargs="?", help="the message; '-' reads standard input")
    publish.add_argument("--file", metavar="PATH", help="read the message from a file")
    publish.add_argument("--key")
    publish.add_argument("--header", action="append", metavar="KEY=VALUE", help="repeatable")
    publish.add_argument("--ack-policy", choices=["leader", "all", "none"])
    publish.add_argument("--partition", type=int)
    publish.add_argument("--count", type=int, default=1,
                         help="publish N messages, pipelined; {i} in VALUE or --key is 1..N")
    publish.add_argument("--msg-id", help="deduplicated within the stream's "
                         "duplicate_window_ms: a retry is acked as a duplicate, not stored")
    publish.add_argument("--expected-offset", type=int, metavar="N",
                         help="fail with OFFSET_MISMATCH unless the message lands at N")
    publish.add_argument("--expected-last-offset-for-key", type=int, metavar="N",
                         help="fail with KEY_OFFSET_MISMATCH unless the key's latest record "
                              "is at N (-1: the key has none)")
    publish.add_argument("--check-registers", metavar="SELECTOR",
                         help="fail with REGISTER_MISMATCH unless the registers match")
    publish.add_argument("--union-register", dest="union_registers", action="append",
                         metavar="NAME=VALUE", help="set a register with the message")
    publish.add_argument("--subtract-register", dest="subtract_registers", action="append",
                         metavar="NAME=VALUE", help="remove a register (where equal)")

    subscribe = leaf(commands, "sub", sub, "print a partition's messages, or with --group "
                     "those a consumer group gives this member")
    subscribe.add_argument("stream")
    subscribe.add_argument("--group", help="join this consumer group: read the partitions it "
                           "assigns, from its committed offsets; commit and leave on exit")
    subscribe.add_argument("--reset", choices=["earliest", "latest", "error"],
                           default="earliest",
                           help="with --group: where a partition with no committed offset "
                                "starts")
    subscribe.add_argument("--partition", type=int, default=0)
    subscribe.add_argument("--from", dest="start", default="earliest", metavar="WHERE",
                           help=FROM_HELP)
    subscribe.add_argument("--follow", "-f", action="store_true",
                           help="keep waiting for new messages (Ctrl-C stops, status 0)")
    subscribe.add_argument("--max", type=int, metavar="N", help="stop after N messages")
    subscribe.add_argument("--format", choices=["text", "json"], default="text",
                           help="json: one object per line (--json too)")
    subscribe.add_argument("--read-replica", action="store_true",
                           help="read from any in-sync replica, not only the leader (it may "
                                "lag the leader; never past what it knows is committed)")

    add_security_commands(commands, leaf)
    cluster = commands.add_parser("cluster", help="cluster state")
    leaf(cluster.add_subparsers(dest="cluster_command", required=True), "status",
         cluster_status, "brokers (with each one's NATS URL and connection state, and "
                         "its data disk's use and whether it is full), the metadata leader, "
                         "and each partition's leader, ISR, epoch, HW and LEO (--json: each "
                         "replica's LEO too)")
