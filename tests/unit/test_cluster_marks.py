"""A starting broker's shutdown mark (Cluster.join, Cluster.lead_again) is proposed again
while the metadata is unavailable: a mark left on would keep every leadership away from the
broker, and the followers of what it leads from starting."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from jetstream.errors import MetadataUnavailable
from jetstream.natsd import free_ports
from jetstream.raft_meta.fsm import ControlledShutdown
from jetstream.server import cluster as cluster_module
from jetstream.server.cluster import Cluster
from jetstream.server.config import BrokerConfig


async def test_lead_again_proposes_until_the_metadata_commits(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    [port] = free_ports(1)
    cluster = Cluster(BrokerConfig(broker_id=0, cluster=f"0@127.0.0.1:{port}"), tmp_path)
    proposed: list[Any] = []

    async def propose(command: Any, timeout: float = 5.0) -> Any:
        proposed.append(command)
        if len(proposed) < 3:
            raise MetadataUnavailable("no leader")
        return None

    monkeypatch.setattr(cluster_module, "RETRY_S", 0.0)
    monkeypatch.setattr(cluster.metadata, "propose", propose)
    try:
        await cluster.lead_again()
    finally:
        monkeypatch.undo()
        await cluster.close()
    assert proposed == [ControlledShutdown(0, False)] * 3
