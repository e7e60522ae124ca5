"""Many partitions: what idle partitions cost, and how creates, publishes, a metadata
failover and a whole-cluster restart scale with their number, against a 3-node NATS
JetStream cluster in the same run.

Theory of operation
- For each partition count N (`--counts`; `--quick` is 100 and 1,000, a full run adds
  3,000), three clusters are started one after the other on loopback, each fresh:
  - ours, N streams: one plain nats-server and three broker processes with default settings
    (bench.replication.OurCluster); N streams of one partition each, replication factor 3,
    min_isr 2;
  - ours, one stream of N partitions (same settings; a stream holds at most 1,024 today,
    so above that the run records the broker's refusal);
  - the peer: a 3-node JetStream cluster (jetstream.natsd.NatsCluster), N R3 file streams.
    JetStream has no partitions inside a stream (a stream is one Raft group), so it has no
    one-stream line.
  Both multi-stream runs go through one procedure (`streams_run`) over a small adapter per
  system (`Ours`, `Peer` in bench.scale_systems), so each phase is done the same way on
  both. The pure figures, targets, table and plot are in bench.scale_figures.
- Warm-up, untimed: ours opens the client's NATS connection (an unacked publish nobody
  reads); JetStream creates and deletes an R3 stream until placement works (a cluster just
  formed may answer "no suitable peers for placement" for a moment).
- Create: one client creates the streams one at a time (ours `create_stream`, JetStream
  `add_stream`), each call timed; p50, p99, total, and the servers' CPU per create.
- Served: then the bench waits until every partition is served: ours, a broker runs its
  leader role (its /metrics lists the partition) and the metadata's ISR holds every
  replica (GET /streams); JetStream, a server's /jsz says it leads the stream, since when,
  and sees every other replica current. Both are read from monitoring ports (HTTP), polled
  at a pace that keeps the probes' own cost small (`until`). "Led" alone (a restart's
  figure) is the first half of each.
- Idle: nothing is sent for `idle_s` (five slices). Each process's CPU (utime + stime of
  /proc/PID/stat, 10 ms ticks) over the window as a share of one core, with the slices
  beside it to show a neighbour's burst on this shared machine; then RSS (VmRSS), open fds
  (/proc/PID/fd) and threads. Figures per process, and the median and max of the three
  brokers (ours' nats-server, which holds the brokers' subscriptions, is listed beside).
- One publish to each: one 128 B message to every stream, all at once, each waiting for its
  ack (ours: the client's `publish`, the stream's ack policy `all`; JetStream
  `js.publish`), PUBLISH_ROUNDS rounds one after the other. The first round is the first
  message of every stream, what the target is judged on: its wall time, each ack's
  latency from its own call, and CPU per message of the servers and of this process. The
  later rounds ("warm", `warm_*`): the median one's wall time and latencies, and their CPU
  per message; shown beside it (JetStream's first message to a stream costs it far more
  than the next ones: 7.7 s against 0.8-1.4 s for 3,000 streams in one run). The load
  generator's ceiling: the same N messages as core NATS requests to a no-op responder
  (bench.common) on that system's nats-server, all at once, the same rounds (the median
  one); the slower of the two must still be at least 2x as fast as the faster side's
  first round (and is reported against the warm rounds too).
- One publish to each again, last, at JetStream's durability: ours' default fsyncs before
  it acks (`always`), JetStream's syncs every two minutes, so ours' streams are first
  updated to `interval` (an fsync each second) and the publishes run again
  (`publish_each_fsync_as_peer`; the target stays on the defaults).
- Metadata failover: SIGKILL the metadata leader (ours: the brokers' /cluster; JetStream:
  /jsz's meta leader) and time from the signal to the first successful create of a probe
  stream by a client connected to the survivors (open before the kill). The probe has 2
  replicas (min_isr 1): an R3 stream cannot be placed while one of three is down (ours
  answers NotEnoughReplicas, JetStream "insufficient resources"). Then the killed process
  is started again and the run waits until everything is served again (`rejoin_s`).
- Whole-cluster restart: SIGTERM all three at once (`stop_s`; a broker still running 10 s
  later is SIGKILLed, as BrokerProcess does), start all three at once, and time until each
  is ready, until every partition has a leader (ours: the leader role runs; JetStream: the
  stream reports an elected leader), then until every replica is in sync. The failover
  and the restart are recorded apart: one that fails notes its `error` and the other
  still runs.
- Targets (the issue's): idle CPU per broker at 1,000 partitions <= 5 % of a core and <=
  JetStream's; create p99 at the largest count <= 1.5x that at the smallest; one publish to
  each <= JetStream's time; fds <= `--fd-budget` at every count; failover and restart at the
  largest count <= 2x their time at the smallest (bench.scale_figures).
- Robustness: each cluster's run has a deadline that grows with N; a run that fails or
  misses it records `error` (and the phase it was in) beside what it measured so far, and
  the sweep goes on. Every process is stopped by its PID when its cluster's block ends. The
  bench raises its RLIMIT_NOFILE to the hard limit first (the servers inherit it).
- A plot of idle CPU and create p99 against N, ours beside JetStream, is saved next to the
  JSON when matplotlib is installed (it is not a dependency of the project).

Run from the repository root: `python -m bench.scale [--quick] [--counts 100,1000]
[--json]`. Every run writes bench/results/scale-<UTC time>.json; with --json the last line
printed is the same JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path

import nats

from bench.common import JsonObject, cpu_seconds, no_op_responder, write_results
from bench.ingest import progress
from bench.replication import eventually
from bench.scale_figures import (
    check_targets,
    cpu_pct,
    failures,
    flat_figures,
    latency_summary,
    parse_counts,
    parse_status,
    plot,
    spread,
    table,
)
from bench.scale_systems import (
    BROKERS,
    PAYLOAD,
    PROBE,
    PROBE_REPLICAS,
    PUBLISH_TIMEOUT_S,
    Ours,
    Peer,
    System,
)
from jetstream.natsd import NatsServer
from jetstream.raft_meta.model import PARTITIONS_MAX
from jetstream.server.config import BrokerConfig
from jetstream.server.files import budget as files_budget

#: Rounds of "one publish to each": the first (the first message of every stream) and five
#: more, whose median is the warm figure.
PUBLISH_ROUNDS = 6
QUICK_COUNTS = (100, 1000)
FULL_COUNTS = (100, 1000, 3000)
IDLE_S_QUICK, IDLE_S_FULL = 10.0, 20.0
IDLE_SLICES = 5
#: Fds a broker may hold beside its partition files (`open_files_max`): NATS, Raft and
#: socket API connections, the Raft journal, listeners. An assumption of this bench.
FD_SOCKET_ALLOWANCE = 256


def fd_budget_default() -> int:
    """The partition-file budget the brokers size for themselves (open_files_max, 0: a share
    of the open-file limit, which a broker raises to its hard limit: the one they inherit
    from this process), plus FD_SOCKET_ALLOWANCE."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return files_budget(hard, BrokerConfig().open_files_max) + FD_SOCKET_ALLOWANCE
