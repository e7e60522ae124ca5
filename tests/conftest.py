"""Shared pytest fixtures. Servers run on ephemeral loopback ports and are stopped by PID."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from jetstream.natsd import NatsServer
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
