"""The fault suite's workload process: a writer publishing unique values with ack `all` at a
steady rate (each publish on its own, so writes keep coming while a leader is down), and one
following consumer per partition, every event written to a history file.

Run as `python -m tests.faults.workload --brokers ... --nats-url ... --stream S --subject X
--partitions N --history FILE`; it runs until SIGTERM, then stops invoking, waits for the
publishes in flight (each has its own timeout) and exits 0.

History (JSON lines, wall-clock seconds, one line per event, flushed as written):

    {"e": "i", "v": value, "t": t}                          a publish is about to be sent
    {"e": "a", "v": value, "t": t, "p": part, "o": offset}  its ack arrived
    {"e": "f", "v": value, "t": t, "c": code}               it failed (ACK_TIMEOUT: unknown)
    {"e": "r", "v": value, "t": t, "p": part, "o": offset}  the consumer read it

A value is written once and never retried, so any value found twice in a log is a duplicate
made by the cluster, and any value found but never invoked is a phantom.

With `--retry-ids` every publish carries its value as its message id and is sent again (same
id) after each failure until it is acked, as a NATS client retrying on timeouts does: a
value found twice is then a duplicate the dedupe window let through. A publish still unacked
RETRY_DEADLINE_S after the workload was told to stop is recorded as failed.

With `--group G --members N` the stream is read by N members of consumer group G instead
(each with a client of its own, committing every COMMIT_S), and an observer reads the group's
committed offsets every OBSERVE_S:

    {"e": "g", "v": value, "t": t, "p": part, "o": offset, "m": member}   consumed
    {"e": "c", "v": "", "t": t, "p": part, "o": offset, "m": member}      commit acknowledged
    {"e": "cf", "v": "", "t": t, "p": part, "o": offset, "m": member, "c": code}  refused
    {"e": "o", "v": "", "t": t, "ts": sent, "p": part, "o": offset}       committed offset

After SIGTERM the writer stops, the members go on until the group has committed everything
acked (or GROUP_DRAIN_S passed), then commit, leave and stop.

With `--keys N` (a compacted stream) the writes go to N keys round-robin, every one carrying
its value in a `w` header too, and with `--delete-every M` every M-th write is a tombstone
(a null value) of its key; invokes then record the key (`"k"`) and deletes (`"d": 1`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import time
from typing import IO, Any

import jetstream
from jetstream.client.group_subscription import GroupSubscription
from jetstream.client.types import Start
from jetstream.errors import JetstreamError
from jetstream.security.tls import TlsArguments

PUBLISH_TIMEOUT_S = 5.0
RETRY_S = 0.2
TICK_S = 0.01
COMMIT_S = 0.2
OBSERVE_S = 0.2
GROUP_DRAIN_S = 40.0
GROUP_SESSION_MS = 6000
RETRY_DEADLINE_S = 30.0


class History:
    def __init__(self, out: IO[str]) -> None:
        self._out = out

    def write(self, event: str, value: str, **fields: Any) -> None:
        self._out.write(json.dumps({"e": event, "v": value, "t": time.time(), **fields},
                                   separators=(",", ":")) + "\n")
        self._out.flush()


async def writer(js: jetstream.Client, args: argparse.Namespace, history: History,
                 stop: asyncio.Event, acked: Acked | None = None) -> None:
    """Send `args.rate` publishes a second, each on its own (at most `args.inflight` waiting
    for their acks), so that writes keep coming while a leader is down."""
    inflight = asyncio.Semaphore(args.inflight)
    tasks: set[asyncio.Task[None]] = set()
    seq = 0
    started = time.monotonic()
    while not stop.is_set():
        due = int((time.monotonic() - started) * args.rate)
        while seq < due and not stop.is_set():
            await inflight.acquire()
            task = asyncio.create_task(publish(js, f"v{seq}", args, history, seq, acked))
            task.add_done_callback(lambda _t: inflight.release())
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            seq += 1
        await _wait(stop, TICK_S)
    await asyncio.gather(*tasks, return_exceptions=True)


async def publish(js: jetstream.Client, value: str, args: argparse.Namespace,
                  history: History, seq: int, acked: Acked | None = None) -> None:
    if args.keys:
        key = f"k{seq % args.keys}"
        delete = bool(args.delete_every) and seq % args.delete_every == args.delete_every - 1
        history.write("i", value, k=key, **({"d": 1} if delete else {}))
        payload, headers = (None if delete else value.encode()), {"w": value.encode()}
    else:
        key, payload, headers = value, value.encode(), None
        history.write("i", value)
    deadline = time.monotonic() + RETRY_DEADLINE_S
    while True:
        try:
            ack = await js.publish(args.subject, payload, key=key.encode(), headers=headers,
                                   ack_policy="all", timeout=PUBLISH_TIMEOUT_S,
                                   msg_id=value if args.retry_ids else None)
            break
        except (JetstreamError, TimeoutError, OSError) as exc:
            if not args.retry_ids or (args.stopping.is_set() and time.monotonic() > deadline):
                history.write("f", value, c=getattr(exc, "code", type(exc).__name__))
                return
            if not args.stopping.is_set():
                deadline = time.monotonic() + RETRY_DEADLINE_S
            await asyncio.sleep(RETRY_S)
    assert ack is not None
    history.write("a", value, p=ack.partition, o=ack.offset)
    if acked is not None:
        acked.ends[ack.partition] = max(acked.ends.get(ack.partition, -1), ack.offset)


async def consumer(js: jetstream.Client, partition: int, args: argparse.Namespace,
                   history: History, stop: asyncio.Event) -> None:
    """Follow the partition from offset 0, resuming after the last offset read on errors."""
    next_offset = 0
    while not stop.is_set():
        try:
            async with js.subscribe(args.stream, partition, start=Start.OFFSET,
                                    offset=next_offset, max_wait_ms=500) as sub:
                async for message in sub:
                    written = message.headers.get("w", message.value or b"")
                    history.write("r", written.decode(errors="replace"),
                                  p=partition, o=message.offset)
                    next_offset = message.offset + 1
                    if stop.is_set():
                        return
        except (TimeoutError, JetstreamError, OSError):
            await _wait(stop, RETRY_S)


class Acked:
    """The highest acked offset of each partition (what the group must commit past)."""

    def __init__(self) -> None:
        self.ends: dict[int, int] = {}


async def group_member(args: argparse.Namespace, name: str, history: History,
                       finished: asyncio.Event) -> None:
    """A member of the group with a client of its own: consume, record, commit every
    COMMIT_S under its member id and epoch; join again after any error."""
    async with jetstream.connect(args.brokers, request_timeout_s=5.0, **tls(args)) as js:
        while not finished.is_set():
            positions: dict[tuple[str, int], int] = {}
            try:
                async with js.subscribe(args.stream, group=args.group, auto_commit=False,
                                        session_timeout_ms=GROUP_SESSION_MS,
                                        max_wait_ms=200) as member:
                    reader = asyncio.create_task(_consume(member, name, positions, history))
                    while not finished.is_set() and not reader.done():
                        await _wait(finished, COMMIT_S)
                        await _commit(js, args.group, member, name, positions, history)
                    failure = reader.exception() if reader.done() else None
                    reader.cancel()
                    await asyncio.gather(reader, return_exceptions=True)
                    if failure is not None:
                        raise failure
                    await _commit(js, args.group, member, name, positions, history)
            except (TimeoutError, JetstreamError, OSError):
                await _wait(finished, RETRY_S)


async def _consume(member: GroupSubscription, name: str, positions: dict[tuple[str, int], int],
                   history: History) -> None:
    async for message in member:
        history.write("g", (message.value or b"").decode(errors="replace"),
                      p=message.partition, o=message.offset, m=name)
        positions[(message.stream, message.partition)] = message.offset + 1


async def _commit(js: jetstream.Client, group: str, member: GroupSubscription, name: str,
                  positions: dict[tuple[str, int], int], history: History) -> None:
    held = member.assignment
    offsets = {k: v for k, v in positions.items() if k in held}
    if not offsets or not member.member_id:
        return
    failed: dict[tuple[str, int], str] = {}
    try:
        refused = await js.commit_offsets(group, offsets, member_id=member.member_id,
                                          member_epoch=member.member_epoch)
        failed = {k: exc.code for k, exc in refused.items()}
    except (TimeoutError, JetstreamError, OSError) as exc:
        failed = dict.fromkeys(offsets, getattr(exc, "code", type(exc).__name__))
    for key, offset in offsets.items():
        if key in failed:
            history.write("cf", "", p=key[1], o=offset, m=name, c=failed[key])
        else:
            history.write("c", "", p=key[1], o=offset, m=name)


async def observer(js: jetstream.Client, args: argparse.Namespace, history: History,
                   acked: Acked, writing_done: asyncio.Event,
                   finished: asyncio.Event) -> None:
    """Record the group's committed offsets every OBSERVE_S; once the writer is done and
    the group committed past every acked offset (or GROUP_DRAIN_S passed), finish."""
    drain_deadline: float | None = None
    while not finished.is_set():
        sent = time.time()
        try:
            committed = await js.fetch_offsets(args.group)
        except (TimeoutError, JetstreamError, OSError):
            committed = None
        if committed is not None:
            for (_stream, partition), value in sorted(committed.items()):
                history.write("o", "", ts=sent, p=partition, o=value.offset)
        if writing_done.is_set():
            if drain_deadline is None:
                drain_deadline = time.monotonic() + GROUP_DRAIN_S
            done = committed is not None and all(
                (args.stream, p) in committed and committed[(args.stream, p)].offset > end
                for p, end in acked.ends.items())
            if done or time.monotonic() > drain_deadline:
                finished.set()
        await asyncio.sleep(OBSERVE_S)


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


def tls(args: argparse.Namespace) -> TlsArguments:
    """The client's TLS files (none: plain)."""
    return {"tls_ca": args.tls_ca, "tls_cert": args.tls_cert, "tls_key": args.tls_key}