POLL_S = 0.05
PROBE_PAUSE_RATIO = 9.0


def run_deadline_s(count: int) -> float:
    """How long one cluster's run at `count` partitions may take, all phases."""
    return 600.0 + 0.6 * count


def wait_deadline_s(count: int) -> float:
    """How long one wait for a condition (ready, served, rejoined) may take."""
    return 120.0 + 0.1 * count


def stream_names(count: int) -> list[tuple[str, str]]:
    """(stream, subject) of each of `count` one-partition streams: the same on both sides."""
    return [(f"s{i:05d}", f"scale.s{i:05d}") for i in range(count)]


# -- measuring processes -----------------------------------------------------------------------


def raise_fd_limit() -> int:
    """RLIMIT_NOFILE of this process (and so of the servers it starts) to its hard limit."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def memory_and_fds(pid: int) -> JsonObject:
    """A process's resident memory, threads and open file descriptors, now."""
    rss_kib, threads = parse_status(Path(f"/proc/{pid}/status").read_text())
    return {"rss_mib": rss_kib / 1024, "fds": len(os.listdir(f"/proc/{pid}/fd")),
            "threads": threads}


async def idle(pids: Mapping[str, int], brokers: Collection[str], idle_s: float) -> JsonObject:
    """Each process's idle CPU over `idle_s`, RSS, fds and threads, and their median and
    max over `brokers` (names in `pids`)."""
    times = [time.perf_counter()]
    cpu = {name: [cpu_seconds(pid)] for name, pid in pids.items()}
    for _ in range(IDLE_SLICES):
        await asyncio.sleep(idle_s / IDLE_SLICES)  # the measured window itself
        times.append(time.perf_counter())
        for name, pid in pids.items():
            cpu[name].append(cpu_seconds(pid))
    processes: JsonObject = {}
    for name, pid in pids.items():
        processes[name] = {**cpu_pct(times, cpu[name]), **memory_and_fds(pid)}
    return {"window_s": idle_s, "processes": processes, "brokers": {
        figure: spread([processes[name][figure] for name in brokers])
        for figure in ("cpu_pct", "rss_mib", "fds", "threads")}}


