"""Datastreams: mirror throughput between two clusters against a NATS JetStream mirror, the
mirror's lag at half its live maximum rate, and the Parquet sink's rows per second.

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
- The source's intake: the compiled load generator (bench/loadgen, one connection, stamped
  128 B requests) sends to fresh streams of A, first unpaced (`source_unpaced_msgs_per_s`),
  then paced at the unpaced rate (or the mirror's catch-up rate, when lower) and down by
  PROBE_STEP until a probe is sustained (every request acked, the achieved rate at least
  SUSTAINED_SHARE of the offered one, ack p99 at most SUSTAINED_ACK_P99_S):
  `source_max_msgs_per_s`. A live mirror copies no faster than its source takes records
  in, and here shares two cores with it, the generator and both nats-servers: its maximum
  live rate (`mirror_live_max_msgs_per_s`) is probed with short lag runs (below) from the
  lower of the catch-up rate and that, down by PROBE_STEP, until the copy keeps up (its
  rate over the run at least KEEPS_UP_SHARE of the offered one, the source sustaining it).
  The lag run offers half of it (`lag_offered_msgs_per_s`); the probe that kept up gives
  the lag at the live maximum itself (`mirror_lag_at_live_max_*`).
- Lag: with a `mirror` mode datastream running from a fresh stream of A into one of B, the
  generator publishes to A at the offered rate for `warmup_s + measure_s` on one
  connection, so record i is offset i and was due at the run's start + i / rate (the
  generator's own schedule). The bench process decodes no record: every ARRIVAL_POLL_S it
  asks B for the copy's high watermark (a Fetch of one byte at the last one seen, which
  waits up to the poll interval for more); every offset the watermark passed since the
  previous answer counts as arrived when this answer came. A record's lag is that time
  less its due time: an upper bound, by at most the gap between two answers (one poll
  interval and a round trip on an idle machine). p50/p99/max over the records due after
  the warm-up (and the first and last of them: a lag that keeps growing shows there), with
  the publish's offered and achieved rate and ack latency, the copy's own rate over the
  measured window (`copy_msgs_per_s`) and the mean gap between answers that moved the
  watermark (`poll_gap_s_mean`: the resolution the machine's load allowed). Records the
  source refused or lost are counted (`lost`). The generator's send lag (`send_lag_s_*`,
  its stamp less the due time, read back from SEND_LAG_SAMPLES records of the source)
  shows whether it kept its schedule. The NATS JetStream mirror gets the same run at the
  same rate: a stream and its `mirror` stream, the mirror's `state.last_seq` polled
  through nats-py.
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
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import nats
import numpy as np
from nats.js.api import StreamConfig, StreamSource

import jetstream
from bench.common import JsonObject, bench_main, cpu_seconds, publish_pipelined
from bench.loadgen import Load, LoadResult, run_load
from jetstream.client import Client
from jetstream.datastreams.parquet_sink import read_manifest
from jetstream.natsd import NatsServer
from jetstream.server.process import BrokerProcess

PAYLOAD = b"x" * 128
WINDOW = 1000
DEADLINE_S = 300.0
POLL_S = 0.01
#: The lag runs poll the copy's high watermark this often (the lag's resolution).
ARRIVAL_POLL_S = 0.005
#: A paced probe is sustained when it achieved this share of its offered rate ...
SUSTAINED_SHARE = 0.85
#: ... and its acks' p99 (from the send) stayed below this.
SUSTAINED_ACK_P99_S = 0.5
PROBE_STEP = 0.8
#: A live mirror keeps up with a rate when its copy's rate over the run is this share of it.
KEEPS_UP_SHARE = 0.95
PROBES_MAX = 6
PROBE_RATE_MIN = 1000
#: Records read back to time the generator's sends against their schedule.
SEND_LAG_SAMPLES = 1000
#: The generator's --stamp: its send time (CLOCK_MONOTONIC ns) in the payload's first digits.
STAMP_DIGITS = 20


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


def _paced(subject: str, rate: int, seconds: float) -> Load:
    """`rate` 128 B stamped requests a second for `seconds` on one connection (so a fresh
    stream's offset i is request i, due at the run's start + i / rate), at most one
    second's worth un-acked."""
    return Load(subject, size=len(PAYLOAD), inflight=max(WINDOW, rate), conns=1,
                count=max(1, round(rate * seconds)), rate=float(rate), stamp=True)


def _publish_figures(result: LoadResult, rate: int) -> JsonObject:
    return {"offered_msgs_per_s": rate, "publish_msgs_per_s": result.msgs_per_s,
            "ack_p50_ms": result.histogram.value_at(50) / 1e6,
            "ack_p99_ms": result.histogram.value_at(99) / 1e6,
            "acked": result.acked, "errors": result.errors, "timed_out": result.timed_out,
            "generator_cpu_us_per_msg": result.generator_cpu_s / max(result.sent, 1) * 1e6}


