"""What security costs: ingest and catch-up reads with TLS on every link ÷ the same with it
off, at R1 and R3, and the metadata Raft group with and without its password.

Theory of operation
- Secured (`on`): a nats-server with TLS that requires client certificates; brokers with
  mutual TLS on the socket API (so replication between brokers is TLS too, each broker
  presenting its own certificate), the HTTP API on TLS, the broker's NATS connection over
  TLS with its certificate (the fast ingest client upgrades after INFO), and in the R3
  cluster an encrypted, authenticated metadata Raft group (`raft_password_file`). The
  publisher and the reader are clients over TLS too. Certificates come from a throwaway CA
  (jetstream.security.certs). The secured brokers also run `authentication` and
  `authorization`: the bench's client authenticates as the user `bench` (password checked
  against its argon2id hash) and every socket request of it is checked against ACL entries
  (create, delete, read on the stream `sec*`) that a super user added first; a stream's
  creation needs `create`, each catch-up fetch `read`. Plain (`off`): the same processes and
  workloads without any of it. (Ingest comes through NATS, which no ACL sees.)
- Ingest: the compiled load generator (bench.loadgen: requests with `window` un-acked on
  one connection, over TLS with the client's certificate on the secured side), 128 B
  messages; R1 with ack `leader`, R3 (3 brokers, min_isr 2) with ack `all`. Its ceiling is
  measured on each side's own nats-server: the same load answered by the no-op responder
  (over TLS on the secured side), and `generator_headroom` is that rate ÷ the rate measured
  (≥ 2: the generator did not limit the run). Catch-up: a stream filled beforehand, then
  read whole from the earliest offset by the Python client's `subscribe` (fetches over the
  socket API).
- CPU per message: user+system seconds of the brokers and of the nats-server over the run,
  from /proc, divided by the messages; wall rates compare machines, CPU compares code. The
  `*_cpu_ratio` figures are that cost plain ÷ secured: what a machine the servers saturate
  would see, and steady when other work shares the cores (wall ratios then are not). The
  load generator's CPU share of one core during each run is reported (`loadgen_cpu_share`:
  the generator process for ingest, this process, the reader, for catch-up).
- Metadata Raft: three RaftMetadata nodes in this process on loopback, with and without a
  password; one proposer committing one command at a time (commit latency p50/p99), then 64
  proposers at once (commits per second).
- Both setups of a workload run at once and each repeat measures one side then the
  other, so load from elsewhere falls on both alike; medians over `repeats` rounds. Every
  process on loopback in a temp dir, stopped by PID.

Run from the repository root: `python -m bench.security [--quick] [--json]`. The last line of
--json output is one JSON object (`tls_ingest_ratio`, `tls_catchup_ratio`,
`tls_r3_ingest_ratio`, ...); a full run also writes it to bench/results/.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jetstream
from bench.common import JsonObject, bench_main, cpu_seconds, percentile
from bench.loadgen import Load, LoadTls, responder, run_load
from bench.replication import OurCluster
from jetstream.natsd import ServerTls, free_ports
from jetstream.raft_meta.fsm import RegisterBroker
from jetstream.raft_meta.model import BrokerInfo
from jetstream.raft_meta.raft import RaftMetadata
from jetstream.security.auth import hash_password
from jetstream.security.certs import ensure_leaves

PAYLOAD = b"x" * 128
#: The secured brokers' users: a super user that grants the ACLs, and the bench's client.
PASSWORDS = {"admin": "bench-admin-password", "bench": "bench-client-password"}
#: What the bench's client may do on the secured brokers.
GRANTS = [{"principal": "bench", "permission": "allow", "operation": operation,
           "resource_type": "stream", "pattern": "sec*"}
          for operation in ("create", "delete", "read")]
SUBJECT = "sec.in"
NOOP_SUBJECT = "sec.noop"
DEADLINE_S = 60.0


@dataclass(frozen=True, slots=True)
class Plan:
    messages: int
    r3_messages: int
    catchup: int
    window: int
    repeats: int
    raft_serial: int
    raft_concurrent: int


QUICK = Plan(messages=30_000, r3_messages=20_000, catchup=300_000, window=2000, repeats=1,
             raft_serial=200, raft_concurrent=1000)
FULL = Plan(messages=150_000, r3_messages=80_000, catchup=1_000_000, window=4000, repeats=3,
            raft_serial=1000, raft_concurrent=5000)


def progress(message: str) -> None:
    print(f"  .. {message}", file=sys.stderr, flush=True)


class Setup(OurCluster):
    """A nats-server and broker processes, all secured (`tls`) or all plain."""

    def __init__(self, work: Path, tls: bool, brokers: int) -> None:
        self.tls = tls
        self.files = ensure_leaves(work / "pki", [("broker", ("127.0.0.1",)),
                                                  ("nats", ("127.0.0.1",)),
                                                  ("client", ("client",))],
                                   ["raft-password"]) if tls else {}
        nats_tls = ServerTls(self.files["nats"], self.files["nats_key"], self.files["ca"],
                             verify=True) if tls else None
        super().__init__(work, brokers, nats_tls, self.broker_args(brokers))

    async def __aenter__(self) -> Setup:
        await super().__aenter__()
        if self.tls:  # the super user lets the bench's client at its stream
            try:
                async with self.connect("admin") as admin:
                    await admin.acl_add(GRANTS)
            except BaseException:
                await self.__aexit__()
                raise
        return self

    def broker_args(self, brokers: int) -> tuple[str, ...]:
        if not self.tls:
            return ()
        f = self.files
        users = " ".join(f"{name}:{hash_password(pw)}" for name, pw in PASSWORDS.items())
        return ("--tls-cert", f["broker"], "--tls-key", f["broker_key"], "--tls-ca", f["ca"],
                "--tls-verify-client", "--nats-tls-ca", f["ca"], "--nats-tls-cert",
                f["broker"], "--nats-tls-key", f["broker_key"],
                "--authentication", "--authorization", "--users", users,
                "--super-users", "admin",
                *(("--raft-password-file", f["raft-password"]) if brokers > 1 else ()))

    def client_options(self, user: str = "bench") -> dict[str, Any]:
        if not self.tls:
            return {}
        f = self.files
        return {"tls_ca": f["ca"], "tls_cert": f["broker"], "tls_key": f["broker_key"],
                "user": user, "password": PASSWORDS[user]}

    def load_tls(self) -> LoadTls | None:
        """The load generator's TLS: the client's certificate, as nats-server requires."""
        if not self.tls:
            return None
        f = self.files
        return LoadTls(f["ca"], f["client"], f["client_key"])

    def connect(self, user: str = "bench") -> jetstream.Client:
        return jetstream.connect(",".join(b.address for b in self.brokers),
                                 **self.client_options(user))

    def cpu(self) -> tuple[float, float]:
        """CPU seconds so far of the brokers, and of the nats-server."""
        return sum(cpu_seconds(b.pid) for b in self.brokers), cpu_seconds(self.nats.pid)


#: A measured run's messages per second and its load generator's CPU seconds (None: the
#: generator is this process).
Work = Callable[[], Awaitable[tuple[float, float | None]]]


async def measured(setup: Setup, messages: int, work: Work) -> JsonObject:
    """Run `work` with the CPU of every process counted."""
    brokers_before, nats_before = setup.cpu()
    own_before, wall_before = time.process_time(), time.perf_counter()
    rate, generator_cpu = await work()
    own, wall = time.process_time() - own_before, time.perf_counter() - wall_before
    brokers_after, nats_after = setup.cpu()
    return {"msgs_per_s": rate,
            "broker_cpu_us_per_msg": (brokers_after - brokers_before) / messages * 1e6,
            "nats_cpu_us_per_msg": (nats_after - nats_before) / messages * 1e6,
            "loadgen_cpu_share": (own if generator_cpu is None else generator_cpu) / wall}


def load(setup: Setup, plan: Plan, messages: int, subject: str = SUBJECT) -> Load:
    return Load(subject, size=len(PAYLOAD), inflight=plan.window, count=messages,
                tls=setup.load_tls())


async def publish(setup: Setup, plan: Plan, messages: int) -> tuple[float, float]:
    """`messages` acknowledged by the brokers: the rate and the generator's CPU seconds."""
    result = await run_load(setup.nats.url, load(setup, plan, messages))
    if result.errors or result.acked != messages:
        raise RuntimeError(f"{result.acked} of {messages} acknowledged, {result.errors} "
                           "error acks")
    return result.msgs_per_s, result.generator_cpu_s