async def publish_each(publish: Callable[[str], Awaitable[object]], subjects: Sequence[str],
                       server_pids: Collection[int], rounds: int = PUBLISH_ROUNDS
                       ) -> JsonObject:
    """One message to each subject, all at once, `rounds` times one round after the other.
    The first round (the first message of each stream, what the issue's target names):
    its wall time, its acks' latencies (each from its own call) and the CPU the servers and
    this process spent per message. The later rounds ("warm"): the median round's wall
    time and ack latencies, and the CPU per message over all of them."""
    walls: list[float] = []
    latencies_of: list[list[float]] = []
    cpu_of: list[tuple[float, float]] = []  # (servers, this process) per round
    errors: list[str] = []

    async def one(subject: str, latencies: list[float]) -> None:
        started = time.perf_counter()
        try:
            await publish(subject)
        except Exception as exc:  # counted and shown: a side that drops acks must say so
            errors.append(f"{subject}: {exc!r}")
            return
        latencies.append(time.perf_counter() - started)

    for _ in range(rounds):
        latencies: list[float] = []
        server_cpu = sum(cpu_seconds(pid) for pid in server_pids)
        client_cpu = time.process_time()
        started = time.perf_counter()
        await asyncio.gather(*(one(subject, latencies) for subject in subjects))
        walls.append(time.perf_counter() - started)
        cpu_of.append((sum(cpu_seconds(pid) for pid in server_pids) - server_cpu,
                       time.process_time() - client_cpu))
        latencies_of.append(latencies)
    n = len(subjects)
    first = latency_summary(latencies_of[0])
    out: JsonObject = {
        "messages": n, "rounds": rounds, "wall_s": walls[0], "round_walls_s": walls,
        "msgs_per_s": n / walls[0], "ack_p50_ms": first["p50_ms"],
        "ack_p99_ms": first["p99_ms"],
        "server_cpu_us_per_msg": cpu_of[0][0] / n * 1e6,
        "client_cpu_us_per_msg": cpu_of[0][1] / n * 1e6,
        "errors": len(errors), "first_errors": errors[:3]}
    if rounds > 1:
        warm = sorted(range(1, rounds), key=walls.__getitem__)[(rounds - 1) // 2]
        summary = latency_summary(latencies_of[warm])
        sent = n * (rounds - 1)
        out.update({
            "warm_wall_s": walls[warm], "warm_ack_p50_ms": summary["p50_ms"],
            "warm_ack_p99_ms": summary["p99_ms"],
            "warm_server_cpu_us_per_msg": sum(s for s, _ in cpu_of[1:]) / sent * 1e6,
            "warm_client_cpu_us_per_msg": sum(c for _, c in cpu_of[1:]) / sent * 1e6})
    return out


async def generator_ceiling(server: NatsServer, count: int) -> JsonObject:
    """The load generator alone: `count` core NATS requests at once to a no-op responder."""
    with no_op_responder(server.url, "scale.noop.>"):
        nc = await nats.connect(server.url)
        try:
            await nc.request("scale.noop.warmup", b"", timeout=PUBLISH_TIMEOUT_S)  # inbox up
            out = await publish_each(
                lambda subject: nc.request(subject, PAYLOAD, timeout=PUBLISH_TIMEOUT_S),
                [f"scale.noop.{i}" for i in range(count)], [server.pid])
            # Its ceiling: no first-message cost here, so the median of every round.
            out["median_wall_s"] = statistics.median(out["round_walls_s"])
            return out
        finally:
            await nc.close()


async def timed_creates(create: Callable[[str, str], Awaitable[object]],
                        names: Sequence[tuple[str, str]],
                        server_pids: Collection[int]) -> JsonObject:
    latencies = []
    server_cpu = sum(cpu_seconds(pid) for pid in server_pids)
    started = time.perf_counter()
    for i, (name, subject) in enumerate(names):
        begun = time.perf_counter()
        await create(name, subject)
        latencies.append(time.perf_counter() - begun)
        if (i + 1) % 500 == 0:
            progress(f"{i + 1} created")
    total = time.perf_counter() - started
    server = sum(cpu_seconds(pid) for pid in server_pids) - server_cpu
    return {**latency_summary(latencies), "total_s": total,
            "server_cpu_ms_per_create": server / len(names) * 1000}


async def until(probe: Callable[[], Awaitable[list[str] | None]], what: str,
                deadline_s: float) -> float:
    """Seconds until `probe` finds nothing missing (an empty list; None: no answer), as of
    the start of the probe that found it so. Between probes it pauses PROBE_PAUSE_RATIO
    times as long as the probe took: describing every stream of a large cluster costs the
    servers CPU (a broker spends ~0.4 s on 1,000 streams), and the probe must not become
    the load it measures (at most a tenth of the time; the price is a coarser figure where
    the probe is dear: a full ISR at 1,000 streams is seen within ~4 s)."""
    started = time.perf_counter()
    last: list[str] | None = None
    while True:
        begun = time.perf_counter()
        last = await probe()
        if last == []:
            return begun - started
        if time.perf_counter() - started > deadline_s:
            gap = "no answer" if last is None else f"{len(last)} missing, e.g. {last[:3]}"
            raise TimeoutError(f"not within {deadline_s:.0f} s: {what} ({gap})")
        await asyncio.sleep(max(POLL_S, PROBE_PAUSE_RATIO * (time.perf_counter() - begun)))


# -- the runs ------------------------------------------------------------------------------------


async def served_then_idle(system: System, expected: Mapping[str, int], count: int,
                           idle_s: float, out: JsonObject) -> None:
    out["phase"] = "served"
    out["served_s"] = await until(lambda: system.unserved(expected, True),
                                  "every partition led with a full ISR",
                                  wait_deadline_s(count))
    out["phase"] = "idle"
    out["idle"] = await idle(system.pids(), system.broker_names(), idle_s)


async def failover(system: System, expected: dict[str, int], deadline_s: float,
                   out: JsonObject) -> None:
    """SIGKILL of the metadata leader -> the next successful create; then the killed
    process back and everything served again. The probe stream joins `expected`."""
    out["killed"] = await system.find_metadata_leader()
    async with system.survivor_probe() as probe:
        killed_at = time.perf_counter()
        await system.kill_metadata_leader()
        await eventually(probe, "a create after the metadata leader's SIGKILL", deadline_s)
        out["failover_s"] = time.perf_counter() - killed_at
    expected[PROBE[0]] = 1
    restarted_at = time.perf_counter()
    await system.start_killed(deadline_s)
    await until(lambda: system.unserved(expected, True), "everything served again",
                deadline_s)
    out["rejoin_s"] = time.perf_counter() - restarted_at


async def restart(system: System, expected: dict[str, int], deadline_s: float,
                  out: JsonObject) -> None:
    """SIGTERM to all at once, all started again -> every partition led, then in sync."""
    stopping = time.perf_counter()
    await system.stop_all()
    started = time.perf_counter()
    out["stop_s"] = started - stopping
    await system.start_all(deadline_s)
    out["ready_s"] = time.perf_counter() - started
    out["led_s"] = out["ready_s"] + await until(lambda: system.unserved(expected, False),
                                                "every partition led", deadline_s)
    out["full_isr_s"] = out["led_s"] + await until(lambda: system.unserved(expected, True),
                                                   "every replica in sync", deadline_s)


async def streams_run(system: System, count: int, idle_s: float, out: JsonObject) -> None:
    """Every phase on `count` one-partition R3 streams of `system`, into `out`. The
    failover and the restart are recorded apart: one that fails (with its `error`) does not
    keep the other from running."""
    deadline = wait_deadline_s(count)
    names = stream_names(count)
    expected = {name: 1 for name, _ in names}
    servers = list(system.pids().values())
    out["phase"] = "warm_up"
    await system.warm_up(deadline)
    out["phase"] = "create"
    out["create"] = await timed_creates(system.create, names, servers)
    await served_then_idle(system, expected, count, idle_s, out)
    out["phase"] = "publish_each"
    out["publish_each"] = await publish_each(system.publish, [s for _, s in names], servers)
    out["phase"] = "generator"
    out["generator"] = await generator_ceiling(system.nats_server(), count)
    for name, phase in (("failover", failover), ("restart", restart)):
        out["phase"] = name
        record: JsonObject = out.setdefault(name, {})
        try:
            await phase(system, expected, deadline, record)
        except Exception as exc:  # recorded; the next phase starts from what is left
            record["error"] = f"{type(exc).__name__}: {exc}"[:2000]
    out["phase"] = "publish_each_fsync_as_peer"
    if await system.fsync_as_peer([name for name, _ in names]):
        out["publish_each_fsync_as_peer"] = await publish_each(  # PIDs since the restart
            system.publish, [s for _, s in names], list(system.pids().values()))
    del out["phase"]


async def ours_streams(work: Path, count: int, idle_s: float, out: JsonObject) -> None:
    async with Ours.running(work) as system:
        await streams_run(system, count, idle_s, out)


async def ours_one_stream(work: Path, count: int, idle_s: float, out: JsonObject) -> None:
    """One stream of `count` partitions: create, served, idle. Past PARTITIONS_MAX (a
    stream's most partitions) the run is recorded as skipped."""
    if count > PARTITIONS_MAX:
        out["skipped"] = f"a stream holds at most {PARTITIONS_MAX} partitions"
        return
    async with Ours.running(work) as system:
        out["phase"] = "create"

        async def create(name: str, subject: str) -> None:
            await system.create(name, subject, partitions=count)

        out["create"] = await timed_creates(create, [("many", "scale.many")],
                                            list(system.pids().values()))
        await served_then_idle(system, {"many": count}, count, idle_s, out)
    del out["phase"]


async def jetstream_streams(work: Path, count: int, idle_s: float, out: JsonObject) -> None:
    async with Peer.running(work) as system:
        await streams_run(system, count, idle_s, out)


Run = Callable[[Path, int, float, JsonObject], Awaitable[None]]
RUNS: tuple[tuple[str, Run], ...] = (
    ("ours", ours_streams), ("ours_one_stream", ours_one_stream),
    ("jetstream", jetstream_streams))


async def one_run(run: Run, work: Path, count: int, idle_s: float) -> JsonObject:
    """A run's figures at `count`; on a failure or a missed deadline, what it measured
    and `error` (with the phase it was in)."""
    out: JsonObject = {}
    try:
        async with asyncio.timeout(run_deadline_s(count)):
            await run(work, count, idle_s, out)
    except Exception as exc:  # recorded; the sweep goes on with the next run
        out["error"] = f"{out.pop('phase', '?')}: {type(exc).__name__}: {exc}"[:2000]
        out["work_dir"] = str(work)
    return out


async def sweep(counts: Sequence[int], idle_s: float, fd_budget: int, mode: str,
                work: Path) -> JsonObject:
    nofile = raise_fd_limit()
    runs: dict[int, dict[str, JsonObject]] = {}
    for count in counts:
        runs[count] = {}
        for name, run in RUNS:
            progress(f"{name}: {count} partitions")
            started = time.perf_counter()
            result = await one_run(run, work / f"{name}-{count}", count, idle_s)
            result["run_s"] = time.perf_counter() - started
            runs[count][name] = result
            progress(f"{name}: {count} partitions: {result.get('error', 'done')} "
                     f"in {result['run_s']:.0f} s")
    flat = flat_figures(runs)
    return {"benchmark": "scale", "mode": mode,
            "created_utc": datetime.now(UTC).isoformat(timespec="seconds"),
            "counts": list(counts), "replication_factor": BROKERS, "idle_window_s": idle_s,
            "fd_budget": fd_budget, "rlimit_nofile": nofile, "message_bytes": len(PAYLOAD),
            "probe_replicas": PROBE_REPLICAS,
            **flat, "targets": check_targets(flat, counts, fd_budget),
            "runs": {str(n): sides for n, sides in runs.items()}}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"counts {','.join(map(str, QUICK_COUNTS))}, {IDLE_S_QUICK:.0f} s "
                             "idle windows")
    parser.add_argument("--counts", type=parse_counts, default=None,
                        help="partition counts, comma-separated (default "
                             f"{','.join(map(str, FULL_COUNTS))})")
    parser.add_argument("--idle-s", type=float, default=None, help="idle window, seconds")
    parser.add_argument("--fd-budget", type=int, default=None,
                        help="most fds a broker may hold (default: the brokers' partition-"
                             f"file budget + {FD_SOCKET_ALLOWANCE})")
    parser.add_argument("--json", action="store_true", help="print one JSON object last")
    args = parser.parse_args(argv)
    counts = args.counts or (QUICK_COUNTS if args.quick else FULL_COUNTS)
    idle_s = args.idle_s or (IDLE_S_QUICK if args.quick else IDLE_S_FULL)
    mode = "counts" if args.counts else "quick" if args.quick else "full"
    work = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    fd_budget = args.fd_budget if args.fd_budget is not None else fd_budget_default()
    results = asyncio.run(sweep(counts, idle_s, fd_budget, mode, work))
    if failures(results["runs"]):
        print(f"a run failed; its processes' logs are kept in {work}", file=sys.stderr)
    else:
        shutil.rmtree(work, ignore_errors=True)
    path = write_results("scale", results)
    print("\n".join((table(results), plot(results, path.with_suffix(".png")),
                     f"results: {path}")))
    if args.json:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
