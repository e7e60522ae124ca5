"""Datastreams: mirror throughput between two clusters against a NATS JetStream mirror, the
mirror's lag at half its rate, and the Parquet sink's rows per second.

Theory of operation
- Two Jetstream clusters of one broker each, each with its own nats-server, on loopback.
  Mirror throughput: a stream of `messages` 128 B records (1 partition, fsync interval, as
  NATS JetStream's default does not fsync each message either) is filled on cluster A
  first (bench.common's pipelined publisher; the load generator is not running while the
  mirror is measured, so it cannot be its bottleneck), then a datastream is created on
  cluster B from it into a new stream of B, and timed until the copy's high watermark holds
  every record: records per second of the catch-up, and the brokers' CPU seconds per
  record (utime + stime of both, /proc). `mirror_*` figures are the `mirror` mode's (what a
  plain mirror of a stream uses: batches copied as they are); `records_mirror_*` the
  `records` mode's (each record re-published with its source in headers), measured the
  same way beside it.
- The peer: one nats-server with JetStream (file storage); a stream filled the same way,
  then a `mirror` stream of it created and timed until it holds every message; the
  server's CPU per message. `mirror_vs_js_mirror` is the ratio of medians over `repeats`.
- Lag: with a `mirror` mode datastream running, 128 B records are published to A at half
  of the measured mirror rate (bench.common.publish_paced) for `warmup_s + measure_s` — or,
  when the source took in less than twice that while it was filled, at LAG_FILL_SHARE of
  the fill rate (`lag_rate_is_half_the_mirror_rate` says which) — and a subscriber of
  B's copy (in this process: one clock) notes when each record arrives; a record's lag runs
  from the time it was due to be published. p50/p99 over the records due after the warm-up.
  The publisher's own lag behind its schedule is reported (`send_lag_p99_ms`) so a
  generator that falls behind shows.
- Parquet: the first filled stream is landed by a `parquet` datastream on A (files of at
  most 100,000 rows, rolled after 1 s), timed until the manifest holds every record.

Run from the repository root: `python -m bench.datastreams [--quick] [--json]`. With --json
the last line is one JSON object (`mirror_msgs_per_s`, `mirror_vs_js_mirror`,
`mirror_lag_p99_s`, `parquet_sink_rows_per_s`, ...); a full run also writes it to
bench/results/datastreams-<UTC time>.json.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import nats
from nats.js.api import StreamConfig, StreamSource

import jetstream
from bench.common import (
    JsonObject,
    bench_main,
    cpu_seconds,
    percentile,
    publish_paced,
    publish_pipelined,
)
from jetstream.client import Client
from jetstream.datastreams.parquet_sink import read_manifest
from jetstream.natsd import NatsServer
from jetstream.server.process import BrokerProcess

PAYLOAD = b"x" * 128
WINDOW = 1000
DEADLINE_S = 300.0
#: The lag run offers at most this share of the rate the source took in when filled.
LAG_FILL_SHARE = 0.2
POLL_S = 0.01


async def _until(probe: Any, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not await probe():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {DEADLINE_S} s: {what}")
        await asyncio.sleep(POLL_S)


async def _fill(url: str, subject: str, count: int) -> JsonObject:
    return await publish_pipelined(url, [(subject, PAYLOAD, None)] * count, WINDOW)


async def _hw(js: Client, stream: str) -> int:
    return (await js.partition_status(stream, 0)).high_watermark or 0


def _destination(stream: str, mode: str) -> JsonObject:
    return {"type": "jetstream", "settings": {"stream": stream, "mode": mode}}


async def mirror_once(a: BrokerProcess, b: BrokerProcess, nats_a: str, messages: int,
                      run: str, mode: str) -> JsonObject:
    src, dst = f"src{run}", f"dst{run}"
    async with jetstream.connect(a.address) as ja, jetstream.connect(b.address) as jb:
        await ja.create_stream(src, src, fsync="interval")
        await jb.create_stream(dst, dst, fsync="interval")
        fill = await _fill(nats_a, src, messages)
        cpu = cpu_seconds(a.pid) + cpu_seconds(b.pid)
        started = time.perf_counter()
        await jb.create_datastream(
            f"m{run}", {"type": "jetstream", "settings": {"brokers": a.address, "stream": src}},
            _destination(dst, mode), batch_records_max=5000, in_flight_max=5000)

        async def copied() -> bool:
            return await _hw(jb, dst) >= messages

        await _until(copied, "the mirror's copy")
        elapsed = time.perf_counter() - started
        cpu = cpu_seconds(a.pid) + cpu_seconds(b.pid) - cpu
        await jb.delete_datastream(f"m{run}")
    return {"msgs_per_s": messages / elapsed, "seconds": elapsed,
            "cpu_us_per_msg": cpu / messages * 1e6, "fill_puts_per_s": fill["puts_per_s"]}


async def js_mirror_once(server: NatsServer, messages: int, run: int) -> JsonObject:
    nc = await nats.connect(server.url)
    try:
        js = nc.jetstream()
        await js.add_stream(StreamConfig(name=f"ORIGIN{run}", subjects=[f"origin{run}"]))
        await _fill(server.url, f"origin{run}", messages)
        cpu = cpu_seconds(server.pid)
        started = time.perf_counter()
        await js.add_stream(StreamConfig(name=f"MIRROR{run}",
                                         mirror=StreamSource(name=f"ORIGIN{run}")))

        async def copied() -> bool:
            info = await js.stream_info(f"MIRROR{run}")
            return bool(info.state.messages >= messages)

        await _until(copied, "the NATS JetStream mirror")
        elapsed = time.perf_counter() - started
        cpu = cpu_seconds(server.pid) - cpu
    finally:
        await nc.close()
    return {"msgs_per_s": messages / elapsed, "seconds": elapsed,
            "cpu_us_per_msg": cpu / messages * 1e6}


async def lag(a: BrokerProcess, b: BrokerProcess, nats_a: str, rate: int, warmup_s: float,
              measure_s: float, mode: str) -> JsonObject:
    async with jetstream.connect(a.address) as ja, jetstream.connect(b.address) as jb:
        await ja.create_stream("lagsrc", "lagsrc", fsync="interval")
        await jb.create_stream("lagdst", "lagdst", fsync="interval")
        await jb.create_datastream(
            "lag", {"type": "jetstream", "settings": {"brokers": a.address,
                                                      "stream": "lagsrc"}},
            _destination("lagdst", mode), batch_records_max=5000, in_flight_max=5000)
        count = round(rate * (warmup_s + measure_s))
        arrived = [0.0] * count
        start = time.perf_counter() + 1.0

        async def follow() -> None:
            seen = 0
            async with jb.subscribe("lagdst", max_wait_ms=100) as sub:
                async for message in sub:
                    arrived[message.offset] = time.perf_counter()
                    seen += 1
                    if seen == count:
                        return

        follower = asyncio.create_task(follow())
        sent = await publish_paced(nats_a, "lagsrc", PAYLOAD, rate, start, warmup_s, measure_s)
        await asyncio.wait_for(follower, DEADLINE_S)
        await jb.delete_datastream("lag")
    first = round(rate * warmup_s)
    lags = [arrived[i] - (start + i / rate) for i in range(first, count)]
    return {"offered_msgs_per_s": rate, "records": len(lags),
            "lag_p50_s": percentile(lags, 50), "lag_p99_s": percentile(lags, 99),
            "lag_max_s": max(lags), "publish_msgs_per_s": sent["msgs_per_s"],
            "send_lag_p99_ms": sent["send_lag_p99_ms"]}


async def parquet(a: BrokerProcess, path: Path, messages: int) -> JsonObject:
    async with jetstream.connect(a.address) as ja:
        cpu = cpu_seconds(a.pid)
        started = time.perf_counter()
        await ja.create_datastream(
            "lake", {"type": "jetstream", "settings": {"stream": "src0"}},
            {"type": "parquet", "settings": {"path": str(path), "roll_ms": 1000}},
            batch_records_max=5000)

        async def filed() -> bool:
            files = read_manifest(path, 0)
            return bool(files) and files[-1]["end_offset"] >= messages

        await _until(filed, "the Parquet files")
        elapsed = time.perf_counter() - started
        cpu = cpu_seconds(a.pid) - cpu
        await ja.delete_datastream("lake")
    return {"rows_per_s": messages / elapsed, "seconds": elapsed,
            "cpu_us_per_row": cpu / messages * 1e6,
            "files": len(read_manifest(path, 0))}


async def run(quick: bool) -> JsonObject:
    messages = 20_000 if quick else 100_000
    repeats = 1 if quick else 3
    warmup_s, measure_s = (2.0, 5.0) if quick else (5.0, 20.0)
    with tempfile.TemporaryDirectory(prefix="bench-datastreams-") as tmp:
        root = Path(tmp)
        with NatsServer(root / "nats-a") as nats_a, NatsServer(root / "nats-b") as nats_b:
            a = BrokerProcess(root / "a", nats_a.url).start()
            b = BrokerProcess(root / "b", nats_b.url).start()
            try:
                ours = [await mirror_once(a, b, nats_a.url, messages, str(r), "mirror")
                        for r in range(repeats)]
                mirror_rate = statistics.median(r["msgs_per_s"] for r in ours)
                by_records = [await mirror_once(a, b, nats_a.url, messages, f"r{r}",
                                                "records") for r in range(repeats)]
                fill_rate = statistics.median(r["fill_puts_per_s"] for r in ours)
                # Half the mirror's rate, unless the source cannot take that much in: then a
                # share of what it took while filled (the publisher and the subscriber share
                # this process; past that the lag measures them and the source's ingest).
                half = max(100, int(mirror_rate / 2))
                rate = max(100, min(half, int(fill_rate * LAG_FILL_SHARE)))
                lagged = await lag(a, b, nats_a.url, rate, warmup_s, measure_s, "mirror")
                landed = await parquet(a, root / "lake", messages)
            finally:
                a.stop()
                b.stop()
        with NatsServer(root / "nats-js", jetstream=True,
                        store_dir=root / "js-store") as js_server:
            theirs = [await js_mirror_once(js_server, messages, r) for r in range(repeats)]
    js_rate = statistics.median(r["msgs_per_s"] for r in theirs)
    return {
        "messages": messages, "repeats": repeats, "payload_bytes": len(PAYLOAD),
        "mirror_msgs_per_s": mirror_rate,
        "js_mirror_msgs_per_s": js_rate,
        "mirror_vs_js_mirror": mirror_rate / js_rate,
        "mirror_cpu_us_per_msg": statistics.median(r["cpu_us_per_msg"] for r in ours),
        "mirror_mode": "mirror",
        "records_mirror_msgs_per_s": statistics.median(r["msgs_per_s"] for r in by_records),
        "records_mirror_cpu_us_per_msg": statistics.median(r["cpu_us_per_msg"]
                                                           for r in by_records),
        "records_mirror_vs_js_mirror": statistics.median(r["msgs_per_s"] for r in by_records)
        / js_rate,
        "source_fill_msgs_per_s": fill_rate,
        "lag_rate_is_half_the_mirror_rate": rate == half,
        "js_mirror_cpu_us_per_msg": statistics.median(r["cpu_us_per_msg"] for r in theirs),
        "mirror_lag_p50_s": lagged["lag_p50_s"], "mirror_lag_p99_s": lagged["lag_p99_s"],
        "lag": lagged,
        "parquet_sink_rows_per_s": landed["rows_per_s"], "parquet": landed,
        "runs": {"mirror": ours, "records_mirror": by_records, "js_mirror": theirs},
        "targets": {"mirror_vs_js_mirror >= 1.0": mirror_rate / js_rate >= 1.0,
                    f"mirror_lag_p99_s <= 1.0 at {rate} msg/s "
                    f"({'half the mirror rate' if rate == half else 'below half the mirror rate'})":
                        lagged["lag_p99_s"] <= 1.0},
    }


def table(results: JsonObject) -> str:
    rows = [
        ("mirror mode (batches)", f"{results['mirror_msgs_per_s']:,.0f} msg/s",
         f"{results['mirror_cpu_us_per_msg']:.1f} us CPU/msg"),
        ("records mode (headers)", f"{results['records_mirror_msgs_per_s']:,.0f} msg/s",
         f"{results['records_mirror_cpu_us_per_msg']:.1f} us CPU/msg"),
        ("NATS JetStream mirror", f"{results['js_mirror_msgs_per_s']:,.0f} msg/s",
         f"{results['js_mirror_cpu_us_per_msg']:.1f} us CPU/msg"),
        ("ratio", f"{results['mirror_vs_js_mirror']:.2f}x", ""),
        (f"lag at {results['lag']['offered_msgs_per_s']:,} msg/s",
         f"p50 {results['mirror_lag_p50_s']:.3f} s",
         f"p99 {results['mirror_lag_p99_s']:.3f} s"),
        ("Parquet sink", f"{results['parquet_sink_rows_per_s']:,.0f} rows/s",
         f"{results['parquet']['cpu_us_per_row']:.1f} us CPU/row"),
    ]
    return "\n".join(f"{a:<34} {b:>18} {c:>22}" for a, b, c in rows)


def main(argv: list[str] | None = None) -> int:
    return bench_main("datastreams", __doc__, argv, run, table)


if __name__ == "__main__":
    raise SystemExit(main())
