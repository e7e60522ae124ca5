"""The broker's NATS hot path, side by side: nats-py against `nats_ingest.IngestConnection`.

Theory of operation
- One nats-server on loopback per run. In this process, a subscriber that does what the
  broker's ingest does minus the log: take every message of `bench.in` in batches and publish
  one ack per message to its reply subject, in batches.
  - nats-py: a subscription without a callback; its private `_pending_queue` is drained in
    batches (giving back `_pending_size`, as the broker's fallback does) and the acks go out
    through `jetstream.server.nats_port.NatsPyNats.publish_many` (PUBs built in one bytes,
    queued with nats-py's `_send_command`): the broker's nats-py fallback path.
  - ingest: `sub.next_batch()` + `conn.publish_many()` + `await conn.drain()`.
- One publisher process (nats-py, raw `nc.publish(subject, payload, reply=...)`, 200k x
  128 B). Nobody subscribes to the ack subjects: the measurement is the subscriber process.
- Two modes. `live`: the publisher runs while the subscriber works; the rate is messages
  over the time from the first message received to the last ack flushed (a PING/PONG after
  the last ack). A live rate cannot exceed what the publisher sends: the publisher's own
  rate is reported next to it. `backlog`: the publisher runs while this process's event loop
  is blocked (the messages wait in the kernel and in nats-server, which buffers up to 64 MiB
  per client), then the subscriber drains the backlog: its capacity, whatever the publisher
  does. Both report the subscriber's CPU time per message (`time.process_time`), which is
  less sensitive to a noisy machine than wall time.
- Figures are medians of `--repeats` runs (sides interleaved); ratios are ingest / nats-py.

Run from the repository root: `python -m bench.nats_ingest_compare [--messages N]
[--repeats R] [--mode live|backlog|both] [--json] [--save]`. With --json the last line is
one JSON object; --save also writes it to bench/results/.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import nats

from jetstream.natsd import NatsServer
from jetstream.server.nats_ingest import connect as ingest_connect
from jetstream.server.nats_port import NatsPyNats

SUBJECT = "bench.in"
ACK_SUBJECT_PREFIX = "bench.ack"
PAYLOAD_BYTES = 128
ACK = b'{"stream":"bench","partition":0,"offset":1}'
BATCH_MSGS_MAX = 16_384
BATCH_BYTES_MAX = 8 * 1024 * 1024
RUN_TIMEOUT_S = 120.0
RESULTS_DIR = Path(__file__).parent / "results"
MODES = ("live", "backlog")

PUBLISHER = """
import asyncio, json, sys, time
import nats
async def main():
    url, count, size, prefix = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    nc = await nats.connect(url, pending_size=64 * 1024 * 1024)
    payload = b"x" * size
    publish = nc.publish
    started = time.perf_counter()
    for i in range(count):
        await publish("bench.in", payload, reply=f"{prefix}.{i}")
    await nc.flush(timeout=60)
    elapsed = time.perf_counter() - started
    await nc.close()
    print(json.dumps({"publish_msgs_per_s": count / elapsed}), flush=True)
