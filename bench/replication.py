"""Replicated ingest (replication factor 3, ack `all`) against NATS JetStream R3, and failover.

Theory of operation
- The publisher is bench.ingest's, imported, not copied: raw nats-py
  `nc.publish(subject, payload, reply=f"{inbox}.{i}")`, at most `window` messages un-acked,
  one `inbox.*` subscription timing each ack from its publish. 128 B messages.
- Ours: one plain nats-server and three broker processes (`--cluster`, default settings), one
  stream with 1 partition, replication factor 3, min_isr 2, ack policy `all`: a broker acks
  (to the reply subject) once the high watermark passes the message, i.e. once every in-sync
  replica holds it. The publisher talks to the nats-server; the leader replicates to its
  followers over the socket API.
- Peer: a 3-node NATS JetStream cluster (jetstream.natsd.NatsCluster), one stream with
  `num_replicas=3`, file storage; its ack means a Raft quorum stored the message. The
  publisher connects to the server that leads the stream, its best case.
- Two pairs: lazy (ours fsync `interval`, JetStream's default `sync_interval` of 2 minutes)
  and durable (ours fsync `always`, JetStream `sync_interval: always`).
- Failover: on a fresh cluster and stream (fsync `interval`), a paced publisher sends
  `failover_rate` messages per second, whatever is acked. Each round finds the partition's
  leader through the client's metadata, SIGKILLs it, and measures from just before the
  signal to the first ack of a message published after the killed process was reaped. Only
  the partition leader subscribes to the stream's subject, so no such message can have been
  acked by the dead broker: the ack comes from the new leader, after its election, its
  subscription and a commit through the surviving ISR. (Acks carry no leader epoch or broker
  id.) The killed broker is then restarted and the round ends when it is back in the ISR,
  each wait under a deadline. Brokers run with default timeouts (`broker_timeout_ms` 3 s,
  `replica_leader_timeout_ms` 1.5 s), which bound how fast a failure is noticed.
- Every process runs in a temp dir on loopback and is stopped by PID. Throughput figures are
  medians over `repeats` runs; failover p99 over a handful of rounds is their maximum. When a
  run fails, its directory (with brokerN.log and the nats-server logs) is kept and named.

Run from the repository root: `python -m bench.replication [--quick] [--json]`. The last line
of --json output is one JSON object; a full run also writes it to bench/results/.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Self, TypeVar

import nats

import jetstream
from bench.common import percentile, start_together
from bench.ingest import (
    PAYLOAD,
    RESULTS_DIR,
    median_run,
    progress,
    publish_with_acks,
)
from jetstream.client import PartitionInfo, StreamInfo
from jetstream.errors import JetstreamError
from jetstream.natsd import NatsCluster, NatsServer, ServerTls, free_ports
from jetstream.server.process import BrokerProcess

T = TypeVar("T")
SUBJECT = "bench.r3"
STREAM = "bench"
BROKERS = 3
#: Waits on the cluster: formation, a full ISR, a failover, a rejoin.
DEADLINE_S = 60.0
#: A failover slower than this is flagged in the table and the JSON.
FAILOVER_SLOW_S = 10.0
POLL_S = 0.05
_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass(frozen=True, slots=True)
class Plan:
    messages: int
    always_messages: int
    window: int
    repeats: int
    failovers: int
    failover_rate: int  # messages per second during the failover rounds


QUICK = Plan(messages=60_000, always_messages=60_000, window=4000, repeats=1, failovers=5,
             failover_rate=500)
FULL = Plan(messages=150_000, always_messages=150_000, window=4000, repeats=3, failovers=20,
            failover_rate=500)


async def eventually(probe: Callable[[], Awaitable[T | None]], what: str,
                     deadline_s: float = DEADLINE_S) -> T:
    """The first non-None result of `probe` (errors count as None) before the deadline."""
    deadline = time.monotonic() + deadline_s
    last_error: Exception | None = None
    while True:
        try:
            result = await probe()
        except (JetstreamError, OSError) as exc:
            result, last_error = None, exc
        if result is not None:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"not within {deadline_s} s: {what} (last error: {last_error})")
        await asyncio.sleep(POLL_S)


# -- ours: a 3-broker cluster --------------------------------------------------------------------


class OurCluster:
    """One plain nats-server and BROKERS broker processes with default settings (or
    `count` brokers, one without `--cluster`, with `extra_args`, and a nats-server with
    `nats_tls`: bench.security's secured setups)."""

    def __init__(self, work: Path, count: int = BROKERS, nats_tls: ServerTls | None = None,
                 extra_args: tuple[str, ...] = ()) -> None:
        self.work = work
        self.nats = NatsServer(work, name="nats", tls=nats_tls)
        self.count = count
        self.extra_args = extra_args
        self.brokers: list[BrokerProcess] = []

    async def __aenter__(self) -> Self:
        await self.nats.astart()
        spec = ",".join(f"{i}@127.0.0.1:{p}" for i, p in enumerate(free_ports(self.count)))
        cluster = ("--cluster", spec) if self.count > 1 else ()
        self.brokers = [BrokerProcess(self.work / f"broker{i}", self.nats.url, broker_id=i,
                                      extra_args=(*cluster, *self.extra_args))
                        for i in range(self.count)]
        try:
            await start_together(self.brokers, DEADLINE_S)
        except BaseException:
            await self.__aexit__()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        for broker in self.brokers:
            await asyncio.to_thread(broker.stop)
        await self.nats.astop()

    def live_addresses(self) -> str:
        return ",".join(b.address for b in self.brokers if b.running)

    async def partition(self) -> PartitionInfo:
        async with jetstream.connect(self.live_addresses(), connect_timeout_s=2.0,
                                     request_timeout_s=5.0) as js:
            info: StreamInfo = await js.stream_info(STREAM)
        return info.partitions[0]

    async def wait_full_isr(self, what: str) -> PartitionInfo:
        async def full() -> PartitionInfo | None:
            p = await self.partition()
            return p if len(p.isr) == BROKERS and p.leader >= 0 else None
        return await eventually(full, what)

    async def create_stream(self, fsync: str) -> PartitionInfo:
        async with jetstream.connect(self.live_addresses()) as js:
            await js.create_stream(STREAM, SUBJECT, fsync=fsync, ack_policy="all",
                                   replication_factor=BROKERS, min_isr=2)
        return await self.wait_full_isr("a full ISR after creating the stream")

    def metadata_leader(self) -> int | None:
        """The metadata Raft leader, as the first live broker's HTTP API sees it."""
        for broker in self.brokers:
            if broker.running:
                try:
                    with _HTTP.open(f"{broker.http_url}/cluster", timeout=2.0) as response:
                        leader = json.load(response).get("metadata_leader")
                        return leader if isinstance(leader, int) else None
                except (OSError, ValueError):
                    continue
        return None

    def by_id(self, broker_id: int) -> BrokerProcess:
        return next(b for b in self.brokers if b.broker_id == broker_id)


async def runs(plan: Plan, url: str, count: int) -> dict[str, Any]:
    results = [await publish_with_acks(url, SUBJECT, count, plan.window)
               for _ in range(plan.repeats)]
    return median_run(results)


async def ours(work: Path, plan: Plan, fsync: str, count: int) -> dict[str, Any]:
    async with OurCluster(work / f"ours-{fsync}") as cluster:
        await cluster.create_stream(fsync)
        result = await runs(plan, cluster.nats.url, count)
        await cluster.wait_full_isr("a full ISR after the runs")  # nobody fell behind for good
        return result


# -- peer: NATS JetStream R3 ---------------------------------------------------------------------


async def jetstream_peer(work: Path, plan: Plan, always: bool, count: int) -> dict[str, Any]:
    config = {"jetstream": {"sync_interval": "always"}} if always else None
    async with NatsCluster(work / f"js-{'always' if always else 'default'}", BROKERS,
                           config=config) as cluster:
        nc = await nats.connect(cluster.urls)
        try:
            js = nc.jetstream()
            await js.add_stream(name="BENCH", subjects=[SUBJECT], storage="file",
                                num_replicas=BROKERS)

            async def current() -> str | None:
                info = await js.stream_info("BENCH")
                peers = info.cluster.replicas if info.cluster else None
                if info.cluster and info.cluster.leader and peers and len(peers) == BROKERS - 1 \
                        and all(p.current for p in peers):
                    return info.cluster.leader
                return None

            leader = await eventually(current, "a JetStream R3 stream with current replicas")
        finally:
            await nc.close()
        url = next(s.url for s in cluster.servers if s.name == leader)
        result = await runs(plan, url, count)
        result["publisher_server"] = "stream leader"
        return result


# -- failover ------------------------------------------------------------------------------------


def is_ack(data: bytes) -> bool:
    """A broker's successful ack: JSON with an offset, no error. A no-responders status
    (empty body, while no leader subscribes) and an error ack are not."""
    return data.startswith(b"{") and b'"offset"' in data and b'"error"' not in data


def first_ack_after(sent_at: Sequence[float], acked_at: Sequence[float | None],
                    published_after: float) -> float | None:
    """The earliest ack time of a message published at or after `published_after`."""
    times = [acked for sent, acked in zip(sent_at, acked_at, strict=True)
             if acked is not None and sent >= published_after]
    return min(times, default=None)


def summarize(samples: Sequence[float]) -> dict[str, Any]:
    """p50 and p99 of the failover samples; p99 of fewer than 100 samples is their max."""
    return {"p50_s": percentile(samples, 50), "p99_s": percentile(samples, 99),
            "max_s": max(samples), "samples_s": [round(s, 3) for s in samples],
            "p99_is_max": len(samples) < 100}


class PacedPublisher:
    """Publishes at `rate` messages per second, acked or not, recording publish and ack
    times by message index. Acks of messages that a dead leader swallowed never come."""

    def __init__(self, url: str, rate: int) -> None:
        self.url = url
        self.interval_s = 1.0 / rate
        self.sent_at: list[float] = []
        self.acked_at: list[float | None] = []
        self.errors = 0
        self.no_responders = 0
        self._watch_after = float("inf")
        self._acked_after = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._nc: Any = None

    async def start(self) -> None:
        self._nc = await nats.connect(self.url, pending_size=16 * 1024 * 1024)
        inbox = self._nc.new_inbox()
        await self._nc.subscribe(inbox + ".*", cb=self._on_reply, pending_msgs_limit=100_000)
        await self._nc.flush()
        self._task = asyncio.get_running_loop().create_task(self._publish(inbox))

    async def _publish(self, inbox: str) -> None:
        started = time.perf_counter()
        i = 0
        while True:
            delay = started + i * self.interval_s - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)  # pacing, not a wait for a condition
            self.sent_at.append(time.perf_counter())
            self.acked_at.append(None)
            await self._nc.publish(SUBJECT, PAYLOAD, reply=f"{inbox}.{i}")
            i += 1

    async def _on_reply(self, msg: Any) -> None:
        now = time.perf_counter()
        i = int(msg.subject.rsplit(".", 1)[1])
        if is_ack(msg.data):
            self.acked_at[i] = now
            if self.sent_at[i] >= self._watch_after:
                self._acked_after.set()
        elif msg.data:
            self.errors += 1
        else:
            self.no_responders += 1

    async def ack_of_message_after(self, published_after: float, deadline_s: float) -> float:
        """Wait for an ack of a message published at or after `published_after`; the time
        the first such ack arrived."""
        self._watch_after = published_after
        self._acked_after.clear()
        if first_ack_after(self.sent_at, self.acked_at, published_after) is None:
            await asyncio.wait_for(self._acked_after.wait(), deadline_s)
        found = first_ack_after(self.sent_at, self.acked_at, published_after)
        assert found is not None
        return found

    async def stop(self) -> dict[str, int]:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._nc is not None:
            await self._nc.close()
        acked = sum(a is not None for a in self.acked_at)
        return {"sent": len(self.sent_at), "acked": acked, "unacked": len(self.sent_at) - acked,
                "error_acks": self.errors, "no_responders": self.no_responders}


