"""Broker throughput and latency against NATS JetStream, driven by a compiled load generator.

Theory of operation
- The load: bench/loadgen's C program sends plain NATS requests (a publish with a reply
  subject, as any NATS user publishes) with N in flight, over 1 connection up to 16 in flight
  and 4 connections above, for `measure_s` seconds after `warmup_s`, timing every ack in a
  log-linear histogram. The same program drives ours and NATS JetStream.
- Its headroom, in the same run: requests through core NATS to the generator's own no-op
  responder (compiled, storing nothing), the best of 256, 1024 and 4096 in flight.
  `generator_headroom` = that rate ÷ the highest rate reported for either system; below 2
  the run says the generator is the bottleneck and every rate target fails.
- Ours: one nats-server and three brokers (bench.replication.OurCluster, default settings),
  four streams of one partition with default ack policy (`all`): R1 and R3, fsync `interval`
  (lazy) and `always` (durable). The generator talks to the nats-server.
- Peer: two 3-node NATS JetStream clusters, the default one (lazy: `sync_interval` 2 min)
  and one with `sync_interval: always` (durable), each with an R1 and an R3 file stream. The
  generator talks to the server that leads the stream, its best case.
- All three systems run for the whole sweep and each cell runs ours, then JetStream, back
  to back, so a noisy neighbour weighs on both. CPU per acked message: user+sys CPU seconds
  (/proc/PID/stat) of every process of the measured system (our brokers and their
  nats-server, which carries our traffic; the JetStream cluster's three servers) over the
  generator's run ÷ acks.
- End to end: the generator publishes at a steady `E2E_RATE` with its send time
  (CLOCK_MONOTONIC ns) in each payload; a consumer in this process reads the same clock on
  arrival: our client's `subscribe` from the end (NEW_ONLY), JetStream's ordered push
  consumer and a pull consumer fetching one message at a time. R1 and R3, lazy streams.
- Profiles (full runs, or `--profile`): py-spy samples the partition leader (and for R3 a
  follower) while the generator runs at 16 and 4096 in flight, R1 and R3 lazy, 128 B; the
  raw stacks are saved beside the JSON and summarised in it.
- Every process runs in a temp dir on loopback and is stopped by PID; a failed run keeps
  its directory (with the brokers' and servers' logs) and names it.

Run from the repository root: `python -m bench.throughput [--quick] [--json] [--profile]
[--save]`. The last line of --json output is one JSON object; a full run (or --save) writes
it, the plot and the profiles to bench/results/.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import nats
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

import jetstream
from bench.common import RESULTS_DIR, JsonObject, cpu_seconds
from bench.loadgen import Load, responder, run_load
from bench.loadgen.histogram import Histogram
from bench.replication import OurCluster, eventually
from bench.throughput_figures import (
    FSYNCS,
    cell_key,
    check_targets,
    compare,
    cpu_per_msg_us,
    generator_figures,
    headline,
    plot,
    summarize_profile,
    table,
)
from jetstream.client import Start
from jetstream.natsd import NatsCluster, NatsServer

BROKERS = 3
REPLICAS = (1, 3)
E2E_RATE = 500
E2E_SIZE = 128
E2E_INFLIGHT = 256
#: Disk kept per stream (ours retention_bytes, JetStream max_bytes): a 4 KiB sweep writes GBs.
STREAM_BYTES_MAX = 512 * 1024 * 1024
PROFILE_INFLIGHTS = (16, 4096)
PROFILE_RATE_HZ = 250
LOAD_TIMEOUT_S = 30.0
NOOP_INFLIGHTS = (256, 1024, 4096)
NOOP_CONNS = 2


@dataclass(frozen=True, slots=True)
class Plan:
    sizes: tuple[int, ...]
    inflights: tuple[int, ...]
    warmup_s: float
    measure_s: float
    e2e_warmup_s: float
    e2e_measure_s: float
    profile_s: float


QUICK = Plan(sizes=(128,), inflights=(1, 16, 256), warmup_s=0.7, measure_s=2.5,
             e2e_warmup_s=0.5, e2e_measure_s=3.0, profile_s=4.0)
FULL = Plan(sizes=(128, 4096), inflights=(1, 16, 256, 4096), warmup_s=1.5, measure_s=5.0,
            e2e_warmup_s=1.0, e2e_measure_s=10.0, profile_s=8.0)


def progress(message: str) -> None:
    print(f"  .. {message}", file=sys.stderr, flush=True)


def layout(inflight: int) -> tuple[int, int]:
    """(connections, in flight per connection) for `inflight` requests in flight in all."""
    conns = 1 if inflight <= 16 else 4
    return conns, max(1, inflight // conns)


def stream_name(replicas: int, fsync: str) -> str:
    return f"tp_r{replicas}_{fsync}"


def subject(replicas: int, fsync: str) -> str:
    return f"tp.r{replicas}.{fsync}"


# -- the systems ---------------------------------------------------------------------------------


class Ours:
    """OurCluster with the four streams."""

    def __init__(self, cluster: OurCluster) -> None:
        self.cluster = cluster

    async def create_streams(self) -> None:
        async with jetstream.connect(self.cluster.live_addresses()) as js:
            for replicas in REPLICAS:
                for fsync in FSYNCS:
                    await js.create_stream(
                        stream_name(replicas, fsync), subject(replicas, fsync),
                        fsync="interval" if fsync == "lazy" else "always",
                        replication_factor=replicas, min_isr=min(replicas, 2),
                        retention_bytes=STREAM_BYTES_MAX)
            for replicas in REPLICAS:
                for fsync in FSYNCS:
                    await self._wait_full_isr(js, stream_name(replicas, fsync), replicas)

    @staticmethod
    async def _wait_full_isr(js: jetstream.Client, name: str, replicas: int) -> None:
        async def full() -> bool | None:
            p = (await js.stream_info(name)).partitions[0]
            return True if p.leader >= 0 and len(p.isr) == replicas else None
        await eventually(full, f"{name} led with a full ISR")

    def url(self, replicas: int, fsync: str) -> str:
        return self.cluster.nats.url

    def pids(self, fsync: str) -> dict[str, int]:
        return {**{f"broker{b.broker_id}": b.pid for b in self.cluster.brokers},
                "nats": self.cluster.nats.pid}

    async def replica_pids(self, replicas: int) -> list[int]:
        """The leader's PID of the lazy stream of `replicas`, then a follower's."""
        async with jetstream.connect(self.cluster.live_addresses()) as js:
            p = (await js.stream_info(stream_name(replicas, "lazy"))).partitions[0]
        followers = [b for b in p.isr if b != p.leader][:1]
        return [self.cluster.by_id(b).pid for b in (p.leader, *followers)]


class Peer:
    """Two 3-node JetStream clusters, lazy and durable, each with an R1 and an R3 stream."""

    def __init__(self, clusters: dict[str, NatsCluster]) -> None:
        self.clusters = clusters
        self.leader_urls: dict[tuple[int, str], str] = {}

    async def create_streams(self) -> None:
        for fsync, cluster in self.clusters.items():
            nc = await nats.connect(cluster.urls)
            try:
                for replicas in REPLICAS:
                    leader = await self._create(nc.jetstream(), replicas, fsync)
                    self.leader_urls[(replicas, fsync)] = next(
                        s.url for s in cluster.servers if s.name == leader)
            finally:
                await nc.close()

    @staticmethod
    async def _create(js: Any, replicas: int, fsync: str) -> str:
        """Creates the stream (retried while the cluster has no meta leader or too few
        peers); the name of the server leading it once its replicas are current."""
        name = stream_name(replicas, fsync)

        async def placed() -> str | None:
            try:
                await js.add_stream(name=name, subjects=[subject(replicas, fsync)],
                                    storage="file", num_replicas=replicas,
                                    max_bytes=STREAM_BYTES_MAX)
                info = await js.stream_info(name)
            except Exception:
                return None
            c = info.cluster
            peers = (c.replicas or []) if c else []
            current = len(peers) == replicas - 1 and all(p.current for p in peers)
            return str(c.leader) if c and c.leader and current else None

        return await eventually(placed, f"JetStream {name} led, replicas current")

    def url(self, replicas: int, fsync: str) -> str:
        return self.leader_urls[(replicas, fsync)]

    def pids(self, fsync: str) -> dict[str, int]:
        return {s.name: s.pid for s in self.clusters[fsync].servers}


@asynccontextmanager
async def systems(work: Path) -> AsyncIterator[tuple[Ours, Peer]]:
    async with OurCluster(work / "ours") as cluster, \
            NatsCluster(work / "js-lazy", BROKERS) as lazy, \
            NatsCluster(work / "js-durable", BROKERS,
                        config={"jetstream": {"sync_interval": "always"}}) as durable:
        ours, peer = Ours(cluster), Peer({"lazy": lazy, "durable": durable})
        await ours.create_streams()
        await peer.create_streams()
        yield ours, peer


# -- one cell ------------------------------------------------------------------------------------


def cell_load(subject_name: str, size: int, inflight: int, plan: Plan) -> Load:
    conns, per_conn = layout(inflight)
    return Load(subject_name, size=size, inflight=per_conn, conns=conns,
                duration_s=plan.measure_s, warmup_s=plan.warmup_s, timeout_s=LOAD_TIMEOUT_S)


async def measure(url: str, load: Load, pids: dict[str, int]) -> JsonObject:
    """One generator run and the CPU the system's processes spent on it."""
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    result = await run_load(url, load)
    after = {name: cpu_seconds(pid) for name, pid in pids.items()}
    return {**result.figures(), **cpu_per_msg_us(before, after, result.acked),
            "conns": load.conns, "inflight_per_conn": load.inflight}


