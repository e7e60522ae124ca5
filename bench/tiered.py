"""Tiered storage against moto's S3 server and `file://`, in one run: offload throughput
against a raw put of the same bytes with the same library (obstore), a catch-up read from the
store against the same read from local disk, and ingest ack p99 while a stream offloads
against one that does not.

- Offload: sealed segments of a real log uploaded by offload passes (read CRC-checked,
  SHA-256, put, HEAD to verify) ÷ `FragmentStore.put` of the same segment files' bytes, read
  beforehand (so the raw side pays nothing but the put). Fresh names each round (an offload
  of bytes already stored uploads nothing).
- Catch-up read: every record of a partition read from offset 0 and decoded, by a leader
  whose disk holds none of it (cold fragment cache: downloads, digest checks and read-ahead
  included) ÷ the same read from the log on local disk.
- Ingest: a broker process, the compiled load generator (bench.loadgen) sending plain NATS
  requests at a fixed rate (an open loop: each request goes when it is due, whatever the
  acks do), ack latency timed by the generator; a stream with 1 MiB segments offloading and
  deleting locally as it goes ÷ the same stream without a store, in the same run, once
  offloading to moto's S3 (the headline: moto is a Python server on the same cores, whose
  work per upload the broker competes with) and once to a directory. A Python publisher
  would put its own lateness into every latency: paced at 2,000 msg/s, nats-py's sends were
  about 1.1 ms late at p99, half the ack p99 it measured. The page cache is written back
  (`sync`) before each round: the offload and read measurements leave a gigabyte or more
  dirty, and its writeback, due 30 s later, stalled the broker's appends behind the file
  system's journal for up to 0.8 s in whichever round it fell.
- Spark over Parquet fragments (bench.tiered_spark): `jetstream.spark.read` of a stream whose
  history is in Parquet fragments (`file://` store) ÷ Spark reading the same rows from a
  plain Parquet dataset.
`python -m bench.tiered --quick --json`.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jetstream
from bench import tiered_spark
from bench.common import JsonObject, bench_main, cpu_seconds
from bench.loadgen import Load, run_load
from jetstream.natsd import NatsServer
from jetstream.server.process import BrokerProcess
from jetstream.stream import format as fmt
from jetstream.stream.config import FsyncPolicy, LogConfig, MiB
from jetstream.stream.handles import HandlePool
from jetstream.stream.log import Log
from jetstream.tiered.local_s3 import LocalS3
from jetstream.tiered.names import Compression
from jetstream.tiered.offload import PassResult
from jetstream.tiered.partition_tier import PartitionTier, TierConfig
from jetstream.tiered.planner import TotalRetention
from jetstream.tiered.reader import FragmentCache
from jetstream.tiered.settings import StoreRetention, TieredSettings
from jetstream.tiered.store import FragmentStore, StoreRegistry

MB = 1_000_000
TARGETS = {"offload_vs_raw_put": 0.8, "store_read_vs_local": 0.5,
           "ingest_p99_ratio_offloading": 1.2, "spark_parquet_fragments_vs_parquet": 0.9}
NO_RETENTION = TotalRetention(None, None, None)


def _fill(directory: Path, segment_bytes: int, total_bytes: int, record_bytes: int) -> Log:
    log = Log(directory, LogConfig(segment_bytes_max=segment_bytes, fsync=FsyncPolicy.NEVER),
              pool=HandlePool(256))
    value = b"v" * record_bytes
    per_batch = max(1, min(1000, (4 * MiB) // (record_bytes + 28)))
    while log.size_bytes < total_bytes:
        log.append([fmt.Record(value)] * per_batch, 0, sync=False)
    log.append([fmt.Record(value)], 0, sync=False)
    return log


def _tier(url: str, stream: str, cache_dir: Path) -> PartitionTier:
    settings = TieredSettings(url, Compression.NONE, None, None, StoreRetention.EXTERNAL)
    return PartitionTier(stream, 0, settings, StoreRegistry(),
                         FragmentCache(cache_dir, 1 << 40, HandlePool(256), None), TierConfig(),
                         None)


def _offload_all(tier: PartitionTier, log: Log) -> int:
    uploaded = 0
    while True:
        outcome = tier.prepare(log, log.log_end_offset, NO_RETENTION, 0, 0)()
        tier.finish(outcome, 0)
        assert isinstance(outcome, PassResult)
        if not outcome.uploaded:
            return uploaded
        uploaded += sum(f.size_bytes for f in outcome.uploaded)


def measure_offload(url: str, tmp: Path, quick: bool) -> JsonObject:
    segment_bytes = 8 * MiB if quick else 32 * MiB
    log = _fill(tmp / "offload-log", segment_bytes, (48 if quick else 256) * MiB, 1000)
    sealed = log.sealed_segments()
    payloads = [seg.log_path.read_bytes() for seg in sealed]
    size = sum(len(p) for p in payloads)
    store = FragmentStore(url)
    raw, ours = [], []
    for r in range(3):
        start = time.perf_counter()
        for i, payload in enumerate(payloads):
            store.put(f"{store.prefix}/raw/{r}/{i:06d}".lstrip("/"), payload)
        raw.append(size / MB / (time.perf_counter() - start))
        tier = _tier(url, f"offload{r}", tmp / f"cache-offload-{r}")
        start = time.perf_counter()
        uploaded = _offload_all(tier, log)
        ours.append(uploaded / MB / (time.perf_counter() - start))
        assert uploaded == size, (uploaded, size)
    log.close()
    return {"segment_bytes": segment_bytes, "offloaded_bytes": size,
            "raw_put_mb_s": statistics.median(raw), "offload_mb_s": statistics.median(ours),
            "offload_vs_raw_put": statistics.median(ours) / statistics.median(raw),
            "rounds_offload_mb_s": ours, "rounds_raw_put_mb_s": raw}


async def _read_records(read: Any, end: int) -> int:
    count, offset = 0, 0
    while offset < end:
        with await read(offset) as piece:
            data = piece.read()
            offset = piece.next_offset
        count += len(fmt.decode_batches(data))
    return count


async def measure_read(url: str, tmp: Path, quick: bool) -> JsonObject:
    records = 200_000 if quick else 1_000_000
    log = _fill(tmp / "read-log", 8 * MiB, records * (128 + 28), 128)
    writer = _tier(url, "catchup", tmp / "cache-writer")
    _offload_all(writer, log)
    end = log.sealed_segments()[-1].next_offset
    local_rates, store_rates = [], []
    for r in range(2 if quick else 3):
        start = time.perf_counter()
        count = await _read_records(
            lambda offset: asyncio.sleep(0, log.read(offset, 1 * MiB, end)), end)
        local_rates.append(count / (time.perf_counter() - start))
        empty = Log(tmp / f"empty-{r}", pool=HandlePool(64))
        reader = _tier(url, "catchup", tmp / f"cache-reader-{r}")
        await reader.open_log(empty, lambda: False)  # lists the store, starts after it
        assert empty.log_start_offset == end
        start = time.perf_counter()
        count_store = await _read_records(
            lambda offset, reader=reader, empty=empty: reader.read(offset, 1 * MiB, end,
                                                                   empty), end)
        store_rates.append(count_store / (time.perf_counter() - start))
        assert count_store == count == end, (count_store, count, end)
        empty.close()
    log.close()
    return {"records": end, "local_records_per_s": statistics.median(local_rates),
            "store_records_per_s": statistics.median(store_rates),
            "store_read_vs_local": statistics.median(store_rates)
            / statistics.median(local_rates)}


def _write_back() -> int:
    """Write the page cache's dirty pages back (`sync`); how many kB were dirty before."""
    dirty_kb = 0
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("Dirty:"):
                dirty_kb = int(line.split()[1])
    os.sync()
    return dirty_kb


