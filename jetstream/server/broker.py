"""The broker process: wiring and lifecycle.

Theory of operation: a broker connects to NATS (or starts an embedded nats-server on
loopback), opens its metadata (jetstream.raft_meta: local for one broker), serves the socket
API and the HTTP API, and reconciles: for every partition the metadata says it leads, it runs
a PartitionLeader (jetstream.server.partition); for every partition it no longer holds, it
stops the role (and deletes the data of a deleted stream). Reconciling is idempotent and runs
after every metadata change. Requests from either API land in `handle` or in the stream
methods here, so both APIs behave the same.

Cluster mode (`cluster` set; jetstream.server.cluster): the metadata is a RaftMetadata, and
the broker takes roles only once it has caught up with the metadata leader and registered.
Every partition whose replicas include this broker gets a role: PartitionLeader (with an ISR
core) where it leads, PartitionFollower (jetstream.server.follower) elsewhere. A role whose
leader or leader epoch changed is replaced (a deposed leader abdicates and becomes a
follower on the same open log); an ISR change at the same epoch is passed to the leader.

Epoch fence (jetstream.isr.highest_epochs): the broker keeps, in <data_dir>/leader-epochs
(fsynced, renamed into place), the highest leader epoch it has seen per partition, and writes
it before it takes a role at a new epoch. A partition whose metadata epoch is below the
recorded one gets no role (a warning is logged) until the metadata catches up: after a power
cut, pysyncobj's unsynced journal may replay an older state than the one already acted on.
The follower's requests and the leader's ISR proposals are checked against it too.

Stopping (SIGTERM, SIGINT or `stop()`): in cluster mode, first hand the partitions it leads
over to in-sync followers; stop accepting requests, stop ingest and finish the
acks of what was received, close the logs (clean recovery point), stop the embedded NATS.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import nats

from jetstream.errors import (
    FencedLeaderEpoch,
    NotLeader,
    ProtocolError,
    UnknownPartition,
    UnknownStream,
)
from jetstream.isr import highest_epochs
from jetstream.isr.highest_epochs import CorruptEpochFile, EpochMark, HighestEpochs, Refused
from jetstream.isr.leader import ProposeIsr
from jetstream.natsd import NatsServer
from jetstream.protocol import messages as m
from jetstream.raft_meta.fsm import Command, CreateStream, DeleteStream, RegisterBroker
from jetstream.raft_meta.local import LocalMetadata
from jetstream.raft_meta.model import BrokerInfo, PartitionState, StreamConfig
from jetstream.raft_meta.raft import RaftMetadata, StateRestored
from jetstream.server.cluster import Cluster
from jetstream.server.config import BrokerConfig
from jetstream.server.follower import PartitionFollower
from jetstream.server.metrics import BrokerMetrics, PartitionMetrics, render
from jetstream.server.nats_port import NatsPort, NatsPyNats, connect_nats
from jetstream.server.partition import PartitionLeader, Replication
from jetstream.server.socket_api import SocketApi
from jetstream.stream.checkpoint import write_atomic
from jetstream.stream.handles import HandlePool
from jetstream.stream.log import Log
from jetstream.tasks import cancel_and_wait

log = logging.getLogger(__name__)

READY_FILE = "broker.json"
#: In each log directory: the `created_version` of the stream the log belongs to.
STREAM_VERSION_FILE = "stream-version"


class Broker:
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.data_dir = Path(config.data_dir)
        self.metrics = BrokerMetrics()
        self.socket_api = SocketApi(self)
        self.http_port = -1
        self.nats_url = ""
        self._nats_server: NatsServer | None = None
        self._nats: NatsPort | None = None
        self._metadata: LocalMetadata | RaftMetadata | None = None
        self._cluster: Cluster | None = None
        self._roles_enabled = False
        self._leaders: dict[tuple[str, int], PartitionLeader] = {}
        self._followers: dict[tuple[str, int], PartitionFollower] = {}
        self._logs: dict[tuple[str, int], Log] = {}
        #: The created_version of the stream each open log belongs to.
        self._log_versions: dict[tuple[str, int], int] = {}
        self._epochs = HighestEpochs()
        #: Partitions refused a role, with the metadata mark refused (warned about once).
        self._refused: dict[tuple[str, int], EpochMark] = {}
        self._failover_task: asyncio.Task[None] | None = None
        self._pool = HandlePool(config.open_files_max)
        self._executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="jetstream-io")
        self._stop = asyncio.Event()
        self._reconcile_lock = asyncio.Lock()
        self._http: Any = None

    # -- lifecycle ----------------------------------------------------------------------------

    async def run(self) -> None:
        """Start, then run until `stop()` or SIGTERM/SIGINT."""
        await self.start()
        await self.run_until_stopped()

    async def run_until_stopped(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self._stop.set)
        try:
            await self._stop.wait()
        finally:
            await self.shutdown()

    def stop(self) -> None:
        self._stop.set()

    async def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._epochs = self._load_epochs()
        urls = self.config.nats_urls
        if not urls:
            self._nats_server = NatsServer(self.data_dir / "nats", name="embedded-nats",
                                           port=self.config.nats_port)
            (self.data_dir / "nats").mkdir(exist_ok=True)
            await self._nats_server.astart()
            urls = [self._nats_server.url]
        self.nats_url = ",".join(urls)
        name = f"jetstream-broker-{self.config.broker_id}"
        if self.config.nats_client == "nats-py":
            self._nats = NatsPyNats(await nats.connect(
                servers=urls, name=name, max_reconnect_attempts=-1, reconnect_time_wait=0.5,
                pending_size=64 * 1024 * 1024, flusher_queue_size=16384))
        else:
            self._nats = await connect_nats(urls, name)
        if self.config.cluster_members:
            self._cluster = Cluster(self.config, self.data_dir / "meta")
            self._metadata = self._cluster.metadata
            self._metadata.add_listener(self._on_metadata_change)  # before any await
        else:
            self._metadata = LocalMetadata(self.data_dir / "meta")
        await self.socket_api.start()
        if self.config.http_port >= 0:
            from jetstream.server.http_api import HttpServer

            self._http = HttpServer(self)
            self.http_port = await self._http.start()
        me = BrokerInfo(self.config.broker_id, self.config.host, self.socket_api.port,
                        max(self.http_port, 0))
        if self._cluster is not None:
            await self._cluster.join(me)
            await self._cluster.renew_leaderships()
            self._failover_task = asyncio.create_task(self._cluster.failover_loop(),
                                                      name="failover")
        else:
            if self._metadata.state.brokers.get(me.id) != me:
                await self._metadata.propose(RegisterBroker(me))
            self._metadata.add_listener(self._on_metadata_change)
        self._roles_enabled = True
        await self.reconcile()
        write_atomic(self.data_dir / READY_FILE, json.dumps(self.describe_self()).encode())
        log.info("broker %d ready: %s", self.config.broker_id, self.describe_self())

    def describe_self(self) -> dict[str, Any]:
        return {"broker_id": self.config.broker_id, "pid": os.getpid(), "host": self.config.host,
                "port": self.socket_api.port, "http_port": self.http_port,
                "nats_url": self.nats_url, "data_dir": str(self.data_dir)}

    async def shutdown(self, *, hand_over: bool = True) -> None:
        """Stop. In a cluster, first hand this broker's leaderships to in-sync followers,
        unless `hand_over` is False (the whole cluster is stopping: `jetstream dev`)."""
        with contextlib.suppress(FileNotFoundError):
            (self.data_dir / READY_FILE).unlink()
        if self._cluster is not None and self._roles_enabled and hand_over:
            await self._cluster.hand_over(sorted(self._leaders))
        async with self._reconcile_lock:
            self._roles_enabled = False
        await cancel_and_wait(self._failover_task)
        await self.socket_api.stop()
        if self._http is not None:
            await self._http.stop()
        async with self._reconcile_lock:
            for key in list(self._leaders):
                # In a cluster, leadership was handed over (or could not be): appending
                # what is still buffered would only grow a suffix the next leader lacks.
                await self._stop_leader(key, abdicate=self._cluster is not None)
            for key in list(self._followers):
                await self._stop_follower(key)
            for key in list(self._logs):
                self._logs.pop(key).close()
        if self._cluster is not None:
            await self._cluster.close()
        if self._nats is not None:
            with contextlib.suppress(Exception):
                await self._nats.close()
        if self._nats_server is not None:
            await self._nats_server.astop()
        self._executor.shutdown(wait=True)

    # -- metadata and roles -----------------------------------------------------------------

    @property
    def metadata(self) -> LocalMetadata | RaftMetadata:
        assert self._metadata is not None, "broker not started"
        return self._metadata

    def _on_metadata_change(self, command: Command | StateRestored, result: Any) -> None:
        if not self._roles_enabled:
            return
        task = asyncio.get_running_loop().create_task(self.reconcile())
        task.add_done_callback(_log_failure)

    async def reconcile(self) -> None:
        """Start or stop partition roles to match the metadata (idempotent)."""
        async with self._reconcile_lock:
            if not self._roles_enabled:
                return
            state = self.metadata.state
            me = self.config.broker_id
            clustered = self._cluster is not None
            wanted = {key: p for key, p in state.partitions.items()
                      if p.leader == me or (clustered and me in p.replicas)}
            await self._retire_roles(wanted)
            for key in list(self._logs):
                p = wanted.get(key)
                if p is None or p.created_version != self._log_versions[key]:
                    log_ = self._logs.pop(key)
                    del self._log_versions[key]
                    if p is None and key[0] in state.streams:
                        log_.close()
                    else:
                        log_.delete()  # its stream is gone (and maybe created again)
            admitted = await self._admit_epochs(state.streams, wanted)
            for key, partition in admitted.items():
                if partition.leader == me:
                    await self._start_leader(state.streams[key[0]], partition)
                else:
                    await self._start_follower(state.streams[key[0]], partition)
            kept = wanted if clustered else state.partitions
            self._delete_orphan_logs({f"{s}-{p}" for s, p in kept})

    async def _admit_epochs(self, streams: Any, wanted: dict[tuple[str, int], PartitionState]
                            ) -> dict[tuple[str, int], PartitionState]:
        """The partitions in `wanted` without a role whose epoch is not below the highest
        recorded; the new highest epochs are made durable before this returns."""
        changed = self._epochs.retain_streams(streams)
        self._refused = {k: v for k, v in self._refused.items() if k in wanted}
        admitted = {}
        for key, partition in wanted.items():
            if key in self._leaders or key in self._followers:
                continue
            mark = _mark(partition)
            outcome = self._epochs.observe(key, mark)
            if isinstance(outcome, Refused):
                if self._refused.get(key) != mark:
                    log.warning("%s/%d: the metadata says leader epoch %d (stream version %d), "
                                "below the %d (version %d) this broker saw before: no role "
                                "until the metadata catches up", key[0], key[1],
                                mark.leader_epoch, mark.created_version,
                                outcome.recorded.leader_epoch, outcome.recorded.created_version)
                self._refused[key] = mark
                continue
            self._refused.pop(key, None)
            changed |= outcome.changed
            admitted[key] = partition
        if changed:
            data = self._epochs.serialize()
            await asyncio.get_running_loop().run_in_executor(
                self._executor, write_atomic, self._epochs_path, data)
        return admitted

    @property
    def _epochs_path(self) -> Path:
        return self.data_dir / highest_epochs.FILE_NAME

    def _load_epochs(self) -> HighestEpochs:
        try:
            return HighestEpochs.parse(self._epochs_path.read_bytes())
        except FileNotFoundError:
            return HighestEpochs()
        except CorruptEpochFile as exc:
            log.error("%s is damaged (%s): starting without the epochs it recorded",
                      self._epochs_path, exc)
            return HighestEpochs()

    def _fence(self, state: PartitionState) -> None:
        """Raise FencedLeaderEpoch when `state`'s epoch is below the highest recorded."""
        key = (state.stream, state.partition)
        if not self._epochs.admits(key, _mark(state)):
            highest = self._epochs.highest(key)
            assert highest is not None
            raise FencedLeaderEpoch(state.stream, state.partition, state.leader_epoch,
                                    highest.leader_epoch)

    async def _retire_roles(self, wanted: dict[tuple[str, int], PartitionState]) -> None:
        """Stop the roles the metadata no longer gives this broker as they are; pass ISR
        changes on to the leaders that stay."""
        me = self.config.broker_id
        for key, leader in list(self._leaders.items()):
            p = wanted.get(key)
            if p is None or p.created_version != leader.state.created_version:
                await self._stop_leader(key)  # deleted (and maybe created again)
            elif p.leader != me or p.leader_epoch != leader.state.leader_epoch:
                await self._stop_leader(key, abdicate=True)
            elif p != leader.state:
                leader.on_metadata(p)
        for key, follower in list(self._followers.items()):
            p = wanted.get(key)
            if p is None or (p.leader, p.leader_epoch, p.created_version) != (
                    follower.state.leader, follower.state.leader_epoch,
                    follower.state.created_version):
                await self._stop_follower(key)
            else:
                follower.state = p

    def _open_log(self, stream: StreamConfig, partition: PartitionState) -> Log:
        """The partition's open log. A directory left by an earlier stream of the same name
        (deleted and created again while this broker was away) is emptied first: its records
        belong to another stream. Each log directory names its stream's `created_version`."""
        key = (stream.name, partition.partition)
        log_ = self._logs.get(key)
        if log_ is None:
            directory = self._log_dir(stream.name, partition.partition)
            marker = directory / STREAM_VERSION_FILE
            version = str(partition.created_version).encode()
            if directory.exists() and marker.exists() and marker.read_bytes() != version:
                log.warning("%s/%d: data of an earlier stream of this name removed",
                            stream.name, partition.partition)
                shutil.rmtree(directory)
            log_ = self._logs[key] = Log(directory, stream.log_config(), pool=self._pool)
            self._log_versions[key] = partition.created_version
            if not marker.exists():
                write_atomic(marker, version)
        return log_

    def _log_dir(self, stream: str, partition: int) -> Path:
        return self.data_dir / "logs" / f"{stream}-{partition}"

    async def _start_leader(self, stream: StreamConfig, partition: PartitionState) -> None:
        log_ = self._open_log(stream, partition)
        assert self._nats is not None
        leader = PartitionLeader(stream, partition, log_, self._nats, self.config,
                                 self._executor, PartitionMetrics(),
                                 self._replication(partition))
        leader.metrics.high_watermark = leader.high_watermark
        await leader.start()
        self._leaders[(stream.name, partition.partition)] = leader
        log.info("leading %s/%d at epoch %d", stream.name, partition.partition,
                 partition.leader_epoch)

    def _replication(self, state: PartitionState) -> Replication | None:
        cluster = self._cluster
        if cluster is None:
            return None
        stream, partition = state.stream, state.partition

        async def propose_isr(decision: ProposeIsr) -> bool | None:
            try:
                self._fence(replace(state, leader_epoch=decision.expected_epoch))
            except FencedLeaderEpoch as exc:
                log.warning("ISR change of %s/%d not proposed: %s", stream, partition, exc)
                return False
            return await cluster.propose_isr(stream, partition, decision)

        return Replication(self.config.broker_id, self.config.replica_lag_ms_max, propose_isr)

    async def _stop_leader(self, key: tuple[str, int], *, abdicate: bool = False) -> None:
        leader = self._leaders.pop(key)
        if abdicate:
            await leader.abdicate()
        else:
            await leader.stop()

    async def _start_follower(self, stream: StreamConfig, partition: PartitionState) -> None:
        assert self._cluster is not None
        follower = PartitionFollower(
            stream, partition, self._open_log(stream, partition), config=self.config,
            executor=self._executor, address_of=self._cluster.address_of,
            report_failure=self._cluster.report_leader_failure, fence=self._fence)
        await follower.start()
        self._followers[(stream.name, partition.partition)] = follower
        log.info("following broker %d for %s/%d at epoch %d", partition.leader, stream.name,
                 partition.partition, partition.leader_epoch)

    async def _stop_follower(self, key: tuple[str, int]) -> None:
        await self._followers.pop(key).stop()

    def _delete_orphan_logs(self, kept: set[str]) -> None:
        logs = self.data_dir / "logs"
        if not logs.exists():
            return
        for path in logs.iterdir():
            if path.is_dir() and path.name not in kept:
                shutil.rmtree(path, ignore_errors=True)

    def leader_for(self, stream: str, partition: int) -> PartitionLeader:
        leader = self._leaders.get((stream, partition))
        if leader is not None:
            return leader
        state = self.metadata.state
        if stream not in state.streams:
            raise UnknownStream(stream)
        if (stream, partition) not in state.partitions:
            raise UnknownPartition(stream, partition)
        p = state.partitions[(stream, partition)]
        broker = state.brokers.get(p.leader)
        raise NotLeader(stream, partition, p.leader, broker.address if broker else "")

    # -- stream operations (both APIs) --------------------------------------------------------

    def stream_config(self, fields: dict[str, Any]) -> StreamConfig:
        """A create request's config; in a cluster of 3+ brokers a stream is replicated 3
        times with min_isr 2 unless the request says otherwise."""
        if self._cluster is not None and self._cluster.size >= 3:
            fields = {**fields}
            fields.setdefault("replication_factor", 3)
            fields.setdefault("min_isr", min(2, fields["replication_factor"]))
        return StreamConfig.from_dict(fields)

    async def create_stream(self, config: StreamConfig) -> bool:
        """Create the stream; False when an identical one existed (idempotent)."""
        live = None
        if self._cluster is not None:
            live = await self._cluster.wait_live(config.replication_factor)
        result = await self.metadata.propose(CreateStream(config, live))
        await self.reconcile()
        return not result.existed

    async def delete_stream(self, name: str) -> None:
        await self.metadata.propose(DeleteStream(name))
        await self.reconcile()

    def describe_stream(self, name: str) -> dict[str, Any]:
        state = self.metadata.state
        config = state.streams.get(name)
        if config is None:
            raise UnknownStream(name)
        partitions = []
        for p in state.stream_partitions(name):
            entry = {"partition": p.partition, "leader": p.leader, "leader_epoch": p.leader_epoch,
                     "replicas": list(p.replicas), "isr": list(p.isr),
                     "subject": config.partition_subject(p.partition)}
            leader = self._leaders.get((name, p.partition))
            if leader is not None:
                entry.update(high_watermark=leader.high_watermark,
                             log_start_offset=leader.log.log_start_offset,
                             log_end_offset=leader.log.log_end_offset,
                             replica_end_offsets=_replica_end_offsets(leader))
            partitions.append(entry)
        return {**config.to_dict(), "partitions": partitions}

    def describe_streams(self, names: list[str] | None = None) -> list[dict[str, Any]]:
        streams = self.metadata.state.streams
        wanted = sorted(streams) if names is None else [n for n in names if n in streams]
        return [self.describe_stream(n) for n in wanted]

    def brokers(self) -> list[dict[str, Any]]:
        return [{"id": b.id, "host": b.host, "port": b.port, "http_port": b.http_port,
                 **({"nats_url": self.nats_url} if b.id == self.config.broker_id else {})}
                for b in sorted(self.metadata.state.brokers.values(), key=lambda b: b.id)]

    def metadata_status(self) -> dict[str, Any]:
        """Who leads the metadata (this broker, alone), and in a cluster the Raft facts."""
        if self._cluster is None:
            return {"metadata_leader": self.config.broker_id}
        status = self._cluster.metadata.status()
        return {"metadata_leader": status["leader_broker_id"], "raft": status}

    def roles(self) -> list[dict[str, Any]]:
        """What this broker does for each of its partitions: lead, follow, or nothing
        because the metadata's epoch is below the highest it recorded ("fenced")."""
        out: list[dict[str, Any]] = []
        for role, holders in (("leader", self._leaders), ("follower", self._followers)):
            out += [{"stream": s, "partition": p, "role": role,
                     "leader_epoch": holder.state.leader_epoch}
                    for (s, p), holder in holders.items()]
        for (s, p), mark in self._refused.items():
            recorded = self._epochs.highest((s, p))
            out.append({"stream": s, "partition": p, "role": "fenced",
                        "leader_epoch": mark.leader_epoch,
                        "recorded_leader_epoch": recorded.leader_epoch if recorded else None})
        return sorted(out, key=lambda r: (r["stream"], r["partition"]))

    def render_metrics(self) -> str:
        for leader in self._leaders.values():
            leader.metrics.dropped = leader.dropped
        rows = [(s, p, leader.metrics, leader.log.log_end_offset)
                for (s, p), leader in sorted(self._leaders.items())]
        return render(rows, self.metrics)

    # -- socket API requests ------------------------------------------------------------------

    async def handle(self, request: m.Request) -> Any:
        """Answer one socket API request: a Response, or (FetchResponse, FileSlice)."""
        if isinstance(request, m.FetchRequest):
            return await self._fetch(request)
        if isinstance(request, m.MetadataRequest):
            leader = self.metadata_status()["metadata_leader"]
            return m.MetadataResponse(self.brokers(), self.describe_streams(request.streams),
                                      -1 if leader is None else leader)
        if isinstance(request, m.ListStreamsRequest):
            return m.ListStreamsResponse(self.describe_streams())
        if isinstance(request, m.CreateStreamRequest):
            await self.create_stream(self.stream_config(dict(request.config)))
            return m.EmptyResponse()
        if isinstance(request, m.DeleteStreamRequest):
            await self.delete_stream(request.name)
            return m.EmptyResponse()
        if isinstance(request, m.OffsetForTimestampRequest):
            leader = self.leader_for(request.stream, request.partition)
            if request.timestamp_ms == m.EARLIEST_TIMESTAMP:
                return m.OffsetForTimestampResponse(leader.log.log_start_offset)
            if request.timestamp_ms == m.LATEST_TIMESTAMP:
                return m.OffsetForTimestampResponse(leader.high_watermark)
            offset = leader.log.offset_for_timestamp(request.timestamp_ms)
            return m.OffsetForTimestampResponse(min(offset, leader.high_watermark))
        if isinstance(request, m.ReportLeaderFailureRequest):
            if self._cluster is not None:
                self._cluster.on_report(request)
            return m.EmptyResponse()
        if isinstance(request, m.EndOffsetForEpochRequest):
            leader = self.leader_for(request.stream, request.partition)
            current = leader.state.leader_epoch
            if request.current_leader_epoch not in (-1, current):
                raise FencedLeaderEpoch(request.stream, request.partition,
                                        request.current_leader_epoch, current)
            answer = leader.log.end_offset_for_epoch(request.leader_epoch)
            return m.EndOffsetForEpochResponse(answer.epoch, answer.end_offset)
        raise ProtocolError(f"{type(request).__name__} is not served by this broker version",
                            field="op")

    async def _fetch(self, request: m.FetchRequest) -> tuple[m.FetchResponse, Any]:
        if request.isolation != "committed" and request.replica_id < 0:
            # Consumers never see uncommitted records (they could be truncated later).
            raise ProtocolError("only replicas may read uncommitted records",
                                field="isolation")
        key = (request.stream, request.partition)
        if request.read_replica and key not in self._leaders:
            follower = self._followers.get(key)
            if follower is not None and follower.in_sync:
                return await self._fetch_from_follower(follower, request)
        leader = self.leader_for(request.stream, request.partition)
        max_bytes = min(request.max_bytes, self.config.fetch_bytes_max)
        wait_ms = min(request.max_wait_ms, self.config.fetch_wait_ms_max)
        if request.isolation == "uncommitted":
            piece = await leader.replica_fetch(request.replica_id, request.offset,
                                               request.leader_epoch, max_bytes, wait_ms)
        else:
            piece = await leader.read(request.offset, max_bytes, wait_ms)
        leader.metrics.fetched_bytes += piece.length
        response = m.FetchResponse(
            request.stream, request.partition, leader.high_watermark,
            leader.log.log_start_offset, leader.log.log_end_offset, piece.next_offset,
            leader.state.leader_epoch)
        return response, piece

    async def _fetch_from_follower(self, follower: PartitionFollower, request: m.FetchRequest
                                   ) -> tuple[m.FetchResponse, Any]:
        """A consumer's read at an in-sync follower: committed records below the HW this
        follower knows (it may lag the leader's), never anything later truncated."""
        max_bytes = min(request.max_bytes, self.config.fetch_bytes_max)
        wait_ms = min(request.max_wait_ms, self.config.fetch_wait_ms_max)
        piece = await follower.read(request.offset, max_bytes, wait_ms)
        log_ = follower.log
        response = m.FetchResponse(
            request.stream, request.partition, min(follower.high_watermark, log_.log_end_offset),
            log_.log_start_offset, log_.log_end_offset, piece.next_offset,
            follower.state.leader_epoch)
        return response, piece


def _replica_end_offsets(leader: PartitionLeader) -> dict[str, int | None]:
    """Each replica's log end offset as the leader knows it (its own LEO; a follower's from
    its last fetch in this leader epoch, None before one). Keys are broker ids as strings
    (msgpack and JSON maps)."""
    isr = leader.isr
    if isr is None:
        return {str(leader.state.leader): leader.log.log_end_offset}
    return {str(r): leader.log.log_end_offset if r == isr.leader_id
            else isr.follower_state(r).log_end_offset for r in leader.state.replicas}


def _mark(state: PartitionState) -> EpochMark:
    return EpochMark(state.created_version, state.leader_epoch)


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("reconcile failed", exc_info=task.exception())

