"""The cost of checking stored data: the scrubber's rate, catch-up reads of checked and
unchecked bytes, and ingest latency while the scrubber runs (issue 18).

Theory of operation
- Scrub rate: a log of `log_bytes` written by this process (128 B records in batches of
  1000, segments of 64 MiB, fsync never) is checked whole, segment after segment, with
  `Log.check_segment(base_offset, pace)` and a pace that only counts (what the scrubber does
  at rate 0: full speed). MB/s of segment bytes, CPU seconds per GB, and the share of the
  bytes `pace` was told of (the scrubber keeps to its rate by it: it must be 100 %). The same
  check runs over the oldest `log_bytes` of the log the broker wrote in part 3, whose
  batches are ingest's own (smaller): the data the scrubber reads there.
- Catch-up reads, at the level a broker pays for: one consumer reads the whole log from
  offset 0 with `Log.read(offset, 1 MiB)` (a consumer fetch's default size) and sends each
  FileSlice with `os.sendfile` into a sink: /dev/null (the read path alone, so the strictest
  ratio) or a socket pair whose far end a thread drains (a connection; a pass is timed until
  the drain has every byte). Per sink, `repeats` times:
  - first read: the log is opened again (`close()`, then `Log(...)`), so no byte is checked
    and every slice is read (pread) and its CRCs walked before it is sent; one pass;
  - then passes that alternate between two readings, until each has run
    `read_seconds_min`: verified (every range is now checked: slices go out as they are,
    zero copy) and off, today's path: `VerifiedRanges.covers` is replaced by a function
    answering True (`unittest.mock.patch.object`) for that pass only, so `Log.read` takes
    every byte as checked and sends it without a look.
  `catchup_verified_ratio` (verified / off, /dev/null) and the first read's ratio to
  verified are medians of the per-repetition ratios. A counter wrapped around
  `log_integrity.first_bad_batch` shows how many slices each reading checked: verified and
  off must check none. The log sits in the page cache (just written): these are CPU costs,
  not the disk's.
- Ingest with and without the scrubber: one nats-server and one broker on loopback; a stream
  (ack leader, fsync interval) is first filled with `prefill_bytes` of 128 B messages at the
  offered rate, so the batches the scrubber reads later (it starts at the oldest) have the
  shape this ingest writes; then the pipelined publisher of bench.common sends
  `CAPACITY_MESSAGES` at full speed (the broker's capacity); scrubber off. Then, in pairs
  whose order alternates, the broker is started again on that data with
  `--scrub-bytes-per-s 0` or with no scrub flag (the default, 4 MiB/s: its first pass starts
  at once and outlasts the run), and 128 B messages are published at a fixed offered rate
  for `warmup_s + measure_s` (bench.common.publish_paced). Each ack's latency runs from the
  time its message was due (a publisher that falls behind shows, not hides); p50, p99 and
  throughput count the messages due after the warm-up. At the ends of the measured window:
  the broker's CPU (utime + stime), the bytes it read with read/pread (`rchar` of
  /proc/<pid>/io, page-cache hits included: the scrubber's reads; its sockets use recv,
  which rchar leaves out), and its /metrics. Unless every scrubbing window read 0.5-2x the
  scrubber's rate, the p99 target is reported as not met: the run did not measure the
  scrubber at its rate. `ingest_p99_ratio_scrubbing` is the median of the per-pair ratios
  p99 on / p99 off.
- The load generator: the same publishers against core NATS with a no-op responder
  (bench.common): the pipelined one at full speed (its ceiling must be at least 2x the
  throughput measured) and the paced one at the offered rate (its own latency floor).
- The machine is small (2 cores) and shared: every figure is a median of `repeats` runs,
  and the runs are listed.

MB means 10**6 bytes. Run from the repository root: `python -m bench.scrub [--quick]
[--json]`. With --json the last line is one JSON object; a full run also writes it to
bench/results/scrub-<UTC time>.json.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal
from unittest import mock

import jetstream
from bench.common import (
    JsonObject,
    bench_main,
    cpu_seconds,
    no_op_responder,
    publish_paced,
    publish_pipelined,
)
from jetstream.client.reading import FETCH_BYTES_DEFAULT
from jetstream.natsd import NatsServer
from jetstream.server.config import BrokerConfig
from jetstream.server.process import BrokerProcess
from jetstream.stream.config import FsyncPolicy, LogConfig, MiB
from jetstream.stream.format import Record
from jetstream.stream.log import Log
from jetstream.stream.verified import BadBatch, VerifiedRanges, first_bad_batch

MB = 1_000_000
PAYLOAD = b"x" * 128
STREAM, SUBJECT = "scrub", "bench.scrub"
RECORDS_PER_BATCH = 1000
#: Seconds per prefill round; rounds go on until the stream holds `prefill_bytes`.
PREFILL_ROUND_S = 5.0
#: Messages of the broker's capacity run (the pipelined publisher at full speed).
CAPACITY_MESSAGES = 100_000
Sink = Literal["devnull", "socket"]
SINKS: tuple[Sink, ...] = ("devnull", "socket")
TARGET_CATCHUP_VERIFIED_RATIO = 0.95
TARGET_INGEST_P99_RATIO = 1.10
TARGET_GENERATOR_HEADROOM = 2.0
SCRUB_BYTES_PER_S_DEFAULT = BrokerConfig().scrub_bytes_per_s


@dataclass(frozen=True, slots=True)
class Plan:
    repeats: int
    log_bytes: int
    read_seconds_min: float
    prefill_bytes: int
    offered_msgs_per_s: int
    warmup_s: float
    measure_s: float
    ceiling_messages: int
    window: int = 4000


QUICK = Plan(repeats=3, log_bytes=64 * MB, read_seconds_min=0.2, prefill_bytes=48 * MB,
             offered_msgs_per_s=20_000, warmup_s=1.5, measure_s=6.0, ceiling_messages=100_000)
FULL = Plan(repeats=7, log_bytes=256 * MB, read_seconds_min=0.5, prefill_bytes=200 * MB,
            offered_msgs_per_s=20_000, warmup_s=3.0, measure_s=15.0, ceiling_messages=200_000)


def progress(message: str) -> None:
    print(f"  .. {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True, slots=True)
class Sample:
    """`size` bytes gone through in `seconds` of wall-clock time and `cpu` CPU seconds of
    this process (every thread); `checked` slices had their CRCs walked by `Log.read`."""

    size: int
    seconds: float
    cpu: float
    checked: int = 0
    paced: int = 0

    @property
    def mb_per_s(self) -> float:
        return self.size / self.seconds / MB

    @property
    def cpu_s_per_gb(self) -> float:
        return self.cpu / (self.size / 1e9)


def summarize(samples: Sequence[Sample]) -> JsonObject:
    return {"mb_per_s": statistics.median(s.mb_per_s for s in samples),
            "cpu_s_per_gb": statistics.median(s.cpu_s_per_gb for s in samples),
            "checked_slices": statistics.median(s.checked for s in samples),
            "paced_share": statistics.median(s.paced / s.size for s in samples),
            "runs_mb_per_s": [round(s.mb_per_s, 1) for s in samples]}


# -- the log in this process -----------------------------------------------------------------


def build_log(directory: Path, size: int) -> Log:
    log = Log(directory, LogConfig(fsync=FsyncPolicy.NEVER))
    records = [Record(os.urandom(len(PAYLOAD))) for _ in range(RECORDS_PER_BATCH)]
    while log.size_bytes < size:
        log.append(records, leader_epoch=0)
    return log


def scrub_pass(log: Log, size_max: int) -> Sample:
    """`check_segment` over the oldest segments, about `size_max` bytes of them, at full
    speed (the scrubber's rate 0: a pace that only counts)."""
    paced = 0

    def pace(n: int) -> None:
        nonlocal paced
        paced += n

    size = 0
    cpu, started = time.process_time(), time.perf_counter()
    for base, segment_bytes in log.segment_snapshot().segments:
        damage = log.check_segment(base, pace)
        if damage is not None:
            raise RuntimeError(f"damage in a log nobody touched: {damage.describe()}")
        size += segment_bytes
        if size >= size_max:
            break
    elapsed = time.perf_counter() - started
    return Sample(size, elapsed, time.process_time() - cpu, paced=paced)


def send_log(log: Log, fd: int) -> int:
    """A consumer's catch-up: the whole log from its start, each slice sent to `fd`."""
    offset, end = log.log_start_offset, log.log_end_offset
    sent = 0
    while offset < end:
        with log.read(offset, FETCH_BYTES_DEFAULT) as piece:
            position, left = piece.position, piece.length
            while left:
                n = os.sendfile(fd, piece.fd, position, left)
                position, left = position + n, left - n
            sent += piece.length
        offset = piece.next_offset
    return sent


class DevNull:
    """A sink that takes every byte at once: the read path's own cost."""

    def __init__(self) -> None:
        self.fd = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)

    def close(self) -> None:
        os.close(self.fd)

    def finish(self, sent: int) -> None:
        self.close()


