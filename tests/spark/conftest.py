"""Fixtures of the Spark tests: one local SparkSession for the whole run (starting one costs
seconds), and one broker (with its nats-server) shared by the tests of a module, each test
using streams of its own. Both reach one moto S3 server (its environment is set before
either starts: Spark's Python workers and the broker read the store's endpoint from theirs).
Everything listens on 127.0.0.1 and is stopped by PID."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

import jetstream
import jetstream.spark
from jetstream.client import Client
from jetstream.natsd import NatsServer
from jetstream.server.process import BrokerProcess
from jetstream.tiered.local_s3 import LocalS3


@pytest.fixture(scope="session")
def s3_env(local_s3: LocalS3) -> LocalS3:
    """moto's S3 server, its environment set in this process (and so in the processes it
    starts) for the whole run."""
    local_s3.apply_env()
    return local_s3


@pytest.fixture(scope="session")
def spark(s3_env: LocalS3) -> Iterator[SparkSession]:
    session = jetstream.spark.local_session("jetstream-tests", **{
        "spark.sql.shuffle.partitions": "2", "spark.sql.session.timeZone": "UTC"})
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="module")
def shared_broker(tmp_path_factory: pytest.TempPathFactory, s3_env: LocalS3
                  ) -> Iterator[BrokerProcess]:
    """A broker (and its nats-server) for every test of a module."""
    root: Path = tmp_path_factory.mktemp("spark-broker")
    with NatsServer(root / "nats") as nats:
        process = BrokerProcess(root / "broker", nats.url,
                                extra_args=("--cleaner-backoff-ms", "50",
                                            "--retention-check-ms", "50"))
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