async def ingest(setup: Setup, plan: Plan, messages: int) -> JsonObject:
    return await measured(setup, messages, lambda: publish(setup, plan, messages))


async def ceiling(setup: Setup, plan: Plan, messages: int) -> float:
    """The generator's own rate with the same load through this side's nats-server, answered
    by the no-op responder."""
    with responder(setup.nats.url, NOOP_SUBJECT, tls=setup.load_tls()):
        result = await run_load(setup.nats.url, load(setup, plan, messages, NOOP_SUBJECT))
    if result.acked != messages or result.no_responders:
        raise RuntimeError(f"the no-op responder answered {result.acked} of {messages}")
    return result.msgs_per_s


async def catchup(setup: Setup, plan: Plan) -> JsonObject:
    async def work() -> tuple[float, float | None]:
        async with setup.connect() as js:
            started, seen = time.perf_counter(), 0
            async for _msg in js.subscribe("sec", start=jetstream.Start.EARLIEST,
                                           stop="latest"):
                seen += 1
            if seen != plan.catchup:
                raise RuntimeError(f"read {seen} of {plan.catchup}")
            return seen / (time.perf_counter() - started), None
    return await measured(setup, plan.catchup, work)


def median(runs: Sequence[JsonObject]) -> JsonObject:
    out = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    out["runs"] = [round(r["msgs_per_s"]) for r in runs]
    return out