class DrainedSocket:
    """One end of a socket pair; a thread drains the other, as a consumer's connection."""

    def __init__(self) -> None:
        self._near, self._far = socket.socketpair()
        self.fd = self._near.fileno()
        self._received = 0
        self._thread = threading.Thread(target=self._drain, name="sink-drain", daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        buf = bytearray(1 << 20)
        while n := self._far.recv_into(buf):
            self._received += n

    def close(self) -> None:
        self._near.shutdown(socket.SHUT_WR)
        self._thread.join()
        self._near.close()
        self._far.close()

    def finish(self, sent: int) -> None:
        """Returns once the far end has received everything sent."""
        self.close()
        if self._received != sent:
            raise RuntimeError(f"sent {sent} bytes, {self._received} arrived")


@contextlib.contextmanager
def counting_checks() -> Iterator[itertools.count[int]]:
    """Count the slices `Log.read` checks (its CRC walk, `first_bad_batch`) in the block."""
    counter = itertools.count()

    def counted(buf: bytes | bytearray | memoryview, expected_offset: int) -> BadBatch | None:
        next(counter)
        return first_bad_batch(buf, expected_offset)

    with mock.patch("jetstream.stream.log_integrity.first_bad_batch", counted):
        yield counter


def _covers_all(_self: VerifiedRanges, start: int, end: int) -> bool:
    return True


@contextlib.contextmanager
def verification_off() -> Iterator[None]:
    """Today's path: every range counts as checked, so `Log.read` sends slices unlooked-at."""
    with mock.patch.object(VerifiedRanges, "covers", _covers_all):
        yield


def timed_pass(log: Log, kind: Sink) -> Sample:
    """One catch-up pass into a fresh sink, timed until the sink has every byte."""
    with counting_checks() as checks:
        sink = DevNull() if kind == "devnull" else DrainedSocket()
        cpu, started = time.process_time(), time.perf_counter()
        try:
            sent = send_log(log, sink.fd)
        except BaseException:
            sink.close()
            raise
        sink.finish(sent)
        return Sample(sent, time.perf_counter() - started, time.process_time() - cpu,
                      next(checks))


def merge(samples: Sequence[Sample]) -> Sample:
    return Sample(sum(s.size for s in samples), sum(s.seconds for s in samples),
                  sum(s.cpu for s in samples), sum(s.checked for s in samples))


def verified_and_off(log: Log, kind: Sink, seconds_min: float) -> tuple[Sample, Sample]:
    """Passes alternating between verified and off (today's path), so that both meet the
    same neighbours, until each has run for `seconds_min`."""
    runs: dict[bool, list[Sample]] = {True: [], False: []}
    for i in itertools.count():
        for checks_on in (True, False) if i % 2 == 0 else (False, True):
            with contextlib.nullcontext() if checks_on else verification_off():
                runs[checks_on].append(timed_pass(log, kind))
        if min(sum(s.seconds for s in r) for r in runs.values()) >= seconds_min:
            return merge(runs[True]), merge(runs[False])
    raise AssertionError("unreachable")


def catchup(directory: Path, kind: Sink, plan: Plan) -> JsonObject:
    """First read, then verified and off (see the module docstring), `plan.repeats` times."""
    first: list[Sample] = []
    verified: list[Sample] = []
    off: list[Sample] = []
    for _ in range(plan.repeats):
        log = Log(directory, LogConfig(fsync=FsyncPolicy.NEVER))  # opened again: unchecked
        try:
            first.append(timed_pass(log, kind))
            checked, unchecked = verified_and_off(log, kind, plan.read_seconds_min)
        finally:
            log.close()
        verified.append(checked)
        off.append(unchecked)
    return {
        "first_read": summarize(first), "verified": summarize(verified), "off": summarize(off),
        "verified_ratio": statistics.median(
            v.mb_per_s / o.mb_per_s for v, o in zip(verified, off, strict=True)),
        "first_read_ratio": statistics.median(
            f.mb_per_s / v.mb_per_s for f, v in zip(first, verified, strict=True)),
    }


def in_process(work: Path, plan: Plan) -> JsonObject:
    directory = work / "log"
    log = build_log(directory, plan.log_bytes)
    try:
        size, segments = log.size_bytes, len(log.segment_base_offsets)
        progress(f"scrub at full speed over {size / MB:.0f} MB")
        scrub = [scrub_pass(log, size) for _ in range(plan.repeats)]
    finally:
        log.close()
    result: JsonObject = {"log_bytes": size, "segments": segments,
                          "record_bytes": len(PAYLOAD), "batch_records": RECORDS_PER_BATCH,
                          "read_bytes": FETCH_BYTES_DEFAULT, "scrub": summarize(scrub)}
    for kind in SINKS:
        progress(f"catch-up reads into {kind}")
        result[kind] = catchup(directory, kind, plan)
    return result


# -- the broker ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Reading:
    at: float
    cpu: float
    #: Bytes the broker has read with read(2)/pread(2) (see read_chars).
    rchar: int
    metrics: str


def metric(text: str, name: str) -> float:
    """The value of one series of a /metrics text (`name` with its labels, if any)."""
    for line in text.splitlines():
        key, _, value = line.rpartition(" ")
        if key == name:
            return float(value)
    raise RuntimeError(f"no {name} in /metrics")


def read_chars(pid: int) -> int:
    """Bytes the process has read with read(2) and pread(2), page-cache hits included
    (`rchar`; recv(2) on sockets is left out)."""
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        name, _, value = line.partition(": ")
        if name == "rchar":
            return int(value)
    raise RuntimeError(f"no rchar in /proc/{pid}/io")


def read_broker(broker: BrokerProcess) -> Reading:
    with urllib.request.urlopen(f"{broker.http_url}/metrics", timeout=10) as response:
        text = response.read().decode()
    return Reading(time.perf_counter(), cpu_seconds(broker.pid), read_chars(broker.pid), text)


async def observe(broker: BrokerProcess, start: float, end: float) -> tuple[Reading, Reading]:
    """Readings of the broker at `start` and `end` (perf_counter times), off the loop."""
    await asyncio.sleep(max(0.0, start - time.perf_counter()))
    before = await asyncio.to_thread(read_broker, broker)
    await asyncio.sleep(max(0.0, end - time.perf_counter()))
    return before, await asyncio.to_thread(read_broker, broker)


def start_broker(work: Path, url: str, scrubbing: bool) -> BrokerProcess:
    """A broker on the one data directory: its default scrubber, or none."""
    flags = () if scrubbing else ("--scrub-bytes-per-s", "0")
    return BrokerProcess(work / "broker", url, extra_args=flags).start()


async def prefill(work: Path, url: str, plan: Plan) -> JsonObject:
    """Create the stream and fill it with `plan.prefill_bytes` at the offered rate, so the
    scrubber later reads batches of the shape this ingest writes (it starts at the oldest);
    then the broker's capacity: the pipelined publisher at full speed. No scrubber."""
    broker = start_broker(work, url, scrubbing=False)
    appended = f'jetstream_partition_appended_bytes_total{{stream="{STREAM}",partition="0"}}'
    try:
        async with jetstream.connect(broker.address) as js:
            await js.create_stream(STREAM, SUBJECT, fsync="interval", ack_policy="leader")
        messages = 0
        stored = 0.0
        while stored < plan.prefill_bytes:
            run = await publish_paced(url, SUBJECT, PAYLOAD, plan.offered_msgs_per_s,
                                      time.perf_counter() + 0.2, 0.0, PREFILL_ROUND_S)
            if run["errors"]:
                raise RuntimeError(f"{run['errors']} publishes failed while filling")
            messages += run["messages"]
            stored = metric((await asyncio.to_thread(read_broker, broker)).metrics, appended)
        capacity = await publish_pipelined(url, [(SUBJECT, PAYLOAD, None)] * CAPACITY_MESSAGES,
                                           plan.window)
    finally:
        broker.stop()
    return {"bytes": stored, "messages": messages,
            "capacity_msgs_per_s": capacity["puts_per_s"]}


async def ingest_run(work: Path, url: str, plan: Plan, scrubbing: bool) -> JsonObject:
    broker = start_broker(work, url, scrubbing)
    try:
        start = time.perf_counter() + 0.5
        window = start + plan.warmup_s
        run, (before, after) = await asyncio.gather(
            publish_paced(url, SUBJECT, PAYLOAD, plan.offered_msgs_per_s, start, plan.warmup_s,
                          plan.measure_s),
            observe(broker, window, window + plan.measure_s))
    finally:
        broker.stop()
    seconds = after.at - before.at
    scrubbed = (metric(after.metrics, "jetstream_scrub_bytes_total")
                - metric(before.metrics, "jetstream_scrub_bytes_total"))
    passes = metric(after.metrics, "jetstream_scrub_passes_total")
    return {**run, "scrubbing": scrubbing,
            "cpu_us_per_msg": (after.cpu - before.cpu) / (seconds * plan.offered_msgs_per_s)
            * 1e6,
            "scrub_bytes_per_s": scrubbed / seconds, "scrub_passes_done": passes,
            "read_bytes_per_s": (after.rchar - before.rchar) / seconds}


def summarize_ingest(runs: Sequence[JsonObject]) -> JsonObject:
    keys = ("msgs_per_s", "ack_p50_ms", "ack_p99_ms", "ack_max_ms", "send_lag_p99_ms",
            "cpu_us_per_msg", "scrub_bytes_per_s", "read_bytes_per_s")
    return {**{k: statistics.median(r[k] for r in runs) for k in keys},
            "errors": sum(r["errors"] for r in runs),
            "scrub_passes_done": max(r["scrub_passes_done"] for r in runs),
            "runs_ack_p99_ms": [round(r["ack_p99_ms"], 2) for r in runs],
            "runs_msgs_per_s": [round(r["msgs_per_s"]) for r in runs],
            "runs_read_bytes_per_s": [round(r["read_bytes_per_s"]) for r in runs]}


async def ingest(work: Path, plan: Plan) -> JsonObject:
    with NatsServer(work / "nats") as server:
        progress(f"filling the stream with {plan.prefill_bytes / MB:.0f} MB of 128 B messages")
        filled = await prefill(work, server.url, plan)
        runs: dict[bool, list[JsonObject]] = {False: [], True: []}
        for rep in range(plan.repeats):
            for scrubbing in (False, True) if rep % 2 == 0 else (True, False):
                progress(f"ingest at {plan.offered_msgs_per_s} msgs/s, scrubber "
                         f"{'default' if scrubbing else 'off'} ({rep + 1}/{plan.repeats})")
                runs[scrubbing].append(await ingest_run(work, server.url, plan, scrubbing))
    progress("scrub at full speed over the broker's log")
    log = Log(work / "broker" / "logs" / f"{STREAM}-0", LogConfig(fsync=FsyncPolicy.NEVER))
    try:
        scrub = [scrub_pass(log, plan.log_bytes) for _ in range(plan.repeats)]
        size = scrub[0].size
    finally:
        log.close()
    off, on = runs[False], runs[True]
    return {"prefill": filled, "off": summarize_ingest(off), "on": summarize_ingest(on),
            "p99_ratio": statistics.median(
                a["ack_p99_ms"] / b["ack_p99_ms"] for a, b in zip(on, off, strict=True)),
            "p50_ratio": statistics.median(
                a["ack_p50_ms"] / b["ack_p50_ms"] for a, b in zip(on, off, strict=True)),
            "broker_log_bytes": size, "broker_log_scrub": summarize(scrub)}


async def generator(work: Path, plan: Plan) -> JsonObject:
    """Both publishers against core NATS and a no-op responder (bench.common)."""
    with NatsServer(work / "nats-core") as server, no_op_responder(server.url, SUBJECT):
        ceiling = [(await publish_pipelined(
            server.url, [(SUBJECT, PAYLOAD, None)] * plan.ceiling_messages, plan.window)
        )["puts_per_s"] for _ in range(plan.repeats)]
        paced = await publish_paced(server.url, SUBJECT, PAYLOAD, plan.offered_msgs_per_s,
                                    time.perf_counter() + 0.5, plan.warmup_s, plan.measure_s)
    return {"ceiling_msgs_per_s": statistics.median(ceiling),
            "runs_ceiling_msgs_per_s": [round(c) for c in ceiling], "paced": paced}


# -- the run -------------------------------------------------------------------------------------


async def run(plan: Plan, quick: bool) -> JsonObject:
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-scrub-") as tmp:
        work = Path(tmp)
        local = await asyncio.to_thread(in_process, work, plan)
        progress("the load generator against core NATS")
        gen = await generator(work, plan)
        broker = await ingest(work, plan)
    reads = local["devnull"]
    headroom = gen["ceiling_msgs_per_s"] / broker["off"]["msgs_per_s"]
    # The scrubber's own reads (rchar) show it kept to its rate through every window.
    at_rate = all(0.5 <= r / SCRUB_BYTES_PER_S_DEFAULT <= 2.0
                  for r in broker["on"]["runs_read_bytes_per_s"])
    return {
        "benchmark": "scrub", "mode": "quick" if quick else "full",
        "created_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(), "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(), "plan": asdict(plan),
        "scrub_mb_per_s": local["scrub"]["mb_per_s"],
        "scrub_cpu_s_per_gb": local["scrub"]["cpu_s_per_gb"],
        "scrub_broker_log_mb_per_s": broker["broker_log_scrub"]["mb_per_s"],
        "scrub_broker_log_cpu_s_per_gb": broker["broker_log_scrub"]["cpu_s_per_gb"],
        "catchup_verified_mb_per_s": reads["verified"]["mb_per_s"],
        "catchup_off_mb_per_s": reads["off"]["mb_per_s"],
        "catchup_verified_ratio": reads["verified_ratio"],
        "catchup_verified_ratio_socket": local["socket"]["verified_ratio"],
        "first_read_mb_per_s": reads["first_read"]["mb_per_s"],
        "first_read_ratio": reads["first_read_ratio"],
        "first_read_socket_mb_per_s": local["socket"]["first_read"]["mb_per_s"],
        "first_read_ratio_socket": local["socket"]["first_read_ratio"],
        "ingest_p99_ratio_scrubbing": broker["p99_ratio"],
        "ingest_p99_ms_scrubber_off": broker["off"]["ack_p99_ms"],
        "ingest_p99_ms_scrubbing": broker["on"]["ack_p99_ms"],
        "ingest_msgs_per_s_scrubber_off": broker["off"]["msgs_per_s"],
        "ingest_msgs_per_s_scrubbing": broker["on"]["msgs_per_s"],
        "cpu_us_per_msg_scrubber_off": broker["off"]["cpu_us_per_msg"],
        "cpu_us_per_msg_scrubbing": broker["on"]["cpu_us_per_msg"],
        "scrub_bytes_per_s_default": SCRUB_BYTES_PER_S_DEFAULT,
        "scrub_bytes_per_s_observed": broker["on"]["read_bytes_per_s"],
        "scrubber_at_rate": at_rate,
        "broker_capacity_msgs_per_s": broker["prefill"]["capacity_msgs_per_s"],
        "load_generator_msgs_per_s": gen["ceiling_msgs_per_s"],
        "load_generator_headroom": headroom,
        "targets": {"catchup_verified_ratio": TARGET_CATCHUP_VERIFIED_RATIO,
                    "ingest_p99_ratio_scrubbing": TARGET_INGEST_P99_RATIO,
                    "load_generator_headroom": TARGET_GENERATOR_HEADROOM},
        "targets_met": {
            "catchup_verified_ratio":
                reads["verified_ratio"] >= TARGET_CATCHUP_VERIFIED_RATIO,
            "ingest_p99_ratio_scrubbing":
                at_rate and broker["p99_ratio"] <= TARGET_INGEST_P99_RATIO,
            "load_generator_headroom": headroom >= TARGET_GENERATOR_HEADROOM},
        "in_process": local, "broker": broker, "generator": gen,
    }


def table(r: JsonObject) -> str:
    local, broker = r["in_process"], r["broker"]
    load = r["loadavg_before"][0], r["loadavg_after"][0]
    lines = [
        (f"Jetstream scrub benchmark ({r['mode']}, medians of {r['plan']['repeats']} runs, "
         f"MB = 10^6 B; load average {load[0]:.1f} before, {load[1]:.1f} after)"),
        "",
        (f"{'scrub at full speed (Log.check_segment)':48} {'MB/s':>8} {'CPU s/GB':>9} "
         f"{'paced':>6}"),
        scrub_row(f"log of {local['log_bytes'] / MB:.0f} MB, 128 B x 1000 a batch",
                  local["scrub"]),
        scrub_row(f"the broker's log, {broker['broker_log_bytes'] / MB:.0f} MB (ingest's "
                  "batches)", broker["broker_log_scrub"]),
        "",
        (f"catch-up from offset 0 ({local['log_bytes'] / MB:.0f} MB, Log.read 1 MiB + sendfile)"
         f"  {'MB/s':>8} {'CPU s/GB':>9} {'checked':>8}"),
    ]
    for kind, title in (("devnull", "into /dev/null"), ("socket", "into a drained socket")):
        c = local[kind]
        lines.append(f"  {title}")
        for mode, name in (("first_read", "first read (opened again: CRC walk)"),
                           ("verified", "verified (zero copy)"), ("off", "off (today's path)")):
            lines.append(f"    {name:50} {c[mode]['mb_per_s']:8,.0f} "
                         f"{c[mode]['cpu_s_per_gb']:9.3f} {c[mode]['checked_slices']:8.0f}")
        lines.append(f"    verified / off {c['verified_ratio']:.3f}, first read / verified "
                     f"{c['first_read_ratio']:.3f}")
    lines += ["", ingest_table(r)]
    if not r["scrubber_at_rate"]:
        lines.append("  THE SCRUBBER DID NOT KEEP TO ITS RATE in every window (read MB/s): "
                     "the p99 ratio does not measure it")
    lines += [
        "",
        "targets",
        target_line("catch-up verified / off (/dev/null)", r["catchup_verified_ratio"],
                    ">=", TARGET_CATCHUP_VERIFIED_RATIO),
        f"    (into a drained socket: {r['catchup_verified_ratio_socket']:.3f})",
        target_line("ingest p99 scrubbing / off", r["ingest_p99_ratio_scrubbing"], "<=",
                    TARGET_INGEST_P99_RATIO),
        f"    (p50: {broker['p50_ratio']:.3f})",
        target_line("load generator ceiling / throughput", r["load_generator_headroom"], ">=",
                    TARGET_GENERATOR_HEADROOM),
    ]
    return "\n".join(lines)


def scrub_row(name: str, figures: JsonObject) -> str:
    return (f"  {name:46} {figures['mb_per_s']:8,.0f} {figures['cpu_s_per_gb']:9.3f} "
            f"{figures['paced_share']:6.0%}")


def ingest_table(r: JsonObject) -> str:
    broker, paced = r["broker"], r["generator"]["paced"]
    rows = [("scrubber off", broker["off"]),
            (f"scrubber default ({SCRUB_BYTES_PER_S_DEFAULT // MiB} MiB/s)", broker["on"])]
    lines = [(f"{'ingest, ' + format(r['plan']['offered_msgs_per_s'], ',') + ' msgs/s offered':40} "
              f"{'msgs/s':>8} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} {'CPU us/msg':>10} "
              f"{'read MB/s':>9}")]
    lines += [f"  {name:38} {row['msgs_per_s']:8,.0f} {row['ack_p50_ms']:7.2f} "
              f"{row['ack_p99_ms']:7.2f} {row['ack_max_ms']:7.1f} "
              f"{row['cpu_us_per_msg']:10.1f} {row['read_bytes_per_s'] / MB:9.2f}"
              for name, row in rows]
    lines += [
        (f"  {'load generator alone (core NATS no-op)':38} {paced['msgs_per_s']:8,.0f} "
         f"{paced['ack_p50_ms']:7.2f} {paced['ack_p99_ms']:7.2f} {paced['ack_max_ms']:7.1f}"),
        (f"  p99 runs: off {broker['off']['runs_ack_p99_ms']}, "
         f"default {broker['on']['runs_ack_p99_ms']}"),
        (f"  load generator ceiling {r['load_generator_msgs_per_s']:,.0f} msgs/s; broker "
         f"capacity, scrubber off {r['broker_capacity_msgs_per_s']:,.0f} msgs/s"),
    ]
    return "\n".join(lines)


def target_line(name: str, value: float, sense: str, target: float) -> str:
    met = value >= target if sense == ">=" else value <= target
    return (f"  {name:40} {value:7.3f}  target {sense} {target:.2f}: "
            f"{'met' if met else 'NOT MET'}")


def main(argv: Sequence[str] | None = None) -> int:
    return bench_main("scrub", __doc__, argv,
                      lambda quick: run(QUICK if quick else FULL, quick), table)


if __name__ == "__main__":
    sys.exit(main())
