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
from jetstream.client.types import Start
from jetstream.errors import JetstreamError

PUBLISH_TIMEOUT_S = 5.0
RETRY_S = 0.2
TICK_S = 0.01


class History:
    def __init__(self, out: IO[str]) -> None:
        self._out = out

    def write(self, event: str, value: str, **fields: Any) -> None:
        self._out.write(json.dumps({"e": event, "v": value, "t": time.time(), **fields},
                                   separators=(",", ":")) + "\n")
        self._out.flush()


async def writer(js: jetstream.Client, args: argparse.Namespace, history: History,
                 stop: asyncio.Event) -> None:
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
            task = asyncio.create_task(publish(js, f"v{seq}", args, history, seq))
            task.add_done_callback(lambda _t: inflight.release())
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            seq += 1
        await _wait(stop, TICK_S)
    await asyncio.gather(*tasks, return_exceptions=True)


async def publish(js: jetstream.Client, value: str, args: argparse.Namespace,
                  history: History, seq: int) -> None:
    if args.keys:
        key = f"k{seq % args.keys}"
        delete = bool(args.delete_every) and seq % args.delete_every == args.delete_every - 1
        history.write("i", value, k=key, **({"d": 1} if delete else {}))
        payload, headers = (None if delete else value.encode()), {"w": value.encode()}
    else:
        key, payload, headers = value, value.encode(), None
        history.write("i", value)
    try:
        ack = await js.publish(args.subject, payload, key=key.encode(), headers=headers,
                               ack_policy="all", timeout=PUBLISH_TIMEOUT_S)
    except JetstreamError as exc:
        history.write("f", value, c=exc.code)
        return
    except (TimeoutError, OSError) as exc:
        history.write("f", value, c=type(exc).__name__)
        return
    assert ack is not None
    history.write("a", value, p=ack.partition, o=ack.offset)


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


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


async def main(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    with open(args.history, "a", encoding="utf-8") as out:  # noqa: ASYNC230 (once, at start)
        history = History(out)
        async with jetstream.connect(args.brokers, nats_url=args.nats_url,
                                     request_timeout_s=5.0) as js:
            writers = [asyncio.create_task(writer(js, args, history, stop))]
            readers = [asyncio.create_task(consumer(js, p, args, history, stop))
                       for p in range(args.partitions)]
            await stop.wait()
            await asyncio.gather(*writers, return_exceptions=True)
            for task in readers:
                task.cancel()
            await asyncio.gather(*readers, return_exceptions=True)


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
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
