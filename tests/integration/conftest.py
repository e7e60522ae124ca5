"""Fixtures that run real brokers: `broker` (a `jetstream server` process on loopback, using
the test's nats-server; see brokers.py) and `js` (an async client connected to it)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

import jetstream
from jetstream.client import Client
from jetstream.server.process import BrokerProcess


@pytest.fixture
def broker(tmp_path: Path, nats_url: str) -> Iterator[BrokerProcess]:
    """A running broker on loopback with its own data directory, stopped after the test."""
    process = BrokerProcess(tmp_path / "broker", nats_url)
    try:
        yield process.start()
    finally:
        process.stop()


@pytest.fixture
async def js(broker: BrokerProcess) -> AsyncIterator[Client]:
    """An async client of `broker`, closed after the test."""
    async with jetstream.connect(broker.address) as client:
        yield client