asyncio.run(main())
"""


@dataclass(frozen=True, slots=True)
class Run:
    msgs_per_s: float
    cpu_us_per_msg: float
    publish_msgs_per_s: float
    received: int


def progress(message: str) -> None:
    print(f"  .. {message}", file=sys.stderr, flush=True)


def publisher_argv(url: str, count: int) -> list[str]:
    return [sys.executable, "-c", PUBLISHER, url, str(count), str(PAYLOAD_BYTES),
            ACK_SUBJECT_PREFIX]


def publisher_rate(stdout: bytes) -> float:
    return float(json.loads(stdout.decode().strip().splitlines()[-1])["publish_msgs_per_s"])


class Clock:
    """Wall and CPU seconds of this process from `start()` to `stop()`."""

    def __init__(self) -> None:
        self._wall = self._cpu = 0.0
        self.wall_s = self.cpu_s = 0.0

    def start(self) -> None:
        self._wall, self._cpu = time.perf_counter(), time.process_time()

    def stop(self) -> None:
        self.wall_s = time.perf_counter() - self._wall
        self.cpu_s = time.process_time() - self._cpu


async def run_side(url: str, count: int, mode: str,
                   consume: Callable[[Clock, bool], Awaitable[int]]) -> Run:
    """Start the publisher (blocking the loop in backlog mode), then let `consume` take
    `count` messages; it starts the clock on its first batch in live mode."""
    clock = Clock()
    if mode == "backlog":
        # Blocking on purpose: the event loop must not read while the backlog builds up.
        done = subprocess.run(  # noqa: ASYNC221
            publisher_argv(url, count), capture_output=True, check=True,
                              timeout=RUN_TIMEOUT_S)
        clock.start()
        received = await asyncio.wait_for(consume(clock, False), RUN_TIMEOUT_S)
        pub_rate = publisher_rate(done.stdout)
    else:
        proc = await asyncio.create_subprocess_exec(
            *publisher_argv(url, count), stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
        try:
            received = await asyncio.wait_for(consume(clock, True), RUN_TIMEOUT_S)
            stdout, _ = await asyncio.wait_for(proc.communicate(), RUN_TIMEOUT_S)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        pub_rate = publisher_rate(stdout)
    return Run(count / clock.wall_s, clock.cpu_s / count * 1e6, pub_rate, received)


async def nats_py_side(url: str, count: int, mode: str) -> Run:
    nc = await nats.connect(url, pending_size=64 * 1024 * 1024)
    sub = await nc.subscribe(SUBJECT)  # no callback: messages wait in sub._pending_queue
    for _ in range(2):  # see partition.py: the second PONG proves the SUB arrived
        await nc.flush()

    async def consume(clock: Clock, start_on_first: bool) -> int:
        queue: asyncio.Queue[Any] = sub._pending_queue
        received = 0
        while received < count:
            first = await queue.get()
            if start_on_first and received == 0:
                clock.start()
            msgs = [first]
            size = len(first.data)
            while len(msgs) < BATCH_MSGS_MAX and size < BATCH_BYTES_MAX:
                try:
                    msg = queue.get_nowait()
                except asyncio.QueueEmpty:
                    break
                msgs.append(msg)
                size += len(msg.data)
            sub._pending_size = max(0, sub._pending_size - size)
            received += len(msgs)
            await NatsPyNats(nc).publish_many([(msg.reply, ACK) for msg in msgs])
        await nc.flush(timeout=60)
        clock.stop()
        return received

    try:
        return await run_side(url, count, mode, consume)
    finally:
        await nc.close()


async def ingest_side(url: str, count: int, mode: str) -> Run:
    conn = await ingest_connect(url, name="bench-ingest")
    sub = conn.subscribe(SUBJECT)
    await conn.flush()

    async def consume(clock: Clock, start_on_first: bool) -> int:
        received = 0
        while received < count:
            msgs = await sub.next_batch(BATCH_MSGS_MAX, BATCH_BYTES_MAX)
            if start_on_first and received == 0:
                clock.start()
            received += len(msgs)
            conn.publish_many([(msg[1] or "", ACK) for msg in msgs])
            await conn.drain()
        await conn.flush(timeout_s=60)
        clock.stop()
        return received

    try:
        run = await run_side(url, count, mode, consume)
    finally:
        await conn.close()
    if sub.dropped:
        raise RuntimeError(f"ingest dropped {sub.dropped} messages")
    return run


SIDES: dict[str, Callable[[str, int, str], Awaitable[Run]]] = {
    "nats_py": nats_py_side,
    "ingest": ingest_side,
}


def summary(runs: Sequence[Run]) -> dict[str, Any]:
    return {
        "msgs_per_s": round(statistics.median(r.msgs_per_s for r in runs)),
        "cpu_us_per_msg": round(statistics.median(r.cpu_us_per_msg for r in runs), 2),
        "publish_msgs_per_s": round(statistics.median(r.publish_msgs_per_s for r in runs)),
        "runs_msgs_per_s": [round(r.msgs_per_s) for r in runs],
    }


async def measure(count: int, repeats: int, modes: Sequence[str]) -> dict[str, Any]:
    results: dict[str, Any] = {"messages": count, "payload_bytes": PAYLOAD_BYTES,
                               "repeats": repeats, "python": platform.python_version(),
                               "nats_py": importlib.metadata.version("nats-py"),
                               "cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory(prefix="nats-ingest-bench-") as work:
        for mode in modes:
            runs: dict[str, list[Run]] = {side: [] for side in SIDES}
            for attempt in range(repeats):
                for side, run in SIDES.items():
                    server_dir = Path(work) / f"{mode}-{side}-{attempt}"
                    with NatsServer(server_dir) as server:
                        result = await run(server.url, count, mode)
                    if result.received != count:
                        raise RuntimeError(f"{side} received {result.received} of {count}")
                    runs[side].append(result)
                    progress(f"{mode} {side} #{attempt + 1}: {result.msgs_per_s:,.0f} msg/s, "
                             f"{result.cpu_us_per_msg:.2f} us CPU/msg, publisher "
                             f"{result.publish_msgs_per_s:,.0f} msg/s")
            sides = {side: summary(side_runs) for side, side_runs in runs.items()}
            sides["ratio_msgs_per_s"] = round(
                sides["ingest"]["msgs_per_s"] / sides["nats_py"]["msgs_per_s"], 2)
            sides["ratio_cpu_per_msg"] = round(
                sides["nats_py"]["cpu_us_per_msg"] / sides["ingest"]["cpu_us_per_msg"], 2)
            results[mode] = sides
    return results


def print_table(results: dict[str, Any], modes: Sequence[str]) -> None:
    print(f"{results['messages']:,} x {results['payload_bytes']} B, medians of "
          f"{results['repeats']}; subscriber = receive + one ack per message")
    print(f"{'mode':<8} {'client':<8} {'msgs/s':>10} {'CPU us/msg':>11} {'publisher/s':>12}")
    for mode in modes:
        for side in SIDES:
            row = results[mode][side]
            print(f"{mode:<8} {side:<8} {row['msgs_per_s']:>10,} {row['cpu_us_per_msg']:>11} "
                  f"{row['publish_msgs_per_s']:>12,}")
        print(f"{mode:<8} {'ratio':<8} {results[mode]['ratio_msgs_per_s']:>9}x "
              f"{results[mode]['ratio_cpu_per_msg']:>10}x   (ingest vs nats-py)")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--mode", choices=(*MODES, "both"), default="both")
    parser.add_argument("--json", action="store_true", help="print one JSON object last")
    parser.add_argument("--save", action="store_true",
                        help=f"also write the JSON to {RESULTS_DIR}/")
    args = parser.parse_args(argv)
    if args.messages < 1 or args.repeats < 1:
        parser.error("--messages and --repeats must be >= 1")
    modes = MODES if args.mode == "both" else (args.mode,)
    results = asyncio.run(measure(args.messages, args.repeats, modes))
    print_table(results, modes)
    if args.save:
        RESULTS_DIR.mkdir(exist_ok=True)
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        (RESULTS_DIR / f"nats-ingest-compare-{stamp}.json").write_text(
            json.dumps(results, indent=1))
    if args.json:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
