"""The partition roles of one broker, reconciled with the metadata.

Theory of operation: `reconcile` makes the roles match the metadata, and is idempotent; the
broker runs it after every metadata change (and the stream admin after each create and
delete). For every partition the metadata says this broker leads it runs a PartitionLeader
(jetstream.server.partition); in cluster mode every other partition whose replicas include
this broker gets a PartitionFollower (jetstream.server.follower). A role whose leader,
leader epoch or stream version changed is replaced (a deposed leader abdicates and becomes a
follower on the same open log); an ISR change at the same epoch is passed to the leader.
New roles are admitted through the epoch fence (jetstream.server.epoch_fence) first, and
leaders start before followers. A partition whose leader is marked as shutting down gets no
follower until its leadership changes or the mark comes off: that broker is stopping, or
starting and about to move what it led to new epochs (jetstream.server.cluster); followers
start at those, instead of at the old epochs, where they would fail and report the leader.
If it does not come back, failover gives its partitions other leaders.

Work in proportion to what changed: a reconcile looks only at the partitions the metadata
changed since the last one. The broker passes each applied command to `changed`
(jetstream.raft_meta.changes maps it to the partitions it touched); they accumulate in a
dirty set until the next reconcile takes them, so commands applied while a reconcile runs
are coalesced into the next one. A create, a delete or an ISR change thus costs work for its
own partitions, not for every stream. Everything is reconciled when roles are enabled
(start-up), when the state was restored whole from a snapshot, and when a broker registers
(rare).

Logs: each partition with a role has one open Log, kept across role changes. A log whose
stream is gone is deleted (with its directory); one left by an earlier stream of the same
name (deleted and created again while this broker was away) is emptied when opened: each log
directory names its stream's `created_version`. Directories of partitions this broker holds
no more are removed: the whole logs directory is listed at a full reconcile, a changed
partition's own directory otherwise.

Roles are taken only while `enabled` (from the end of start-up until stopping), and
reconciling holds a lock, so a stop never races a reconcile half-way through.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from jetstream.errors import FencedLeaderEpoch, NotLeader, UnknownPartition, UnknownStream
from jetstream.isr.disk_full import LedPartition
from jetstream.isr.leader import ProposeIsr
from jetstream.raft_meta.changes import EVERYTHING, Dirty, Touched
from jetstream.raft_meta.local import LocalMetadata
from jetstream.raft_meta.model import PartitionState, StreamConfig
from jetstream.raft_meta.raft import RaftMetadata
from jetstream.server.batched_calls import BatchedCalls, run_fsyncs
from jetstream.server.cluster import Cluster
from jetstream.server.config import BrokerConfig
from jetstream.server.disk import DiskMonitor
from jetstream.server.epoch_fence import EpochFence, PartitionKey
from jetstream.server.fetch_sessions import FetchSessions
from jetstream.server.follower import PartitionFollower
from jetstream.server.leader_isr import Replication
from jetstream.server.leader_reads import ReadAround
from jetstream.server.long_lived import LongLivedObjects
from jetstream.server.metrics import PartitionMetrics
from jetstream.server.nats_port import NatsPort
from jetstream.server.partition import PartitionLeader
from jetstream.server.replica_fetcher import ReplicaFetchers
from jetstream.server.scheduler import Scheduler, Work
from jetstream.stream.checkpoint import read_small, write_atomic
from jetstream.stream.dir_lock import LOGS_LOCK_FILE, DirLock
from jetstream.stream.fs_sync import FileSystemSync
from jetstream.stream.handles import HandlePool
from jetstream.stream.log import Log, close_all
from jetstream.tiered.partition_tier import TierConfig
from jetstream.tiered.service import Tiering
from jetstream.tiered.settings import settings_of

log = logging.getLogger(__name__)

#: In each log directory: the `created_version` of the stream the log belongs to.
STREAM_VERSION_FILE = "stream-version"
#: Threads of the broker's executor for blocking work of its logs (fsyncs, followers'
#: appends, retention); the followers' appends of one turn are split into as many jobs.
IO_THREADS = 4
#: Roles a reconcile stops, or leader roles it starts, at once.
ROLES_CHANGED_TOGETHER = 128
#: Follower roles a reconcile starts in one loop turn (each takes about a millisecond).
FOLLOWERS_STARTED_PER_TURN = 32


def stream_version_marker(created_version: int) -> bytes:
    """What the STREAM_VERSION_FILE of a log of the stream `created_version` holds."""
    return str(created_version).encode()


async def _all_of(steps: list[Awaitable[None]],
                  between: Callable[[], None] = lambda: None) -> None:
    """Run `steps` ROLES_CHANGED_TOGETHER at a time, then raise the first failure. Each stop
    or start of a role waits for a few loop turns: one after the other, thousands of them
    would add those up; all at once, their work between two waits would be one long turn
    that holds up the fetch sessions' answers (and followers then think leaders failed).
    `between` runs after each of those waves."""
    failures: list[BaseException] = []
    for start in range(0, len(steps), ROLES_CHANGED_TOGETHER):
        outcomes = await asyncio.gather(*steps[start:start + ROLES_CHANGED_TOGETHER],
                                        return_exceptions=True)
        failures += [o for o in outcomes if isinstance(o, BaseException)]
        between()
    if failures:
        raise failures[0]


def _no_address(broker_id: int) -> str | None:
    """One broker knows no other."""
    return None


@dataclass(slots=True)
class ReconcileMetrics:
    reconciles: int = 0
    full: int = 0
    #: Partitions looked at, all reconciles together.
    partitions_examined: int = 0
    leaders_started: int = 0
    #: Roles (leaders and followers) started and stopped.
    roles_started: int = 0
    roles_stopped: int = 0


@dataclass(frozen=True, slots=True)
class LogFiles:
    """Where a partition's open log lives on this broker: its directory (absolute), the
    marker file naming the stream it belongs to, and what that marker holds."""

    directory: Path
    version_file: Path
    stream_version: str


class Roles:
    """The leaders, followers and open logs of this broker (see the module docstring)."""

    def __init__(self, config: BrokerConfig, data_dir: Path,
                 metadata: LocalMetadata | RaftMetadata, cluster: Cluster | None,
                 nats: NatsPort, fence: EpochFence, executor: Executor,
                 scheduler: Scheduler, disk: DiskMonitor | None = None, *,
                 pool: HandlePool) -> None:
        self._config = config
        #: Runs the background work of the partitions led here (jetstream.server.housekeeping).
        self.scheduler = scheduler
        self._disk = disk
        self._data_dir = data_dir
        self._metadata = metadata
        self._cluster = cluster
        self._nats = nats
        self.fence = fence
        self._executor = executor
        self._stream_sets: dict[Callable[[StreamConfig], bool], tuple[int, frozenset[str]]] = {}
        #: Followers' appends of one fetch answer, and the fsyncs leaders start in one
        #: turn, go to the executor together.
        self._pool = pool
        # One lock for every log here, not a descriptor per log (jetstream.stream.dir_lock).
        self._logs_dir = data_dir / "logs"
        self._logs_lock = DirLock(self._logs_dir, LOGS_LOCK_FILE)
        #: One syncfs for the logs a turn makes durable, in place of an fsync each.
        self.fs_sync = (FileSystemSync.open(self._logs_dir) if config.fsync_group_min
                        else None)
        self._appends = BatchedCalls(executor, jobs_max=IO_THREADS, fs=self.fs_sync,
                                     group_min=config.fsync_group_min)
        if self.fs_sync is not None:
            # Leaders' `interval` fsyncs due together: one syncfs for the batch.
            scheduler.run_with(Work.FSYNC, partial(run_fsyncs, self.fs_sync,
                                                   config.fsync_group_min))
        self.leaders: dict[PartitionKey, PartitionLeader] = {}
        self.followers: dict[PartitionKey, PartitionFollower] = {}
        self._logs: dict[PartitionKey, Log] = {}
        #: The created_version of the stream each open log belongs to.
        self._log_versions: dict[PartitionKey, int] = {}
        self._lock = asyncio.Lock()
        self._dirty = Dirty()
        #: Follower roles to start once `follow` is called (None: start them at once).
        self._held: set[PartitionKey] | None = None
        self.metrics = ReconcileMetrics()
        #: The process's heap, when the broker owns it (jetstream.server.long_lived).
        self.long_lived: LongLivedObjects | None = None
        self.enabled = False
        #: Set by the broker (jetstream.server.integrity): what leaders do about damage a
        #: read meets, and whom followers tell of damage their reads found.
        self.read_around: ReadAround | None = None
        self.damage_found: Callable[[PartitionKey], None] | None = None
        #: As a leader: the fetch sessions of the brokers following here.
        self.sessions = FetchSessions(self.leaders.get, self.not_leading,
                                      config.replica_fetch_hw_delay_ms)
        #: Tiered storage of the partitions led here (streams with a `fragment_store`).
        self.tiering = Tiering(data_dir, config.fragment_cache_bytes_max, pool, executor,
                               TierConfig(list_interval_ms=config.fragment_list_interval_ms,
                                          backoff_ms_max=config.fragment_backoff_ms_max))
        #: As a follower: this broker's fetch session at each leader broker.
        self.fetchers = ReplicaFetchers(
            config, cluster.address_of if cluster is not None else _no_address, disk)

    async def enable(self, *, hold_followers: bool = False) -> None:
        """Take roles from now on, and reconcile everything. `hold_followers`: follower
        roles to start stay pending until `follow` (a starting broker's leaders and
        readiness do not wait for its followers, nor share the CPU with them)."""
        self.enabled = True
        self._held = set() if hold_followers else None
        self._dirty.add(EVERYTHING)
        await self.reconcile()

    def follow(self) -> None:
        """Start follower roles from now on: the next `reconcile` looks again at those held
        since `enable`."""
        if self._held:
            self._dirty.add(Touched(frozenset(self._held)))
        self._held = None

    def changed(self, change: Touched) -> None:
        """The metadata changed what `change` names: the next `reconcile` looks at it."""
        self._dirty.add(change)

    @property
    def pending(self) -> bool:
        """Changes wait for a reconcile."""
        return bool(self._dirty)

    async def reconcile(self) -> None:
        """Start or stop the roles of the partitions changed since the last reconcile to
        match the metadata (idempotent). On failure they stay dirty, for the next attempt."""
        async with self._lock:
            if not self.enabled or not self._dirty:
                return
            change = self._dirty.take()
            try:
                await self._reconcile(change)
            except BaseException:
                self._dirty.add(change)
                raise
            finally:
                self._settle()

    def _settle(self) -> None:
        """Tell the process's heap keeper (jetstream.server.long_lived) how many roles
        started and stopped so far: also between the waves of one reconcile, since a
        broker starting thousands of roles in one reconcile would otherwise walk all it
        allocated so far in every full collection until the end (measured: 0.65 s of full
        collections before a broker starting 2,000 leaders was ready, 0.06 s after)."""
        if self.long_lived is not None:
            self.long_lived.observe(self.metrics.roles_started, self.metrics.roles_stopped)

    async def _reconcile(self, change: Touched) -> None:
        state = self._metadata.state
        me = self._config.broker_id
        clustered = self._cluster is not None
        if change.everything:
            keys = sorted(state.partitions.keys() | self._logs.keys() | self.leaders.keys()
                          | self.followers.keys())
        else:
            keys = sorted(change.keys)
        self.metrics.reconciles += 1
        self.metrics.full += change.everything
        self.metrics.partitions_examined += len(keys)
        wanted = {}
        for key in keys:
            p = state.partitions.get(key)
            if p is not None and (p.leader == me or (clustered and me in p.replicas)):
                wanted[key] = p
        await self._retire(keys, wanted)
        await self._apply_configs(keys, state.streams)
        for key in keys:
            log_ = self._logs.get(key)
            if log_ is None:
                continue
            p = wanted.get(key)
            if p is None or p.created_version != self._log_versions[key]:
                del self._logs[key], self._log_versions[key]
                if p is None and key[0] in state.streams:
                    log_.close()
                else:
                    log_.delete()  # its stream is gone (and maybe created again)
        held = {key for key in wanted if key in self.leaders or key in self.followers}
        admitted = await self.fence.admit(
            wanted, held, unwanted=[k for k in keys if k not in wanted],
            gone=[k for k in keys if k[0] not in state.streams],
            streams=state.streams.keys() if change.everything else None)
        # Leaders first: the partitions wait for them, not for this broker's followers.
        # In waves: the leaders of one loop turn share the PING that confirms their NATS
        # subscriptions (a wave bounds the work between a wait's start and its PONG).
        await _all_of([self._start_leader(state.streams[p.stream], p)
                       for p in admitted.values() if p.leader == me], self._settle)
        to_follow = [p for p in admitted.values()
                     if p.leader != me and p.leader not in state.shutting_down]
        if self._held is not None:
            self._held.update((p.stream, p.partition) for p in to_follow)
            to_follow = []
        for started, partition in enumerate(to_follow, 1):
            await self._start_follower(state.streams[partition.stream], partition)
            if started % FOLLOWERS_STARTED_PER_TURN == 0:
                self._settle()
                await asyncio.sleep(0)  # a follower's start does not wait: let others run
        self.tiering.retain(self.leaders.keys() | self.followers.keys())
        kept = wanted.keys() if clustered else state.partitions.keys()
        if change.everything:
            self._delete_orphan_logs({f"{name}-{p}" for name, p in kept})
        else:
            for key in keys:
                if key not in kept:
                    self._delete_log_dir(f"{key[0]}-{key[1]}")

    async def stop_followers(self) -> None:
        """Stop every follower role and the replica fetchers, and take no more roles (the
        broker is stopping: it replicates no more, and while the brokers it follows stop
        too, each fetch would only fail and be reported to the metadata leader)."""
        async with self._lock:
            self.enabled = False
            await self._stop_followers()

    async def _stop_followers(self) -> None:
        followers = list(self.followers.values())
        self.followers.clear()
        for follower in followers:
            follower.stopping()
        await self.fetchers.close()
        await asyncio.gather(*(follower.stop() for follower in followers))

    async def stop_all(self) -> None:
        """Stop every role and close every log (the broker is stopping)."""
        async with self._lock:
            self.enabled = False
            # In a cluster, leadership was handed over (or could not be): appending what is
            # still buffered would only grow a suffix the next leader lacks.
            abdicate = self._cluster is not None
            await _all_of([self._stop_leader(key, abdicate=abdicate) for key in list(self.leaders)])
            await self._stop_followers()
            self.sessions.close_all()
            logs = list(self._logs.values())
            self._logs.clear()
            await asyncio.to_thread(close_all, logs)  # two file-system syncs for them all
            if self.fs_sync is not None:
                self.fs_sync.close()
            self._logs_lock.release()
            await self.tiering.close()

    # -- lookups ----------------------------------------------------------------------------

    def stream(self, name: str) -> StreamConfig | None:
        return self._metadata.state.streams.get(name)

    def log_version(self, key: PartitionKey) -> int:
        """The created_version of the stream the partition's open log belongs to."""
        return self._log_versions[key]

    def log_files(self, key: PartitionKey) -> LogFiles:
        """Where the partition's open log lives (a bulk reader reads its segment files)."""
        directory = self._logs[key].directory.absolute()
        return LogFiles(directory, directory / STREAM_VERSION_FILE,
                        stream_version_marker(self._log_versions[key]).decode())

    def replicas(self, streams: Iterable[str] | None = None
                 ) -> Iterator[tuple[PartitionKey, StreamConfig, Log, int]]:
        """Each partition replica held here with a role (of `streams` only, when given: then
        the work is in proportion to their partitions): its stream, open log and high
        watermark (the leader's, or the one a follower last learned)."""
        configs = self._metadata.state.streams
        if streams is None:
            keys: Iterable[PartitionKey] = list(self._logs)
        else:
            keys = [(name, p) for name in streams if name in configs
                    for p in range(configs[name].partitions) if (name, p) in self._logs]
        for key in keys:
            log_ = self._logs.get(key)
            stream = configs.get(key[0])
            role = self.leaders.get(key) or self.followers.get(key)
            if log_ is not None and stream is not None and role is not None:
                yield key, stream, log_, role.high_watermark

    def streams_where(self, wanted: Callable[[StreamConfig], bool]) -> frozenset[str]:
        """The names of the streams whose config is `wanted`, worked out again only when the
        metadata changed since the last call with the same `wanted`."""
        state = self._metadata.state
        cached = self._stream_sets.get(wanted)
        if cached is None or cached[0] != state.version:
            names = frozenset(n for n, config in state.streams.items() if wanted(config))
            cached = self._stream_sets[wanted] = (state.version, names)
        return cached[1]

    def led_here(self, stream: str, partition: int) -> bool:
        """This broker runs the partition's leader role."""
        return (stream, partition) in self.leaders

    def touch_follower(self, key: PartitionKey) -> None:
        """The follower of `key` here may have more to tell its leader (damage found or
        healed): its fetch session names it with the next request."""
        follower = self.followers.get(key)
        if follower is not None:
            self.fetchers.touch(follower.state.leader, key)

    def log_of(self, key: PartitionKey) -> Log | None:
        """The open log of a replica held here with a role, else None."""
        if key in self.leaders or key in self.followers:
            return self._logs.get(key)
        return None

    def partition_state(self, key: PartitionKey) -> PartitionState | None:
        """The partition's state as the metadata holds it now."""
        return self._metadata.state.partitions.get(key)

    def not_leading(self, key: PartitionKey) -> NotLeader:
        """NOT_LEADER for a partition no leader role serves here, naming the leader the
        metadata knows: this broker itself while its leader role starts."""
        state = self._metadata.state
        p = state.partitions.get(key)
        if p is None:
            return NotLeader(*key)
        broker = state.brokers.get(p.leader)
        return NotLeader(key[0], key[1], p.leader, broker.address if broker else "")

    def leader_for(self, stream: str, partition: int) -> PartitionLeader:
        """This broker's leader of the partition, else UnknownStream, UnknownPartition or
        NotLeader naming the leader the metadata knows."""
        leader = self.leaders.get((stream, partition))
        if leader is not None:
            return leader
        state = self._metadata.state
        if stream not in state.streams:
            raise UnknownStream(stream)
        if (stream, partition) not in state.partitions:
            raise UnknownPartition(stream, partition)
        p = state.partitions[(stream, partition)]
        broker = state.brokers.get(p.leader)
        raise NotLeader(stream, partition, p.leader, broker.address if broker else "")

    def segment_rolled(self, key: PartitionKey) -> None:
        """The log cleaner rolled the partition's active segment: retention may apply."""
        leader = self.leaders.get(key)
        if leader is not None:
            leader.segments_changed()

    def led(self) -> list[LedPartition]:
        """The replicated partitions this broker leads, as their leaders see them."""
        out = []
        for leader in self.leaders.values():
            isr, state = leader.isr, leader.state
            if isr is None:
                continue
            unfit = frozenset(r for r in state.replicas
                              if r != isr.leader_id and isr.follower_state(r).unfit)
            out.append(LedPartition(state.stream, state.partition, state.leader_epoch,
                                    state.replicas, state.isr, unfit))
        return out

    def describe(self) -> list[dict[str, Any]]:
        """What this broker does for each of its partitions: lead, follow, or nothing
        because the metadata's epoch is below the highest it recorded ("fenced")."""
        out: list[dict[str, Any]] = [
            {"stream": s, "partition": p, "role": "leader", "leader_epoch": r.state.leader_epoch}
            for (s, p), r in self.leaders.items()]
        out += [{"stream": s, "partition": p, "role": "follower",
                 "leader_epoch": r.state.leader_epoch} for (s, p), r in self.followers.items()]
        for (s, p), epoch, recorded in self.fence.refused():
            out.append({"stream": s, "partition": p, "role": "fenced", "leader_epoch": epoch,
                        "recorded_leader_epoch": recorded})
        return sorted(out, key=lambda r: (r["stream"], r["partition"]))

    # -- starting and stopping roles --------------------------------------------------------

    async def _retire(self, keys: list[PartitionKey],
                      wanted: dict[PartitionKey, PartitionState]) -> None:
        """Stop the roles of `keys` the metadata no longer gives this broker as they are;
        pass ISR changes on to the leaders that stay."""
        me = self._config.broker_id
        stopping: list[Awaitable[None]] = []
        for key in keys:
            leader = self.leaders.get(key)
            if leader is None:
                continue
            p = wanted.get(key)
            if p is None or p.created_version != leader.state.created_version:
                stopping.append(self._stop_leader(key))  # deleted (and maybe created again)
            elif p.leader != me or p.leader_epoch != leader.state.leader_epoch:
                stopping.append(self._stop_leader(key, abdicate=True))
            elif p != leader.state:
                leader.on_metadata(p)
        await _all_of(stopping)
        stopping = []
        for key in keys:
            follower = self.followers.get(key)
            if follower is None:
                continue
            p = wanted.get(key)
            if p is None or (p.leader, p.leader_epoch, p.created_version) != (
                    follower.state.leader, follower.state.leader_epoch,
                    follower.state.created_version):
                stopping.append(self.followers.pop(key).stop())
                self.metrics.roles_stopped += 1
            else:
                follower.state = p
        await _all_of(stopping)

    async def _apply_configs(self, keys: list[PartitionKey],
                             streams: Mapping[str, StreamConfig]) -> None:
        """Give the open logs and running roles of `keys` their stream's current config
        (after an update). A leader whose tiered settings changed is restarted at the same
        epoch: its tier follows the settings it started with. Anything else, the fsync policy
        included, changes in place: a restarted leader would refuse `all` publishes until
        its followers fetched from it again."""
        for key in keys:
            log_ = self._logs.get(key)
            stream = streams.get(key[0])
            if log_ is None or stream is None:
                continue
            wanted = stream.log_config()
            if wanted != log_.config:
                log_.reconfigure(wanted)
            follower = self.followers.get(key)
            if follower is not None:
                follower.stream = stream
                self.tiering.follow(stream, key[1])  # its index follows the settings
        for key in keys:
            leader = self.leaders.get(key)
            stream = streams.get(key[0])
            if leader is None or stream is None or stream == leader.stream:
                continue
            if settings_of(stream) != settings_of(leader.stream):
                await self._stop_leader(key)  # started again below, by the same reconcile
            else:
                leader.reconfigure(stream)

    def _open_log(self, stream: StreamConfig, partition: PartitionState) -> Log:
        """The partition's open log; a directory of an earlier stream of the same name is
        emptied first: its records belong to another stream."""
        key = (stream.name, partition.partition)
        log_ = self._logs.get(key)
        if log_ is None:
            directory = self._logs_dir / f"{stream.name}-{partition.partition}"
            marker = directory / STREAM_VERSION_FILE
            version = stream_version_marker(partition.created_version)
            found = read_small(marker)
            if found is not None and found != version:
                log.warning("%s/%d: data of an earlier stream of this name removed",
                            stream.name, partition.partition)
                shutil.rmtree(directory)
            log_ = self._logs[key] = Log(directory, stream.log_config(), pool=self._pool,
                                         parent_lock=self._logs_lock)
            self._log_versions[key] = partition.created_version
            if found != version:
                write_atomic(marker, version)
        return log_

    async def _start_leader(self, stream: StreamConfig, partition: PartitionState) -> None:
        leader = PartitionLeader(stream, partition, self._open_log(stream, partition),
                                 self._nats, self._config, self._executor, PartitionMetrics(),
                                 self.scheduler, self._replication(partition), self._disk,
                                 self.read_around, self.sessions,
                                 self.tiering.tier_for(stream, partition.partition),
                                 syncs=self._appends)
        leader.metrics.high_watermark = leader.high_watermark
        await leader.start()
        self.metrics.leaders_started += 1
        self.metrics.roles_started += 1
        key = (stream.name, partition.partition)
        self.leaders[key] = leader
        self.sessions.changed(key)
        log.info("leading %s/%d at epoch %d", stream.name, partition.partition,
                 partition.leader_epoch)

    def _replication(self, state: PartitionState) -> Replication | None:
        cluster = self._cluster
        if cluster is None:
            return None
        stream, partition = state.stream, state.partition

        async def propose_isr(decision: ProposeIsr) -> bool | None:
            try:
                self.fence.check(replace(state, leader_epoch=decision.expected_epoch))
            except FencedLeaderEpoch as exc:
                log.warning("ISR change of %s/%d not proposed: %s", stream, partition, exc)
                return False
            return await cluster.propose_isr(stream, partition, decision)

        return Replication(self._config.broker_id, self._config.replica_lag_ms_max, propose_isr)

    async def _stop_leader(self, key: PartitionKey, *, abdicate: bool = False) -> None:
        leader = self.leaders.pop(key)
        self.metrics.roles_stopped += 1
        if abdicate:
            await leader.abdicate()
        else:
            await leader.stop()
        self.sessions.changed(key)  # followers fetching it there learn it is not led here

    async def _start_follower(self, stream: StreamConfig, partition: PartitionState) -> None:
        assert self._cluster is not None
        follower = PartitionFollower(
            stream, partition, self._open_log(stream, partition), config=self._config,
            executor=self._executor, fetchers=self.fetchers,
            report_failure=self._cluster.report_leader_failure, fence=self.fence.check,
            damage_found=self.damage_found, disk=self._disk, appends=self._appends)
        await follower.start()
        self.followers[(stream.name, partition.partition)] = follower
        self.metrics.roles_started += 1
        self.tiering.follow(stream, partition.partition)
        log.info("following broker %d for %s/%d at epoch %d", partition.leader, stream.name,
                 partition.partition, partition.leader_epoch)

    def _delete_orphan_logs(self, kept: set[str]) -> None:
        logs = self._logs_dir
        if not logs.exists():
            return
        for path in logs.iterdir():
            if path.is_dir() and path.name not in kept:
                shutil.rmtree(path, ignore_errors=True)

    def _delete_log_dir(self, name: str) -> None:
        """Remove the log directory `name` of a partition this broker holds no more."""
        path = self._logs_dir / name
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)

    def render_metrics(self) -> list[str]:
        m = self.metrics
        lines = []
        for name, value, text in (
                ("reconciles", m.reconciles, "Reconciles of the roles with the metadata."),
                ("full_reconciles", m.full, "Reconciles that looked at every partition."),
                ("reconcile_partitions_examined", m.partitions_examined,
                 "Partitions the reconciles looked at."),
                ("leaders_started", m.leaders_started, "Leader roles started."),
                ("nats_confirm_pings", self._nats.confirm_pings,
                 "NATS round trips that confirmed leaders' subscriptions (shared)."),
                ("fsync_groups", self._appends.groups,
                 "Turns whose logs were made durable together (fsync_group_min)."),
                ("fsync_group_syncfs", self.fs_sync.syncs if self.fs_sync else 0,
                 "syncfs calls made in place of an fsync per log."),
                ("fsync_group_failures", self.fs_sync.failures if self.fs_sync else 0,
                 "syncfs calls that failed (each log of its group failed too)."),
                ("gc_freezes", self.long_lived.freezes if self.long_lived else 0,
                 "Objects of the roles started moved out of full collections' reach."),
                ("gc_thaws", self.long_lived.thaws if self.long_lived else 0,
                 "Full collections of the frozen objects, after roles stopped.")):
            lines += [f"# HELP jetstream_roles_{name}_total {text}",
                      f"# TYPE jetstream_roles_{name}_total counter",
                      f"jetstream_roles_{name}_total {value}"]
        return lines + self.fence.render_metrics()
