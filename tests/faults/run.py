"""A long random mix of faults against a 3-broker cluster under load, then the checker.

    python -m tests.faults.run --minutes 20 [--seed N] [--fsync always|interval]
                               [--partitions N] [--faults a,b,...] [--json] [--keep DIR]

Each cycle picks a fault at random (tests/faults/faults.py), applies it and undoes it, waits
until the cluster is healthy again (every broker up, every ISR full) and has acked more
writes. When the time is up the workload stops, every replica catches up, every process is
stopped and every replica's log is read and checked (tests/faults/checker.py). The figures
are printed; with --json the last line is one JSON object. Exit 1 when a safety check failed
or the cluster got stuck (an availability failure), 0 otherwise.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from jetstream.stream.config import FsyncPolicy
from tests.disk_space import tmpfs_available
from tests.faults.checker import Report, check
from tests.faults.cluster import ClusterStuck, FaultCluster
from tests.faults.compacted import CompactedReport, check_compacted
from tests.faults.faults import ALL, DISK_FAULTS, GROUP_FAULTS
from tests.faults.groups import check_group


def run_mix(work_dir: Path, *, seconds: float, seed: int, fsync: FsyncPolicy,
            partitions: int = 1, faults: list[str] | None = None, cycles: int | None = None,
            log: Any = None, compacted_keys: int = 0, group: str = "",
            idle_streams: int = 0, tls: bool = False, retry_ids: bool = False,
            store: bool = False) -> dict[str, Any]:
    """Run the mix for `seconds` of load (or exactly `cycles` faults); the checker's report
    plus the run's figures. With `group`, the stream is read by a consumer group whose
    members run in the workload, and the group's checker (tests/faults/groups.py) adds its
    figures, prefixed `group_`. Faults that fill a disk need each broker's data directory on
    a tmpfs of its own: without `faults`, they are in the mix only where one can be mounted
    (as root); named without that, the cluster does not start (TmpfsUnavailable).
    `idle_streams` idle R3 streams are created beside the workload's. `tls` secures every
    link (mutual TLS, NATS over TLS, the Raft password). With `retry_ids` the workload
    retries every unacked publish with its message id (no duplicates allowed). With `store`
    the stream offloads to a fragment store during the faults, and the checker reads what
    the brokers serve from it (tests/faults/cluster.py); `store_reads` counts those reads."""
    names = faults or default_faults()
    every = {**ALL, **GROUP_FAULTS}
    rng = random.Random(seed)
    cluster = FaultCluster(work_dir, partitions=partitions, fsync=fsync, seed=seed,
                           compacted_keys=compacted_keys, group=group,
                           disks=bool(DISK_FAULTS & set(names)), idle_streams=idle_streams,
                           tls=tls, retry_ids=retry_ids, store=store)
    kills: list[tuple[str, float]] = []
    done: Counter[str] = Counter()
    stuck = ""
    try:
        cluster.start()
        cluster.start_workload()
        cluster.wait_progress()
        load_started = time.time()
        started = time.monotonic()
        while (time.monotonic() - started < seconds if cycles is None
               else sum(done.values()) < cycles):
            name = rng.choice(names)
            if log is not None:
                print(f"[{time.monotonic() - started:7.1f} s] {name}", file=log, flush=True)
            try:
                kills += [(name, t) for t in every[name](cluster)]
                cluster.wait_healthy()
                cluster.wait_progress()
            except ClusterStuck as exc:
                stuck = f"{name}: {exc}"
                break
            done[name] += 1
        replicas = cluster.finish()  # ClusterStuck here: nothing can be checked
        load_seconds = time.time() - load_started
        history = cluster.history() + cluster.final_reads
        report: Report | CompactedReport = (
            check_compacted(history, replicas) if compacted_keys
            else check(history, replicas, kills))
        group_report = check_group(history) if group else None
    finally:
        cluster.close()
    result = report.to_dict()
    if group_report is not None:
        result.update({f"group_{k}": v for k, v in group_report.to_dict().items()})
        result["safe"] = result["safe"] and group_report.safe
    result.update(
        fault_cycles=sum(done.values()), faults=dict(sorted(done.items())), seed=seed,
        fsync=fsync.value, partitions=partitions, seconds=round(load_seconds, 1),
        acked_per_s=round(report.acked / load_seconds, 1) if load_seconds else 0.0,
        compacted_keys=compacted_keys, bit_flips=len(cluster.flips), idle_streams=idle_streams,
        stuck=stuck, retry_ids=retry_ids, store_reads=cluster.store_reads,
        final_reads=len(cluster.final_reads))
    return result


def default_faults() -> list[str]:
    """Every fault, less those that fill a disk where no tmpfs can be mounted."""
    return sorted(n for n in ALL if n not in DISK_FAULTS or tmpfs_available())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faults.run")
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--fsync", choices=[p.value for p in FsyncPolicy], default="always")
    parser.add_argument("--partitions", type=int, default=1)
    parser.add_argument("--faults", default="", help=f"comma-separated subset of {sorted(ALL)}")
    parser.add_argument("--idle-streams", type=int, default=200,
                        help="idle R3 streams beside the workload's")
    parser.add_argument("--retry-ids", action="store_true",
                        help="the workload retries every unacked publish with its message id")
    parser.add_argument("--store", action="store_true",
                        help="the stream offloads to a fragment store during the faults")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")
    parser.add_argument("--keep", help="work in this directory and keep it (logs, history)")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(2**31)
    faults = [f for f in args.faults.split(",") if f]
    unknown = sorted(set(faults) - set(ALL))
    if unknown:
        parser.error(f"unknown faults: {unknown}")
    work_dir = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="jetstream-faults-"))
    try:
        result = run_mix(work_dir, seconds=args.minutes * 60, seed=seed,
                         fsync=FsyncPolicy(args.fsync), partitions=args.partitions,
                         faults=faults or None, log=sys.stderr,
                         idle_streams=args.idle_streams, retry_ids=args.retry_ids,
                         store=args.store)
    finally:
        if not args.keep:
            shutil.rmtree(work_dir, ignore_errors=True)
    for key in ("fault_cycles", "acked", "acked_lost", "offset_conflicts", "divergent_replicas",
                "phantom_reads", "truncated_reads", "duplicates", "unknown", "failed",
                "failover_p50_s", "failover_p99_s", "acked_per_s", "stuck"):
        print(f"{key:>20}: {result[key]}")
    if args.json:
        print(json.dumps(result))
    return 0 if result["safe"] and not result["stuck"] else 1


if __name__ == "__main__":
    sys.exit(main())
