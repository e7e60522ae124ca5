"""A datastream's rate limit (jetstream.datastreams.rate): the token bucket holds its rate over
time whatever the batch sizes, allows a second's burst at most, and the limit is checked in
the definition and shared by the tasks."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jetstream.datastreams.model import DatastreamConfig, Endpoint
from jetstream.datastreams.rate import TokenBucket, task_rate
from jetstream.datastreams.updates import merged
from jetstream.errors import InvalidDatastreamConfig


@given(st.integers(1, 5000), st.lists(st.integers(1, 3000), min_size=1, max_size=50))
def test_a_task_that_waits_as_told_never_beats_the_rate(rate: int, batches: list[int]) -> None:
    """Taking batches back to back and sleeping as the bucket says: the records written by
    time t never pass one second's burst plus rate * t."""
    bucket = TokenBucket.full(rate, 0.0)
    now, written = 0.0, 0
    for count in batches:
        now += bucket.take(count, now)
        written += count
        assert written <= rate * (1 + now) + 1e-6


def test_an_idle_bucket_fills_to_one_second_and_no_more() -> None:
    bucket = TokenBucket.full(100, 0.0)
    assert bucket.take(100, 0.0) == 0.0
    assert bucket.take(50, 0.0) == pytest.approx(0.5)  # a debt of 50 at 100/s
    assert bucket.take(0, 10.0) == 0.0
    assert bucket.tokens == pytest.approx(100)  # ten idle seconds fill one second's worth
    assert bucket.take(300, 10.0) == pytest.approx(2.0)  # a batch past the bucket goes whole
    with pytest.raises(ValueError):
        TokenBucket.full(0, 0.0)


def test_the_limit_is_checked_shared_and_updatable() -> None:
    ends = {"source": Endpoint("jetstream", {"stream": "a"}),
            "destination": Endpoint("jetstream", {"stream": "b"})}
    config = DatastreamConfig("d", **ends, max_tasks=4, rate_limit_records_per_s=1000)
    assert config.shown()["rate_limit_records_per_s"] == 1000
    assert DatastreamConfig.from_dict(config.to_dict()) == config
    for bad in (0, -1, True, 1.5, "10", 10**9):
        with pytest.raises(InvalidDatastreamConfig) as info:
            DatastreamConfig("d", **ends, rate_limit_records_per_s=bad)  # type: ignore[arg-type]
        assert info.value.fields["field"] == "rate_limit_records_per_s"
    assert task_rate(1000, 4) == 250.0 and task_rate(None, 4) is None
    assert merged(config, {"rate_limit_records_per_s": None}).rate_limit_records_per_s is None
    assert merged(config, {"rate_limit_records_per_s": 5}).rate_limit_records_per_s == 5