async def measure_ingest(bucket: str, tmp: Path, quick: bool) -> dict[str, JsonObject]:
    """Ack p99 of a stream that offloads to moto's S3 (`s3`) and of one that offloads to a
    directory (`file`), each ÷ that of a stream without a store, all three on one broker and
    taking turns in each round."""
    rate, size = 2000, 1024
    warmup_s, measure_s = (2.0, 8.0) if quick else (5.0, 30.0)
    rounds = 1 if quick else 3
    stores = {"s3": f"{bucket}/ingest", "file": f"file://{tmp}/ingest-store"}
    out: dict[str, list[JsonObject]] = {"plain": [], "s3": [], "file": []}
    with NatsServer(tmp / "nats") as nats_server:
        broker = BrokerProcess(tmp / "broker", nats_server.url).start()
        try:
            async with jetstream.connect(broker.address) as js:
                await js.create_stream("plain", "bench.plain", segment_bytes_max=MiB,
                                       fsync="never")
                for name, url in stores.items():
                    await js.create_stream(name, f"bench.{name}", segment_bytes_max=MiB,
                                           fsync="never", tiered={
                                               "fragment_store": url,
                                               "local_retention_bytes": 4 * MiB})
                for _ in range(rounds):
                    for name in out:
                        dirty_kb = await asyncio.to_thread(_write_back)
                        cpu = cpu_seconds(broker.pid)
                        load = await run_load(nats_server.url, Load(
                            f"bench.{name}", size=size, inflight=rate, rate=rate,
                            duration_s=measure_s, warmup_s=warmup_s))
                        figures = load.figures()
                        sent = max(load.sent, 1)
                        figures["broker_cpu_us_per_msg"] = (
                            (cpu_seconds(broker.pid) - cpu) / sent * 1e6)
                        figures["generator_cpu_us_per_msg"] = load.generator_cpu_s / sent * 1e6
                        figures["dirty_kb_before_sync"] = dirty_kb
                        out[name].append(figures)
                stored = {name: (await js.fragments(name, 0))[0] for name in stores}
        finally:
            broker.stop()
    plain = statistics.median(f["ack_p99_ms"] for f in out["plain"])
    results: dict[str, JsonObject] = {}
    for name in stores:
        offloading = statistics.median(f["ack_p99_ms"] for f in out[name])
        results[name] = {
            "rate_msgs_per_s": rate, "payload_bytes": size,
            "plain_ack_p99_ms": plain, "offloading_ack_p99_ms": offloading,
            "ingest_p99_ratio_offloading": offloading / plain,
            "offloaded_fragments": stored[name].get("stored_fragments", 0),
            "offload_backlog_bytes": stored[name].get("backlog_bytes", 0),
            "generator": "bench/loadgen",
            "generator_cpu_us_per_msg": statistics.median(
                f["generator_cpu_us_per_msg"] for f in out["plain"] + out[name]),
            "runs": {"plain": out["plain"], "offloading": out[name]}}
    return results


