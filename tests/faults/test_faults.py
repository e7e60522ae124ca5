"""The fault suite, each fault on its own and a short random mix: a real nats-server, 3 real
broker processes with every broker <-> broker link relayed, a workload process publishing with
ack `all`, and the checker over its history and every replica's final log. Every test fails on
any acked write lost, offset conflict, phantom, divergent replica or truncated read, and when
the cluster does not recover (ClusterStuck). A full disk needs a tmpfs per broker (root): where
none can be mounted, its test skips and the mix goes without it. Longer runs:
`python -m tests.faults.run`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from jetstream.stream.config import FsyncPolicy
from tests.disk_space import tmpfs_available
from tests.faults.faults import ALL, DISK_FAULTS
from tests.faults.run import run_mix

pytestmark = pytest.mark.slow

#: Faults that kill, cut off or stop a partition leader, and the failovers each must show
#: at least.
LEADER_FAULTS = {"kill_leader": 2, "kill_leader_five_times": 5, "partition_leader": 2,
                 "blackhole_leader": 2, "rolling_restart": 1}
#: A failover slower than this is an availability bug here (loopback, short timeouts).
FAILOVER_S_MAX = 10.0


def assert_safe(result: dict[str, Any]) -> None:
    summary = {k: result[k] for k in ("acked", "acked_lost", "offset_conflicts",
                                      "phantom_reads", "divergent_replicas", "truncated_reads",
                                      "duplicates", "examples", "stuck", "seed")}
    assert result["safe"], summary
    assert not result["stuck"], summary
    assert result["acked"] > 0, summary
    assert result["duplicates"] == 0, summary


@pytest.mark.parametrize("fault", sorted(ALL))
def test_fault(tmp_path: Path, fault: str) -> None:
    if fault in DISK_FAULTS and not tmpfs_available():
        pytest.skip("each broker needs a tmpfs of its own, and none can be mounted here")
    cycles = 1 if fault in ("kill_leader_five_times", "kill_all", "rolling_restart") else 2
    result = run_mix(tmp_path, seconds=0, cycles=cycles, seed=7, fsync=FsyncPolicy.ALWAYS,
                     faults=[fault])
    assert_safe(result)
    assert result["fault_cycles"] == cycles
    if fault == "bitflip":
        assert result["bit_flips"] >= 1, result  # damage was made, and healed: the
        # checker read every replica's every batch, CRC-checked, and found them whole
    if fault in LEADER_FAULTS:
        assert len(result["failover_s"]) >= LEADER_FAULTS[fault], result["failover_s"]
        assert result["failover_max_s"] < FAILOVER_S_MAX, result["failover_s"]


def test_random_mix(tmp_path: Path) -> None:
    """Six random faults on two partitions with fsync `interval` (acks still wait for
    the ISR: replication, not fsync, keeps them), beside 200 idle R3 streams: each fault moves
    hundreds of leaderships and ISRs at once through the metadata. The stream offloads to a
    fragment store meanwhile (small segments, small local retention): the final reads from
    offset 0 are served from the store below the leaders' local log start, and the checker
    counts them and the stored records with everything else."""
    seed = int(os.environ.get("JETSTREAM_FAULT_SEED", "11"))
    result = run_mix(tmp_path, seconds=0, cycles=6, seed=seed, fsync=FsyncPolicy.INTERVAL,
                     partitions=2, idle_streams=200, store=True)
    assert_safe(result)
    assert result["fault_cycles"] == 6
    assert result["store_reads"] > 0 and result["final_reads"] == result["committed"], result


def test_random_mix_with_every_link_secured(tmp_path: Path) -> None:
    """Four random faults with mutual TLS on every broker listener (replication through the
    relays included), NATS over TLS with client certificates, the Raft password, and
    authentication and authorization on (brokers replicate as the broker principal; the
    workload reads and uses groups through ACL entries)."""
    seed = int(os.environ.get("JETSTREAM_FAULT_SEED", "13"))
    result = run_mix(tmp_path, seconds=0, cycles=4, seed=seed, fsync=FsyncPolicy.INTERVAL,
                     partitions=2, idle_streams=50, tls=True)
    assert_safe(result)
    assert result["fault_cycles"] == 4


def test_retried_publishes_with_ids_are_stored_once(tmp_path: Path) -> None:
    """Leader faults while the workload retries every unacked publish with its message id
    (what NATS clients do on a timeout): every value acked, none stored twice."""
    result = run_mix(tmp_path, seconds=0, cycles=3, seed=3, fsync=FsyncPolicy.ALWAYS,
                     faults=["kill_leader", "partition_leader", "blackhole_leader"],
                     retry_ids=True)
    assert_safe(result)  # duplicates == 0 among the rest
    assert result["retry_ids"] and result["fault_cycles"] == 3


#: The faults a compacted stream goes through while its replicas' cleaners run.
COMPACTED_FAULTS = ["kill_leader", "kill_follower", "partition_leader", "rolling_restart",
                    "pause"]


def test_compacted_stream_under_faults(tmp_path: Path) -> None:
    """A compacted stream (20 keys, every 7th write a tombstone, small segments, eager
    cleaning) through leader and follower faults: every key's newest acked value survives on
    every replica, no deleted key comes back, live keys agree across replicas."""
    result = run_mix(tmp_path, seconds=0, cycles=4, seed=5, fsync=FsyncPolicy.ALWAYS,
                     faults=COMPACTED_FAULTS, compacted_keys=20)
    summary = {k: result[k] for k in ("acked", "deletes_acked", "keys", "latest_lost",
                                      "deleted_returned", "phantoms", "divergent_replicas",
                                      "examples", "stuck")}
    assert result["safe"], summary
    assert not result["stuck"], summary
    assert result["acked"] > 100 and result["deletes_acked"] > 0, summary
    assert result["keys"] == 20, summary


#: The faults a consumer group goes through while its members consume and commit.
GROUP_FAULTS = ["kill_coordinator", "kill_coordinator", "kill_leader", "pause"]


def test_consumer_group_under_faults(tmp_path: Path) -> None:
    """Three members of a consumer group read a 3-partition stream and commit every 200 ms
    while the group's coordinator (the leader of its `__offsets` partition) is killed, a
    stream leader is killed and a broker paused: no acknowledged commit lost, no committed
    offset backwards, every acked message consumed, redeliveries only above what was
    committed (counted)."""
    result = run_mix(tmp_path, seconds=0, cycles=4, seed=3, fsync=FsyncPolicy.ALWAYS,
                     partitions=3, faults=GROUP_FAULTS, group="crew")
    summary = {k: v for k, v in result.items() if k.startswith("group_")}
    summary.update(acked=result["acked"], acked_lost=result["acked_lost"],
                   stuck=result["stuck"], faults=result["faults"])
    assert result["safe"], summary
    assert not result["stuck"], summary
    # Enough traffic to make the checks above mean something (a run commits about 60 times
    # when quiet; faults right after start leave fewer).
    assert result["group_acked"] > 100 and result["group_commits_acked"] >= 5, summary
    assert result["group_members"] >= 3, summary
    assert result["faults"].get("kill_coordinator", 0) >= 1, summary