async def main(args: argparse.Namespace) -> None:
    stop = args.stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    with open(args.history, "a", encoding="utf-8") as out:  # noqa: ASYNC230 (once, at start)
        history = History(out)
        async with jetstream.connect(args.brokers, nats_url=args.nats_url,
                                     request_timeout_s=5.0, **tls(args)) as js:
            if args.group:
                await run_group(js, args, history, stop)
                return
            writers = [asyncio.create_task(writer(js, args, history, stop))]
            readers = [asyncio.create_task(consumer(js, p, args, history, stop))
                       for p in range(args.partitions)]
            await stop.wait()
            await asyncio.gather(*writers, return_exceptions=True)
            for task in readers:
                task.cancel()
            await asyncio.gather(*readers, return_exceptions=True)


async def run_group(js: jetstream.Client, args: argparse.Namespace, history: History,
                    stop: asyncio.Event) -> None:
    acked, writing_done, finished = Acked(), asyncio.Event(), asyncio.Event()
    members = [asyncio.create_task(group_member(args, f"m{i}", history, finished))
               for i in range(args.members)]
    watcher = asyncio.create_task(observer(js, args, history, acked, writing_done, finished))
    await writer(js, args, history, stop, acked)
    writing_done.set()
    await finished.wait()
    await asyncio.gather(*members, return_exceptions=True)
    watcher.cancel()
    await asyncio.gather(watcher, return_exceptions=True)
    final = await js.fetch_offsets(args.group)
    for (_stream, partition), value in sorted(final.items()):
        history.write("o", "", ts=time.time(), p=partition, o=value.offset)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.faults.workload")
    parser.add_argument("--brokers", required=True)
    parser.add_argument("--nats-url", required=True)
    parser.add_argument("--stream", required=True)
    parser.add_argument("--subject", required=True)
    parser.add_argument("--partitions", type=int, default=1)
    parser.add_argument("--rate", type=int, default=400, help="publishes per second")
    parser.add_argument("--inflight", type=int, default=4000, help="most awaiting acks")
    parser.add_argument("--history", required=True)
    parser.add_argument("--keys", type=int, default=0, help="compacted: write to N keys")
    parser.add_argument("--delete-every", type=int, default=0, help="every M-th a tombstone")
    parser.add_argument("--group", default="", help="read with this consumer group")
    parser.add_argument("--members", type=int, default=3, help="the group's members")
    parser.add_argument("--tls-ca", help="TLS: the brokers' CA (its client also to NATS)")
    parser.add_argument("--tls-cert", help="TLS: this client's certificate")
    parser.add_argument("--tls-key", help="TLS: this client's key")
    parser.add_argument("--retry-ids", action="store_true",
                        help="retry every unacked publish with its value as message id")
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