async def run(quick: bool) -> JsonObject:
    results: dict[str, Any] = {"quick": quick, "targets": TARGETS}
    with tempfile.TemporaryDirectory() as tmp_name, LocalS3(Path(tmp_name) / "moto.log") as s3:
        tmp = Path(tmp_name)
        s3.apply_env()
        bucket = s3.create_bucket("bench-tiered")
        for backend, url in (("s3", f"{bucket}/tier"), ("file", f"file://{tmp}/store")):
            (tmp / backend).mkdir()
            results[backend] = {"offload": measure_offload(url, tmp / backend, quick),
                                "read": await measure_read(url, tmp / backend, quick)}
        ingest = await measure_ingest(bucket, tmp, quick)
        results["ingest_s3"], results["ingest_file"] = ingest["s3"], ingest["file"]
        results["spark_file"] = await tiered_spark.measure(tmp, quick)
    results["offload_vs_raw_put"] = results["s3"]["offload"]["offload_vs_raw_put"]
    results["store_read_vs_local"] = results["s3"]["read"]["store_read_vs_local"]
    results["ingest_p99_ratio_offloading"] = \
        results["ingest_s3"]["ingest_p99_ratio_offloading"]
    results["ingest_p99_ratio_offloading_file"] = \
        results["ingest_file"]["ingest_p99_ratio_offloading"]
    results["spark_parquet_fragments_vs_parquet"] = \
        results["spark_file"]["spark_parquet_fragments_vs_parquet"]
    return results


def table(results: JsonObject) -> str:
    lines = [f"{'figure':<52}{'s3 (moto)':>14}{'file://':>14}"]
    for label, part, key, fmt_ in (
            ("raw put MB/s", "offload", "raw_put_mb_s", "{:.1f}"),
            ("offload MB/s", "offload", "offload_mb_s", "{:.1f}"),
            ("offload ÷ raw put (target >= 0.8)", "offload", "offload_vs_raw_put", "{:.2f}"),
            ("catch-up read from local disk, records/s", "read", "local_records_per_s",
             "{:,.0f}"),
            ("catch-up read from the store, records/s", "read", "store_records_per_s",
             "{:,.0f}"),
            ("store ÷ local (target >= 0.5)", "read", "store_read_vs_local", "{:.2f}")):
        lines.append(f"{label:<52}{fmt_.format(results['s3'][part][key]):>14}"
                     f"{fmt_.format(results['file'][part][key]):>14}")
    for store in ("s3", "file"):
        ingest = results[f"ingest_{store}"]
        lines.append(f"ingest ack p99 without / while offloading ({store}): "
                     f"{ingest['plain_ack_p99_ms']:.2f} / {ingest['offloading_ack_p99_ms']:.2f}"
                     f" ms = {ingest['ingest_p99_ratio_offloading']:.2f}x (target <= 1.2), "
                     f"{ingest['offloaded_fragments']} fragments offloaded, generator "
                     f"{ingest['generator_cpu_us_per_msg']:.1f} us of CPU a message")
    spark = results["spark_file"]
    lines.append(
        f"spark over Parquet fragments / plain Parquet (file://, {spark['rows']:,} rows in "
        f"{spark['parquet_fragments']} fragments, tail {spark['tail_records']:,} records): "
        f"{spark['parquet_fragments_read']['rows_per_s']:,.0f} / "
        f"{spark['plain_parquet_read']['rows_per_s']:,.0f} rows/s = "
        f"{spark['spark_parquet_fragments_vs_parquet']:.2f}x (target >= 0.9); CPU "
        f"{spark['parquet_fragments_read']['cpu_us_per_row']:.2f} / "
        f"{spark['plain_parquet_read']['cpu_us_per_row']:.2f} us/row; with the live tail "
        f"through the source: {spark['with_tail_read']['rows_per_s']:,.0f} rows/s = "
        f"{spark['with_tail_vs_parquet']:.2f}x; planning {spark['planning_seconds']:.3f} s")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    return bench_main("tiered", __doc__, argv, run, table)


if __name__ == "__main__":
    sys.exit(main())
