"""The faults: each applies itself to a FaultCluster, holds for a while, undoes itself
(restart, resume, heal) and returns the wall-clock times at which it killed or cut off a
partition leader (the checker measures failover from those).

Holding a fault is the fault's duration, not a wait for a condition; every wait for the
cluster to react (a new leader) is a condition with a deadline (FaultCluster.wait).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from jetstream.offsets.records import OFFSETS_STREAM
from jetstream.stream.config import FsyncPolicy
from tests.faults.cluster import BROKERS, FaultCluster
from tests.faults.proxy import Mode

Fault = Callable[[FaultCluster], list[float]]


def hold(seconds: float) -> None:
    """Keep the fault in place for `seconds` while the workload runs."""
    time.sleep(seconds)


def _leader(c: FaultCluster, partition: int = 0) -> tuple[int, int]:
    view = c.wait(lambda: c.partition(partition, from_leader=False), "the partition's leader")
    return view.leader, view.leader_epoch


def kill_leader(c: FaultCluster) -> list[float]:
    """SIGKILL the partition leader; restart it once another broker leads."""
    partition = c.rng.randrange(c.partitions)
    leader, epoch = _leader(c, partition)
    killed_at = time.time()
    c.kill(leader)
    c.wait_new_leader(partition, epoch)
    hold(c.rng.uniform(0.5, 2.0))
    c.restart(leader)
    return [killed_at]


def kill_coordinator(c: FaultCluster) -> list[float]:
    """SIGKILL the leader of the consumer group's `__offsets` partition (its coordinator)
    while the members consume and commit; restart it once another broker leads. Without a
    group (or before `__offsets` exists), the stream's leader instead."""
    if not c.group or not c.offsets_created():
        return kill_leader(c)
    partition = c.coordinator_partition()
    view = c.wait(lambda: c.partition(partition, from_leader=False, stream=OFFSETS_STREAM),
                  "the coordinator")
    c.kill(view.leader)
    c.wait_new_leader(partition, view.leader_epoch, stream=OFFSETS_STREAM)
    hold(c.rng.uniform(0.5, 2.0))
    c.restart(view.leader)
    return []


def kill_follower(c: FaultCluster) -> list[float]:
    """SIGKILL a follower long enough to leave the ISR, then restart it."""
    leader, _ = _leader(c)
    follower = c.rng.choice([b for b in range(BROKERS) if b != leader])
    c.kill(follower)
    hold(c.rng.uniform(1.0, 4.0))
    c.restart(follower)
    return []


def kill_metadata_leader(c: FaultCluster) -> list[float]:
    """SIGKILL the metadata (Raft) leader; restart it."""
    target = c.wait(c.metadata_leader, "a metadata leader")
    leader, _ = _leader(c)
    killed_at = time.time()
    c.kill(target)
    hold(c.rng.uniform(1.0, 3.0))
    c.restart(target)
    return [killed_at] if target == leader else []


def pause(c: FaultCluster) -> list[float]:
    """SIGSTOP a broker (the leader half of the time), SIGCONT it 0.5-4 s later."""
    leader, _ = _leader(c)
    target = leader if c.rng.random() < 0.5 else c.rng.randrange(BROKERS)
    paused_at = time.time()
    c.pause(target)
    seconds = c.rng.uniform(0.5, 4.0)
    hold(seconds)
    c.resume(target)
    # A pause longer than the leader timeout makes the followers elect another leader.
    return [paused_at] if target == leader and seconds > 1.5 else []


def kill_all(c: FaultCluster) -> list[float]:
    """SIGKILL every broker, then restart them all."""
    killed_at = time.time()
    for b in range(BROKERS):
        c.kill(b)
    hold(c.rng.uniform(0.2, 1.0))
    for b in range(BROKERS):
        c.brokers[b].start(wait=False)
    for b in range(BROKERS):
        c.brokers[b].wait_ready()
    return [killed_at]


def kill_leader_five_times(c: FaultCluster) -> list[float]:
    """Kill whichever broker leads, five times in a row (each time once the ISR is full
    again, so that a leader can be elected)."""
    kills: list[float] = []
    for _ in range(5):
        c.wait_healthy()
        kills += kill_leader(c)
    return kills


def partition_leader(c: FaultCluster, mode: Mode = Mode.DOWN) -> list[float]:
    """Cut the partition leader off from the other brokers (connections refused) for 3-6 s;
    NATS and clients still reach it."""
    leader, _ = _leader(c)
    cut_at = time.time()
    c.isolate(leader, mode)
    hold(c.rng.uniform(3.0, 6.0))
    c.heal()
    return [cut_at]


def blackhole_leader(c: FaultCluster) -> list[float]:
    """As partition_leader, but the network goes silent instead (nothing gets through,
    nothing is refused: only timeouts tell)."""
    return partition_leader(c, Mode.BLACKHOLE)