async def failover(work: Path, plan: Plan) -> dict[str, Any]:
    rounds: list[dict[str, Any]] = []
    async with OurCluster(work / "failover") as cluster:
        await cluster.create_stream("interval")
        publisher = PacedPublisher(cluster.nats.url, plan.failover_rate)
        await publisher.start()
        try:
            await publisher.ack_of_message_after(time.perf_counter(), DEADLINE_S)
            for n in range(plan.failovers):
                rounds.append(await failover_round(cluster, publisher))
                progress(f"failover {n + 1}/{plan.failovers}: "
                         f"{rounds[-1]['failover_s']:.2f} s, {rounds[-1]}")
        finally:
            traffic = await publisher.stop()
    samples = [r["failover_s"] for r in rounds]
    return {**summarize(samples), "rounds": rounds, "traffic": traffic,
            "rate_msgs_per_s": plan.failover_rate,
            "slow": sum(s > FAILOVER_SLOW_S for s in samples)}


async def failover_round(cluster: OurCluster, publisher: PacedPublisher) -> dict[str, Any]:
    before = await cluster.wait_full_isr("a full ISR before a kill")
    metadata_leader = await asyncio.to_thread(cluster.metadata_leader)
    victim = cluster.by_id(before.leader)
    killed_at = time.perf_counter()
    await asyncio.to_thread(victim.kill)  # SIGKILL by PID, then reaped
    dead_at = time.perf_counter()
    try:
        acked_at = await publisher.ack_of_message_after(dead_at, DEADLINE_S)
    except TimeoutError:
        raise RuntimeError(f"no ack {DEADLINE_S} s after killing broker {victim.broker_id}, "
                           f"the leader of {STREAM}/0 at epoch {before.leader_epoch}: see "
                           f"{cluster.work}/broker*.log") from None
    after = await cluster.partition()
    restart_at = time.perf_counter()
    await asyncio.to_thread(victim.start)

    async def rejoined() -> PartitionInfo | None:
        p = await cluster.partition()
        return p if victim.broker_id in p.isr else None

    await eventually(rejoined, f"broker {victim.broker_id} back in the ISR")
    return {"failover_s": acked_at - killed_at, "killed": victim.broker_id,
            "killed_led_metadata": metadata_leader == victim.broker_id,
            "epoch": [before.leader_epoch, after.leader_epoch], "new_leader": after.leader,
            "rejoin_s": round(time.perf_counter() - restart_at, 3)}


