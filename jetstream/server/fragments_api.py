"""FRAGMENTS on a partition's leader: list its fragments and extents, prune its history.

Theory of operation: the leader's tier (jetstream.tiered.partition_tier) holds the fragment
index; this handler describes it, with the partition's extents (what a consumer can read
from the store and from the disk), and carries out a prune (jetstream.protocol.fragments).
A stream without a `fragment_store` lists no fragments; pruning it is INVALID_STREAM_CONFIG.
"""

from __future__ import annotations

from typing import Any

from jetstream.errors import InvalidStreamConfig
from jetstream.protocol import messages as m
from jetstream.server.config import BrokerConfig
from jetstream.server.partition import PartitionLeader
from jetstream.server.roles import Roles


def extents(leader: PartitionLeader) -> dict[str, Any]:
    """Where the partition's committed offsets are: from the store and on this disk."""
    log_ = leader.log
    out: dict[str, Any] = {"log_start_offset": leader.read_start_offset,
                           "local_log_start_offset": log_.log_start_offset,
                           "log_end_offset": log_.log_end_offset,
                           "high_watermark": leader.high_watermark}
    if leader.tier is not None:
        out.update(leader.tier.describe(log_))
    return out


class FragmentsService:
    def __init__(self, config: BrokerConfig, roles: Roles) -> None:
        self._config = config
        self._roles = roles

    async def handle(self, request: m.FragmentsRequest) -> m.FragmentsResponse:
        leader = self._roles.leader_for(request.stream, request.partition)
        tier = leader.tier
        pruned: list[dict[str, Any]] = []
        if request.prune:
            if tier is None:
                raise InvalidStreamConfig(f"stream {request.stream} has no fragment_store: "
                                          "nothing to prune", field="fragment_store")
            before_offset = request.before_offset if request.before_offset >= 0 else None
            before_ms = request.before_ms if request.before_ms >= 0 else None
            store = tier.store()
            result = await tier.prune(leader.log, before_offset, before_ms)
            pruned = [{"begin": f.begin, "end": f.end, "url": store.url_of(f.name)}
                      for f in result.deleted_fragments]
            if result.local_deleted:
                leader.log_start_moved()
        fragments = tier.describe_fragments() if tier is not None else []
        return m.FragmentsResponse(request.stream, request.partition, self._config.broker_id,
                                   extents(leader), fragments, pruned)
