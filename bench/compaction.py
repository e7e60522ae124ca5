"""Compacted streams as a KV table, side by side with NATS KV: puts, gets, the cleaner.

Theory of operation
- Data: `records` puts over `keys` keys (128 B values), `tombstone_share` of them deletes
  (a tombstone: our null value; NATS KV's `KV-Operation: DEL`), the same sequence for both.
- Puts, pipelined (at most `window` un-acked on one connection, so in the data's order), by
  the compiled load generator (bench/loadgen) sending the data as a list of messages: ours
  is an envelope carrying the key to a compacted stream with ack `leader` and fsync
  `interval`; NATS KV is a bucket (history 1, file storage, its default fsync) written on
  `$KV.<bucket>.<key>`, a delete with the header `KV-Operation: DEL`. Same durability: both
  ack once the leader stored it, neither fsyncs per put.
- Gets, on random keys: latency one at a time (p50/p99) through each side's client, ours
  `get` (socket API, key index) and nats-py `kv.get` (the bucket allows direct gets: a
  request for the last message on the key's subject); throughput (gets/s: the median of
  THROUGHPUT_ROUNDS runs, each of the keys THROUGHPUT_REPEATS times over and begun once the
  server has settled) from the
  compiled generator with `concurrency` requests unanswered on one connection: GET frames
  to our broker's socket API (`--protocol frames`), and to nats-server the direct-get
  requests nats-py's `kv.get` sends (`$JS.API.DIRECT.GET.KV_<bucket>.$KV.<bucket>.<key>`).
- The load generators: for puts, the same compiled generator sending our messages to its
  no-op responder through core NATS; for gets, requests that nats-server answers itself as
  it answers a direct get (to a subject no one subscribes to: "no responders"), and GET
  frames to the generator's frames responder, which answers each with an empty response.
  Each must run at least twice the rate of what it measures, or the figures measure the
  generator: for gets, each side against its own path (GET frames to the frames responder
  for ours, requests nats-server bounces for NATS KV).
- The cleaner, in process on a log built from the same data (segments of 64 MiB): one pass,
  records/s and MB/s, bytes after/before. On the broker: time from the end of the puts to
  the first finished pass (segments of 4 MiB, `min_cleanable_dirty_ratio` 0.1).
- Ingest latency with and without cleaning: sequential acked publishes to another stream of
  the same broker, once the puts are all indexed (the key index's catch-up done), then
  again at once after the compacted stream is made cleanable (it is created with a
  compaction lag of a day, then updated to none), while the first pass runs over it. The
  share of the second probe during which the pass ran is reported (from the pass's end and
  duration); the time to the first clean counts from the update.
- CPU: utime+stime of the broker and of nats-server per put and per get (/proc).

Run from the repository root: `python -m bench.compaction [--quick] [--json]`. With
--json the last line is one JSON object; a full run also writes it to bench/results/.
"""

from __future__ import annotations

import asyncio
import random
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

import httpx
import nats

import jetstream
from bench.common import (
    JsonObject,
    Message,
    bench_main,
    cpu_seconds,
    percentile,
    settled,
    until_children,
)
from bench.loadgen import (
    LoadResult,
    frames_responder,
    publish_listed,
    request_frames,
    request_listed,
    responder,
)
from jetstream.compaction.cleaner import clean
from jetstream.compaction.planner import CleaningPlan, CompactionConfig
from jetstream.natsd import NatsServer
from jetstream.protocol.codec import encode_request
from jetstream.protocol.envelope import encode_envelope
from jetstream.protocol.frames import Kind, Op, encode_frame, hello_request
from jetstream.protocol.kv import GetRequest
from jetstream.server.process import BrokerProcess
from jetstream.stream import format as fmt
from jetstream.stream.config import FsyncPolicy, LogConfig, MiB
from jetstream.stream.log import Log