async def sweep(ours: Ours, peer: Peer, plan: Plan) -> dict[str, JsonObject]:
    cells: dict[str, JsonObject] = {}
    for size in plan.sizes:
        for replicas in REPLICAS:
            for fsync in FSYNCS:
                for inflight in plan.inflights:
                    key = cell_key(replicas, fsync, size, inflight)
                    load = cell_load(subject(replicas, fsync), size, inflight, plan)
                    a = await measure(ours.url(replicas, fsync), load, ours.pids(fsync))
                    b = await measure(peer.url(replicas, fsync), load, peer.pids(fsync))
                    cells[key] = compare(a, b)
                    progress(f"{key}: ours {a['msgs_per_s']:,.0f} msg/s p50 "
                             f"{a['ack_p50_ms']:.2f} ms, JetStream {b['msgs_per_s']:,.0f} msg/s "
                             f"p50 {b['ack_p50_ms']:.2f} ms: {cells[key]['ratio']:.2f}x")
    return cells


async def noop_ceiling(work: Path, plan: Plan) -> JsonObject:
    """The generator's ceiling: requests through core NATS to its compiled no-op responder,
    the best of NOOP_INFLIGHTS (a request through core NATS takes two hops where JetStream
    answers in one, so the ceiling is taken where the pipeline is fullest)."""
    tries: list[JsonObject] = []
    with NatsServer(work / "nats-noop") as server, \
            responder(server.url, "tp.noop", conns=NOOP_CONNS) as responder_pid:
        for inflight in NOOP_INFLIGHTS:
            load = Load("tp.noop", size=min(plan.sizes), inflight=inflight // NOOP_CONNS,
                        conns=NOOP_CONNS, duration_s=plan.measure_s, warmup_s=plan.warmup_s,
                        timeout_s=LOAD_TIMEOUT_S)
            tries.append({**await measure(server.url, load, {"nats": server.pid,
                                                              "responder": responder_pid}),
                          "inflight": inflight})
    best = max(tries, key=lambda t: float(t["msgs_per_s"]))
    return {**best, "tries": {t["inflight"]: round(t["msgs_per_s"]) for t in tries}}


