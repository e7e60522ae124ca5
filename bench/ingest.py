"""Ingest and catch-up reads of one broker, side by side with NATS JetStream and core NATS.

Theory of operation
- One publisher pattern for every side, in this process, with nats-py: raw
  `nc.publish(subject, payload, reply=f"{inbox}.{i}")`, at most `window` messages un-acked,
  one wildcard subscription on `inbox.*` counting acks and timing each one from its publish.
  This is the fastest nats-py path to JetStream (FIELD_NOTES: 2-3x `publish_async`), so the
  peer is measured at its best.
- (a) Jetstream: an embedded-free setup (one plain nats-server, one broker process), one
  stream, 128 B messages, ack policy `leader`, fsync `interval` (closest to JetStream's
  default, which fsyncs every 2 minutes). (b) NATS JetStream R1, file storage, on the same
  subject. (c) The ceiling: core NATS with a responder process that answers each message
  (pub -> sub -> reply with no storage at all).
- The durable pair: (a) with fsync `always` (one fsync covers a whole batch and batches
  overlap their fsyncs) against JetStream with `sync_interval: always` (one fsync per
  message).
- Catch-up: a stream holding `catchup` messages is read from the start: our client's
  `subscribe(start=EARLIEST, stop="latest")` against JetStream's fastest nats-py read paths,
  an ordered push consumer and a hand-rolled pull loop (batches of 1000, callback), the best
  of which is the peer.
- Every side runs in fresh server processes in a temp dir on loopback, stopped by PID.
  Figures are medians over `repeats` runs; the machine is shared and noisy.

Run from the repository root: `python -m bench.ingest [--quick] [--json]`. The last line of
--json output is one JSON object; a full run also writes it to bench/results/.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import nats

import jetstream
from bench.common import JsonObject, no_op_responder, publish_pipelined
from jetstream.natsd import NatsServer
from jetstream.server.process import BrokerProcess

PAYLOAD = b"x" * 128
SUBJECT = "bench.in"
ACK_TIMEOUT_S = 120.0
RESULTS_DIR = Path(__file__).parent / "results"


@dataclass(frozen=True, slots=True)
class Plan:
    messages: int
    always_messages: int
    jetstream_always_messages: int
    catchup: int
    window: int
    repeats: int


QUICK = Plan(messages=40_000, always_messages=40_000, jetstream_always_messages=4_000,
             catchup=200_000, window=4000, repeats=1)
FULL = Plan(messages=200_000, always_messages=200_000, jetstream_always_messages=20_000,
            catchup=1_000_000, window=4000, repeats=3)


@dataclass(frozen=True, slots=True)
class PubRun:
    msgs_per_s: float
    ack_p50_ms: float
    ack_p99_ms: float
    errors: int


def progress(message: str) -> None:
    print(f"  .. {message}", file=sys.stderr, flush=True)


# -- the publisher pattern ----------------------------------------------------------------------


async def publish_with_acks(url: str, subject: str, count: int, window: int) -> PubRun:
    """`count` PAYLOAD messages on `subject` through the pipelined publisher of bench.common."""
    run = await publish_pipelined(url, [(subject, PAYLOAD, None)] * count, window)
    return PubRun(run["puts_per_s"], run["ack_p50_ms"], run["ack_p99_ms"], run["errors"])


def median_run(runs: Sequence[PubRun]) -> JsonObject:
    return {
        "msgs_per_s": statistics.median(r.msgs_per_s for r in runs),
        "ack_p50_ms": statistics.median(r.ack_p50_ms for r in runs),
        "ack_p99_ms": statistics.median(r.ack_p99_ms for r in runs),
        "errors": sum(r.errors for r in runs),
        "runs": [round(r.msgs_per_s) for r in runs],
    }


async def repeat(plan: Plan, run: Callable[[], Awaitable[PubRun]]) -> JsonObject:
    return median_run([await run() for _ in range(plan.repeats)])


# -- the sides -----------------------------------------------------------------------------------


async def ours(work: Path, plan: Plan, fsync: str, count: int) -> JsonObject:
    with NatsServer(work / f"nats-ours-{fsync}") as server:
        broker = BrokerProcess(work / f"broker-{fsync}", server.url,
                               extra_args=("--http-port", "-1")).start()
        try:
            async with jetstream.connect(broker.address) as js:
                await js.create_stream("bench", SUBJECT, fsync=fsync, ack_policy="leader")
            return await repeat(plan, lambda: publish_with_acks(server.url, SUBJECT, count,
                                                                plan.window))
        finally:
            broker.stop()


async def jetstream_peer(work: Path, plan: Plan, always: bool, count: int) -> JsonObject:
    config = {"jetstream": {"sync_interval": "always"}} if always else None
    with NatsServer(work / f"nats-js-{always}", jetstream=True, config=config) as server:
        nc = await nats.connect(server.url)
        await nc.jetstream().add_stream(name="BENCH", subjects=[SUBJECT], storage="file")
        await nc.close()
        return await repeat(plan, lambda: publish_with_acks(server.url, SUBJECT, count,
                                                            plan.window))


async def core_ceiling(work: Path, plan: Plan) -> JsonObject:
    with NatsServer(work / "nats-core") as server, no_op_responder(server.url, SUBJECT):
        return await repeat(plan, lambda: publish_with_acks(server.url, SUBJECT,
                                                            plan.messages, plan.window))


# -- catch-up reads --------------------------------------------------------------------------


async def ours_catchup(work: Path, plan: Plan) -> JsonObject:
    with NatsServer(work / "nats-catchup") as server:
        broker = BrokerProcess(work / "broker-catchup", server.url,
                               extra_args=("--http-port", "-1")).start()
        try:
            async with jetstream.connect(broker.address) as js:
                await js.create_stream("catchup", SUBJECT, fsync="never", ack_policy="leader")
            progress(f"filling our stream with {plan.catchup} messages")
            await publish_with_acks(server.url, SUBJECT, plan.catchup, plan.window)
            rates = []
            for _ in range(plan.repeats):
                async with jetstream.connect(broker.address) as js:
                    started = time.perf_counter()
                    seen = 0
                    async for _msg in js.subscribe("catchup", start=jetstream.Start.EARLIEST,
                                                   stop="latest"):
                        seen += 1
                    rates.append(seen / (time.perf_counter() - started))
                    if seen != plan.catchup:
                        raise RuntimeError(f"read {seen} of {plan.catchup} messages")
            return {"msgs_per_s": statistics.median(rates), "runs": [round(r) for r in rates]}
        finally:
            broker.stop()


async def jetstream_ordered_push(url: str, count: int) -> float:
    nc = await nats.connect(url)
    js = nc.jetstream()
    done = asyncio.Event()
    seen = 0

    async def on(_msg: Any) -> None:
        nonlocal seen
        seen += 1
        if seen == count:
            done.set()

    started = time.perf_counter()
    sub = await js.subscribe(SUBJECT, ordered_consumer=True, cb=on,
                             pending_msgs_limit=1_000_000)
    await asyncio.wait_for(done.wait(), ACK_TIMEOUT_S)
    elapsed = time.perf_counter() - started
    await sub.unsubscribe()
    await nc.close()
    return count / elapsed


async def jetstream_pull_loop(url: str, count: int, name: str) -> float:
    """Pull requests of 1000 sent by hand, two in flight, a callback counting messages."""
    nc = await nats.connect(url)
    js = nc.jetstream()
    await js.add_consumer("BENCH", durable_name=name, ack_policy="none")
    inbox = nc.new_inbox()
    done = asyncio.Event()
    seen = 0
    batch = 1000
    next_subject = f"$JS.API.CONSUMER.MSG.NEXT.BENCH.{name}"
    request = json.dumps({"batch": batch, "expires": 5_000_000_000}).encode()

    async def on(msg: Any) -> None:
        nonlocal seen
        if msg.headers and msg.headers.get("Status"):
            return  # 404/408: request expired or no more messages
        seen += 1
        if seen % batch == 0 and seen < count:
            await nc.publish(next_subject, request, reply=inbox)
        if seen == count:
            done.set()

    await nc.subscribe(inbox, cb=on, pending_msgs_limit=1_000_000)
    started = time.perf_counter()
    await nc.publish(next_subject, request, reply=inbox)
    await nc.publish(next_subject, request, reply=inbox)
    await asyncio.wait_for(done.wait(), ACK_TIMEOUT_S)
    elapsed = time.perf_counter() - started
    await nc.close()
    return count / elapsed


async def jetstream_catchup(work: Path, plan: Plan) -> dict[str, Any]:
    with NatsServer(work / "nats-js-catchup", jetstream=True) as server:
        nc = await nats.connect(server.url)
        await nc.jetstream().add_stream(name="BENCH", subjects=[SUBJECT], storage="file")
        await nc.close()
        progress(f"filling the JetStream stream with {plan.catchup} messages")
        await publish_with_acks(server.url, SUBJECT, plan.catchup, plan.window)
        push = [await jetstream_ordered_push(server.url, plan.catchup)
                for _ in range(plan.repeats)]
        pull = [await jetstream_pull_loop(server.url, plan.catchup, f"pull{i}")
                for i in range(plan.repeats)]
        return {"ordered_push_msgs_per_s": statistics.median(push),
                "pull_loop_msgs_per_s": statistics.median(pull),
                "best_msgs_per_s": max(statistics.median(push), statistics.median(pull))}


# -- the run -------------------------------------------------------------------------------------


async def run(plan: Plan, quick: bool) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="bench-ingest-"))
    try:
        progress("ours, fsync interval, ack leader")
        a = await ours(work, plan, "interval", plan.messages)
        progress("NATS JetStream R1, file storage, default sync")
        b = await jetstream_peer(work, plan, False, plan.messages)
        progress("core NATS responder (ceiling)")
        c = await core_ceiling(work, plan)
        progress("ours, fsync always")
        a_always = await ours(work, plan, "always", plan.always_messages)
        progress("NATS JetStream R1, sync_interval always")
        b_always = await jetstream_peer(work, plan, True, plan.jetstream_always_messages)
        progress("catch-up reads")
        ours_read = await ours_catchup(work, plan)
        peer_read = await jetstream_catchup(work, plan)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {
        "benchmark": "ingest", "mode": "quick" if quick else "full",
        "created_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "message_bytes": len(PAYLOAD), "window": plan.window, "repeats": plan.repeats,
        "ours": a, "jetstream": b, "core_nats": c,
        "ours_fsync_always": a_always, "jetstream_sync_always": b_always,
        "catchup_messages": plan.catchup, "ours_catchup": ours_read,
        "jetstream_catchup": peer_read,
        "ingest_msgs_per_s": a["msgs_per_s"],
        "jetstream_ingest_msgs_per_s": b["msgs_per_s"],
        "core_nats_msgs_per_s": c["msgs_per_s"],
        "ingest_ratio_vs_jetstream": a["msgs_per_s"] / b["msgs_per_s"],
        "ingest_ratio_vs_core_nats": a["msgs_per_s"] / c["msgs_per_s"],
        "ack_p50_ms": a["ack_p50_ms"], "ack_p99_ms": a["ack_p99_ms"],
        "fsync_always_msgs_per_s": a_always["msgs_per_s"],
        "jetstream_fsync_always_msgs_per_s": b_always["msgs_per_s"],
        "fsync_always_ratio_vs_jetstream": a_always["msgs_per_s"] / b_always["msgs_per_s"],
        "catchup_msgs_per_s": ours_read["msgs_per_s"],
        "jetstream_catchup_best_msgs_per_s": peer_read["best_msgs_per_s"],
        "catchup_ratio_vs_jetstream_best": ours_read["msgs_per_s"] / peer_read["best_msgs_per_s"],
        "targets": {"ingest_ratio_vs_jetstream": 1.0, "fsync_always_ratio_vs_jetstream": 5.0,
                    "catchup_ratio_vs_jetstream_best": 3.0},
    }


def table(r: dict[str, Any]) -> str:
    rows = [
        ("(a) Jetstream, fsync interval, ack leader", r["ours"]),
        ("(b) NATS JetStream R1, file, default sync", r["jetstream"]),
        ("(c) core NATS responder (ceiling)", r["core_nats"]),
        ("(a) Jetstream, fsync always", r["ours_fsync_always"]),
        ("(b) NATS JetStream R1, sync_interval always", r["jetstream_sync_always"]),
    ]
    lines = [(f"{'publish, 128 B, window ' + str(r['window']):46} {'msgs/s':>9} {'p50 ms':>8} "
             f"{'p99 ms':>8} {'errors':>6}")]
    for name, row in rows:
        lines.append(f"{name:46} {row['msgs_per_s']:9.0f} {row['ack_p50_ms']:8.2f} "
                     f"{row['ack_p99_ms']:8.2f} {row['errors']:6d}")
    jc = r["jetstream_catchup"]
    lines += [
        "",
        f"catch-up read of {r['catchup_messages']} messages          msgs/s",
        f"  Jetstream subscribe                      {r['catchup_msgs_per_s']:9.0f}",
        f"  JetStream ordered push consumer          {jc['ordered_push_msgs_per_s']:9.0f}",
        f"  JetStream hand-rolled pull loop          {jc['pull_loop_msgs_per_s']:9.0f}",
        "",
        (f"ingest a/b {r['ingest_ratio_vs_jetstream']:.2f} (target >= 1.0)   "
        f"a/c {r['ingest_ratio_vs_core_nats']:.2f}"),
        f"fsync always a/b {r['fsync_always_ratio_vs_jetstream']:.2f} (target >= 5.0)",
        (f"catch-up vs JetStream best {r['catchup_ratio_vs_jetstream_best']:.2f} "
        "(target >= 3.0)"),
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a run of a minute or two")
    parser.add_argument("--json", action="store_true", help="print one JSON object last")
    args = parser.parse_args(argv)
    results = asyncio.run(run(QUICK if args.quick else FULL, args.quick))
    print(table(results))
    if not args.quick:
        RESULTS_DIR.mkdir(exist_ok=True)
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        (RESULTS_DIR / f"ingest-{stamp}.json").write_text(json.dumps(results, indent=1))
    if args.json:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