async def _probe(a: BrokerProcess, nats_a: str, load: Load) -> LoadResult:
    async with jetstream.connect(a.address) as ja:
        await ja.create_stream(load.subject, load.subject, fsync="interval")
    return await run_load(nats_a, load)


def sustained(result: LoadResult, rate: int, count: int) -> bool:
    """A paced run the source kept up with: every request acked without error, its
    achieved rate near the offered one and its ack latency bounded."""
    return (not result.timed_out and result.acked == count and result.errors == 0
            and result.msgs_per_s >= SUSTAINED_SHARE * rate
            and result.histogram.value_at(99) / 1e9 <= SUSTAINED_ACK_P99_S)


async def source_rate(a: BrokerProcess, nats_a: str, cap: int, probe_s: float) -> JsonObject:
    """What the source ingests from the compiled generator: its unpaced rate on one
    connection (for about `probe_s` at half `cap`), then paced probes from min(cap, that)
    down by PROBE_STEP until one is sustained: the highest sustained rate."""
    unpaced = await _probe(a, nats_a, Load("probeu", size=len(PAYLOAD), inflight=WINDOW,
                                           count=max(WINDOW, round(cap / 2 * probe_s))))
    rate, probes = min(cap, int(unpaced.msgs_per_s)), []
    for k in range(PROBES_MAX):
        load = _paced(f"probe{k}", rate, probe_s)
        result = await _probe(a, nats_a, load)
        ok = sustained(result, rate, load.count or 0)
        probes.append({**_publish_figures(result, rate), "sustained": ok})
        if ok or rate <= PROBE_RATE_MIN:
            break
        rate = max(PROBE_RATE_MIN, int(rate * PROBE_STEP))
    return {"source_unpaced_msgs_per_s": unpaced.msgs_per_s, "source_max_msgs_per_s": rate,
            "source_max_is_a_floor": rate == cap, "probes": probes}


async def live_max(a: BrokerProcess, b: BrokerProcess, nats_a: str, cap: int,
                   probe_s: float) -> JsonObject:
    """The mirror's maximum live rate: lag runs (a fresh mirror each, `probe_s` measured
    after a 1 s warm-up) from `cap` down by PROBE_STEP until the copy keeps up: the source
    took every record at least at SUSTAINED_SHARE of the offered rate, and the copy's own
    rate over the measured window was at least KEEPS_UP_SHARE of it."""
    rate, probes = cap, []
    for k in range(PROBES_MAX):
        figures = await lag(a, b, nats_a, rate, 1.0, probe_s, f"probe{k}")
        ok = (figures["lost"] == 0
              and figures["publish_msgs_per_s"] >= SUSTAINED_SHARE * rate
              and figures["copy_msgs_per_s"] >= KEEPS_UP_SHARE * rate)
        probes.append({**figures, "keeps_up": ok})
        if ok or rate <= PROBE_RATE_MIN:
            break
        rate = max(PROBE_RATE_MIN, int(rate * PROBE_STEP))
    return {"live_max_msgs_per_s": rate, "probes": probes}


async def poll_arrivals(high: Callable[[int], Awaitable[int]], wanted: Callable[[], int],
                        deadline_s: float) -> list[tuple[int, int]]:
    """Every ARRIVAL_POLL_S until it reaches `wanted()` (read anew each time: the publish's
    count, then what the source holds once it is over): (CLOCK_MONOTONIC ns when the
    answer came, high watermark) whenever the watermark `high(last)` reports moved on."""
    polls: list[tuple[int, int]] = []
    last, deadline = 0, time.monotonic() + deadline_s
    while last < wanted():
        tick = time.monotonic()
        if tick > deadline:
            raise AssertionError(f"the copy holds {last} of {wanted()} in {deadline_s} s")
        now = await high(last)
        if now > last:
            polls.append((time.monotonic_ns(), now))
            last = now
        await asyncio.sleep(max(0.0, tick + ARRIVAL_POLL_S - time.monotonic()))
    return polls


def arrival_lags_s(polls: Sequence[tuple[int, int]], start_ns: int, rate: int, first: int,
                   count: int) -> Any:
    """Each record's lag from [first, count): the first poll whose high watermark passed
    its offset, less the time it was due (`start_ns + offset / rate`)."""
    times = np.array([t for t, _ in polls], dtype=np.int64)
    highs = np.minimum(np.array([h for _, h in polls], dtype=np.int64), count)
    arrived = np.repeat(times, np.diff(highs, prepend=0))
    due = start_ns + np.arange(count, dtype=np.float64) * (1e9 / rate)
    return (arrived[first:count] - due[first:]) / 1e9