# -- end to end ----------------------------------------------------------------------------------


class Arrivals:
    """(send ns, arrival ns) of each message a consumer got, from the stamp in its payload."""

    def __init__(self) -> None:
        self.times: list[tuple[int, int]] = []
        self.got = asyncio.Event()
        self.expected: int | None = None

    def add(self, payload: bytes) -> None:
        self.times.append((int(payload[:20]), time.monotonic_ns()))
        if self.expected is not None and len(self.times) >= self.expected:
            self.got.set()

    def figures(self, warmup_s: float) -> JsonObject:
        if not self.times:
            return {"messages": 0}
        first = min(sent for sent, _ in self.times)
        histogram = Histogram()
        for sent, arrived in self.times:
            if sent >= first + warmup_s * 1e9:
                histogram.record(arrived - sent)
        return {**histogram.summary_ms(), "messages": histogram.total,
                "received": len(self.times), "expected": self.expected}


Consumer = Callable[[Arrivals], AbstractAsyncContextManager[None]]


async def end_to_end(url: str, subject_name: str, consumer: Consumer, plan: Plan) -> JsonObject:
    """Publishes at E2E_RATE with stamps while `consumer` (reading from the end once
    entered) hands each payload to an Arrivals."""
    arrivals = Arrivals()
    async with consumer(arrivals):
        result = await run_load(url, Load(
            subject_name, size=E2E_SIZE, inflight=E2E_INFLIGHT, rate=E2E_RATE,
            duration_s=plan.e2e_measure_s, warmup_s=plan.e2e_warmup_s, stamp=True,
            timeout_s=LOAD_TIMEOUT_S))
        arrivals.expected = result.sent
        if len(arrivals.times) < result.sent:
            with contextlib.suppress(TimeoutError):  # reported: received < expected
                await asyncio.wait_for(arrivals.got.wait(), LOAD_TIMEOUT_S)
    return {**arrivals.figures(plan.e2e_warmup_s), "errors": result.errors}


