"""Consumer groups side by side with NATS JetStream pull consumers: commits, group consumption,
rebalances.

Theory of operation
- Data: `messages` messages of 128 B over 6 partitions (ours: a stream of 6 partitions;
  JetStream: a stream on `work.*`, file storage), loaded by the same pipelined raw NATS
  publisher (bench.common) before anything is timed.
- Commits (ours only: a JetStream consumer's position is its acks): `commit_offset` one at a
  time (p50/p99, commits/s), the same from `concurrency` groups at once (commits/s), and
  commits of all 6 partitions in one request (offsets/s). Committed means: on every in-sync
  replica, fsynced (`__offsets` has ack `all`, fsync always).
- Group consumption: 1 member, then 3 members (each with a client of its own, in this
  process), reading everything from the 6 partitions with auto-commit (every second); against
  JetStream pull consumers with explicit acks — a durable consumer, `fetch(256)` batches,
  `ack()` of every message (its at-least-once equivalent) — 1 subscriber, then 3 subscribers
  bound to one durable. Timed from the join (ours) or the first fetch (JetStream) until the
  last message.
- Rebalances: with 3 members over 6 partitions, the time from one member's graceful leave
  until the other two hold all 6; and from SIGKILL of a member process until they do (the
  members' session timeout is `session_ms`: the target is that plus 1 s).
- The load generator: the consuming client's own ceiling on our broker — the 6 partitions
  read by plain partition subscriptions (no group, no commits) — and a no-op socket request
  (LIST_GROUPS) for the committing client. A ratio under 2 means the client, not the broker,
  sets the pace.
- CPU: utime+stime of the broker or nats-server and of this process, per message.

Run from the repository root: `python -m bench.groups [--quick] [--json]`. With --json the
last line is one JSON object; a full run also writes it to bench/results/.
"""

from __future__ import annotations

import asyncio
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import nats
from nats.js.api import AckPolicy, ConsumerConfig

import jetstream
from bench.common import JsonObject, Message, bench_main, cpu_seconds, percentile, publish_pipelined
from jetstream.client import Client
from jetstream.client.group_subscription import GroupSubscription
from jetstream.natsd import NatsServer
from jetstream.protocol import messages as m
from jetstream.server.process import BrokerProcess

VALUE = b"v" * 128
STREAM, PARTITIONS = "work", 6
DEADLINE_S = 300.0


@dataclass(frozen=True, slots=True)
class Plan:
    messages: int
    commits: int
    batched_commits: int
    concurrency: int
    rebalances: int
    session_ms: int
    window: int = 1000


FULL = Plan(300_000, 5000, 1000, 16, 10, 3000)
QUICK = Plan(60_000, 1000, 200, 16, 3, 3000)


def self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def our_messages(count: int) -> list[Message]:
    return [(STREAM if i % PARTITIONS == 0 else f"{STREAM}.{i % PARTITIONS}", VALUE, None)
            for i in range(count)]


def js_messages(count: int) -> list[Message]:
    return [(f"{STREAM}.{i % PARTITIONS}", VALUE, None) for i in range(count)]


async def until(check: Any, what: str, deadline_s: float = DEADLINE_S) -> float:
    """Poll `check()` every millisecond; the monotonic time it first held."""
    deadline = time.monotonic() + deadline_s
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out: {what}")
        await asyncio.sleep(0.001)
    return time.monotonic()


# -- ours ----------------------------------------------------------------------------------

