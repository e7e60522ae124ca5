"""The cluster settings of BrokerConfig: parsing of `cluster` and the replica limits."""

from __future__ import annotations

import pytest

from jetstream.errors import InvalidConfig
from jetstream.server.config import BrokerConfig


def test_single_broker_by_default() -> None:
    config = BrokerConfig()
    assert config.cluster_members == {}
    assert (config.replica_lag_ms_max, config.replica_leader_timeout_ms,
            config.replica_fetch_wait_ms, config.replica_fetch_bytes_max,
            config.broker_timeout_ms) == (10_000, 1_500, 500, 4 * 1024 * 1024, 3_000)


def test_cluster_members() -> None:
    config = BrokerConfig(broker_id=2, cluster=" 1@10.0.0.1:7001, 2@h2:7002,3@h3:7003")
    assert config.cluster_members == {1: "10.0.0.1:7001", 2: "h2:7002", 3: "h3:7003"}


@pytest.mark.parametrize(("cluster", "broker_id"), [
    ("0@h:1,0@h:2", 0),        # a broker twice
    ("1@h:1,2@h:2", 0),        # this broker missing
    ("x@h:1", 0),              # not an id
    ("0@h", 0),                # no port
    ("0@:7001", 0),            # no host
    ("0@h:70000", 0),          # port out of range
])
def test_bad_cluster(cluster: str, broker_id: int) -> None:
    with pytest.raises(InvalidConfig) as info:
        BrokerConfig(broker_id=broker_id, cluster=cluster)
    assert info.value.fields["field"] == "cluster"


@pytest.mark.parametrize("name", ["replica_lag_ms_max", "replica_leader_timeout_ms",
                                  "replica_fetch_bytes_max", "broker_timeout_ms"])
def test_replica_limits_checked(name: str) -> None:
    with pytest.raises(InvalidConfig):
        BrokerConfig(**{name: 0})


def test_env_sets_cluster() -> None:
    config = BrokerConfig.load(env={"JETSTREAM_CLUSTER": "0@127.0.0.1:7001",
                                    "JETSTREAM_REPLICA_LAG_MS_MAX": "2500"})
    assert config.cluster_members == {0: "127.0.0.1:7001"}
    assert config.replica_lag_ms_max == 2500


def test_routes() -> None:
    config = BrokerConfig(broker_id=0, cluster="0@h0:7000,1@h1:7001,2@h2:7002",
                          raft_routes="1@relay:9001", peer_routes="2@relay:9102")
    assert config.raft_route_map == {"h1:7001": "relay:9001"}
    assert config.peer_route_map == {2: "relay:9102"}


@pytest.mark.parametrize(("name", "value"), [
    ("raft_routes", "5@relay:9001"),  # not a member
    ("peer_routes", "1@relay"),  # no port
    ("peer_routes", "1@relay:1,1@relay:2"),  # twice
])
def test_bad_routes(name: str, value: str) -> None:
    with pytest.raises(InvalidConfig) as info:
        BrokerConfig(broker_id=0, cluster="0@h0:7000,1@h1:7001", **{name: value})
    assert info.value.fields["field"] == name


@pytest.mark.parametrize(("value", "valid"), [
    (0, True),  # sized from the open-file limit at start
    (1, False), (15, False), (16, True), (1 << 20, True), ((1 << 20) + 1, False), (-1, False),
])
def test_open_files_max(value: int, valid: bool) -> None:
    if valid:
        assert BrokerConfig(open_files_max=value).open_files_max == value
    else:
        with pytest.raises(InvalidConfig) as info:
            BrokerConfig(open_files_max=value)
        assert info.value.fields["field"] == "open_files_max"
        assert "0 sizes it from the open-file limit" in str(info.value)