def power_loss(c: FaultCluster) -> list[float]:
    """With fsync `always`: SIGKILL a broker and cut its files back to no more than it surely
    had to keep, plus a torn write of random bytes at the end; restart it.

    What a broker surely fsynced is known from outside only through its peers: a follower
    fsyncs what it fetched before it fetches again, so its leader's record of its position
    (read once the follower is dead and cannot fetch again) is a lower bound. A leader acks
    and commits only below the HW, which is at most what every in-sync follower reported;
    with the other brokers paused while it is read and killed, that least position cannot
    be passed by the HW, so cutting the leader there loses nothing it could have acked."""
    if c.fsync is not FsyncPolicy.ALWAYS:
        return kill_leader(c)
    target = c.rng.randrange(BROKERS)
    others = [b for b in range(BROKERS) if b != target]
    keep: dict[int, int] = {}
    led: list[int] = []
    for b in others:
        c.pause(b)
    try:
        for p in range(c.partitions):
            view = c.partition(p)
            if view is None or view.leader != target:
                continue
            led.append(p)
            followers = [r for r in view.isr if r != target]
            known = [view.replica_end_offsets.get(r) for r in followers]
            if followers and view.high_watermark is not None and None not in known:
                keep[p] = min(k for k in known if k is not None)
        killed_at = time.time()
        c.kill(target)
    finally:
        for b in others:
            c.resume(b)
    for p in range(c.partitions):
        if p in led:
            continue
        after = c.wait(lambda p=p: c.partition(p), f"partition {p} seen from its leader")
        known_follower = after.replica_end_offsets.get(target)
        if known_follower is not None:
            keep[p] = known_follower
    for p, offset in keep.items():
        c.cut_log(target, p, offset, garbage=os.urandom(c.rng.randrange(1, 300)))
    hold(c.rng.uniform(0.5, 2.0))
    c.restart(target)
    return [killed_at] if led else []


def rolling_restart(c: FaultCluster) -> list[float]:
    """SIGTERM each broker in turn (it hands its leaderships to in-sync followers first) and
    restart it once the cluster is healthy again; the hand-overs count as failovers."""
    handovers: list[float] = []
    for b in range(BROKERS):
        c.wait_healthy()
        leader, _ = _leader(c)
        stopped_at = time.time()
        c.brokers[b].stop()  # SIGTERM, waits for the exit
        if b == leader:
            handovers.append(stopped_at)
        c.restart(b)
    return handovers


def disk_full(c: FaultCluster) -> list[float]:
    """Fill one broker's data disk past the high watermark (the partition leader half of the
    time) and free it 1-3 s later. A full leader hands its partitions to an in-sync
    follower; a full follower leaves the ISR; either rejoins once it has room again."""
    leader, epoch = _leader(c)
    target = leader if c.rng.random() < 0.5 else c.rng.choice(
        [b for b in range(BROKERS) if b != leader])
    c.fill_disk(target)
    if target == leader:
        c.wait_new_leader(0, epoch)
    else:
        c.wait(lambda: _out_of_isr(c, target), f"full broker {target} out of the ISR")
    hold(c.rng.uniform(1.0, 3.0))
    c.free_disk(target)
    return []


def _out_of_isr(c: FaultCluster, broker: int) -> bool:
    view = c.partition(0, from_leader=False)
    return view is not None and broker not in view.isr


def slow_links(c: FaultCluster) -> list[float]:
    """Delay every broker <-> broker byte of one broker by 50-300 ms for 2-5 s."""
    target = c.rng.randrange(BROKERS)
    c.isolate(target, Mode.UP, delay_ms=c.rng.randrange(50, 300))
    hold(c.rng.uniform(2.0, 5.0))
    c.heal()
    return []


def bitflip(c: FaultCluster) -> list[float]:
    """Flip bits in one broker's stored data (a minority of the replicas) while the cluster
    runs: in a sealed segment, in the active one, or in an index file (then restart that
    broker so the file is loaded). The damage must be found, healed or served around: the
    checker finds no wrong record read and every replica whole at the end."""
    target = c.rng.randrange(BROKERS)
    kind = c.rng.choice(["sealed", "active", "index"])
    partition = c.rng.randrange(c.partitions)
    if kind == "index":
        c.brokers[target].stop()  # SIGTERM: index files are written when segments seal
        c.flip_bits(target, partition, kind)
        c.restart(target)
    else:
        c.flip_bits(target, partition, kind)
    hold(c.rng.uniform(1.0, 3.0))
    return []


ALL: dict[str, Fault] = {
    "kill_leader": kill_leader,
    "kill_follower": kill_follower,
    "kill_metadata_leader": kill_metadata_leader,
    "pause": pause,
    "kill_all": kill_all,
    "kill_leader_five_times": kill_leader_five_times,
    "partition_leader": partition_leader,
    "blackhole_leader": blackhole_leader,
    "power_loss": power_loss,
    "rolling_restart": rolling_restart,
    "slow_links": slow_links,
    "bitflip": bitflip,
    "disk_full": disk_full,
}

#: Faults that need each broker's data disk on a filesystem of its own (FaultCluster.disks).
DISK_FAULTS = frozenset({"disk_full"})

#: Faults for a consumer group's scenario only (run_mix takes them by name too).
GROUP_FAULTS: dict[str, Fault] = {"kill_coordinator": kill_coordinator}