@asynccontextmanager
async def reading(task: Coroutine[Any, Any, None]) -> AsyncIterator[None]:
    """`task` runs inside the block and is cancelled after it."""
    running = asyncio.get_running_loop().create_task(task)
    try:
        yield
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)


def ours_subscribe(ours: Ours, replicas: int) -> Consumer:
    @asynccontextmanager
    async def consumer(arrivals: Arrivals) -> AsyncIterator[None]:
        async with jetstream.connect(ours.cluster.live_addresses()) as js:
            sub = await js.subscribe(stream_name(replicas, "lazy"), start=Start.NEW_ONLY)

            async def read() -> None:
                async for msg in sub:
                    arrivals.add(msg.value)

            async with reading(read()):
                yield
    return consumer


def js_consumer(url: str, replicas: int, pull: bool) -> Consumer:
    """JetStream's ordered push consumer, or a pull consumer fetching one at a time."""
    @asynccontextmanager
    async def consumer(arrivals: Arrivals) -> AsyncIterator[None]:
        nc = await nats.connect(url)
        try:
            js = nc.jetstream()
            if not pull:
                async def on_msg(msg: Any) -> None:
                    arrivals.add(msg.data)

                await js.subscribe(subject(replicas, "lazy"), cb=on_msg,
                                   ordered_consumer=True, deliver_policy=DeliverPolicy.NEW)
                await nc.flush()
                yield
                return
            psub = await js.pull_subscribe(
                subject(replicas, "lazy"), durable=f"e2e_pull_r{replicas}",
                config=ConsumerConfig(deliver_policy=DeliverPolicy.NEW,
                                      ack_policy=AckPolicy.NONE))

            async def fetch_loop() -> None:
                while True:
                    try:
                        for msg in await psub.fetch(1, timeout=2.0):
                            arrivals.add(msg.data)
                    except nats.errors.TimeoutError:
                        continue

            async with reading(fetch_loop()):
                yield
        finally:
            await nc.close()
    return consumer


async def all_end_to_end(ours: Ours, peer: Peer, plan: Plan) -> dict[str, JsonObject]:
    e2e: dict[str, JsonObject] = {}
    for replicas in REPLICAS:
        row: JsonObject = {}
        s = subject(replicas, "lazy")
        row["ours_subscribe"] = await end_to_end(ours.url(replicas, "lazy"), s,
                                                 ours_subscribe(ours, replicas), plan)
        js_url = peer.url(replicas, "lazy")
        row["js_push"] = await end_to_end(js_url, s, js_consumer(js_url, replicas, False), plan)
        row["js_pull"] = await end_to_end(js_url, s, js_consumer(js_url, replicas, True), plan)
        e2e[f"r{replicas}"] = row
        progress(f"end to end R{replicas}: " + ", ".join(
            f"{k} p50 {v.get('p50_ms', 0):.2f} p99 {v.get('p99_ms', 0):.2f} ms"
            for k, v in row.items()))
    return e2e


# -- profiles ------------------------------------------------------------------------------------


def py_spy() -> str | None:
    candidate = Path(sysconfig.get_path("scripts")) / "py-spy"
    return str(candidate) if candidate.exists() else shutil.which("py-spy")


