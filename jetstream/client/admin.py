"""The client's stream administration and cluster description calls.

Theory of operation: every call here is one request at any broker (the router's `admin`):
a broker that does not lead the metadata forwards a change to the one that does and answers
once it is applied. Each answer also corrects the client's metadata cache, so a stream
created here can be published to and read at once, and one deleted here is forgotten.
`partition_status` is the exception: it asks the partition's leader, the only broker that
knows its offsets, once and without retries (a status view should not wait out a
failover); and `scrub` asks every broker, each for its own replicas.

`StreamAdmin` is one part of `Client` (client.py): it holds no state of its own and reaches
the cluster through the client's router.
"""

from __future__ import annotations

import asyncio
import enum
import warnings
from collections.abc import Mapping
from typing import Any

from jetstream.client.metadata import partition_of
from jetstream.client.routing import Router
from jetstream.client.types import BrokerInfo, PartitionInfo, StreamInfo
from jetstream.errors import JetstreamError, NotLeader, UnknownStream
from jetstream.protocol import messages as m
from jetstream.protocol.envelope import AckPolicy

#: How long `scrub` waits for one broker's pass (it reads every byte of its replicas).
SCRUB_TIMEOUT_S = 600.0


class StreamAdmin:
    """Create, delete, list and describe streams; describe the cluster."""

    _router: Router

    @property
    def brokers(self) -> list[BrokerInfo]:
        """The brokers of the cluster, as of the last metadata refresh."""
        return self._router.metadata.broker_list()

    @property
    def metadata_leader(self) -> int | None:
        """The broker leading the metadata as of the last refresh; None when unknown."""
        return self._router.metadata.metadata_leader

    async def refresh_metadata(self) -> None:
        """Read brokers and streams again. Raises BrokerUnavailable when no broker answers."""
        await self._router.refresh_metadata()

    async def create_stream(
        self,
        name: str,
        subject: str,
        *,
        partitions: int = 1,
        ingest_group: str | None = None,
        labels: Mapping[str, str] | None = None,
        ack_policy: AckPolicy | str | None = None,
        fsync: str | None = None,
        retention_ms: int | None = None,
        retention_bytes: int | None = None,
        retention_messages: int | None = None,
        max_message_bytes: int | None = None,
        segment_bytes_max: int | None = None,
        segment_ms_max: int | None = None,
        replication_factor: int | None = None,
        min_isr: int | None = None,
        cleanup_policy: str | None = None,
        min_cleanable_dirty_ratio: float | None = None,
        min_compaction_lag_ms: int | None = None,
        max_compaction_lag_ms: int | None = None,
        delete_retention_ms: int | None = None,
        duplicate_window_ms: int | None = None,
        group: str | None = None,
        tiered: Mapping[str, object] | None = None,
    ) -> StreamInfo:
        """Create a stream reading `subject` (partition p > 0 reads `<subject>.<p>`); options
        left None take the broker's defaults. Idempotent: creating a stream that exists with
        the same config returns it. Raises StreamExists (another config),
        InvalidStreamConfig (a bad name, subject or value), NotEnoughReplicas. `group` is the
        deprecated spelling of `ingest_group` (the load-balance group). `tiered`: the tiered
        storage settings (`fragment_store`, `fragment_compression`, `local_retention_ms`,
        `local_retention_bytes`, `fragment_store_retention`)."""
        if group is not None:
            warnings.warn("create_stream(group=...) is deprecated: use ingest_group=",
                          DeprecationWarning, stacklevel=2)
            ingest_group = ingest_group if ingest_group is not None else group
        config: dict[str, object] = {"name": name, "subject": subject, "partitions": partitions}
        options = {"ingest_group": ingest_group,
                   "labels": dict(labels) if labels is not None else None,
                   "ack_policy": _option(ack_policy), "fsync": _option(fsync),
                   "retention_ms": retention_ms, "retention_bytes": retention_bytes,
                   "retention_messages": retention_messages,
                   "max_message_bytes": max_message_bytes,
                   "segment_bytes_max": segment_bytes_max, "segment_ms_max": segment_ms_max,
                   "replication_factor": replication_factor, "min_isr": min_isr,
                   "cleanup_policy": cleanup_policy,
                   "min_cleanable_dirty_ratio": min_cleanable_dirty_ratio,
                   "min_compaction_lag_ms": min_compaction_lag_ms,
                   "max_compaction_lag_ms": max_compaction_lag_ms,
                   "delete_retention_ms": delete_retention_ms,
                   "duplicate_window_ms": duplicate_window_ms}
        config.update((k, v) for k, v in options.items() if v is not None)
        config.update((k, v) for k, v in (tiered or {}).items() if v is not None)
        await self._router.admin(m.CreateStreamRequest(config), m.EmptyResponse)
        return await self.stream_info(name)

    async def update_stream(self, name: str, /, **changes: object) -> StreamInfo:
        """Change settings of a stream, e.g. `update_stream("s", retention_ms=None,
        cleanup_policy="compact")` (None: no limit). Changeable: retention, cleanup policy and
        compaction settings, segment size and age, ack policy, fsync, largest message; every
        replica applies the change. Raises InvalidStreamConfig (an unknown or fixed setting, a
        bad value), UnknownStream."""
        values = {k: v.value if isinstance(v, enum.Enum) else v for k, v in changes.items()}
        await self._router.admin(m.UpdateStreamRequest(name, values), m.UpdateStreamResponse)
        self._router.metadata.drop_stream(name)
        return await self.stream_info(name)

    async def delete_stream(self, name: str) -> None:
        """Delete a stream and its data. Raises UnknownStream."""
        try:
            await self._router.admin(m.DeleteStreamRequest(name), m.EmptyResponse)
        finally:
            self._router.metadata.drop_stream(name)

    async def list_streams(self, *, internal: bool = False) -> list[StreamInfo]:
        """Every stream, sorted by name; the internal ones (`__offsets`) only with
        `internal`."""
        response = await self._router.admin(m.ListStreamsRequest(internal),
                                            m.ListStreamsResponse)
        streams = [StreamInfo.from_dict(s) for s in response.streams]
        self._router.remember_streams(streams)
        return streams

    async def stream_info(self, name: str) -> StreamInfo:
        """The stream `name` with its partitions (offsets included when the answering broker
        leads them). Raises UnknownStream."""
        return await self._router.load_stream(name)

    async def partition_status(self, stream: str, partition: int) -> PartitionInfo:
        """The partition as its leader describes it: offsets included (high watermark, log
        start and end, and each replica's log end offset as the leader knows it). One
        request at the leader the metadata names, not retried (a status view should not
        wait for a failover): raises UnknownStream, UnknownPartition, NotLeader (that broker
        does not lead it) or BrokerUnavailable."""
        conn = await self._router.leader_connection(stream, partition)
        response = m.expect_response(await conn.request(m.MetadataRequest([stream])),
                                     m.MetadataResponse)
        if not response.streams:
            raise UnknownStream(stream)
        found = partition_of(StreamInfo.from_dict(response.streams[0]), partition)
        if found.log_end_offset is None:  # that broker does not lead it (any more)
            raise NotLeader(stream, partition, found.leader)
        return found

    async def scrub(self, stream: str, partition: int = -1, *,
                    timeout_s: float = SCRUB_TIMEOUT_S) -> list[dict[str, Any]]:
        """Check every byte of every replica of `stream` (one `partition`, or -1 for all)
        now, on each broker holding one, healing what can be: one entry per replica (its
        broker, role, damage still found, repairs made, lost ranges). A broker that does
        not answer within `timeout_s` gets an entry with its `error`."""
        await self._router.load_stream(stream)  # UnknownStream before any broker is asked
        brokers = sorted(self._router.metadata.brokers)

        async def ask(broker_id: int) -> list[dict[str, Any]]:
            try:
                conn = await self._router.broker_connection(broker_id)
                response = m.expect_response(
                    await conn.request(m.ScrubRequest(stream, partition), timeout_s=timeout_s),
                    m.ScrubResponse)
            except (JetstreamError, OSError) as exc:
                return [{"broker_id": broker_id, "error": str(exc)}]
            return [{"broker_id": response.broker_id, **entry}
                    for entry in response.partitions]

        answers = await asyncio.gather(*(ask(b) for b in brokers))
        return sorted((e for found in answers for e in found),
                      key=lambda e: (e.get("partition", -1), e["broker_id"]))

    async def fragments(self, stream: str, partition: int = -1, *, prune: bool = False,
                        before_offset: int = -1, before_ms: int = -1
                        ) -> list[dict[str, Any]]:
        """Each partition's (or one `partition`'s) fragments in its fragment store and its
        extents, as its leader knows them. With `prune`, the leaders first delete the
        history ending at or before `before_offset` (or modified before `before_ms`), in
        the store and on their disks. Raises UnknownStream, InvalidStreamConfig (a prune of
        a stream without a store), FragmentStoreUnavailable."""
        info = await self._router.load_stream(stream)
        wanted = [p.partition for p in info.partitions if partition in (-1, p.partition)]
        if not wanted:
            partition_of(info, partition)  # raises UnknownPartition

        async def ask(p: int) -> dict[str, Any]:
            request = m.FragmentsRequest(stream, p, prune, before_offset, before_ms)

            async def call(conn: Any) -> m.FragmentsResponse:
                return m.expect_response(await conn.request(request), m.FragmentsResponse)

            answer = await self._router.with_leader(stream, p, call)
            return {"partition": p, "broker_id": answer.broker_id, **answer.extents,
                    "fragments": answer.fragments, "pruned": answer.pruned}

        return list(await asyncio.gather(*(ask(p) for p in wanted)))

    async def registers(self, stream: str, partition: int = 0) -> dict[str, str]:
        """The partition's registers, as its leader holds them (the newest appends' may not
        be committed yet). Raises UnknownStream, UnknownPartition."""
        request = m.RegistersRequest(stream, partition)

        async def call(conn: Any) -> m.RegistersResponse:
            return m.expect_response(await conn.request(request), m.RegistersResponse)

        return (await self._router.with_leader(stream, partition, call)).registers


def _option(value: AckPolicy | str | None) -> str | None:
    """An option as the broker reads it: an enum's value, a str as it is."""
    return value.value if isinstance(value, enum.Enum) else value
