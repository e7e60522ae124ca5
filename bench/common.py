"""What the benchmarks share: percentiles, a process's CPU time, the pipelined raw NATS
publisher (the fastest nats-py path: `nc.publish(subject, payload, reply=inbox.N)` with one
`inbox.*` subscription; see FIELD_NOTES) that loads both sides of a comparison, the same
publisher at a fixed offered rate (latency under a given load), the no-op responder that
measures the load generator's own ceiling, and the command line."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import nats

from jetstream.server.process import BrokerProcess
from jetstream.stream.config import MiB

JsonObject = dict[str, Any]
#: (subject, payload, headers) of one publish.
Message = tuple[str, bytes, dict[str, str] | None]
ACK_TIMEOUT_S = 300.0
RESULTS_DIR = Path(__file__).parent / "results"


def percentile(samples: Sequence[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p / 100))] if ordered else 0.0


def _process_stats() -> Iterator[tuple[int, list[str]]]:
    """(pid, the fields of /proc/<pid>/stat after the command name) of every process."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            yield int(stat.parent.name), stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue  # exited meanwhile


def children(pid: int) -> list[int]:
    """The PIDs of the process's children running now."""
    return [child for child, fields in _process_stats()
            if fields[1] == str(pid) and fields[0] != "Z"]


async def until_children(pid: int, count: int, deadline_s: float = 30.0) -> None:
    """Wait until the process runs at least `count` children (a broker's worker processes,
    started when it first holds a compacted partition) and they have settled: a baseline
    taken while they start measures their start."""
    started = time.monotonic()
    while len(children(pid)) < count:
        if time.monotonic() - started > deadline_s:
            raise RuntimeError(f"process {pid} did not start {count} children")
        await asyncio.sleep(0.05)
    await settled(pid, deadline_s - (time.monotonic() - started))


