"""Shared pytest fixtures. Servers run on ephemeral loopback ports and are stopped by PID."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from jetstream.natsd import NatsServer
from jetstream.tiered.local_s3 import LocalS3
from tests.pki import Pki


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    """A started core NATS server (no JetStream) on 127.0.0.1, stopped after the test."""
    with NatsServer(tmp_path / "nats") as server:
        yield server


@pytest.fixture
def nats_url(nats_server: NatsServer) -> str:
    """The `nats://127.0.0.1:PORT` URL of `nats_server`."""
    return nats_server.url


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    """A throwaway CA (trustme) whose certificates are written under the test's directory."""
    return Pki(tmp_path / "pki")


@pytest.fixture(scope="session")
def local_s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalS3]:
    """moto's S3 server on a free 127.0.0.1 port (one per test session), stopped by PID.
    Its `env` reaches it (brokers get it in their environment); `create_bucket` makes one."""
    with LocalS3(tmp_path_factory.mktemp("moto") / "moto.log") as server:
        yield server


@pytest.fixture
def s3_bucket(local_s3: LocalS3, request: pytest.FixtureRequest,
              monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh bucket on `local_s3` for this test, as `s3://bucket`; this process's
    environment reaches it."""
    for key, value in local_s3.env.items():
        monkeypatch.setenv(key, value)
    name = "t-" + "".join(c if c.isalnum() else "-" for c in request.node.name.lower())[:50]
    return local_s3.create_bucket(name.strip("-") + f"-{os.getpid()}")
