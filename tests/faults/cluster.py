"""The fault suite's topology: one nats-server, 3 broker processes whose every broker <-> broker
link (metadata Raft and socket API) runs through a relay a fault can cut, and one workload
process (tests/faults/workload.py), all on loopback, in one work directory.

Theory of operation: ports are chosen up front so each broker can be told, at its first start,
to dial each peer through the relay of that directed link (`--raft-routes`, `--peer-routes`);
clients and NATS are not relayed. Everything here is synchronous and blocking: the relays run
on their own thread (proxy.Relays), brokers and the workload are child processes stopped by
PID. The cluster's view is read over HTTP (`GET /cluster` of a live broker); every wait is a
condition polled until a deadline. At the end `finish()` heals the network, waits until every
replica holds everything committed, stops every process and reads every replica's log files,
for the checker (tests/faults/checker.py).

With `store`, the workload's stream offloads to a fragment store (`file://` in the work
directory) with small segments and a small local retention, so fragments are uploaded and
local segments deleted during the faults; `finish()` then reads every partition from offset
0 through the brokers (below a leader's local log start they serve the store) into the
history as consumer reads, and a replica's records below its local log start are the
store's (read from the fragments, SHA-256 checked), so the checker covers both.

With `disks`, each broker's data directory is a tmpfs of its own (DISK_SIZE; mounting needs
root, else TmpfsUnavailable), which a fault can fill past the brokers' disk high watermark
and free again (`fill_disk`, `free_disk`).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import httpx

from jetstream.compaction.planner import CleanupPolicy
from jetstream.natsd import NatsServer, ServerTls, restartable_ports
from jetstream.offsets.records import OFFSETS_STREAM, coordinator_partition
from jetstream.raft_meta.model import StreamConfig
from jetstream.security.auth import hash_password
from jetstream.security.certs import ensure_leaves
from jetstream.security.tls import client_context
from jetstream.server.process import BrokerProcess
from jetstream.stream.config import FsyncPolicy
from jetstream.stream.log import Log
from tests.disk_space import fill, free, tmpfs
from tests.faults.checker import Record, Replica
from tests.faults.proxy import Mode, Relays
from tests.faults.workload import GROUP_DRAIN_S

T = TypeVar("T")
HOST = "127.0.0.1"
STREAM = "faults"
SUBJECT = "faults.in"
BROKERS = 3
POLL_S = 0.1
HTTP_TIMEOUT_S = 2.0
#: Secured clusters run authentication and authorization too: the harness is a super user
#: (HTTP Basic), the workload the principal of its client certificate ("client"), allowed
#: by ACL entries only what it does: read streams, use consumer groups.
HARNESS_USER, HARNESS_PASSWORD = "harness", "harness-password"
WORKLOAD_ACLS = [{"principal": "client", "permission": "allow", "operation": operation,
                  "resource_type": kind, "pattern": "*"}
                 for operation, kind in (("read", "stream"), ("group", "group"))]
#: Short timeouts so that failover and ISR changes happen within a fault's window.
TUNING = ("--replica-lag-ms-max", "2000", "--replica-leader-timeout-ms", "1000",
          "--broker-timeout-ms", "2000", "--checkpoint-interval-ms", "200",
          # The scrubber passes every 2 s: damage a fault leaves is found during the run.
          "--scrub-bytes-per-s", str(32 << 20), "--scrub-interval-ms", "2000",
          # Preferred leaders are given back every 2 s: leaderships a fault moved go back
          # while the workload runs and the next faults strike.
          "--leader-imbalance-check-interval-ms", "2000", "-v")
HEALTHY_TIMEOUT_S = 60.0
WORKLOAD_STOP_TIMEOUT_S = 30.0
#: `__offsets` partitions in the fault cluster (fewer than the default: quicker to create).
OFFSETS_PARTITIONS = 3
#: With `disks`: each broker's own data disk, how often brokers check it, and how full a
#: fault fills it (past the default high watermark, 95 %, short of the last byte).
DISK_SIZE = "512m"
DISK_TUNING = ("--disk-check-ms", "200")
DISK_FILL_PERCENT = 97.0
#: With `store`: the stream's segments, and what stays on the leader's disk.
STORE_SEGMENT_BYTES = 16 * 1024
STORE_LOCAL_BYTES = 2 * STORE_SEGMENT_BYTES


class ClusterStuck(AssertionError):
    """The cluster did not reach a condition before its deadline: an availability failure."""


@dataclass
class PartitionView:
    partition: int
    leader: int
    leader_epoch: int
    replicas: list[int]
    isr: list[int]
    high_watermark: int | None = None
    log_end_offset: int | None = None
    #: Each replica's LEO as the leader knows it (missing: not known yet).
    replica_end_offsets: dict[int, int] = field(default_factory=dict)


class FaultCluster:
    def __init__(self, work_dir: Path, *, partitions: int = 1,
                 fsync: FsyncPolicy = FsyncPolicy.ALWAYS, rate: int = 400,
                 seed: int = 0, compacted_keys: int = 0, group: str = "",
                 disks: bool = False, idle_streams: int = 0, tls: bool = False,
                 retry_ids: bool = False, store: bool = False) -> None:
        self.work_dir = work_dir
        #: The workload stream's fragment store (None: none).
        self.store_url = f"file://{work_dir / 'store'}" if store else None
        #: What finish() read through the brokers from offset 0 (history "r" events), and
        #: how many reads the brokers served from the store.
        self.final_reads: list[dict[str, Any]] = []
        self.store_reads = 0
        #: Every link secured: mutual TLS on the brokers' listeners (replication through the
        #: relays included), NATS over TLS with client certificates, the Raft password.
        self.tls = ensure_leaves(work_dir / "pki", [
            ("broker", (HOST,)), ("nats", (HOST,)), ("client", ("client",))],
            ["raft-password"]) if tls else {}
        #: The workload retries every unacked publish with its message id.
        self.retry_ids = retry_ids
        #: Idle R3 streams beside the workload's (what many partitions cost must not break
        #: failover, ISR changes or recovery).
        self.idle_streams = idle_streams
        self.partitions = partitions
        self.fsync = fsync
        self.rate = rate
        self.rng = random.Random(seed)
        #: A compacted stream whose writes go to this many keys (0: a plain stream).
        self.compacted_keys = compacted_keys
        #: A consumer group reading the stream (its members run in the workload), or "".
        self.group = group
        #: Each broker's data directory on a tmpfs of its own (a fault may fill it).
        self.disks = disks
        self._mounts = ExitStack()
        self.history_path = work_dir / "history.jsonl"
        self.nats: NatsServer | None = None
        self.relays: Relays | None = None
        self.brokers: list[BrokerProcess] = []
        self.paused: set[int] = set()
        self._workload: subprocess.Popen[bytes] | None = None
        self._history_read = 0
        self._acks = 0
        self._http = httpx.Client(timeout=HTTP_TIMEOUT_S, verify=self._client_tls() or True,
                                  auth=(HARNESS_USER, HARNESS_PASSWORD) if tls else None)
        #: The bit flips made (tests/faults/faults.py's bitflip), for the report.
        self.flips: list[str] = []

    # -- start and stop --------------------------------------------------------------------------

    def start(self) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        f = self.tls
        self.nats = NatsServer(self.work_dir / "nats", tls=ServerTls(
            f["nats"], f["nats_key"], f["ca"], verify=True) if f else None)
        self.nats.start()
        ports = restartable_ports(2 * BROKERS)
        raft_ports, api_ports = ports[:BROKERS], ports[BROKERS:]
        if self.disks:
            for b in range(BROKERS):
                self._mounts.enter_context(tmpfs(self.work_dir / f"broker{b}", DISK_SIZE))
        self.relays = Relays()
        members = ",".join(f"{b}@{HOST}:{raft_ports[b]}" for b in range(BROKERS))
        for b in range(BROKERS):
            raft_routes, peer_routes = [], []
            for peer in range(BROKERS):
                if peer == b:
                    continue
                raft = self.relays.add(f"raft:{b}>{peer}", f"{HOST}:{raft_ports[peer]}")
                api = self.relays.add(f"api:{b}>{peer}", f"{HOST}:{api_ports[peer]}")
                raft_routes.append(f"{peer}@{raft.address}")
                peer_routes.append(f"{peer}@{api.address}")
            broker = BrokerProcess(
                self.work_dir / f"broker{b}", self.nats.url, broker_id=b,
                extra_args=("--cluster", members, "--raft-routes", ",".join(raft_routes),
                            "--peer-routes", ",".join(peer_routes), "--http-port", "0",
                            "--cleaner-backoff-ms", "200",
                            "--offsets-partitions", str(OFFSETS_PARTITIONS), *TUNING,
                            *(DISK_TUNING if self.disks else ()), *self._broker_tls()))
            broker.port = api_ports[b]
            self.brokers.append(broker)
        for broker in self.brokers:
            broker.start(wait=False)
        for broker in self.brokers:
            broker.wait_ready(HEALTHY_TIMEOUT_S)
        if self.tls:
            response = self._http.post(self.brokers[0].http_url + "/acls",
                                       json={"acls": WORKLOAD_ACLS}, timeout=30.0)
            if response.status_code != 200:
                raise ClusterStuck(f"add ACLs: {response.status_code} {response.text}")
        self._create_stream()
        self.wait_healthy()

    def _create_stream(self) -> None:
        config = StreamConfig(name=STREAM, subject=SUBJECT, partitions=self.partitions,
                              replication_factor=BROKERS, min_isr=2, fsync=self.fsync)
        if self.compacted_keys:  # small segments, eager cleaning: passes during the faults
            config = replace(config, cleanup_policy=CleanupPolicy.COMPACT,
                             segment_bytes_max=4096, min_cleanable_dirty_ratio=0.05,
                             delete_retention_ms=1000)
        if self.store_url is not None:
            config = replace(config, segment_bytes_max=STORE_SEGMENT_BYTES,
                             fragment_store=self.store_url,
                             local_retention_bytes=STORE_LOCAL_BYTES)
        url = self.brokers[0].http_url + "/streams"
        idle = [StreamConfig(name=f"idle-{i}", subject=f"idle.{i}",
                             replication_factor=BROKERS, min_isr=2, fsync=self.fsync)
                for i in range(self.idle_streams)]
        for each in (config, *idle):
            response = self._http.post(url, json=each.to_dict(), timeout=30.0)
            if response.status_code not in (200, 201):
                raise ClusterStuck(f"create stream {each.name}: {response.status_code} "
                                   f"{response.text}")

    def start_workload(self) -> None:
        assert self.nats is not None
        argv = [sys.executable, "-m", "tests.faults.workload",
                "--brokers", ",".join(b.address for b in self.brokers),
                "--nats-url", self.nats.url, "--stream", STREAM, "--subject", SUBJECT,
                "--partitions", str(self.partitions), "--rate", str(self.rate),
                "--history", str(self.history_path)]
        if self.compacted_keys:
            argv += ["--keys", str(self.compacted_keys), "--delete-every", "7"]
        if self.group:
            argv += ["--group", self.group, "--members", "3"]
        if self.tls:
            argv += ["--tls-ca", self.tls["ca"], "--tls-cert", self.tls["client"],
                     "--tls-key", self.tls["client_key"]]
        if self.retry_ids:
            argv.append("--retry-ids")
        with open(self.work_dir / "workload.log", "ab") as out:
            self._workload = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                              stdin=subprocess.DEVNULL)

    def stop_workload(self) -> None:
        proc = self._workload
        if proc is None or proc.poll() is not None:
            return
        os.kill(proc.pid, signal.SIGTERM)
        try:  # a group's members first consume and commit everything acked
            proc.wait(WORKLOAD_STOP_TIMEOUT_S + (GROUP_DRAIN_S if self.group else 0))
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(WORKLOAD_STOP_TIMEOUT_S)

    def close(self) -> None:
        """Stop everything by PID (safe to call twice, and after a failure)."""
        for b in list(self.paused):
            self.resume(b)
        if self._workload is not None and self._workload.poll() is None:
            os.kill(self._workload.pid, signal.SIGKILL)
            self._workload.wait(WORKLOAD_STOP_TIMEOUT_S)
        for broker in self.brokers:
            broker.kill()
        if self.relays is not None:
            self.relays.close()
            self.relays = None
        if self.nats is not None:
            self.nats.stop()
            self.nats = None
        self._mounts.close()
        self._http.close()

    def _broker_tls(self) -> tuple[str, ...]:
        f = self.tls
        if not f:
            return ()
        return ("--tls-cert", f["broker"], "--tls-key", f["broker_key"], "--tls-ca", f["ca"],
                "--tls-verify-client", "--http-tls-verify-client",
                "--raft-password-file", f["raft-password"], "--nats-tls-ca", f["ca"],
                "--nats-tls-cert", f["broker"], "--nats-tls-key", f["broker_key"],
                "--authentication", "--authorization", "--super-users", HARNESS_USER,
                "--users", f"{HARNESS_USER}:{hash_password(HARNESS_PASSWORD)}")

    def _client_tls(self) -> ssl.SSLContext | None:
        f = self.tls
        return client_context(f["ca"], f["client"], f["client_key"]) if f else None

    # -- the cluster's view ----------------------------------------------------------------------

    def live(self) -> list[int]:
        return [b for b, p in enumerate(self.brokers) if p.running and b not in self.paused]

    def view(self, via: int | None = None) -> dict[str, Any] | None:
        """`GET /cluster` of a live broker (of `via`), or None when none answers."""
        for b in [via] if via is not None else self.rng.sample(self.live(), len(self.live())):
            if not self.brokers[b].running or b in self.paused:
                continue
            try:
                response = self._http.get(self.brokers[b].http_url + "/cluster")
            except httpx.HTTPError:
                continue
            if response.status_code == 200:
                result: dict[str, Any] = response.json()
                return result
        return None

    def partition(self, partition: int, *, from_leader: bool = True,
                  stream: str = STREAM) -> PartitionView | None:
        """The partition as the metadata has it; with HW and LEOs when its leader answers."""
        view = self.view()
        entry = _partition_entry(view, partition, stream)
        if entry is None:
            return None
        result = PartitionView(partition, entry["leader"], entry["leader_epoch"],
                               entry["replicas"], entry["isr"])
        if from_leader and result.leader in self.live():
            led = _partition_entry(self.view(result.leader), partition, stream)
            if led is not None and led["leader"] == result.leader and \
                    "high_watermark" in led:
                result.high_watermark = led["high_watermark"]
                result.log_end_offset = led["log_end_offset"]
                result.replica_end_offsets = {
                    int(k): v for k, v in (led.get("replica_end_offsets") or {}).items()
                    if v is not None}
        return result

    def metadata_leader(self) -> int | None:
        view = self.view()
        leader = None if view is None else view.get("metadata_leader")
        return leader if isinstance(leader, int) else None

    def leader_of(self, partition: int = 0) -> int | None:
        p = self.partition(partition, from_leader=False)
        return None if p is None else p.leader

    def wait(self, probe: Callable[[], T | None], what: str,
             timeout_s: float = HEALTHY_TIMEOUT_S) -> T:
        deadline = time.monotonic() + timeout_s
        while True:
            result = probe()
            if result is not None and result is not False:
                return result
            if time.monotonic() > deadline:
                raise ClusterStuck(f"not within {timeout_s} s: {what}")
            time.sleep(POLL_S)

    def wait_healthy(self, timeout_s: float = HEALTHY_TIMEOUT_S) -> None:
        """Every broker running, and every partition led by a live broker with a full ISR."""
        def healthy() -> bool:
            if len(self.live()) != BROKERS:
                return False
            wanted = [(STREAM, p) for p in range(self.partitions)]
            if self.group and self.offsets_created():
                wanted += [(OFFSETS_STREAM, p) for p in range(OFFSETS_PARTITIONS)]
            for stream, p in wanted:
                view = self.partition(p, stream=stream)
                if view is None or view.high_watermark is None or \
                        sorted(view.isr) != sorted(view.replicas):
                    return False
            return True

        self.wait(healthy, "a healthy cluster (all brokers up, every ISR full)", timeout_s)

    def _idle_in_sync(self) -> bool:
        """Every idle stream led, with every replica in its ISR."""
        view = self.view()
        if view is None:
            return False
        full = 0
        for stream in view.get("streams", []):
            if str(stream.get("name", "")).startswith("idle-"):
                entry = stream["partitions"][0]
                full += entry.get("leader", -1) in self.live() and \
                    sorted(entry["isr"]) == sorted(entry["replicas"])
        return full == self.idle_streams

    def offsets_created(self) -> bool:
        return _partition_entry(self.view(), 0, OFFSETS_STREAM) is not None

    def coordinator_partition(self) -> int:
        return coordinator_partition(self.group, OFFSETS_PARTITIONS)

    def wait_new_leader(self, partition: int, old_epoch: int,
                        timeout_s: float = HEALTHY_TIMEOUT_S,
                        stream: str = STREAM) -> PartitionView:
        def moved() -> PartitionView | None:
            view = self.partition(partition, stream=stream)
            if view is None or view.leader_epoch <= old_epoch or view.high_watermark is None:
                return None
            return view

        return self.wait(moved, f"a new leader of partition {partition}", timeout_s)

    # -- faults ----------------------------------------------------------------------------------

    def kill(self, b: int) -> None:
        self.paused.discard(b)
        self.brokers[b].stop(signal.SIGKILL)

    def restart(self, b: int) -> None:
        broker = self.brokers[b]
        if not broker.running:
            broker.start(wait=False)
            broker.wait_ready(HEALTHY_TIMEOUT_S)

    def pause(self, b: int) -> None:
        os.kill(self.brokers[b].pid, signal.SIGSTOP)
        self.paused.add(b)

    def resume(self, b: int) -> None:
        if b in self.paused and self.brokers[b].running:
            os.kill(self.brokers[b].pid, signal.SIGCONT)
        self.paused.discard(b)

    def isolate(self, b: int, mode: Mode = Mode.DOWN, delay_ms: int = 0) -> None:
        """Put every broker <-> broker link of `b`, both ways, in `mode` (down: cut off; NATS
        and clients still reach it)."""
        assert self.relays is not None
        names = [n for n in self.relays.links
                 if n.split(":")[1].startswith(f"{b}>") or n.endswith(f">{b}")]
        self.relays.set_mode(names, mode, delay_ms)

    def heal(self) -> None:
        assert self.relays is not None
        self.relays.heal()

    def fill_disk(self, b: int) -> None:
        """Fill broker `b`'s data disk past the brokers' high watermark."""
        assert self.disks, "a cluster without disks of its own"
        fill(self.brokers[b].data_dir, DISK_FILL_PERCENT)

    def free_disk(self, b: int) -> None:
        if self.disks:
            free(self.brokers[b].data_dir)

    def cut_log(self, b: int, partition: int, offset: int, garbage: bytes = b"") -> None:
        """Cut a stopped broker's replica of `partition` back to `offset` (what was surely
        fsynced; rounded up to the end of the batch holding it, since a batch is written and
        fsynced whole), then append `garbage` to its last segment (a torn write)."""
        directory = self.brokers[b].data_dir / "logs" / f"{STREAM}-{partition}"
        if not directory.exists():
            return
        log = Log(directory)
        try:
            if log.log_start_offset <= offset < log.log_end_offset:
                held = log.read_records(offset, 1)
                offset = held[-1].offset + 1 if held else offset
            if offset < log.log_end_offset:
                log.truncate_to(max(offset, log.log_start_offset))
            segments = sorted(directory.glob("*.log"))
        finally:
            log.close()
        if garbage and segments:
            with open(segments[-1], "ab") as f:
                f.write(garbage)

    def flip_bits(self, b: int, partition: int, kind: str) -> str:
        """Flip 1-5 bits of broker `b`'s replica of `partition`, at random: in a record
        batch of a sealed segment (`sealed`), of the active segment below what every replica
        already holds (`active`), or in an offset index file (`index`, which matters when the
        file is next loaded: the broker is restarted). What was flipped, for the log."""
        directory = self.brokers[b].data_dir / "logs" / f"{STREAM}-{partition}"
        logs = sorted(directory.glob("*.log"))
        if kind == "index":
            files = [p for p in sorted(directory.glob("*.index")) if p.stat().st_size >= 16]
            if not files:
                return "no index file yet"
            path = self.rng.choice(files)
            position = self.rng.randrange(path.stat().st_size)
        else:
            large = [p for p in logs if p.stat().st_size > 4096]
            sealed = [p for p in large if p != logs[-1]]
            candidates = (sealed if kind == "sealed" else []) or [p for p in large
                                                                   if p == logs[-1]]
            if not candidates:
                return "no segment large enough yet"
            path = self.rng.choice(candidates)
            # Well below the end: bytes every replica has fetched (and the HW passed).
            position = self.rng.randrange(path.stat().st_size // 2)
        with open(path, "r+b") as f:
            for _ in range(self.rng.randrange(1, 6)):
                at = min(position + self.rng.randrange(16), path.stat().st_size - 1)
                f.seek(at)
                byte = f.read(1)[0]
                f.seek(at)
                f.write(bytes([byte ^ (1 << self.rng.randrange(8))]))
        self.flips.append(f"broker {b}: {path.name} at {position}")
        return self.flips[-1]

    def scrub_everywhere(self) -> None:
        """Have every broker check every byte of its replicas now and heal them; wait until
        no replica reports damage (a lost range fails the wait: nothing may be lost with one
        damaged replica at a time)."""
        from jetstream.client import connect

        async def clean() -> bool:
            async with connect(",".join(b.address for b in self.brokers),
                               tls=self._client_tls(), user=HARNESS_USER if self.tls else None,
                               password=HARNESS_PASSWORD if self.tls else None) as js:
                found = await js.scrub(STREAM)
            return all(not e.get("damage") and not e.get("lost") and "error" not in e
                       for e in found)

        self.wait(lambda: True if asyncio.run(clean()) else None,
                  "every replica scrubbed clean")

    # -- the end ---------------------------------------------------------------------------------

    def finish(self) -> dict[int, list[Replica]]:
        """Stop the workload, heal, let every replica catch up, stop the brokers and read
        every replica's log; per partition, the replicas with the leader's final HW."""
        self.stop_workload()
        for b in list(self.paused):
            self.resume(b)
        for b in range(BROKERS):
            self.free_disk(b)
        self.heal()
        for b, broker in enumerate(self.brokers):
            if not broker.running:
                self.restart(b)
        self.wait_healthy()
        if self.idle_streams:
            self.wait(self._idle_in_sync, f"all {self.idle_streams} idle streams led with a "
                      "full ISR")
        hws: dict[int, int] = {}
        for p in range(self.partitions):
            def caught_up(p: int = p) -> PartitionView | None:
                view = self.partition(p)
                if view is None or view.high_watermark is None:
                    return None
                ends = [view.replica_end_offsets.get(r) for r in view.replicas
                        if r != view.leader]
                if view.high_watermark == view.log_end_offset and \
                        all(e == view.log_end_offset for e in ends):
                    return view
                return None

            final = self.wait(caught_up, f"every replica of partition {p} caught up")
            assert final.high_watermark is not None
            hws[p] = final.high_watermark
        self.scrub_everywhere()
        if self.store_url is not None:
            self.final_reads = asyncio.run(self._read_everything(hws))
            self.store_reads = sum(self._metric(b, "fragment_store_reads_total")
                                   for b in range(BROKERS))
        for broker in self.brokers:
            broker.stop(signal.SIGKILL)  # the files stay in the page cache: nothing is lost
        replicas: dict[int, list[Replica]] = {}
        for p in range(self.partitions):
            replicas[p] = []
            for b, broker in enumerate(self.brokers):
                directory = broker.data_dir / "logs" / f"{STREAM}-{p}"
                records = read_log(directory)
                if self.store_url is not None:
                    local_start = records[0][0] if records else hws[p]
                    records = stored_records(self.store_url, p, local_start) + records
                replicas[p].append(Replica(b, hws[p], records))
        return replicas

    async def _read_everything(self, hws: dict[int, int]) -> list[dict[str, Any]]:
        """Every partition from offset 0 to its HW, through the brokers, as consumer reads."""
        from jetstream.client import connect

        reads: list[dict[str, Any]] = []
        async with connect(",".join(b.address for b in self.brokers),
                           tls=self._client_tls(), user=HARNESS_USER if self.tls else None,
                           password=HARNESS_PASSWORD if self.tls else None) as js:
            for p, hw in hws.items():
                offset = 0
                while offset < hw:
                    result = await js.fetch(STREAM, p, offset, max_bytes=1 << 20)
                    if not result.messages:
                        raise ClusterStuck(f"partition {p}: nothing read at {offset} < {hw}")
                    for m in result.messages:
                        written = m.headers.get("w", m.value or b"")
                        reads.append({"e": "r", "v": written.decode(errors="replace"),
                                      "t": time.time(), "p": p, "o": m.offset})
                    offset = result.messages[-1].offset + 1
        return reads

    def _metric(self, b: int, name: str) -> int:
        """The sum of `jetstream_partition_<name>` over the stream's partitions on broker
        `b`."""
        text = self._http.get(self.brokers[b].http_url + "/metrics").text
        prefix = f'jetstream_partition_{name}{{stream="{STREAM}",'
        return sum(int(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith(prefix))

    def acks(self) -> int:
        """Acks the workload has recorded so far."""
        if not self.history_path.exists():
            return 0
        with open(self.history_path, "rb") as f:
            f.seek(self._history_read)
            data = f.read()
        whole = data[:data.rfind(b"\n") + 1]  # complete lines only
        self._history_read += len(whole)
        self._acks += whole.count(b'"e":"a"')
        return self._acks

    def wait_progress(self, acks: int = 20, timeout_s: float = HEALTHY_TIMEOUT_S) -> None:
        """Wait until the workload has `acks` more acks: the cluster serves writes."""
        target = self.acks() + acks
        self.wait(lambda: self.acks() >= target, f"{acks} more acks", timeout_s)

    def history(self) -> list[dict[str, Any]]:
        with open(self.history_path, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.endswith("\n")]


def stored_records(store_url: str, partition: int, below: int) -> list[Record]:
    """The records below offset `below` from the partition's fragments in the store, from
    offset 0 through the chain of fragments (each SHA-256 checked); it stops at a gap."""
    from jetstream.stream.format import decode_batches
    from jetstream.tiered import codec
    from jetstream.tiered.index import FragmentIndex
    from jetstream.tiered.store import FragmentStore

    store = FragmentStore(store_url)
    index = FragmentIndex(store.list_partition(STREAM, partition))
    records: list[Record] = []
    at = 0
    while at < below:
        fragment = index.covering(at)
        if fragment is None:
            break
        data = codec.decode(fragment.name, store.get(store.key(fragment.name)),
                            store.url_of(fragment.name))
        records.extend((r.offset, r.timestamp_ms, r.leader_epoch, r.key, r.value,
                        tuple(sorted(r.headers.items())), r.subject)
                       for r in decode_batches(data, min_offset=at) if r.offset < below)
        at = fragment.end
    return records


def read_log(directory: Path) -> list[Record]:
    """Every record of the log in `directory`, every field of each."""
    log = Log(directory)
    records: list[Record] = []
    try:
        offset = log.log_start_offset
        while offset < log.log_end_offset:
            batch = log.read_records(offset)
            if not batch:
                break
            records.extend((r.offset, r.timestamp_ms, r.leader_epoch, r.key, r.value,
                            tuple(sorted(r.headers.items())), r.subject) for r in batch)
            offset = batch[-1].offset + 1
    finally:
        log.close()
    return records


def _partition_entry(view: dict[str, Any] | None, partition: int,
                     name: str = STREAM) -> dict[str, Any] | None:
    if view is None:
        return None
    for stream in view.get("streams", []):
        if stream.get("name") == name:
            for entry in stream["partitions"]:
                if entry["partition"] == partition:
                    return dict(entry)
    return None
