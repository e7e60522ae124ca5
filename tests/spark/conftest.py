"""Fixtures of the Spark tests: one local SparkSession for the whole run (starting one costs
seconds), and one broker (with its nats-server) shared by the tests of a module, each test
using streams of its own. Everything listens on 127.0.0.1 and is stopped by PID."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

import jetstream
import jetstream.spark
from jetstream.client import Client
from jetstream.natsd import NatsServer
from jetstream.server.process import BrokerProcess

# The session's Python workers run this interpreter; the driver binds loopback only.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from pyspark.sql import SparkSession


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = (SparkSession.builder.master("local[2]").appName("jetstream-tests")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.sql.session.timeZone", "UTC")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    jetstream.spark.register(session)
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="module")
def shared_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A broker (and its nats-server) for every test of a module."""
    root: Path = tmp_path_factory.mktemp("spark-broker")
    with NatsServer(root / "nats") as nats:
        process = BrokerProcess(root / "broker", nats.url,
                                extra_args=("--cleaner-backoff-ms", "50"))
        try:
            yield process.start()
        finally:
            process.stop()


@pytest.fixture
async def js(shared_broker: BrokerProcess) -> AsyncIterator[Client]:
    async with jetstream.connect(shared_broker.address) as client:
        yield client


@pytest.fixture
def stream_name() -> str:
    """A stream name no other test uses."""
    return f"s{uuid.uuid4().hex[:10]}"