VALUE = b"v" * 128
STREAM, SUBJECT, BUCKET = "kv", "kv.in", "kv"
#: The compaction lag the stream is created with, so that no pass runs before the bench
#: makes it cleanable (min_compaction_lag_ms 0).
HELD_BACK_MS = 86_400_000
#: Gets/s is the median of this many runs, each of the gets' keys this many times over.
THROUGHPUT_ROUNDS, THROUGHPUT_REPEATS = 3, 5


@dataclass(frozen=True, slots=True)
class Plan:
    records: int
    keys: int
    tombstone_share: float
    gets: int
    concurrency: int
    window: int
    probe_publishes: int


FULL = Plan(1_000_000, 10_000, 0.1, 20_000, 16, 1000, 2000)
QUICK = Plan(200_000, 10_000, 0.1, 4000, 16, 1000, 1000)
#: A broker holding a compacted partition runs the cleaner's and the key index's worker
#: processes, and multiprocessing's resource tracker.
BROKER_CHILDREN = 3


def workload(plan: Plan) -> list[tuple[bytes, bytes | None]]:
    rng = random.Random(2026)
    return [(b"key-%05d" % rng.randrange(plan.keys),
             None if rng.random() < plan.tombstone_share else VALUE)
            for _ in range(plan.records)]


async def get_latencies(get: Callable[[bytes], Awaitable[object]], keys: Sequence[bytes]
                        ) -> JsonObject:
    """One get at a time through a client: its latencies."""
    latencies = []
    for key in keys:
        started = time.perf_counter()
        await get(key)
        latencies.append(time.perf_counter() - started)
    return {"get_p50_ms": percentile(latencies, 50) * 1000,
            "get_p99_ms": percentile(latencies, 99) * 1000}


def get_frames(keys: Sequence[bytes]) -> tuple[bytes, list[bytes]]:
    """The HELLO and a GET request frame per key, for the compiled generator."""
    hello = encode_frame(0, Kind.REQUEST, Op.HELLO, hello_request("bench-compaction"))
    return hello, [encode_request(0, GetRequest(STREAM, 0, key)) for key in keys]


def direct_gets(keys: Sequence[bytes]) -> list[Message]:
    """NATS KV's get of each key as the request a NATS client sends: a direct get of the
    last message on the key's subject (what nats-py's `kv.get` asks for)."""
    return [(f"$JS.API.DIRECT.GET.KV_{BUCKET}.$KV.{BUCKET}.{key.decode()}", b"", None)
            for key in keys]


