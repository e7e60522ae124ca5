"""Stream administration and the broker's description of the cluster, for both APIs.

Theory of operation: creating and deleting a stream are metadata proposals (Raft in a
cluster, a local file on one broker); after each the roles are reconciled at once, so a
stream this broker leads is ready when the call returns. Creating is idempotent: an identical
stream answers "existed", another config STREAM_EXISTS. In a cluster a create waits (up to
`broker_timeout_ms`) for as many live brokers as the stream has replicas, and in a cluster
of three or more a stream is replicated 3 times with min_isr 2 unless the request says
otherwise.

Describing is read-only and answers from this broker's metadata, adding what only a leader
knows (high watermark, log start and end, each replica's log end offset) for the
partitions this broker leads. Each broker describes its own NATS connection (URL and
state) in its own entry of the broker list; a client asks each broker for its entry.

`Admin` is what the HTTP API is given (it satisfies jetstream.server.api.HttpServices); its
`on_*` methods answer the socket API's Metadata, ListStreams, CreateStream and DeleteStream
requests.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jetstream.datastreams.service import DatastreamService
from jetstream.errors import NotLeader, ProtectedStream, UnknownStream
from jetstream.offsets.records import is_internal
from jetstream.protocol import messages as m
from jetstream.raft_meta.fsm import CreateStream, DeleteStream, UpdateStream
from jetstream.raft_meta.local import LocalMetadata
from jetstream.raft_meta.model import StreamConfig
from jetstream.raft_meta.raft import RaftMetadata
from jetstream.security.guard import insecure_listeners
from jetstream.server.cleaner import CleanerService
from jetstream.server.cluster import Cluster
from jetstream.server.config import BrokerConfig
from jetstream.server.coordinator import Coordinators
from jetstream.server.disk import DiskMonitor
from jetstream.server.files import OpenFiles
from jetstream.server.fragments_api import FragmentsService
from jetstream.server.integrity import Integrity
from jetstream.server.kv import KeyValue
from jetstream.server.metrics import BrokerMetrics, render
from jetstream.server.nats_port import NatsPort
from jetstream.server.partition import PartitionLeader
from jetstream.server.roles import Roles
from jetstream.tiered.partition_tier import PartitionTier


class Admin:
    """Stream CRUD and descriptions (see the module docstring)."""

    def __init__(self, config: BrokerConfig, metadata: LocalMetadata | RaftMetadata,
                 cluster: Cluster | None, roles: Roles, metrics: BrokerMetrics,
                 nats_url: str, nats: NatsPort, cleaner: CleanerService, kv: KeyValue,
                 coordinators: Coordinators, disk: DiskMonitor | None = None,
                 integrity: Integrity | None = None, files: OpenFiles | None = None) -> None:
        self._config = config
        self._disk = disk
        self._files = files
        self.integrity = integrity or Integrity(config, roles, None, None)
        self._metadata = metadata
        self._cluster = cluster
        self._roles = roles
        self._metrics = metrics
        self._nats_url = nats_url
        self._nats = nats
        self._cleaner = cleaner
        self._kv = kv
        self._coordinators = coordinators
        self.fragments = FragmentsService(config, roles)
        #: Datastreams (jetstream.datastreams.service), set by the broker once built.
        self.datastreams: DatastreamService | None = None

    @property
    def broker_id(self) -> int:
        return self._config.broker_id

    # -- stream operations ------------------------------------------------------------------

    def stream_config(self, fields: Mapping[str, Any]) -> StreamConfig:
        """A create request's config, with the cluster's replication defaults. Internal names
        (`__*`) are refused: those streams are the system's."""
        values = dict(fields)
        name = values.get("name")
        if isinstance(name, str) and is_internal(name):
            raise ProtectedStream(name, "create")
        if self._cluster is not None and self._cluster.size >= 3:
            values.setdefault("replication_factor", 3)
            factor = values["replication_factor"]
            # A factor of the wrong type is left for from_dict to name in its error.
            values.setdefault("min_isr", min(2, factor) if isinstance(factor, int) else 2)
        return StreamConfig.from_dict(values)

    async def create_stream(self, config: StreamConfig) -> bool:
        """Create the stream; False when an identical one existed (idempotent)."""
        live = None
        if self._cluster is not None:
            live = await self._cluster.wait_live(config.replication_factor)
        result = await self._metadata.propose(CreateStream(config, live))
        await self._roles.reconcile()
        if self._cluster is not None:
            # A publish right after the create must find every partition's leader serving.
            await self._cluster.wait_served(config.name, self._roles.led_here)
        return not result.existed

    async def delete_stream(self, name: str) -> None:
        if is_internal(name):
            raise ProtectedStream(name, "delete")
        await self._metadata.propose(DeleteStream(name))
        await self._roles.reconcile()

    async def update_stream(self, name: str, changes: Mapping[str, Any]) -> StreamConfig:
        """Change settings of a stream through the metadata log; the new config."""
        if is_internal(name):
            raise ProtectedStream(name, "update")
        config: StreamConfig = await self._metadata.propose(UpdateStream(name, dict(changes)))
        await self._roles.reconcile()
        return config

    async def get_key(self, request: m.GetRequest) -> m.GetResponse:
        return await self._kv.get(request)

    async def list_keys(self, request: m.KeysRequest) -> m.KeysResponse:
        return await self._kv.keys(request)

    def leader_for(self, stream: str, partition: int) -> PartitionLeader:
        """The leader to append to (HTTP): internal streams take no appends from users."""
        if is_internal(stream):
            raise ProtectedStream(stream, "publish to")
        return self._roles.leader_for(stream, partition)

    # -- descriptions -----------------------------------------------------------------------

    def describe_stream(self, name: str) -> dict[str, Any]:
        state = self._metadata.state
        config = state.streams.get(name)
        if config is None:
            raise UnknownStream(name)
        partitions = []
        for p in state.stream_partitions(name):
            entry: dict[str, Any] = {
                "partition": p.partition, "leader": p.leader, "leader_epoch": p.leader_epoch,
                "replicas": list(p.replicas), "isr": list(p.isr),
                "subject": config.partition_subject(p.partition)}
            leader = self._roles.leaders.get((name, p.partition))
            if leader is not None:
                entry.update(high_watermark=leader.high_watermark,
                             log_start_offset=leader.read_start_offset,
                             local_log_start_offset=leader.log.log_start_offset,
                             log_end_offset=leader.log.log_end_offset,
                             replica_end_offsets=_replica_end_offsets(leader))
                if leader.tier is not None:
                    entry["stored"] = leader.tier.describe(leader.log)
            partitions.append(entry)
        # This stream's replicas only: a walk over every replica held here, for each stream
        # of a listing, would cost the square of the partitions held.
        held = {k: (log_, hw) for k, _s, log_, hw in self._roles.replicas((name,))}
        for entry in partitions:
            if (name, entry["partition"]) in held:  # this broker's copy of it
                entry["integrity"] = self.integrity.describe((name, entry["partition"]))
        if config.cleanup_policy.compacts:
            for entry in partitions:
                found = held.get((name, entry["partition"]))
                if found is not None:  # this broker's copy of it (each replica compacts alone)
                    entry["compaction"] = self._cleaner.describe(
                        (name, entry["partition"]), config, *found)
        return {**config.to_dict(), "partitions": partitions}

    def describe_streams(self, names: list[str] | None = None, *,
                         internal: bool = False) -> list[dict[str, Any]]:
        """The named streams, or every stream (the internal ones only with `internal`)."""
        streams = self._metadata.state.streams
        wanted = ([n for n in sorted(streams) if internal or not is_internal(n)]
                  if names is None else [n for n in names if n in streams])
        return [self.describe_stream(n) for n in wanted]

    def brokers(self) -> list[dict[str, Any]]:
        """Every registered broker; this one's entry adds its NATS URL and connection state,
        its data disk's use and whether it is full, and its open files: partition files open,
        their budget, and the open-file limit (only a broker knows its own)."""
        me = self._config.broker_id
        own: dict[str, Any] = {"nats_url": self._nats_url, "nats_state": self._nats.state}
        if self._disk is not None:
            own.update(disk_used_percent=round(self._disk.used_percent, 1),
                       disk_full=self._disk.full)
        if self._files is not None:
            own.update(open_files=self._files.pool.open_count,
                       open_files_max=self._files.pool.max_open,
                       open_files_limit=self._files.limit)
        return [{"id": b.id, "host": b.host, "port": b.port, "http_port": b.http_port,
                 **(own if b.id == me else {})}
                for b in sorted(self._metadata.state.brokers.values(), key=lambda b: b.id)]

    def metadata_status(self) -> dict[str, Any]:
        """Who leads the metadata (this broker, alone), and in a cluster the Raft facts."""
        if self._cluster is None:
            return {"metadata_leader": self._config.broker_id}
        status = self._cluster.metadata.status()
        return {"metadata_leader": status["leader_broker_id"], "raft": status}

    def cluster_view(self) -> dict[str, Any]:
        return {"brokers": self.brokers(), **self.metadata_status(),
                "streams": self.describe_streams(internal=True),
                "roles": self._roles.describe()}

    def health(self) -> dict[str, Any]:
        health: dict[str, Any] = {"status": "ok", "broker_id": self._config.broker_id,
                                  "streams": len(self._metadata.state.streams)}
        if self._disk is not None:
            health["disk"] = self._disk.describe()
        if self._files is not None:
            health["files"] = self._files.describe()
        health["tls"] = {"socket": self._config.socket_tls is not None,
                         "http": self._config.http_tls is not None,
                         "nats": self._config.nats_tls is not None}
        # Started with --insecure: say so on every look, not just once in the log.
        insecure = insecure_listeners(self._config, self._config.insecure)
        if insecure is not None:
            health["insecure"] = insecure
        stores = self._roles.tiering.warnings(self._tiers())
        if stores:
            health["fragment_store_warnings"] = stores
        if self.datastreams is not None:
            health["datastreams"] = self.datastreams.health()
        return health

    def _tiers(self) -> list[PartitionTier]:
        return self._roles.tiering.held()  # led and followed

    def render_metrics(self, high_watermarks: Mapping[tuple[str, int], int]) -> str:
        leaders = self._roles.leaders
        for leader in leaders.values():
            leader.metrics.dropped = leader.dropped
        rows = [(s, p, leader.metrics, leader.log.log_end_offset)
                for (s, p), leader in sorted(leaders.items())]
        disk = self._disk.render_metrics() if self._disk is not None else []
        if self._files is not None:
            disk += self._files.render_metrics()
        disk += self._roles.render_metrics()
        disk += self._roles.tiering.render_metrics(self._tiers())
        if self._cluster is not None:
            disk += self._cluster.render_metrics()
        if self.datastreams is not None:
            disk += self.datastreams.render_metrics()
        return (render(rows, self._metrics) + "\n".join(self._cleaner.render_metrics()) + "\n"
                + "\n".join(self.integrity.render_metrics()) + "\n"
                + "\n".join(self._roles.sessions.render_metrics()) + "\n"
                + "\n".join(self._roles.fetchers.render_metrics()) + "\n"
                + "\n".join(self._roles.scheduler.render_metrics()) + "\n"
                + "\n".join(self._coordinators.render_metrics(high_watermarks)) + "\n"
                + "".join(line + "\n" for line in disk))

    def group_partitions(self) -> list[tuple[str, int]]:
        return self._coordinators.partitions()

    def high_watermarks(self) -> dict[tuple[str, int], int]:
        return {key: leader.high_watermark for key, leader in self._roles.leaders.items()}

    # -- socket API handlers ----------------------------------------------------------------

    async def on_metadata(self, request: m.MetadataRequest) -> m.MetadataResponse:
        leader = self.metadata_status()["metadata_leader"]
        return m.MetadataResponse(self.brokers(), self.describe_streams(request.streams),
                                  -1 if leader is None else leader)

    async def on_list_streams(self, request: m.ListStreamsRequest) -> m.ListStreamsResponse:
        return m.ListStreamsResponse(self.describe_streams(internal=request.internal))

    async def on_fragments(self, request: m.FragmentsRequest) -> m.FragmentsResponse:
        return await self.fragments.handle(request)

    async def on_registers(self, request: m.RegistersRequest) -> m.RegistersResponse:
        leader = self.leader_for(request.stream, request.partition)
        if not is_internal(request.stream):
            await leader.guarded.loaded()  # read from the log as the leader starts
            if not leader.guarded.ready:
                raise NotLeader(request.stream, request.partition)  # it stopped meanwhile
        return m.RegistersResponse(request.stream, request.partition, self._config.broker_id,
                                   leader.guarded.registers)

    async def on_scrub(self, request: m.ScrubRequest) -> m.ScrubResponse:
        if request.stream not in self._metadata.state.streams:
            raise UnknownStream(request.stream)
        return m.ScrubResponse(self._config.broker_id,
                               await self.integrity.scrub_now(request.stream, request.partition))

    async def on_create_stream(self, request: m.CreateStreamRequest) -> m.EmptyResponse:
        await self.create_stream(self.stream_config(request.config))
        return m.EmptyResponse()

    async def on_update_stream(self, request: m.UpdateStreamRequest
                               ) -> m.UpdateStreamResponse:
        config = await self.update_stream(request.name, request.changes)
        return m.UpdateStreamResponse(config.to_dict())

    async def on_delete_stream(self, request: m.DeleteStreamRequest) -> m.EmptyResponse:
        await self.delete_stream(request.name)
        return m.EmptyResponse()


def _replica_end_offsets(leader: PartitionLeader) -> dict[str, int | None]:
    """Each replica's log end offset as the leader knows it (its own LEO; a follower's from
    its last fetch in this leader epoch, None before one). Keys are broker ids as strings
    (msgpack and JSON maps)."""
    isr = leader.isr
    if isr is None:
        return {str(leader.state.leader): leader.log.log_end_offset}
    return {str(r): leader.log.log_end_offset if r == isr.leader_id
            else isr.follower_state(r).log_end_offset for r in leader.state.replicas}
