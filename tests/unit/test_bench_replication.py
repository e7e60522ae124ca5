"""The pure helpers of bench/replication.py: which replies are acks, which ack ends a failover,
and the percentiles it reports."""

from __future__ import annotations

import pytest

from bench.common import percentile
from bench.replication import first_ack_after, is_ack, summarize
from jetstream.errors import NotEnoughReplicas
from jetstream.protocol.ack import encode_ack, encode_error_ack


def test_only_a_successful_ack_counts() -> None:
    assert is_ack(encode_ack("bench", 0, 41, "bench.r3", None, "all"))
    assert not is_ack(encode_error_ack("bench", 0, None, NotEnoughReplicas(2, 1)))
    assert not is_ack(b"")  # nats-server's no-responders status while no leader subscribes


@pytest.mark.parametrize(("after", "expected"), [
    (0.0, 1.5),    # every message: the earliest ack
    (2.0, 4.5),    # message 2's ack came before message 1's: arrival order, not index
    (3.5, None),   # message 3 was never acked (its leader died)
    (9.0, None),   # nothing published since
])
def test_first_ack_after(after: float, expected: float | None) -> None:
    sent_at = [1.0, 2.0, 3.0, 4.0]
    acked_at = [1.5, 5.0, 4.5, None]
    assert first_ack_after(sent_at, acked_at, after) == expected


def test_percentiles_of_few_samples() -> None:
    samples = [1.7, 1.6, 3.2, 1.8, 1.5]
    assert percentile(samples, 50) == 1.7
    assert percentile(samples, 99) == 3.2  # fewer than 100 samples: p99 is the max
    summary = summarize(samples)
    assert summary["p50_s"] == 1.7 and summary["p99_s"] == summary["max_s"] == 3.2
    assert summary["p99_is_max"]
    assert percentile(list(range(1000)), 99) == 990