# -- the run -------------------------------------------------------------------------------------


async def run(plan: Plan, quick: bool, work: Path) -> dict[str, Any]:
    progress("ours R3, fsync interval, ack all")
    a = await ours(work, plan, "interval", plan.messages)
    progress("NATS JetStream R3, file storage, default sync")
    b = await jetstream_peer(work, plan, False, plan.messages)
    progress("ours R3, fsync always, ack all")
    a_always = await ours(work, plan, "always", plan.always_messages)
    progress("NATS JetStream R3, sync_interval always")
    b_always = await jetstream_peer(work, plan, True, plan.always_messages)
    progress(f"failover: {plan.failovers} SIGKILLs of the partition leader")
    f = await failover(work, plan)
    return {
        "benchmark": "replication", "mode": "quick" if quick else "full",
        "created_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "message_bytes": len(PAYLOAD), "window": plan.window, "repeats": plan.repeats,
        "replication_factor": BROKERS, "min_isr": 2, "ack_policy": "all",
        "ours": a, "jetstream_r3": b, "ours_fsync_always": a_always,
        "jetstream_r3_sync_always": b_always, "failover": f,
        "r3_ingest_msgs_per_s": a["msgs_per_s"],
        "jetstream_r3_msgs_per_s": b["msgs_per_s"],
        "r3_ratio_vs_jetstream_r3": a["msgs_per_s"] / b["msgs_per_s"],
        "ack_p50_ms": a["ack_p50_ms"], "ack_p99_ms": a["ack_p99_ms"],
        "jetstream_r3_ack_p50_ms": b["ack_p50_ms"], "jetstream_r3_ack_p99_ms": b["ack_p99_ms"],
        "r3_fsync_always_msgs_per_s": a_always["msgs_per_s"],
        "jetstream_r3_sync_always_msgs_per_s": b_always["msgs_per_s"],
        "r3_fsync_always_ratio_vs_jetstream_r3": a_always["msgs_per_s"] / b_always["msgs_per_s"],
        "fsync_always_ack_p50_ms": a_always["ack_p50_ms"],
        "fsync_always_ack_p99_ms": a_always["ack_p99_ms"],
        "failover_p50_s": f["p50_s"], "failover_p99_s": f["p99_s"],
    }