async def profiles(ours: Ours, plan: Plan, out_dir: Path) -> JsonObject:
    """py-spy of the leader (and an R3 follower) at each PROFILE_INFLIGHTS count, R1 and R3
    lazy, 128 B, in runs of their own (sampling slows the process it samples)."""
    spy = py_spy()
    if spy is None:
        return {"error": "py-spy not found: pip install py-spy (it is in the dev extras)"}
    await asyncio.to_thread(out_dir.mkdir, parents=True, exist_ok=True)
    found: JsonObject = {}
    for replicas in REPLICAS:
        pids = await ours.replica_pids(replicas)
        for inflight in PROFILE_INFLIGHTS:
            spies = []
            for role, pid in zip(("leader", "follower"), pids, strict=False):
                path = out_dir / f"r{replicas}-inflight{inflight}-{role}.txt"
                spies.append((role, path, await asyncio.create_subprocess_exec(
                    spy, "record", "--pid", str(pid), "--duration", str(round(plan.profile_s)),
                    "--rate", str(PROFILE_RATE_HZ), "--nonblocking", "--format", "raw",
                    "-o", str(path), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)))
            load = Load(subject(replicas, "lazy"), size=128, inflight=layout(inflight)[1],
                        conns=layout(inflight)[0], duration_s=plan.profile_s - 1.0,
                        warmup_s=0.5, timeout_s=LOAD_TIMEOUT_S)
            result = await run_load(ours.url(replicas, "lazy"), load)
            for role, path, proc in spies:
                _, err = await proc.communicate()
                key = f"r{replicas}_inflight_{inflight}_{role}"
                found[key] = ({**summarize_profile(path.read_text()), "file": str(path),
                               "msgs_per_s": result.msgs_per_s} if path.exists()
                              else {"error": err.decode().strip()[:500]})
            progress(f"profiled R{replicas} at {inflight} in flight")
    return found


# -- the run -------------------------------------------------------------------------------------


async def run(plan: Plan, quick: bool, profile: bool, work: Path, name: str) -> JsonObject:
    async with systems(work) as (ours, peer):
        progress("the generator against core NATS and its no-op responder")
        noop = await noop_ceiling(work, plan)
        progress(f"no-op: {noop['msgs_per_s']:,.0f} msg/s")
        cells = await sweep(ours, peer, plan)
        e2e = await all_end_to_end(ours, peer, plan)
        profiled = await profiles(ours, plan, RESULTS_DIR / f"{name}-profiles") \
            if profile else {}
    generator = generator_figures(noop, cells)
    headroom = generator["generator_headroom"]
    return {
        "benchmark": "throughput", "mode": "quick" if quick else "full",
        "created_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "sizes": list(plan.sizes), "inflights": list(plan.inflights),
        "warmup_s": plan.warmup_s, "measure_s": plan.measure_s, "e2e_rate": E2E_RATE,
        "noop": noop, "cells": cells, "e2e": e2e, "profiles": profiled,
        "targets": check_targets(cells, e2e, headroom),
        **headline(cells, e2e, headroom), **generator,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="128 B, in flight 1/16/256: under four minutes")
    parser.add_argument("--json", action="store_true", help="print one JSON object last")
    parser.add_argument("--profile", action="store_true",
                        help="py-spy profiles (always on in a full run)")
    parser.add_argument("--save", action="store_true",
                        help="write the JSON and the plot to bench/results/ "
                             "(always on in a full run)")
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    save = args.save or not args.quick
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    name = f"throughput{'-quick' if args.quick else ''}-{stamp}"
    work = Path(tempfile.mkdtemp(prefix="bench-throughput-"))
    try:
        results = asyncio.run(run(plan, args.quick, args.profile or not args.quick, work, name))
    except BaseException:
        print(f"run failed; its processes' logs are kept in {work}", file=sys.stderr)
        raise
    shutil.rmtree(work, ignore_errors=True)
    if save:
        RESULTS_DIR.mkdir(exist_ok=True)
        progress(plot(results, RESULTS_DIR / f"{name}.png"))
        (RESULTS_DIR / f"{name}.json").write_text(json.dumps(results, indent=1))
        progress(f"results: {RESULTS_DIR / name}.json")
    print(table(results))
    if args.json:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