async def r1(work: Path, plan: Plan) -> JsonObject:
    """R1 ingest, then catch-up reads, plain and secured side by side: both setups run at
    once and each repeat measures one then the other, so load from elsewhere on the machine
    falls on both alike."""
    async with Setup(work / "r1-off", False, 1) as off, Setup(work / "r1-on", True, 1) as on:
        sides = {"off": off, "on": on}
        for setup in sides.values():
            async with setup.connect() as js:
                await js.create_stream("sec", SUBJECT, ack_policy="leader")
        progress("R1 ingest, TLS off and on")
        ingests = await alternate(sides, plan, lambda s: ingest(s, plan, plan.messages))
        with_headroom(ingests, {name: await ceiling(setup, plan, plan.messages)
                                for name, setup in sides.items()})
        for name, setup in sides.items():
            async with setup.connect() as js:
                await js.delete_stream("sec")
                await js.create_stream("sec", SUBJECT, ack_policy="leader", fsync="never")
            progress(f"filling {plan.catchup} messages to read, TLS {name}")
            await publish(setup, plan, plan.catchup)
        progress("R1 catch-up reads, TLS off and on")
        reads = await alternate(sides, plan, lambda s: catchup(s, plan))
        return {"ingest": ingests, "catchup": reads}


async def r3(work: Path, plan: Plan) -> JsonObject:
    async with Setup(work / "r3-off", False, 3) as off, Setup(work / "r3-on", True, 3) as on:
        sides = {"off": off, "on": on}
        for setup in sides.values():
            async with setup.connect() as js:
                await js.create_stream("sec", SUBJECT, ack_policy="all", replication_factor=3,
                                       min_isr=2)
        progress("R3 ingest, TLS off and on")
        ingests = await alternate(sides, plan, lambda s: ingest(s, plan, plan.r3_messages))
        with_headroom(ingests, {name: await ceiling(setup, plan, plan.r3_messages)
                                for name, setup in sides.items()})
        return ingests


def with_headroom(sides: JsonObject, ceilings: dict[str, float]) -> None:
    """Add to each side the generator's ceiling there and its headroom over the rate."""
    for name, rate in ceilings.items():
        side = sides[name]
        side["generator_ceiling_msgs_per_s"] = rate
        side["generator_headroom"] = round(rate / float(side["msgs_per_s"]), 2)


async def alternate(sides: dict[str, Setup], plan: Plan,
                    once: Callable[[Setup], Awaitable[JsonObject]]) -> JsonObject:
    """`repeats` rounds of `once` on each side in turn; the median of each side."""
    runs: dict[str, list[JsonObject]] = {name: [] for name in sides}
    for _ in range(plan.repeats):
        for name, setup in sides.items():
            runs[name].append(await once(setup))
    return {name: median(results) for name, results in runs.items()}


# -- metadata Raft -----------------------------------------------------------------------------


async def raft(work: Path, plan: Plan, password: str | None) -> JsonObject:
    addresses = [f"127.0.0.1:{port}" for port in free_ports(3)]
    ids = {address: i for i, address in enumerate(addresses)}
    nodes = [RaftMetadata(work / f"node{i}", address, addresses, broker_id=i, broker_ids=ids,
                          password=password) for i, address in enumerate(addresses)]
    try:
        deadline = time.monotonic() + DEADLINE_S
        while not any(n.is_leader for n in nodes):
            if time.monotonic() > deadline:
                raise RuntimeError("no metadata leader")
            await asyncio.sleep(0.05)
        leader = next(n for n in nodes if n.is_leader)
        latencies = []
        for i in range(plan.raft_serial):
            started = time.perf_counter()
            await leader.propose(RegisterBroker(BrokerInfo(7, "127.0.0.1", 1000 + i)))
            latencies.append(time.perf_counter() - started)
        queue = iter(range(plan.raft_concurrent))

        async def proposer() -> None:
            for i in queue:
                await leader.propose(RegisterBroker(BrokerInfo(8, "127.0.0.1", 1000 + i)),
                                     timeout=30.0)
        started = time.perf_counter()
        await asyncio.gather(*(proposer() for _ in range(64)))
        return {"commit_p50_ms": percentile(latencies, 50) * 1000,
                "commit_p99_ms": percentile(latencies, 99) * 1000,
                "commits_per_s_64": plan.raft_concurrent / (time.perf_counter() - started)}
    finally:
        for node in nodes:
            await node.close()