async def throughput(pid: int, run: Callable[[], Awaitable[LoadResult]]) -> JsonObject:
    """Gets/s, the p50 and the server's CPU per get: the median of THROUGHPUT_ROUNDS runs of
    `run`, each once the server (`pid`) has settled."""
    rounds = []
    for _ in range(THROUGHPUT_ROUNDS):
        await settled(pid)
        cpu0 = cpu_seconds(pid)
        result = await run()
        rounds.append((result, (cpu_seconds(pid) - cpu0) / result.messages * 1e6))
    rounds.sort(key=lambda r: r[0].msgs_per_s)
    result, cpu_us = rounds[len(rounds) // 2]
    return {"gets_per_s": result.msgs_per_s,
            "gets_concurrent_p50_ms": result.histogram.value_at(50) / 1e6,
            "cpu_us_per_get": cpu_us,
            "rounds_gets_per_s": [r.msgs_per_s for r, _ in rounds]}


# -- the sides -------------------------------------------------------------------------------

def our_messages(data: Sequence[tuple[bytes, bytes | None]]) -> list[Message]:
    return [(SUBJECT, encode_envelope(value, key), None) for key, value in data]


def kv_messages(data: Sequence[tuple[bytes, bytes | None]]) -> list[Message]:
    return [(f"$KV.{BUCKET}.{key.decode()}", VALUE, None) if value is not None
            else (f"$KV.{BUCKET}.{key.decode()}", b"", {"KV-Operation": "DEL"})
            for key, value in data]


async def until_first_pass(broker: BrokerProcess, deadline_s: float = 300) -> float:
    """The monotonic time at which the broker shows its first finished pass."""
    started = time.monotonic()
    async with httpx.AsyncClient(base_url=broker.http_url, timeout=30) as http:
        while time.monotonic() - started < deadline_s:
            part = (await http.get(f"/streams/{STREAM}")).json()["partitions"][0]
            if (part.get("compaction") or {}).get("passes", 0) >= 1:
                return time.monotonic()
            await asyncio.sleep(0.05)
    raise RuntimeError("no cleaning pass")


async def pass_overlap(broker: BrokerProcess, started: float, ended: float) -> float:
    """The share of the wall-clock span [started, ended] during which the stream's last
    pass ran (the broker reports its end and its duration)."""
    async with httpx.AsyncClient(base_url=broker.http_url, timeout=30) as http:
        done = (await http.get(f"/streams/{STREAM}")).json()["partitions"][0]["compaction"]
    end = float(done["last_clean_ms"]) / 1000
    start = end - float(done["last_pass_s"])
    return max(0.0, min(end, ended) - max(start, started)) / max(ended - started, 1e-9)


async def probe_latencies(js: jetstream.Client, count: int) -> list[float]:
    out = []
    for i in range(count):
        started = time.perf_counter()
        await js.publish("probe.in", b"%d" % i)
        out.append(time.perf_counter() - started)
    return out


async def ours(work: Path, plan: Plan, data: Sequence[tuple[bytes, bytes | None]]) -> JsonObject:
    keys = [random.Random(7).choice(data)[0] for _ in range(plan.gets)]
    with NatsServer(work / "nats-ours") as server:
        broker = BrokerProcess(work / "broker", server.url, extra_args=(
            "--cleaner-backoff-ms", "100", "--key-index-interval-ms", "20")).start()
        try:
            async with jetstream.connect(broker.address) as js:
                # Nothing is cleanable (every record is younger than the lag) until the
                # update below.
                await js.create_stream(STREAM, SUBJECT, cleanup_policy="compact",
                                       fsync="interval", ack_policy="leader",
                                       segment_bytes_max=4 * MiB,
                                       min_cleanable_dirty_ratio=0.1,
                                       min_compaction_lag_ms=HELD_BACK_MS)
                await js.create_stream("probe", "probe.in", fsync="interval",
                                       ack_policy="leader")
                await until_children(broker.pid, BROKER_CHILDREN)
                cpu0 = cpu_seconds(broker.pid)
                puts = await publish_listed(server.url, our_messages(data), plan.window, work)
                puts["cpu_us_per_put"] = (cpu_seconds(broker.pid) - cpu0) / plan.records * 1e6
                last = await js.publish(SUBJECT, VALUE, key=keys[0])
                assert last is not None
                await js.get(STREAM, keys[0], min_offset=last.offset, wait_ms=60_000)
                # The broker at rest (the puts indexed), then while its first pass runs.
                idle = await probe_latencies(js, plan.probe_publishes)
                cleanable = time.monotonic()
                await js.update_stream(STREAM, min_compaction_lag_ms=0)
                probe_started = time.time()
                cleaning = await probe_latencies(js, plan.probe_publishes)
                probe_ended = time.time()
                first_pass_s = await until_first_pass(broker) - cleanable
                overlap = await pass_overlap(broker, probe_started, probe_ended)
                gets = await get_latencies(lambda k: js.get(STREAM, k), keys)
                hello, requests = get_frames(keys)
                gets |= await throughput(broker.pid, lambda: request_frames(
                    broker.address, hello, requests * THROUGHPUT_REPEATS, plan.concurrency,
                    work))
        finally:
            broker.stop()
    return {**puts, **gets, "time_to_first_clean_s": first_pass_s,
            "probe_share_while_cleaning": overlap,
            "ingest_p99_ms_idle": percentile(idle, 99) * 1000,
            "ingest_p99_ms_cleaning": percentile(cleaning, 99) * 1000}


async def nats_kv(work: Path, plan: Plan, data: Sequence[tuple[bytes, bytes | None]]
                  ) -> JsonObject:
    keys = [random.Random(7).choice(data)[0] for _ in range(plan.gets)]
    with NatsServer(work / "nats-kv", jetstream=True) as server:
        nc = await nats.connect(server.url)
        try:
            js = nc.jetstream()
            kv = await js.create_key_value(bucket=BUCKET, history=1, direct=True)
            cpu0 = cpu_seconds(server.pid)
            puts = await publish_listed(server.url, kv_messages(data), plan.window, work)
            puts["cpu_us_per_put"] = (cpu_seconds(server.pid) - cpu0) / plan.records * 1e6

            async def get(key: bytes) -> object:
                try:
                    return await kv.get(key.decode())
                except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
                    return None

            gets = await get_latencies(get, keys)
            gets |= await throughput(server.pid, lambda: request_listed(
                server.url, direct_gets(keys) * THROUGHPUT_REPEATS, plan.concurrency, work))
        finally:
            await nc.close()
    return {**puts, **gets}


async def generator_ceiling(work: Path, plan: Plan,
                            data: Sequence[tuple[bytes, bytes | None]]) -> JsonObject:
    """The compiled generator against no-op peers: the puts through core NATS to its
    responder; the gets as requests nats-server answers itself, as it answers a direct get
    (no one subscribes to their subject: it replies "no responders"), and the GET frames to
    its frames responder."""
    keys = [key for key, _ in data[:plan.gets]]
    sink = [("sink.put", payload, headers) for _, payload, headers in our_messages(data)]
    with NatsServer(work / "nats-core") as server:
        with responder(server.url, "sink.put"):
            puts = await publish_listed(server.url, sink, plan.window, work)
        nats_gets = await request_listed(
            server.url, [("sink.none", b"", None)] * (len(keys) * THROUGHPUT_REPEATS),
            plan.concurrency, work)
    hello, requests = get_frames(keys)
    with frames_responder() as address:
        frame_gets = await request_frames(address, hello, requests * THROUGHPUT_REPEATS,
                                          plan.concurrency, work)
    return {"puts_per_s": puts["puts_per_s"], "nats_gets_per_s": nats_gets.msgs_per_s,
            "frame_gets_per_s": frame_gets.msgs_per_s,
            "gets_per_s": min(nats_gets.msgs_per_s, frame_gets.msgs_per_s)}


def cleaner_in_process(work: Path, data: Sequence[tuple[bytes, bytes | None]]) -> JsonObject:
    log = Log(work / "cleaner-log", LogConfig(segment_bytes_max=64 * MiB,
                                              fsync=FsyncPolicy.NEVER))
    try:
        for i in range(0, len(data), 1000):
            log.append([fmt.Record(v, k) for k, v in data[i:i + 1000]], 0)
        log.roll_if_older(2**62, log.log_end_offset)
        before = log.size_bytes
        plan = CleaningPlan("bench", 0, log.sealed_segments()[-1].next_offset, 1.0, False)
        result = clean(log, plan, CompactionConfig(segment_bytes_max=64 * MiB), 128 * MiB)
        return {"clean_records_per_s": result.stats.records_read / result.duration_s,
                "clean_mb_per_s": result.stats.bytes_read / result.duration_s / 1e6,
                "bytes_after_over_before": log.size_bytes / before,
                "records_removed": result.stats.records_removed,
                "pass_s": result.duration_s}
    finally:
        log.delete()


async def run(plan: Plan) -> JsonObject:
    data = workload(plan)
    with tempfile.TemporaryDirectory(prefix="bench-compaction-") as tmp:
        work = Path(tmp)
        print("cleaner in process ...", file=sys.stderr, flush=True)
        cleaner = cleaner_in_process(work, data)
        print("ours ...", file=sys.stderr, flush=True)
        our = await ours(work, plan, data)
        print("NATS KV ...", file=sys.stderr, flush=True)
        peer = await nats_kv(work, plan, data)
        print("load generator ceiling ...", file=sys.stderr, flush=True)
        ceiling = await generator_ceiling(work, plan, data)
    best = max(our["puts_per_s"], peer["puts_per_s"])
    # Each side's gets against its own path's ceiling: GET frames to the no-op frames
    # responder for ours, requests nats-server bounces itself for NATS KV.
    ours_get_headroom = ceiling["frame_gets_per_s"] / our["gets_per_s"]
    nats_get_headroom = ceiling["nats_gets_per_s"] / peer["gets_per_s"]
    return {
        "plan": asdict(plan),
        "cleaner": cleaner, "ours": our, "nats_kv": peer, "generator": ceiling,
        "clean_records_per_s": cleaner["clean_records_per_s"],
        "bytes_after_over_before": cleaner["bytes_after_over_before"],
        "get_p99_ms": our["get_p99_ms"],
        "get_vs_nats_kv": our["gets_per_s"] / peer["gets_per_s"],
        "put_vs_nats_kv": our["puts_per_s"] / peer["puts_per_s"],
        "ingest_p99_ratio_cleaning": our["ingest_p99_ms_cleaning"] / max(
            our["ingest_p99_ms_idle"], 1e-9),
        "generator_put_headroom": ceiling["puts_per_s"] / best,
        "generator_get_headroom": min(ours_get_headroom, nats_get_headroom),
        "generator_get_headroom_ours": ours_get_headroom,
        "generator_get_headroom_nats": nats_get_headroom,
        "time": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def table(r: JsonObject) -> str:
    o, p, c = r["ours"], r["nats_kv"], r["cleaner"]
    rows = [
        f"{'':28} {'ours':>12} {'NATS KV':>12} {'ratio':>7}",
        (f"{'puts/s (pipelined)':28} {o['puts_per_s']:12,.0f} {p['puts_per_s']:12,.0f} "
        f"{r['put_vs_nats_kv']:7.2f}  (target >= 1.0)"),
        f"{'put ack p99 ms':28} {o['ack_p99_ms']:12.2f} {p['ack_p99_ms']:12.2f}",
        f"{'CPU us/put (server)':28} {o['cpu_us_per_put']:12.1f} {p['cpu_us_per_put']:12.1f}",
        f"{'get p50 ms':28} {o['get_p50_ms']:12.3f} {p['get_p50_ms']:12.3f}",
        (f"{'get p99 ms':28} {o['get_p99_ms']:12.3f} {p['get_p99_ms']:12.3f}  "
        f"(target ours <= 1 ms)"),
        (f"{'gets/s (concurrent)':28} {o['gets_per_s']:12,.0f} {p['gets_per_s']:12,.0f} "
        f"{r['get_vs_nats_kv']:7.2f}  (target >= 1.5)"),
        f"{'CPU us/get (server)':28} {o['cpu_us_per_get']:12.1f} {p['cpu_us_per_get']:12.1f}",
        "",
        (f"cleaner: {c['clean_records_per_s']:,.0f} records/s, {c['clean_mb_per_s']:.1f} MB/s "
        f"(target >= 300k records/s), bytes after/before {c['bytes_after_over_before']:.3f}, "
        f"first pass on the broker {o['time_to_first_clean_s']:.2f} s after it became "
        f"cleanable"),
        (f"ingest p99 while cleaning / idle: {o['ingest_p99_ms_cleaning']:.2f} / "
        f"{o['ingest_p99_ms_idle']:.2f} ms = {r['ingest_p99_ratio_cleaning']:.2f} "
        f"(target <= 1.2; the pass ran during {o['probe_share_while_cleaning']:.0%} of "
        "the probe)"),
        (f"load generator headroom (no-op peers / measured): puts "
        f"{r['generator_put_headroom']:.2f}x, gets {r['generator_get_headroom']:.2f}x "
        f"(ours {r['generator_get_headroom_ours']:.2f}x, NATS KV "
        f"{r['generator_get_headroom_nats']:.2f}x; >= 2 needed)"),
    ]
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    return bench_main("compaction", __doc__, argv,
                      lambda quick: run(QUICK if quick else FULL), table)


if __name__ == "__main__":
    sys.exit(main())