async def commit_figures(js: Client, plan: Plan) -> JsonObject:
    latencies = []
    started = time.perf_counter()
    for i in range(plan.commits):
        t0 = time.perf_counter()
        await js.commit_offset("bench-commits", STREAM, i % PARTITIONS, i + 1)
        latencies.append(time.perf_counter() - t0)
    sequential = plan.commits / (time.perf_counter() - started)

    async def group_commits(g: int) -> None:
        for i in range(plan.commits // plan.concurrency):
            await js.commit_offset(f"bench-commits-{g}", STREAM, i % PARTITIONS, i + 1)

    started = time.perf_counter()
    await asyncio.gather(*(group_commits(g) for g in range(plan.concurrency)))
    concurrent = (plan.commits // plan.concurrency * plan.concurrency
                  / (time.perf_counter() - started))
    batch_latencies = []
    started = time.perf_counter()
    for i in range(plan.batched_commits):
        t0 = time.perf_counter()
        failed = await js.commit_offsets("bench-batched",
                                         {(STREAM, p): i + 1 for p in range(PARTITIONS)})
        assert not failed, failed
        batch_latencies.append(time.perf_counter() - t0)
    batched = plan.batched_commits / (time.perf_counter() - started)
    return {"commits_per_s": sequential, "commit_p50_ms": percentile(latencies, 50) * 1000,
            "commit_p99_ms": percentile(latencies, 99) * 1000,
            "commits_per_s_concurrent_groups": concurrent,
            "batched_commits_per_s": batched, "batched_offsets_per_s": batched * PARTITIONS,
            "batched_commit_p99_ms": percentile(batch_latencies, 99) * 1000}


async def noop_requests(js: Client, count: int) -> float:
    """Sequential LIST_GROUPS requests/s: the committing client's own ceiling."""
    conn = await js.coordinator_connection("bench-commits")
    started = time.perf_counter()
    for _ in range(count):
        await conn.request(m.ListGroupsRequest())
    return count / (time.perf_counter() - started)


async def group_consume(broker: BrokerProcess, address: str, plan: Plan, members: int,
                        group: str) -> JsonObject:
    clients = [await jetstream.connect(address).start() for _ in range(members)]
    subs: list[GroupSubscription] = []
    counts = [0] * members
    cpu0, broker0 = self_cpu(), cpu_seconds(broker.pid)
    started = time.perf_counter()  # from the join: reading starts as partitions arrive
    try:
        subs.extend([await js.subscribe(STREAM, group=group, auto_commit_interval_ms=1000,
                                        max_wait_ms=100).start() for js in clients])

        async def consume(i: int, sub: GroupSubscription) -> None:
            async for _msg in sub:
                counts[i] += 1

        tasks = [asyncio.create_task(consume(i, s)) for i, s in enumerate(subs)]
        await until(lambda: sum(counts) >= plan.messages, "everything consumed")
        elapsed = time.perf_counter() - started
        cpu, broker_cpu = self_cpu() - cpu0, cpu_seconds(broker.pid) - broker0
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        for sub in subs:
            await sub.close()
        for js in clients:
            await js.close()
    return {"msgs_per_s": sum(counts) / elapsed,
            "client_cpu_us_per_msg": cpu / sum(counts) * 1e6,
            "server_cpu_us_per_msg": broker_cpu / sum(counts) * 1e6}


async def plain_read(js: Client, plan: Plan) -> float:
    """The 6 partitions read by plain partition subscriptions: the client's ceiling."""
    subs = [await js.subscribe(STREAM, p, stop="latest").start() for p in range(PARTITIONS)]
    total = 0
    started = time.perf_counter()

    async def read(sub: Any) -> int:
        count = 0
        while (batch := await sub.next_batch()) is not None:
            count += len(batch)
        return count

    total = sum(await asyncio.gather(*(read(s) for s in subs)))
    return total / (time.perf_counter() - started)


MEMBER = """
import asyncio, sys
import jetstream
async def main():
    async with jetstream.connect(sys.argv[1]) as js:
        async with js.subscribe("work", group=sys.argv[2],
                                session_timeout_ms=int(sys.argv[3])) as member:
            print("joined", flush=True)
            async for _ in member:
                pass
asyncio.run(main())
"""


async def rebalances(address: str, plan: Plan) -> JsonObject:
    """Graceful leave, then crash (SIGKILL of a member process), `plan.rebalances` times."""
    clients = [await jetstream.connect(address).start() for _ in range(3)]

    def member(js: Client, group: str) -> GroupSubscription:
        return js.subscribe(STREAM, group=group, session_timeout_ms=plan.session_ms)

    leave, crash = [], []
    try:
        stay = [await member(clients[0], "leave").start(), await member(clients[1], "leave")
                .start()]
        for _ in range(plan.rebalances):
            goer = await member(clients[2], "leave").start()
            await until(lambda g=goer: len(g.assignment) == 2
                        and all(len(s.assignment) == 2 for s in stay), "2/2/2")
            started = time.monotonic()
            await goer.close()
            done = await until(lambda: all(len(s.assignment) == 3 for s in stay), "3/3")
            leave.append(done - started)
        for sub in stay:
            await sub.close()
        stay = [await member(clients[0], "crash").start(), await member(clients[1], "crash")
                .start()]
        for _ in range(plan.rebalances):
            proc = subprocess.Popen(  # noqa: ASYNC220 - returns at once
                [sys.executable, "-c", MEMBER, address, "crash", str(plan.session_ms)],
                stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
            try:
                await until(lambda: all(len(s.assignment) == 2 for s in stay), "2/2/2")
                started = time.monotonic()
                os.kill(proc.pid, signal.SIGKILL)
                done = await until(lambda: all(len(s.assignment) == 3 for s in stay), "3/3")
                crash.append(done - started)
            finally:
                proc.kill()
                proc.wait()
        for sub in stay:
            await sub.close()
    finally:
        for js in clients:
            await js.close()
    return {"rebalance_leave_p50_s": percentile(leave, 50),
            "rebalance_leave_p99_s": percentile(leave, 99),
            "rebalance_crash_p50_s": percentile(crash, 50),
            "rebalance_crash_p99_s": percentile(crash, 99), "session_ms": plan.session_ms}


async def ours(work: Path, plan: Plan) -> JsonObject:
    with NatsServer(work / "nats-ours") as server:
        broker = BrokerProcess(work / "broker", server.url).start()
        try:
            async with jetstream.connect(broker.address) as js:
                await js.create_stream(STREAM, STREAM, partitions=PARTITIONS)
                load = await publish_pipelined(server.url, our_messages(plan.messages),
                                               plan.window)
                print("  commits ...", file=sys.stderr, flush=True)
                commits = await commit_figures(js, plan)
                noop = await noop_requests(js, plan.commits)
                print("  group consumption ...", file=sys.stderr, flush=True)
                one = await group_consume(broker, broker.address, plan, 1, "one")
                three = await group_consume(broker, broker.address, plan, 3, "three")
                ceiling = await plain_read(js, plan)
                print("  rebalances ...", file=sys.stderr, flush=True)
                moves = await rebalances(broker.address, plan)
        finally:
            broker.stop()
    return {"load_puts_per_s": load["puts_per_s"], **commits, "noop_requests_per_s": noop,
            "consume_1": one, "consume_3": three, "plain_read_msgs_per_s": ceiling, **moves}


# -- NATS JetStream --------------------------------------------------------------------------

async def js_pull(server: NatsServer, durable: str, subscribers: int, plan: Plan
                  ) -> JsonObject:
    nc = await nats.connect(server.url)
    try:
        js = nc.jetstream()
        await js.add_consumer(STREAM, ConsumerConfig(
            durable_name=durable, ack_policy=AckPolicy.EXPLICIT, max_ack_pending=100_000))
        subs = [await js.pull_subscribe(f"{STREAM}.*", durable=durable, stream=STREAM)
                for _ in range(subscribers)]
        counts = [0] * subscribers
        done = asyncio.Event()

        async def pull(i: int, sub: Any) -> None:
            while not done.is_set():
                try:
                    batch = await sub.fetch(256, timeout=1)
                except nats.errors.TimeoutError:
                    continue
                for msg in batch:
                    await msg.ack()
                counts[i] += len(batch)
                if sum(counts) >= plan.messages:
                    done.set()

        cpu0, server0 = self_cpu(), cpu_seconds(server.pid)
        started = time.perf_counter()
        await asyncio.wait_for(asyncio.gather(*(pull(i, s) for i, s in enumerate(subs))),
                               DEADLINE_S)
        elapsed = time.perf_counter() - started
        await nc.flush()
        cpu, server_cpu = self_cpu() - cpu0, cpu_seconds(server.pid) - server0
    finally:
        await nc.close()
    total = sum(counts)
    return {"msgs_per_s": total / elapsed, "client_cpu_us_per_msg": cpu / total * 1e6,
            "server_cpu_us_per_msg": server_cpu / total * 1e6}


async def nats_jetstream(work: Path, plan: Plan) -> JsonObject:
    with NatsServer(work / "nats-js", jetstream=True) as server:
        nc = await nats.connect(server.url)
        try:
            await nc.jetstream().add_stream(name=STREAM, subjects=[f"{STREAM}.*"])
        finally:
            await nc.close()
        load = await publish_pipelined(server.url, js_messages(plan.messages), plan.window)
        one = await js_pull(server, "one", 1, plan)
        three = await js_pull(server, "three", 3, plan)
    return {"load_puts_per_s": load["puts_per_s"], "consume_1": one, "consume_3": three}


# -- the report ------------------------------------------------------------------------------

async def run(plan: Plan) -> JsonObject:
    with tempfile.TemporaryDirectory(prefix="bench-groups-") as tmp:
        work = Path(tmp)
        print("ours ...", file=sys.stderr, flush=True)
        our = await ours(work, plan)
        print("NATS JetStream ...", file=sys.stderr, flush=True)
        peer = await nats_jetstream(work, plan)
    return {
        "plan": asdict(plan), "ours": our, "nats_jetstream": peer,
        "commits_per_s": our["commits_per_s"], "commit_p99_ms": our["commit_p99_ms"],
        "group_consume_msgs_per_s": our["consume_1"]["msgs_per_s"],
        "group_consume_3_msgs_per_s": our["consume_3"]["msgs_per_s"],
        "group_vs_js_pull_ack": our["consume_1"]["msgs_per_s"]
        / peer["consume_1"]["msgs_per_s"],
        "group_3_vs_js_pull_ack_3": our["consume_3"]["msgs_per_s"]
        / peer["consume_3"]["msgs_per_s"],
        "rebalance_leave_p99_s": our["rebalance_leave_p99_s"],
        "rebalance_crash_p99_s": our["rebalance_crash_p99_s"],
        "consumer_headroom": our["plain_read_msgs_per_s"] / our["consume_1"]["msgs_per_s"],
        "commit_client_headroom": our["noop_requests_per_s"] / our["commits_per_s"],
        "time": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def table(r: JsonObject) -> str:
    o, p = r["ours"], r["nats_jetstream"]
    rows = [f"{'':34} {'ours':>12} {'JetStream':>12} {'ratio':>7}"]
    for n, target in ((1, "  (target >= 3.0)"), (3, "")):
        a, b = o[f"consume_{n}"], p[f"consume_{n}"]
        key = "group_vs_js_pull_ack" if n == 1 else "group_3_vs_js_pull_ack_3"
        label = f"consume, {n} member(s) msgs/s"
        rows.append(f"{label:34} {a['msgs_per_s']:12,.0f} {b['msgs_per_s']:12,.0f} "
                    f"{r[key]:7.2f}{target}")
        rows.append(f"{'  CPU us/msg server / client':34} "
                    f"{a['server_cpu_us_per_msg']:5.1f}/{a['client_cpu_us_per_msg']:5.1f} "
                    f"{b['server_cpu_us_per_msg']:6.1f}/{b['client_cpu_us_per_msg']:5.1f}")
    lines = [
        (("commits (1 partition, one at a time): {:,.0f}/s, p50 {:.2f} ms, p99 {:.2f} ms "
         "(target <= 5 ms)"), o["commits_per_s"], o["commit_p50_ms"], o["commit_p99_ms"]),
        ("commits from {} groups at once: {:,.0f}/s", r["plan"]["concurrency"],
         o["commits_per_s_concurrent_groups"]),
        ("commits of 6 partitions: {:,.0f}/s ({:,.0f} offsets/s), p99 {:.2f} ms",
         o["batched_commits_per_s"], o["batched_offsets_per_s"], o["batched_commit_p99_ms"]),
        ("rebalance after a graceful leave: p50 {:.3f} s, p99 {:.3f} s (target <= 1 s)",
         o["rebalance_leave_p50_s"], o["rebalance_leave_p99_s"]),
        (("rebalance after a crash (session {} ms): p50 {:.2f} s, p99 {:.2f} s (target <= "
         "{:.0f} s)"), o["session_ms"], o["rebalance_crash_p50_s"], o["rebalance_crash_p99_s"],
         o["session_ms"] / 1000 + 1),
        (("load generator: plain reads {:,.0f} msgs/s = {:.2f}x group consumption; no-op "
         "requests {:,.0f}/s = {:.2f}x commits (>= 2 needed)"), o["plain_read_msgs_per_s"],
         r["consumer_headroom"], o["noop_requests_per_s"], r["commit_client_headroom"]),
    ]
    rows.append("")
    rows.extend(text.format(*values) for text, *values in lines)
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    return bench_main("groups", __doc__, argv,
                      lambda quick: run(QUICK if quick else FULL), table)


if __name__ == "__main__":
    sys.exit(main())