# -- the run -----------------------------------------------------------------------------------


def ratio(sides: JsonObject) -> float:
    return round(float(sides["on"]["msgs_per_s"]) / float(sides["off"]["msgs_per_s"]), 3)


def cpu_ratio(sides: JsonObject) -> float:
    """Server CPU per message plain ÷ secured (brokers and nats-server): the throughput
    ratio a machine whose cores the servers saturate would see, whatever else runs on it."""
    def cost(side: JsonObject) -> float:
        return float(side["broker_cpu_us_per_msg"]) + float(side["nats_cpu_us_per_msg"])
    return round(cost(sides["off"]) / cost(sides["on"]), 3)


async def run(quick: bool) -> JsonObject:
    plan = QUICK if quick else FULL
    with tempfile.TemporaryDirectory(prefix="bench-security-") as tmp:
        work = Path(tmp)
        r1_runs = await r1(work, plan)
        r3_runs = await r3(work, plan)
        progress("metadata Raft without and with its password")
        raft_off = await raft(work / "raft-off", plan, None)
        raft_on = await raft(work / "raft-on", plan, "bench-password")
    return {
        "bench": "security", "quick": quick, "message_bytes": len(PAYLOAD),
        "tls_ingest_ratio": ratio(r1_runs["ingest"]),
        "tls_catchup_ratio": ratio(r1_runs["catchup"]),
        "tls_r3_ingest_ratio": ratio(r3_runs),
        "tls_ingest_cpu_ratio": cpu_ratio(r1_runs["ingest"]),
        "tls_catchup_cpu_ratio": cpu_ratio(r1_runs["catchup"]),
        "tls_r3_ingest_cpu_ratio": cpu_ratio(r3_runs),
        "generator_headroom": min(float(runs[side]["generator_headroom"])
                                  for runs in (r1_runs["ingest"], r3_runs)
                                  for side in ("off", "on")),
        "authorization": "on in the secured setups: password authentication and ACL checks "
                         "of every socket request (the ratios are TLS + authorization ÷ off)",
        "r1_ingest": r1_runs["ingest"], "r1_catchup": r1_runs["catchup"],
        "r3_ingest": r3_runs,
        "raft": {"off": raft_off, "on": raft_on,
                 "commit_p50_ratio": round(raft_on["commit_p50_ms"]
                                           / raft_off["commit_p50_ms"], 3),
                 "throughput_ratio": round(raft_on["commits_per_s_64"]
                                           / raft_off["commits_per_s_64"], 3)},
    }


def table(r: JsonObject) -> str:
    rows = [(f"security bench ({'quick' if r['quick'] else 'full'}), 128 B messages; "
            "TLS on / off"), "",
            (f"{'workload':<14}{'off msg/s':>12}{'on msg/s':>12}{'ratio':>8}{'cpu ratio':>10}"
            f"{'broker µs/msg off/on':>24}{'loadgen cpu':>14}")]
    for label, key, ratio_key in (("R1 ingest", "r1_ingest", "tls_ingest"),
                                  ("R1 catch-up", "r1_catchup", "tls_catchup"),
                                  ("R3 ingest", "r3_ingest", "tls_r3_ingest")):
        off, on = r[key]["off"], r[key]["on"]
        rows.append(f"{label:<14}{off['msgs_per_s']:>12,.0f}{on['msgs_per_s']:>12,.0f}"
                    f"{r[ratio_key + '_ratio']:>8.2f}{r[ratio_key + '_cpu_ratio']:>10.2f}"
                    f"{off['broker_cpu_us_per_msg']:>12.1f}/{on['broker_cpu_us_per_msg']:<11.1f}"
                    f"{off['loadgen_cpu_share']:>7.2f}/{on['loadgen_cpu_share']:.2f}")
    rows.append(f"load generator headroom (its ceiling on the same nats-server ÷ the rate, "
                f"lowest of the ingest runs): {r['generator_headroom']:.1f}x")
    raft = r["raft"]
    rows += ["", (f"metadata Raft commit p50 {raft['off']['commit_p50_ms']:.2f} ms -> "
             f"{raft['on']['commit_p50_ms']:.2f} ms with the password; 64 proposers "
             f"{raft['off']['commits_per_s_64']:,.0f} -> {raft['on']['commits_per_s_64']:,.0f}"
             " commits/s"), f"authorization: {r['authorization']}"]
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    return bench_main("security", __doc__, argv, run, table)


if __name__ == "__main__":
    sys.exit(main())