def table(r: dict[str, Any]) -> str:
    rows = [
        ("ours R3, fsync interval, ack all", r["ours"]),
        ("NATS JetStream R3, file, default sync", r["jetstream_r3"]),
        ("ours R3, fsync always, ack all", r["ours_fsync_always"]),
        ("NATS JetStream R3, sync_interval always", r["jetstream_r3_sync_always"]),
    ]
    lines = [(f"{'publish, 128 B, window ' + str(r['window']):42} {'msgs/s':>9} {'p50 ms':>8} "
             f"{'p99 ms':>8} {'errors':>6}")]
    for name, row in rows:
        lines.append(f"{name:42} {row['msgs_per_s']:9.0f} {row['ack_p50_ms']:8.2f} "
                     f"{row['ack_p99_ms']:8.2f} {row['errors']:6d}")
    f = r["failover"]
    p99 = "p99 (= max: few samples)" if f["p99_is_max"] else "p99"
    lines += [
        "",
        (f"lazy ours/JetStream R3 {r['r3_ratio_vs_jetstream_r3']:.2f}   "
        f"durable ours/JetStream R3 {r['r3_fsync_always_ratio_vs_jetstream_r3']:.2f}"),
        f"failover (SIGKILL of the leader -> first ack of a later message), "
        f"{len(f['samples_s'])} rounds: p50 {f['p50_s']:.2f} s, {p99} {f['p99_s']:.2f} s"
        + (f", {f['slow']} over {FAILOVER_SLOW_S:.0f} s" if f["slow"] else ""),
        f"  samples {f['samples_s']}",
        (f"  paced publisher at {f['rate_msgs_per_s']}/s: {f['traffic']} (unacked: published "
        "while no leader subscribed, or in flight to the killed one)"),
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a run of a minute or two")
    parser.add_argument("--json", action="store_true", help="print one JSON object last")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-replication-"))
    try:
        results = asyncio.run(run(QUICK if args.quick else FULL, args.quick, work))
    except BaseException:
        print(f"run failed; its processes' logs are kept in {work}", file=sys.stderr)
        raise
    shutil.rmtree(work, ignore_errors=True)
    print(table(results))
    if not args.quick:
        RESULTS_DIR.mkdir(exist_ok=True)
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        (RESULTS_DIR / f"replication-{stamp}.json").write_text(json.dumps(results, indent=1))
    if args.json:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
