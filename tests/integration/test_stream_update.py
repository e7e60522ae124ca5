"""Compaction settings at create, and `update_stream` through every surface: the client, the
CLI and the HTTP API, against a real broker. Changes go through the metadata log and reach
the partition's open log."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import pytest

from jetstream.client import Client
from jetstream.errors import InvalidStreamConfig, UnknownStream
from jetstream.server.process import BrokerProcess


async def test_compaction_settings_at_create_and_in_info(js: Client) -> None:
    info = await js.create_stream("kv", "kv.in", cleanup_policy="compact",
                                  min_cleanable_dirty_ratio=0.2, delete_retention_ms=1000,
                                  min_compaction_lag_ms=5, max_compaction_lag_ms=60_000,
                                  segment_ms_max=3_600_000)
    assert info.config["cleanup_policy"] == "compact"
    assert info.config["min_cleanable_dirty_ratio"] == 0.2
    assert (info.config["delete_retention_ms"], info.config["min_compaction_lag_ms"],
            info.config["max_compaction_lag_ms"], info.config["segment_ms_max"]) == (
        1000, 5, 60_000, 3_600_000)
    # Idempotent with the same settings; another cleanup policy is another config.
    assert (await js.create_stream("kv", "kv.in", cleanup_policy="compact",
                                   min_cleanable_dirty_ratio=0.2, delete_retention_ms=1000,
                                   min_compaction_lag_ms=5, max_compaction_lag_ms=60_000,
                                   segment_ms_max=3_600_000)).name == "kv"
    with pytest.raises(InvalidStreamConfig) as caught:
        await js.create_stream("bad", "bad.in", cleanup_policy="shred")
    assert caught.value.fields["field"] == "cleanup_policy"
    with pytest.raises(InvalidStreamConfig) as caught:
        await js.create_stream("bad", "bad.in", min_cleanable_dirty_ratio=2.0)
    assert caught.value.fields["field"] == "min_cleanable_dirty_ratio"


async def test_update_stream_changes_settings_and_refuses_fixed_ones(js: Client) -> None:
    await js.create_stream("orders", "orders.in", retention_ms=60_000)
    info = await js.update_stream("orders", retention_ms=None, cleanup_policy="compact,delete",
                                  ack_policy="leader", fsync="interval")
    assert info.config["retention_ms"] is None
    assert info.config["cleanup_policy"] == "compact,delete"
    assert (info.ack_policy, info.config["fsync"]) == ("leader", "interval")
    # The stream keeps working after its fsync policy changed (in place, same leader).
    ack = await js.publish("orders.in", b"after", key=b"k")
    assert ack is not None and ack.offset == 0
    again = await js.stream_info("orders")
    assert again.config["cleanup_policy"] == "compact,delete"
    for fixed in ("partitions", "subject", "replication_factor", "name"):
        with pytest.raises(InvalidStreamConfig) as caught:
            await js.update_stream("orders", **{fixed: 2})
        assert caught.value.fields["field"] == fixed
    with pytest.raises(InvalidStreamConfig):
        await js.update_stream("orders", retention_ms=-1)
    with pytest.raises(InvalidStreamConfig):
        await js.update_stream("orders")
    with pytest.raises(UnknownStream):
        await js.update_stream("nope", retention_ms=1)
    # Nothing of the refused updates was applied.
    assert (await js.stream_info("orders")).config["retention_ms"] is None


def test_update_from_the_cli_and_http(broker: BrokerProcess) -> None:
    env = {**os.environ, "JETSTREAM_BROKERS": broker.address}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "jetstream", *args], env=env,
                              capture_output=True, text=True, timeout=60)

    created = cli("stream", "create", "events", "--subject", "events.in",
                  "--cleanup-policy", "compact", "--delete-retention-ms", "500")
    assert created.returncode == 0, created.stderr
    updated = cli("stream", "update", "events", "--retention-bytes", "1048576",
                  "--min-cleanable-dirty-ratio", "0.25", "--json")
    assert updated.returncode == 0, updated.stderr
    config = json.loads(updated.stdout.strip().splitlines()[-1])
    assert config["retention_bytes"] == 1048576
    assert config["min_cleanable_dirty_ratio"] == 0.25
    assert cli("stream", "update", "events", "--retention-bytes", "none").returncode == 0
    refused = cli("stream", "update", "events")
    assert refused.returncode == 2
    bad = cli("stream", "update", "events", "--fsync", "sometimes")
    assert bad.returncode == 1 and "INVALID_STREAM_CONFIG" in bad.stderr

    url = broker.http_url
    with httpx.Client(base_url=url, timeout=30) as http:
        answer = http.patch("/streams/events", json={"delete_retention_ms": 42})
        assert answer.status_code == 200, answer.text
        assert answer.json()["delete_retention_ms"] == 42
        assert answer.json()["retention_bytes"] is None
        answer = http.patch("/streams/events", json={"partitions": 3})
        assert answer.status_code == 400
        assert answer.json()["error"]["code"] == "INVALID_STREAM_CONFIG"
        assert answer.json()["error"]["field"] == "partitions"
        assert http.patch("/streams/none", json={"retention_ms": 1}).status_code == 404