def copy_figures(polls: Sequence[tuple[int, int]], from_ns: int) -> JsonObject:
    """The copy's rate from the first answer at or after `from_ns` to the last, and the mean
    gap between answers that moved the watermark (the lag's real resolution)."""
    (t0, h0), (t1, h1) = next(p for p in polls if p[0] >= from_ns), polls[-1]
    gap = (polls[-1][0] - polls[0][0]) / max(1, len(polls) - 1) / 1e9
    return {"copy_msgs_per_s": (h1 - h0) / max(t1 - t0, 1) * 1e9, "poll_gap_s_mean": gap}


def _spread(values: Any, name: str) -> JsonObject:
    ordered = np.sort(np.asarray(values, dtype=np.float64))
    at = {p: float(ordered[min(len(ordered) - 1, int(len(ordered) * p / 100))])
          for p in (50, 99)}
    return {f"{name}_p50": at[50], f"{name}_p99": at[99], f"{name}_max": float(ordered[-1])}


def _samples(first: int, count: int) -> range:
    return range(first, count, max(1, (count - first) // SEND_LAG_SAMPLES))


async def _lag_run(nats_url: str, subject: str, rate: int, warmup_s: float, measure_s: float,
                   high: Callable[[int], Awaitable[int]], held: Callable[[], Awaitable[int]],
                   stamp_at: Callable[[int], Awaitable[int]]) -> JsonObject:
    """The paced publish of `subject` with the poller of its copy beside it: the lag
    figures over the records due after the warm-up, with how many records the source holds
    (`held()` once the publish is over: fewer than were sent if some were lost, and then the
    offsets after a lost one were due up to that many intervals later than counted), and
    the generator's send lag read back from SEND_LAG_SAMPLES of them (`stamp_at(offset)`:
    the stamp of the source's record at `offset`)."""
    load = _paced(subject, rate, warmup_s + measure_s)
    wanted, first = [load.count or 0], round(rate * warmup_s)
    poller = asyncio.create_task(poll_arrivals(high, lambda: wanted[0],
                                               warmup_s + measure_s + DEADLINE_S))
    try:
        result = await run_load(nats_url, load)
        wanted[0] = await held()
        polls = await poller
    finally:
        poller.cancel()
    lags = arrival_lags_s(polls, result.start_ns, rate, first, wanted[0])
    sent = [(await stamp_at(offset) - result.start_ns) / 1e9 - offset / rate
            for offset in _samples(first, wanted[0])]
    return {**_publish_figures(result, rate), "records": len(lags), "polls": len(polls),
            **copy_figures(polls, result.start_ns + round(warmup_s * 1e9)),
            "lag_s_first": float(lags[0]), "lag_s_last": float(lags[-1]),
            "source_records": wanted[0], "lost": (load.count or 0) - wanted[0],
            "poll_interval_s": ARRIVAL_POLL_S, **_spread(lags, "lag_s"),
            **_spread(sent, "send_lag_s")}


async def lag(a: BrokerProcess, b: BrokerProcess, nats_a: str, rate: int, warmup_s: float,
              measure_s: float, tag: str) -> JsonObject:
    """A lag run of a fresh mirror (streams and datastream named with `tag`)."""
    source, copy = f"lagsrc{tag}", f"lagdst{tag}"
    async with jetstream.connect(a.address) as ja, jetstream.connect(b.address) as jb:
        await ja.create_stream(source, source, fsync="interval")
        await jb.create_stream(copy, copy, fsync="interval")
        await jb.create_datastream(
            f"lag{tag}", {"type": "jetstream", "settings": {"brokers": a.address,
                                                            "stream": source}},
            _destination(copy, "mirror"), batch_records_max=5000, in_flight_max=5000)

        async def high(offset: int) -> int:
            response, _ = await jb.fetch_batches(copy, 0, offset, max_bytes=1,
                                                 max_wait_ms=round(ARRIVAL_POLL_S * 1000))
            return response.high_watermark

        async def held() -> int:
            return await _hw(ja, source)

        async def stamp_at(offset: int) -> int:
            found = (await ja.fetch(source, 0, offset, max_bytes=1)).messages
            return next(int(m.value[:STAMP_DIGITS]) for m in found if m.offset == offset)

        figures = await _lag_run(nats_a, source, rate, warmup_s, measure_s, high, held,
                                 stamp_at)
        await jb.delete_datastream(f"lag{tag}")
    return figures


async def js_lag(server: NatsServer, rate: int, warmup_s: float, measure_s: float, tag: str
                 ) -> JsonObject:
    origin, mirror = f"ORIGINLAG{tag}", f"MIRRORLAG{tag}"
    nc = await nats.connect(server.url)
    try:
        js = nc.jetstream()
        await js.add_stream(StreamConfig(name=origin, subjects=[origin.lower()]))
        await js.add_stream(StreamConfig(name=mirror, mirror=StreamSource(name=origin)))

        async def high(_: int) -> int:
            return int((await js.stream_info(mirror)).state.last_seq)

        async def held() -> int:
            return int((await js.stream_info(origin)).state.last_seq)

        async def stamp_at(offset: int) -> int:
            found = await js.get_msg(origin, seq=offset + 1)
            return int((found.data or b"")[:STAMP_DIGITS])

        return await _lag_run(server.url, origin.lower(), rate, warmup_s, measure_s, high,
                              held, stamp_at)
    finally:
        await nc.close()


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
    probe_s = 2.0 if quick else 4.0
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
                # A live mirror copies no faster than its source takes records in, and
                # shares the cores with it: its maximum live rate is probed from the lower
                # of the catch-up rate and the source's sustained intake, and the lag run
                # offers half of it.
                source = await source_rate(a, nats_a.url, int(mirror_rate), probe_s)
                source_max = source["source_max_msgs_per_s"]
                live = await live_max(a, b, nats_a.url, int(min(mirror_rate, source_max)),
                                      probe_s)
                rate = max(PROBE_RATE_MIN, live["live_max_msgs_per_s"] // 2)
                at_max = live["probes"][-1]
                lagged = await lag(a, b, nats_a.url, rate, warmup_s, measure_s, "half")
                landed = await parquet(a, root / "lake", messages)
            finally:
                a.stop()
                b.stop()
        with NatsServer(root / "nats-js", jetstream=True,
                        store_dir=root / "js-store") as js_server:
            theirs = [await js_mirror_once(js_server, messages, r) for r in range(repeats)]
            js_lagged = await js_lag(js_server, rate, warmup_s, measure_s, "HALF")
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
        "js_mirror_cpu_us_per_msg": statistics.median(r["cpu_us_per_msg"] for r in theirs),
        "lag_offered_msgs_per_s": rate,
        "source_max_msgs_per_s": source_max,
        "mirror_live_max_msgs_per_s": live["live_max_msgs_per_s"],
        "mirror_lag_p50_s": lagged["lag_s_p50"], "mirror_lag_p99_s": lagged["lag_s_p99"],
        "mirror_lag_max_s": lagged["lag_s_max"],
        "js_mirror_lag_p50_s": js_lagged["lag_s_p50"],
        "js_mirror_lag_p99_s": js_lagged["lag_s_p99"],
        "js_mirror_lag_max_s": js_lagged["lag_s_max"],
        "mirror_lag_at_live_max_p50_s": at_max["lag_s_p50"],
        "mirror_lag_at_live_max_p99_s": at_max["lag_s_p99"],
        "lag": lagged, "js_lag": js_lagged, "live_max": live, "source": source,
        "parquet_sink_rows_per_s": landed["rows_per_s"], "parquet": landed,
        "runs": {"mirror": ours, "records_mirror": by_records, "js_mirror": theirs},
        "targets": {"mirror_vs_js_mirror >= 1.0": mirror_rate / js_rate >= 1.0,
                    f"mirror_lag_p99_s <= 1.0 at {rate} msg/s (half the mirror's live maximum)":
                        lagged["lag_s_p99"] <= 1.0},
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
        (f"lag at {results['lag_offered_msgs_per_s']:,} msg/s",
         f"p50 {results['mirror_lag_p50_s']:.3f} s",
         f"p99 {results['mirror_lag_p99_s']:.3f} s"),
        ("NATS JetStream mirror lag", f"p50 {results['js_mirror_lag_p50_s']:.3f} s",
         f"p99 {results['js_mirror_lag_p99_s']:.3f} s"),
        (f"lag at {results['mirror_live_max_msgs_per_s']:,} msg/s (live max, probe)",
         f"p50 {results['mirror_lag_at_live_max_p50_s']:.3f} s",
         f"p99 {results['mirror_lag_at_live_max_p99_s']:.3f} s"),
        ("Parquet sink", f"{results['parquet_sink_rows_per_s']:,.0f} rows/s",
         f"{results['parquet']['cpu_us_per_row']:.1f} us CPU/row"),
    ]
    return "\n".join(f"{a:<34} {b:>18} {c:>22}" for a, b, c in rows)


def main(argv: list[str] | None = None) -> int:
    return bench_main("datastreams", __doc__, argv, run, table)


if __name__ == "__main__":
    raise SystemExit(main())