async def settled(pid: int, deadline_s: float = 30.0) -> None:
    """Wait (at most `deadline_s`) until the process and its children have been nearly idle
    for a quarter second: under 20 ms of CPU."""
    started = time.monotonic()
    before = cpu_seconds(pid)
    while time.monotonic() - started < deadline_s:
        await asyncio.sleep(0.25)
        now = cpu_seconds(pid)
        if now - before < 0.02:
            return
        before = now


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) of the process and of its children: those running now
    (a broker's worker processes) and those it has waited for."""
    total = 0
    for found, fields in _process_stats():
        if found == pid:  # utime, stime, cutime, cstime
            total += sum(int(f) for f in fields[11:15])
        elif fields[1] == str(pid):
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


RESPONDER = """
import asyncio, sys
import nats
async def main():
    nc = await nats.connect(sys.argv[1])
    async def on(msg):
        await nc.publish(msg.reply, b'+OK')
    await nc.subscribe(sys.argv[2], cb=on, pending_msgs_limit=1_000_000)
    await nc.flush()
    print("ready", flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""


@contextlib.contextmanager
def no_op_responder(url: str, subject: str) -> Iterator[None]:
    """A process that answers every message on `subject` with `+OK` (core NATS, nothing
    stored), for the load generator's ceiling; stopped by PID on exit."""
    responder = subprocess.Popen([sys.executable, "-c", RESPONDER, url, subject],
                                 stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        assert responder.stdout is not None
        if responder.stdout.readline().strip() != b"ready":
            raise RuntimeError("the no-op responder did not start")
        yield
    finally:
        responder.kill()
        responder.wait()


# -- the publisher --------------------------------------------------------------------------

async def publish_pipelined(url: str, messages: Sequence[Message], window: int,
                            **connect_options: Any) -> JsonObject:
    """`connect_options` go to nats-py's connect (`tls=`, credentials)."""
    nc = await nats.connect(url, pending_size=64 * MiB, **connect_options)
    inbox = nc.new_inbox()
    count = len(messages)
    sent_at = [0.0] * count
    latencies: list[float] = []
    state = {"in_flight": 0, "acked": 0, "errors": 0}
    room, done = asyncio.Event(), asyncio.Event()

    async def on_ack(msg: Any) -> None:
        latencies.append(time.perf_counter() - sent_at[int(msg.subject.rsplit(".", 1)[1])])
        if b'"error"' in msg.data:
            state["errors"] += 1
        state["acked"] += 1
        state["in_flight"] -= 1
        room.set()
        if state["acked"] == count:
            done.set()

    await nc.subscribe(inbox + ".*", cb=on_ack, pending_msgs_limit=10 * window)
    await nc.flush()
    started = time.perf_counter()
    for i, (subject, payload, headers) in enumerate(messages):
        while state["in_flight"] >= window:
            room.clear()
            await room.wait()
        sent_at[i] = time.perf_counter()
        state["in_flight"] += 1
        await nc.publish(subject, payload, reply=f"{inbox}.{i}", headers=headers)
    await asyncio.wait_for(done.wait(), ACK_TIMEOUT_S)
    elapsed = time.perf_counter() - started
    await nc.close()
    return {"puts_per_s": count / elapsed, "ack_p50_ms": percentile(latencies, 50) * 1000,
            "ack_p99_ms": percentile(latencies, 99) * 1000, "errors": state["errors"]}


async def publish_paced(url: str, subject: str, payload: bytes, rate: int, start: float,
                        warmup_s: float, measure_s: float) -> JsonObject:
    """`payload` on `subject` at `rate` a second from `start` (a perf_counter time) for
    `warmup_s + measure_s`, the raw publisher's way, at most one second's worth un-acked.
    Each ack's latency runs from the time its message was due, so a publisher that falls
    behind shows in it (`send_lag_p99_ms` says by how much); the figures count the messages
    due after the warm-up."""
    assert rate > 0 and measure_s > 0
    count = round(rate * (warmup_s + measure_s))
    first = round(rate * warmup_s)
    in_flight_max = rate
    due_at = [start + i / rate for i in range(count)]
    latencies = [0.0] * count
    lags = [0.0] * count
    state = {"in_flight": 0, "acked": 0, "errors": 0, "last_ack": 0.0}
    room, done = asyncio.Event(), asyncio.Event()
    nc = await nats.connect(url, pending_size=64 * MiB)
    inbox = nc.new_inbox()

    async def on_ack(msg: Any) -> None:
        now = time.perf_counter()
        i = int(msg.subject.rsplit(".", 1)[1])
        latencies[i] = now - due_at[i]
        if b'"error"' in msg.data:
            state["errors"] += 1
        state["last_ack"] = now
        state["acked"] += 1
        state["in_flight"] -= 1
        room.set()
        if state["acked"] == count:
            done.set()

    try:
        await nc.subscribe(inbox + ".*", cb=on_ack, pending_msgs_limit=10 * in_flight_max)
        await nc.flush()
        await asyncio.sleep(max(0.0, start - time.perf_counter()))
        i = 0
        while i < count:
            due = min(count, int((time.perf_counter() - start) * rate) + 1)
            while i < due:
                while state["in_flight"] >= in_flight_max:
                    room.clear()
                    await room.wait()
                lags[i] = time.perf_counter() - due_at[i]
                state["in_flight"] += 1
                await nc.publish(subject, payload, reply=f"{inbox}.{i}")
                i += 1
            if i < count:
                await asyncio.sleep(max(0.0, due_at[i] - time.perf_counter()))
        await asyncio.wait_for(done.wait(), ACK_TIMEOUT_S)
    finally:
        await nc.close()
    measured = latencies[first:]
    return {"offered_msgs_per_s": rate, "messages": len(measured),
            "msgs_per_s": len(measured) / (state["last_ack"] - due_at[first]),
            "ack_p50_ms": percentile(measured, 50) * 1000,
            "ack_p99_ms": percentile(measured, 99) * 1000,
            "ack_max_ms": max(measured) * 1000,
            "send_lag_p99_ms": percentile(lags[first:], 99) * 1000,
            "errors": int(state["errors"])}


async def start_together(brokers: Sequence[BrokerProcess], deadline_s: float) -> None:
    """Launch every broker, then wait until each is ready: brokers of a cluster become ready
    only together, once a majority of them runs."""
    for broker in brokers:
        broker.start(wait=False)
    for broker in brokers:
        await asyncio.to_thread(broker.wait_ready, deadline_s)


def bench_main(name: str, doc: str | None, argv: Sequence[str] | None,
               run: Callable[[bool], Coroutine[Any, Any, JsonObject]],
               table: Callable[[JsonObject], str]) -> int:
    """A bench's command line: `--quick` (`run(True)`), `--json` (one JSON object last); a
    full run also writes its JSON to bench/results/<name>-<time>.json."""
    parser = argparse.ArgumentParser(description=(doc or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a run of a minute or two")
    parser.add_argument("--json", action="store_true", help="print one JSON object last")
    args = parser.parse_args(argv)
    results = asyncio.run(run(args.quick))
    print(table(results))
    if not args.quick:
        write_results(name, results)
    if args.json:
        print(json.dumps(results))
    return 0


def write_results(name: str, results: JsonObject) -> Path:
    """`results` as bench/results/<name>-<UTC time>.json; its path."""
    RESULTS_DIR.mkdir(exist_ok=True)
    path = RESULTS_DIR / f"{name}-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}.json"
    path.write_text(json.dumps(results, indent=1))
    return path
