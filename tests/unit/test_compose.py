"""docker-compose.yml cannot be run here (no Docker engine): check that it parses and that
every broker's command is a valid `jetstream server` invocation of one consistent cluster."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any

import yaml

from jetstream.cli import build_parser
from jetstream.security.guard import exposures
from jetstream.server.config import BrokerConfig

ROOT = Path(__file__).resolve().parents[2]


def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return data


def broker_config(command: list[str]) -> BrokerConfig:
    args = build_parser().parse_args(command)
    assert args.command == "server"
    overrides = {f.name: getattr(args, f.name, None) for f in fields(BrokerConfig)}
    return BrokerConfig.load(None, env={}, overrides=overrides)


def test_compose_runs_nats_and_three_brokers_with_persistent_volumes() -> None:
    services = compose()["services"]
    assert set(services) == {"secrets", "nats", "broker0", "broker1", "broker2"}
    volumes = set(compose()["volumes"])
    for name in ("broker0", "broker1", "broker2"):
        service = services[name]
        assert set(service["depends_on"]) == {"nats", "secrets"} and service["build"] == "."
        assert service["depends_on"]["secrets"]["condition"] == "service_completed_successfully"
        data, secrets = service["volumes"]
        volume, _, path = data.partition(":")
        assert volume in volumes and path == "/data"
        assert secrets == "secrets:/secrets:ro"


def test_compose_ships_secured() -> None:
    """Generated secrets, TLS on every link: no broker would need --insecure."""
    services = compose()["services"]
    certs = build_parser().parse_args(services["secrets"]["command"])
    leaves = dict(leaf.split("=", 1) for leaf in certs.leaf)
    assert set(leaves["broker"].split(",")) >= {"broker0", "broker1", "broker2"}
    assert leaves["nats"] == "nats" and certs.secret == ["raft-password"]
    nats = services["nats"]["command"]
    assert {"--tls", "--tlsverify"} <= set(nats)
    for name in ("broker0", "broker1", "broker2"):
        config = broker_config(services[name]["command"])
        assert exposures(config) == [] and not config.insecure
        assert config.tls_verify_client and config.http_tls_verify_client
        assert config.raft_password_file == "/secrets/raft-password"
        assert config.nats_tls is not None and config.nats_tls.cert


def test_every_broker_command_is_a_valid_server_invocation_of_one_cluster() -> None:
    services = compose()["services"]
    configs = {name: broker_config(services[name]["command"])
               for name in ("broker0", "broker1", "broker2")}
    members = {c.broker_id: c.cluster_members for c in configs.values()}
    assert sorted(members) == [0, 1, 2]
    assert all(m == members[0] for m in members.values())  # one cluster definition
    for name, config in configs.items():
        assert config.broker_id == int(name[-1])
        assert config.host == name  # advertised: other containers resolve the service name
        assert members[0][config.broker_id].startswith(f"{name}:")
        assert config.nats_url == "tls://nats:4222" and config.data_dir == "/data"
    host_ports = [p.split(":")[0] for s in services.values() for p in s.get("ports", [])]
    assert len(host_ports) == len(set(host_ports))


def test_the_image_runs_the_jetstream_command() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "pip install --no-cache-dir ." in dockerfile
    assert 'ENTRYPOINT ["jetstream"]' in dockerfile
