"""The internal `__offsets` stream: its config, its creation on first use, and where each
consumer group's coordinator is.

Theory of operation: `__offsets` is created the first time a client looks for a group's
coordinator (FIND_COORDINATOR, to any broker): the broker proposes it to the metadata leader
like any stream, with the settings of the broker's config — `offsets_partitions` partitions,
compacted, ack `all`, fsync always, replicated `offsets_replication_factor` times (capped at
the cluster's size) with min ISR 2 when it has three replicas. A broker that finds it
already created (by another broker, perhaps with other settings) uses it as it is. Its
partitions have no NATS subject to read: their leaders append only what coordinators write.
The coordinator of group g is the leader of partition `crc32(g) % partitions`
(jetstream.offsets.records.coordinator_partition); FIND_COORDINATOR names that broker.
"""

from __future__ import annotations

import contextlib

from jetstream.compaction.planner import CleanupPolicy
from jetstream.errors import NotCoordinator, StreamExists
from jetstream.offsets.records import OFFSETS_STREAM, coordinator_partition
from jetstream.protocol import messages as m
from jetstream.protocol.envelope import AckPolicy
from jetstream.raft_meta.fsm import CreateStream
from jetstream.raft_meta.local import LocalMetadata
from jetstream.raft_meta.model import StreamConfig
from jetstream.raft_meta.raft import RaftMetadata
from jetstream.server.cluster import Cluster
from jetstream.server.config import BrokerConfig
from jetstream.server.roles import Roles
from jetstream.stream.config import FsyncPolicy, MiB

#: The subject of `__offsets` (no partition of it subscribes: see the module docstring).
OFFSETS_SUBJECT = "_jetstream.offsets"


class OffsetsStream:
    def __init__(self, config: BrokerConfig, metadata: LocalMetadata | RaftMetadata,
                 cluster: Cluster | None, roles: Roles) -> None:
        self._config = config
        self._metadata = metadata
        self._cluster = cluster
        self._roles = roles

    def stream_config(self) -> StreamConfig:
        brokers = self._cluster.size if self._cluster is not None else 1
        factor = min(self._config.offsets_replication_factor, brokers)
        return StreamConfig(
            OFFSETS_STREAM, OFFSETS_SUBJECT, partitions=self._config.offsets_partitions,
            replication_factor=factor, min_isr=min(2, factor), ack_policy=AckPolicy.ALL,
            fsync=FsyncPolicy.ALWAYS, cleanup_policy=CleanupPolicy.COMPACT,
            segment_bytes_max=16 * MiB, max_message_bytes=8 * MiB)

    @property
    def existing(self) -> StreamConfig | None:
        return self._metadata.state.streams.get(OFFSETS_STREAM)

    async def ensure(self) -> StreamConfig:
        """The `__offsets` config, creating the stream first when it does not exist yet."""
        existing = self.existing
        if existing is not None:
            return existing
        config = self.stream_config()
        live = None
        if self._cluster is not None:
            live = await self._cluster.wait_live(config.replication_factor)
        # Another broker may have created it, with other settings: then that one is used.
        with contextlib.suppress(StreamExists):
            await self._metadata.propose(CreateStream(config, live))
        await self._roles.reconcile()
        created = self.existing
        assert created is not None
        return created

    def partition_of(self, group: str) -> int:
        """The `__offsets` partition of `group` (the stream exists)."""
        existing = self.existing
        if existing is None:
            raise NotCoordinator(group, "no __offsets stream yet")
        return coordinator_partition(group, existing.partitions)

    async def find_coordinator(self, request: m.FindCoordinatorRequest
                               ) -> m.FindCoordinatorResponse:
        config = await self.ensure()
        partition = coordinator_partition(request.group, config.partitions)
        state = self._metadata.state
        held = state.partitions.get((OFFSETS_STREAM, partition))
        broker = state.brokers.get(held.leader) if held is not None else None
        if broker is None:
            raise NotCoordinator(request.group, f"__offsets/{partition} has no leader now")
        return m.FindCoordinatorResponse(partition, broker.id, broker.host, broker.port)
