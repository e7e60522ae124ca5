"""Throughput of the commit log storage engine, side by side with the raw disk under it.

Theory of operation
- The peer of the storage engine is the disk itself: the same run measures raw sequential
  writes (1 MiB `os.write`s, no fsync) and raw fsync latency (4 KiB write + fsync) in the same
  directory, and reports the log's write rate as a ratio of the raw one.
- Without fsync both "write" into the page cache. On this VM a page the guest has not
  touched lately costs a host fault (a 1 MiB write: ~0.2 ms on warm pages, ~2.7 ms on cold
  ones), so the raw figure swings 0.4-6 GB/s with what ran before. A raw write right after
  another of the same size gets warm pages (right after a 384 MiB log run it got cold ones
  every time); a long-running broker recycles page-cache pages, so warm is the representative
  case, and the stricter. So the ratio is measured in pairs: an unmeasured raw write, a
  measured one, then the log's appends (1 KiB x 1000, fsync NEVER) of the same volume, after
  one warm-up pair; it is the median of the per-pair ratios. The table lists the raw runs, so
  a cold one shows. Each side is also timed to stable storage (raw: a final fsync; log:
  `close()`, which seals and fsyncs every segment). That pair is the disk's raw sequential
  write and the log's write to disk, so it is the ratio the target (`raw_write_ratio`)
  applies to; the page-cache ratio (`raw_write_ratio_page_cache`) measures the engine's CPU
  cost against a memory copy and is reported beside it.
- Appends go through `Log.append(records, leader_epoch=0)`, the leader's path. The `Record`
  objects are built before the clock starts; encoding, CRC, pwrite, index upkeep and fsync
  happen inside `append` and are timed, because the broker pays for them. Each run appends for
  a fixed wall-clock time into a fresh log, then deletes it without the closing fsync (that
  fsync is not part of the append path, and deleting drops the dirty pages so the next run
  starts from a quiet page cache).
- INTERVAL uses `fsync_interval_ms` = 1000 (the default), so a run shorter than that fsyncs
  only when a segment rolls (INTERVAL and ALWAYS fsync the sealed segment at the roll).
- Group commit: four threads append one record at a time with fsync ALWAYS and `sync=True`;
  `os.fsync` is wrapped by a counter for that run only, so the report says how many fsyncs
  the shared commits saved.
- Reads go from the start of a log of 128 B records (batches of 1000) to its end, decoded
  (`read_records`, CRC-checked) and raw (`read_bytes`). The log was just written, so this
  reads the page cache: it measures the engine's CPU cost, not the disk.
- The machine is shared and noisy: every figure is the median of several runs (3 with
  --quick, 5 otherwise), and the table shows the spread of the runs.

MB means 10**6 bytes. Append MB/s counts record values (what the producer sent); "disk MB/s"
counts the encoded batches written (values plus 28 B per record and 47 B per batch).

Run from the repository root: `python -m bench.storage [--quick] [--json] [--dir DIR]`.
A full run (no --quick) also writes its JSON to bench/results/storage-<UTC time>.json.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jetstream.stream.config import FsyncPolicy, LogConfig
from jetstream.stream.format import Record
from jetstream.stream.log import Log

if TYPE_CHECKING:
    from _typeshed import FileDescriptorLike

#: A figure set as it is written to JSON: numbers, strings, lists and nested figure sets.
JsonObject = dict[str, Any]

MiB = 1024 * 1024
MB = 1_000_000
RECORD_SIZES = (128, 1024)
BATCH_SIZES = (1, 100, 1000)
POLICIES = (FsyncPolicy.NEVER, FsyncPolicy.INTERVAL, FsyncPolicy.ALWAYS)
# Distinct record values per size; batches are cut from this pool and reused.
VALUE_POOL = 1000
GROUP_COMMIT_THREADS = 4
RAW_WRITE_CHUNK = 1 * MiB
RAW_FSYNC_WRITE = 4 * 1024
TARGET_APPEND_RECORDS_PER_S = 1_000_000
TARGET_RAW_WRITE_RATIO = 0.5
# A volume-bound run gives up after this long (a very slow disk).
RUN_SECONDS_MAX = 60.0
RESULTS_DIR = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True, slots=True)
class Plan:
    """How long and how much each measurement runs; one run of each is one sample."""

    repeats: int
    append_seconds: float
    group_commit_seconds: float
    read_log_records: int
    read_seconds_min: float
    raw_write_bytes: int
    fsync_iterations: int
    fsync_interval_ms: int


QUICK = Plan(repeats=3, append_seconds=0.25, group_commit_seconds=0.5,
             read_log_records=100_000, read_seconds_min=0.2, raw_write_bytes=64 * MiB,
             fsync_iterations=200, fsync_interval_ms=1000)
FULL = Plan(repeats=5, append_seconds=1.0, group_commit_seconds=2.0,
            read_log_records=250_000, read_seconds_min=0.5, raw_write_bytes=384 * MiB,
            fsync_iterations=200, fsync_interval_ms=1000)


@dataclass(frozen=True, slots=True)
class Sample:
    """One timed run: how many records and bytes went through in `seconds` of wall-clock
    time, and the CPU time (user + system) the process spent meanwhile."""

    records: int
    payload_bytes: int
    disk_bytes: int
    seconds: float
    cpu_seconds: float

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds

    @property
    def mb_per_s(self) -> float:
        return self.payload_bytes / self.seconds / MB

    @property
    def disk_mb_per_s(self) -> float:
        return self.disk_bytes / self.seconds / MB

    @property
    def cpu_us_per_record(self) -> float:
        return self.cpu_seconds / self.records * 1e6


def progress(message: str) -> None:
    """Progress goes to stderr: stdout holds the table and the JSON line only."""
    print(message, file=sys.stderr, flush=True)


def summarize(samples: Sequence[Sample]) -> JsonObject:
    """Medians of the per-run rates (not rates of summed totals), and their spread. CPU time
    per record is steadier than wall-clock rates when a neighbour takes the CPU; CPU share
    (CPU time / wall time) well below 1 means waiting: on fsync, or for the CPU."""
    rates = [s.records_per_s for s in samples]
    median = statistics.median(rates)
    return {
        "records_per_s": median,
        "mb_per_s": statistics.median(s.mb_per_s for s in samples),
        "disk_mb_per_s": statistics.median(s.disk_mb_per_s for s in samples),
        "cpu_us_per_record": statistics.median(s.cpu_us_per_record for s in samples),
        "cpu_share": statistics.median(s.cpu_seconds / s.seconds for s in samples),
        "spread": (max(rates) - min(rates)) / median if median else 0.0,
        "runs_records_per_s": rates,
    }


# -- the log ------------------------------------------------------------------------------------

def prebuilt_batches(record_bytes: int, batch_records: int) -> list[list[Record]]:
    records = [Record(os.urandom(record_bytes)) for _ in range(VALUE_POOL)]
    return [records[i:i + batch_records] for i in range(0, len(records), batch_records)]


def append_for(log: Log, batches: Sequence[Sequence[Record]], seconds: float,
               record_bytes: int, records_max: int = 2**62) -> Sample:
    """Append `batches` round and round for `seconds` of wall-clock time or until
    `records_max` records, whichever comes first."""
    records = disk_bytes = 0
    cpu_start = time.process_time()
    start = time.perf_counter()
    deadline = start + seconds
    for batch in itertools.cycle(batches):
        info = log.append(batch, leader_epoch=0)
        records += len(batch)
        disk_bytes += info.size_bytes
        if records >= records_max or time.perf_counter() >= deadline:
            break
    elapsed = time.perf_counter() - start
    return Sample(records, records * record_bytes, disk_bytes, elapsed,
                  time.process_time() - cpu_start)


def append_run(directory: Path, config: LogConfig, batches: Sequence[Sequence[Record]],
               seconds: float, record_bytes: int, records_max: int = 2**62) -> Sample:
    log = Log(directory, config)
    try:
        return append_for(log, batches, seconds, record_bytes, records_max)
    finally:
        log.delete()


def append_matrix(workdir: Path, plan: Plan) -> list[JsonObject]:
    cells = []
    for record_bytes, batch_records, policy in itertools.product(RECORD_SIZES, BATCH_SIZES,
                                                                 POLICIES):
        batches = prebuilt_batches(record_bytes, batch_records)
        config = LogConfig(fsync=policy, fsync_interval_ms=plan.fsync_interval_ms)
        samples = [append_run(workdir / f"append-{rep}", config, batches, plan.append_seconds,
                              record_bytes) for rep in range(plan.repeats)]
        cell = {"record_bytes": record_bytes, "batch_records": batch_records,
                "fsync": policy.value, **summarize(samples)}
        progress(f"append {record_bytes:>4} B x {batch_records:>4} fsync {policy.value:<8} "
                 f"{cell['records_per_s']:>12,.0f} records/s")
        cells.append(cell)
    return cells


def find_cell(cells: Sequence[JsonObject], record_bytes: int, batch_records: int,
              policy: FsyncPolicy) -> JsonObject:
    key = (record_bytes, batch_records, policy.value)
    return next(c for c in cells if (c["record_bytes"], c["batch_records"], c["fsync"]) == key)


@contextlib.contextmanager
def counting_fsync() -> Iterator[itertools.count[int]]:
    """Count every `os.fsync` of this process while the block runs. `next()` on a count is
    atomic under the GIL, and the wrapper costs well under a microsecond per fsync."""
    counter = itertools.count()
    real_fsync = os.fsync

    def fsync(fd: FileDescriptorLike) -> None:  # os.fsync's own signature
        next(counter)
        real_fsync(fd)

    os.fsync = fsync
    try:
        yield counter
    finally:
        os.fsync = real_fsync


def group_commit_run(directory: Path, seconds: float) -> tuple[Sample, int]:
    """GROUP_COMMIT_THREADS threads, one record per append, fsync ALWAYS, sync=True.
    Returns the sample and the number of fsyncs the run made."""
    batches = prebuilt_batches(128, 1)
    log = Log(directory, LogConfig(fsync=FsyncPolicy.ALWAYS))
    start_line = threading.Barrier(GROUP_COMMIT_THREADS + 1)
    results: list[Sample] = []

    def worker() -> None:
        start_line.wait()
        results.append(append_for(log, batches, seconds, 128))

    threads = [threading.Thread(target=worker) for _ in range(GROUP_COMMIT_THREADS)]
    try:
        with counting_fsync() as counter:
            for thread in threads:
                thread.start()
            start_line.wait()
            cpu_start = time.process_time()
            start = time.perf_counter()
            for thread in threads:
                thread.join()
            elapsed = time.perf_counter() - start
            cpu = time.process_time() - cpu_start
            fsyncs = next(counter)
    finally:
        log.delete()
    if len(results) != GROUP_COMMIT_THREADS:
        raise RuntimeError("a group commit thread failed; see its traceback above")
    records = sum(s.records for s in results)
    disk_bytes = sum(s.disk_bytes for s in results)
    return Sample(records, records * 128, disk_bytes, elapsed, cpu), fsyncs


def group_commit(workdir: Path, plan: Plan, one_thread_records_per_s: float) -> JsonObject:
    runs = [group_commit_run(workdir / f"group-{rep}", plan.group_commit_seconds)
            for rep in range(plan.repeats)]
    samples = [sample for sample, _fsyncs in runs]
    fsyncs_per_append = statistics.median(f / s.records for s, f in runs)
    result = {"threads": GROUP_COMMIT_THREADS, "record_bytes": 128, "batch_records": 1,
              "fsync": FsyncPolicy.ALWAYS.value, **summarize(samples),
              "fsyncs_per_append": fsyncs_per_append,
              "fsyncs_saved_fraction": 1 - fsyncs_per_append}
    result["speedup_vs_one_thread"] = result["records_per_s"] / one_thread_records_per_s
    progress(f"group commit {result['records_per_s']:,.0f} records/s, "
             f"{fsyncs_per_append:.2f} fsyncs per append")
    return result


def build_read_log(directory: Path, records: int) -> Log:
    log = Log(directory, LogConfig(fsync=FsyncPolicy.NEVER))
    batches = prebuilt_batches(128, 1000)
    for batch in itertools.islice(itertools.cycle(batches), -(-records // 1000)):
        log.append(batch, leader_epoch=0)
    return log


def read_records_pass(log: Log) -> int:
    """Decode the whole log from its start; returns the records read."""
    offset, end = log.log_start_offset, log.log_end_offset
    records = 0
    while offset < end:
        batch = log.read_records(offset)
        records += len(batch)
        offset = batch[-1].offset + 1
    return records


def read_bytes_pass(log: Log) -> int:
    """Read the whole log from its start as raw batches; returns the records covered."""
    offset, end = log.log_start_offset, log.log_end_offset
    total = 0
    while offset < end:
        data, offset = log.read_bytes(offset, 1 << 20)
        total += len(data)
    if total != log.size_bytes:
        raise RuntimeError(f"read {total} bytes of a {log.size_bytes} byte log")
    return end - log.log_start_offset


def timed_passes(read_pass: Callable[[Log], int], log: Log, record_bytes: int,
                 seconds_min: float) -> Sample:
    """Whole passes over the log until `seconds_min` have gone by (at least one)."""
    passes = records = 0
    cpu_start = time.process_time()
    start = time.perf_counter()
    while True:
        records += read_pass(log)
        passes += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds_min:
            return Sample(records, records * record_bytes, passes * log.size_bytes, elapsed,
                          time.process_time() - cpu_start)


def reads(workdir: Path, plan: Plan) -> JsonObject:
    log = build_read_log(workdir / "read", plan.read_log_records)
    try:
        decoded = [timed_passes(read_records_pass, log, 128, plan.read_seconds_min)
                   for _ in range(plan.repeats)]
        raw = [timed_passes(read_bytes_pass, log, 128, plan.read_seconds_min)
               for _ in range(plan.repeats)]
        result: JsonObject = {"log_records": log.log_end_offset, "record_bytes": 128,
                  "batch_records": 1000, "log_bytes": log.size_bytes,
                  "read_records": summarize(decoded), "read_bytes": summarize(raw)}
    finally:
        log.delete()
    progress(f"read_records {result['read_records']['records_per_s']:,.0f} records/s, "
             f"read_bytes {result['read_bytes']['disk_mb_per_s']:,.0f} MB/s")
    return result


# -- the raw disk -------------------------------------------------------------------------------

def raw_write_run(path: Path, total_bytes: int) -> tuple[float, float]:
    """Sequential 1 MiB os.write calls into a new file, then one fsync: (seconds to write,
    seconds to write and fsync)."""
    chunk = os.urandom(RAW_WRITE_CHUNK)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        start = time.perf_counter()
        for _ in range(total_bytes // RAW_WRITE_CHUNK):
            os.write(fd, chunk)
        written = time.perf_counter()
        os.fsync(fd)
        synced = time.perf_counter()
    finally:
        os.close(fd)
        path.unlink()
    return written - start, synced - start


def raw_fsync_run(path: Path, iterations: int) -> list[float]:
    """Milliseconds of each 4 KiB append + fsync (the file grows, as a segment does)."""
    block = os.urandom(RAW_FSYNC_WRITE)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    latencies = []
    try:
        for _ in range(iterations):
            start = time.perf_counter()
            os.write(fd, block)
            os.fsync(fd)
            latencies.append((time.perf_counter() - start) * 1000)
    finally:
        os.close(fd)
        path.unlink()
    return latencies


def percentile(values: Sequence[float], pct: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[pct - 1]


@dataclass(frozen=True, slots=True)
class WritePair:
    """The raw disk and the log writing the same volume, one after the other."""

    raw_write_s: float
    raw_write_fsync_s: float
    log: Sample
    log_close_s: float  # close() seals and fsyncs every segment: the log's durable write


def write_pair(workdir: Path, batches: Sequence[Sequence[Record]], volume: int) -> WritePair:
    # Measured after the log's run, 384 MiB of raw writes met cold pages every time; after
    # another raw write of the same size, warm ones (see the module docstring).
    raw_write_run(workdir / "raw-write", volume)
    raw_write_s, raw_write_fsync_s = raw_write_run(workdir / "raw-write", volume)
    log = Log(workdir / "side-by-side", LogConfig(fsync=FsyncPolicy.NEVER))
    try:
        sample = append_for(log, batches, RUN_SECONDS_MAX, 1024, records_max=volume // 1024)
        start = time.perf_counter()
        log.close()
        log_close_s = time.perf_counter() - start
    finally:
        log.delete()
    return WritePair(raw_write_s, raw_write_fsync_s, sample, log_close_s)


def pair_figures(pair: WritePair, volume: int) -> dict[str, float]:
    raw = volume / pair.raw_write_s / MB
    raw_fsync = volume / pair.raw_write_fsync_s / MB
    log = pair.log.mb_per_s
    log_close = pair.log.payload_bytes / MB / (pair.log.seconds + pair.log_close_s)
    return {"raw_write_mb_per_s": raw, "raw_write_fsync_mb_per_s": raw_fsync,
            "log_mb_per_s": log, "log_close_mb_per_s": log_close,
            "ratio": log / raw, "ratio_with_fsync": log_close / raw_fsync}


def write_side_by_side(workdir: Path, plan: Plan) -> JsonObject:
    """Raw sequential writes and the log's 1 KiB x 1000 fsync-NEVER appends of the same
    volume, alternating (see the module docstring); the first pair only warms up. The ratios
    are medians of per-pair ratios: the two halves of a pair ran under the same conditions."""
    batches = prebuilt_batches(1024, 1000)
    volume = plan.raw_write_bytes
    write_pair(workdir, batches, volume)
    pairs = [write_pair(workdir, batches, volume) for _ in range(plan.repeats)]
    runs = [pair_figures(pair, volume) for pair in pairs]
    result: JsonObject = {name: statistics.median(run[name] for run in runs)
                                 for name in runs[0]}
    result.update(bytes_per_run=volume, runs=runs, log=summarize([p.log for p in pairs]))
    progress(f"raw write {result['raw_write_mb_per_s']:,.0f} MB/s, log 1 KiB x 1000 "
             f"{result['log_mb_per_s']:,.0f} MB/s, ratio {result['ratio']:.2f}")
    return result


def fsync_latency(workdir: Path, plan: Plan) -> JsonObject:
    runs = [raw_fsync_run(workdir / "raw-fsync", plan.fsync_iterations)
            for _ in range(plan.repeats)]
    result = {"iterations_per_run": plan.fsync_iterations,
              "p50_ms": statistics.median(percentile(run, 50) for run in runs),
              "p99_ms": statistics.median(percentile(run, 99) for run in runs)}
    progress(f"fsync p50 {result['p50_ms']:.3f} ms p99 {result['p99_ms']:.3f} ms")
    return result


# -- putting it together --------------------------------------------------------------------------

def git_state() -> JsonObject:
    """The commit measured, and whether the storage engine had uncommitted edits."""
    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], capture_output=True, text=True, check=False,
                              cwd=RESULTS_DIR.parent.parent)
        return done.stdout.strip()

    return {"commit": git("rev-parse", "HEAD"),
            "engine_dirty": bool(git("status", "--porcelain", "--", "jetstream/stream"))}


def run(workdir: Path, plan: Plan, quick: bool) -> JsonObject:
    # Load averages before and after: a busy neighbour explains an odd run.
    load_before = os.getloadavg()
    fsyncs = fsync_latency(workdir, plan)
    side = write_side_by_side(workdir, plan)
    cells = append_matrix(workdir, plan)
    one_thread = find_cell(cells, 128, 1, FsyncPolicy.ALWAYS)["records_per_s"]
    grouped = group_commit(workdir, plan, one_thread)
    read = reads(workdir, plan)
    headline = find_cell(cells, 128, 1000, FsyncPolicy.NEVER)
    return {
        "benchmark": "storage",
        "mode": "quick" if quick else "full",
        "created_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "git": git_state(),
        "plan": asdict(plan),
        "append_records_per_s": headline["records_per_s"],
        "append_mb_per_s": headline["mb_per_s"],
        "append_fsync_always_records_per_s":
            find_cell(cells, 128, 1000, FsyncPolicy.ALWAYS)["records_per_s"],
        "read_records_per_s": read["read_records"]["records_per_s"],
        "read_bytes_mb_per_s": read["read_bytes"]["disk_mb_per_s"],
        # The target compares what reaches the disk: both sides end with an fsync. Without
        # it the "raw write" is a memory copy into the page cache; that ratio is kept too.
        "raw_write_mb_per_s": side["raw_write_fsync_mb_per_s"],
        "raw_write_ratio": side["ratio_with_fsync"],
        "raw_write_page_cache_mb_per_s": side["raw_write_mb_per_s"],
        "raw_write_ratio_page_cache": side["ratio"],
        "raw_fsync_p50_ms": fsyncs["p50_ms"],
        "raw_fsync_p99_ms": fsyncs["p99_ms"],
        "target_append_records_per_s": TARGET_APPEND_RECORDS_PER_S,
        "target_append_met": headline["records_per_s"] >= TARGET_APPEND_RECORDS_PER_S,
        "target_raw_write_ratio": TARGET_RAW_WRITE_RATIO,
        "target_raw_write_ratio_met": side["ratio_with_fsync"] >= TARGET_RAW_WRITE_RATIO,
        "write_side_by_side": side,
        "fsync_latency": fsyncs,
        "append_matrix": cells,
        "group_commit": grouped,
        "read": read,
    }


def table(results: JsonObject) -> str:
    plan = results["plan"]
    load = results["loadavg_before"][0], results["loadavg_after"][0]
    title = (f"Jetstream storage benchmark ({results['mode']}, median of {plan['repeats']} "
             f"runs, MB = 10^6 B; load average {load[0]:.1f} before, {load[1]:.1f} after)")
    sections = [title, disk_table(results), append_table(results["append_matrix"]),
                group_commit_table(results["group_commit"]), read_table(results["read"]),
                targets_table(results)]
    return "\n\n".join(sections)


def disk_table(results: JsonObject) -> str:
    side, fsyncs = results["write_side_by_side"], results["fsync_latency"]
    volume = side["bytes_per_run"] // MiB
    raw_runs = [run["raw_write_mb_per_s"] for run in side["runs"]]
    return "\n".join([
        f"raw disk vs log: {volume} MiB each, 1 MiB os.write vs Log.append 1 KiB x 1000",
        f"  {'':<28} {'raw MB/s':>10} {'log MB/s':>10} {'log / raw':>10}",
        (f"  {'page cache (no fsync)':<28} {side['raw_write_mb_per_s']:>10,.0f} "
        f"{side['log_mb_per_s']:>10,.0f} {side['ratio']:>10.2f}"),
        (f"  {'ending with fsync / close':<28} {side['raw_write_fsync_mb_per_s']:>10,.0f} "
        f"{side['log_close_mb_per_s']:>10,.0f} {side['ratio_with_fsync']:>10.2f}"),
        (f"  raw write runs: {', '.join(f'{r:,.0f}' for r in raw_runs)} MB/s (under ~1,500: cold "
        f"pages, see --help)"),
        (f"  raw 4 KiB write + fsync: p50 {fsyncs['p50_ms']:.3f} ms, "
        f"p99 {fsyncs['p99_ms']:.3f} ms"),
    ])


def append_table(cells: Sequence[JsonObject]) -> str:
    lines = [
        "append for a fixed time (Log.append; MB/s of values, disk MB/s of encoded batches)",
        (f"  {'record':>6} {'batch':>5} {'fsync':<8} {'records/s':>12} {'MB/s':>8} "
        f"{'disk MB/s':>9} {'spread':>7} {'CPU us/rec':>10} {'CPU':>5}"),
    ]
    lines.extend(
        f"  {cell['record_bytes']:>4} B {cell['batch_records']:>5} {cell['fsync']:<8} "
        f"{cell['records_per_s']:>12,.0f} {cell['mb_per_s']:>8,.1f} "
        f"{cell['disk_mb_per_s']:>9,.1f} {cell['spread']:>7.0%} "
        f"{cell['cpu_us_per_record']:>10.2f} {cell['cpu_share']:>5.0%}"
        for cell in cells)
    return "\n".join(lines)


def group_commit_table(grouped: JsonObject) -> str:
    return (
        f"group commit: {grouped['threads']} threads, 128 B x 1, fsync always\n"
        f"  {grouped['records_per_s']:>12,.0f} records/s "
        f"({grouped['speedup_vs_one_thread']:.1f}x one thread), "
        f"{grouped['fsyncs_per_append']:.2f} fsyncs per append "
        f"({grouped['fsyncs_saved_fraction']:.0%} saved)"
    )


def read_table(read: JsonObject) -> str:
    return "\n".join([
        f"read from the start: {read['log_records']:,} records of 128 B in batches of 1000",
        (f"  read_records (decoded)  {read['read_records']['records_per_s']:>12,.0f} records/s"
        f"  ({read['read_records']['cpu_us_per_record']:.2f} CPU us/record)"),
        f"  read_bytes (raw)        {read['read_bytes']['disk_mb_per_s']:>12,.0f} MB/s",
    ])


def targets_table(results: JsonObject) -> str:
    return "\n".join([
        "targets",
        target_line("append 128 B x 1000, fsync never",
                    results["append_records_per_s"], TARGET_APPEND_RECORDS_PER_S,
                    results["target_append_met"], "{:,.0f} records/s"),
        target_line("log / raw write to disk, 1 KiB x 1000",
                    results["raw_write_ratio"], TARGET_RAW_WRITE_RATIO,
                    results["target_raw_write_ratio_met"], "{:.2f}"),
        f"  (into the page cache only, no fsync: {results['raw_write_ratio_page_cache']:.2f})",
    ])


def target_line(name: str, value: float, target: float, met: bool, fmt: str) -> str:
    verdict = "met" if met else "NOT MET"
    return f"  {name:<40} {fmt.format(value):>18}  target {fmt.format(target)}: {verdict}"


def save(results: JsonObject) -> Path:
    """Write the JSON beside the other runs; a .tmp then a rename, so no half file remains."""
    RESULTS_DIR.mkdir(exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = RESULTS_DIR / f"storage-{stamp}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(results, indent=2) + "\n")
    tmp.replace(path)
    return path


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.storage", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="fewer and shorter runs (under a minute); results are not saved")
    parser.add_argument("--json", action="store_true",
                        help="print every figure as one JSON object on the last line")
    parser.add_argument("--dir", type=Path, default=None,
                        help="where to create the scratch directory (default: /tmp); the "
                             "scratch directory is removed at the end")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    plan = QUICK if args.quick else FULL
    if args.dir is not None:
        args.dir.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="jetstream-bench-", dir=args.dir))
    try:
        results = run(workdir, plan, args.quick)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(table(results))
    if not args.quick:
        print(f"\nsaved {save(results)}")
    if args.json:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
