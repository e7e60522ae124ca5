"""The pure parts of the Spark source: options, start/end resolution, pushed filters, task
splitting and the streaming trigger cap."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql.datasource import EqualTo, GreaterThan, GreaterThanOrEqual, In, LessThan

from jetstream.errors import DataLoss, InvalidSparkOption, OffsetOutOfRange
from jetstream.spark.filters import push_filters
from jetstream.spark.options import EARLIEST, LATEST, parse_read_options, parse_write_options
from jetstream.spark.planning import (
    OffsetBounds,
    PartitionListing,
    Ranges,
    offsets_json,
    plan_tasks,
    resolve_end,
    resolve_start,
)
from jetstream.spark.streaming import cap, from_json

BASE = {"brokers": "127.0.0.1:1", "stream": "orders"}


def listing(hw: int = 100, log_start: int = 10, bases: tuple[int, ...] = (0, 40, 80)
            ) -> PartitionListing:
    return PartitionListing("orders", 0, hw, log_start,
                            tuple((b, f"/d/{b:020d}.log") for b in bases), "/d/v", "1")


def test_options_parse_kafka_forms() -> None:
    options = parse_read_options({**BASE, "startingOffsets": '{"orders": {"0": 42, "1": -2}}',
                                  "ENDINGOFFSETS": "latest", "readFrom": "Files"})
    assert options.starting.for_partition("orders", 0) == 42
    assert options.starting.for_partition("orders", 1) == EARLIEST
    assert options.starting.for_partition("orders", 2) == EARLIEST
    assert options.ending.default == LATEST and options.read_from == "files"
    assert parse_read_options(BASE, streaming=True).starting.default == LATEST
    assert parse_read_options({**BASE, "stream": "a, b,a"}).streams == ("a", "b")


@pytest.mark.parametrize("bad", [
    {"stream": "orders", "selector": "a=b"},
    {"startingOffsets": "yesterday"},
    {"startingOffsets": '{"orders": {"x": 1}}'},
    {"endingOffsets": "earliest"},
    {"readFrom": "tape"},
    {"compacted": "oldest"},
    {"maxRecordsPerPartition": "0"},
    {"failOnDataLoss": "maybe"},
    {"stream": "bad name"},
    {"group": "bad group"},
])
def test_bad_options_name_themselves(bad: dict[str, str]) -> None:
    with pytest.raises(InvalidSparkOption) as caught:
        parse_read_options({**BASE, **bad})
    assert caught.value.code == "INVALID_SPARK_OPTION"
    assert caught.value.field.lower() in {k.lower() for k in bad} | {"stream"}


def test_streaming_refuses_batch_only_options() -> None:
    with pytest.raises(InvalidSparkOption):
        parse_read_options({**BASE, "endingOffsets": "latest"}, streaming=True)
    with pytest.raises(InvalidSparkOption):
        parse_write_options({"brokers": "127.0.0.1:1"})


def test_starts_come_from_the_group_then_the_options() -> None:
    options = parse_read_options({**BASE, "startingOffsets": '{"orders": {"0": 50}}'})
    view = listing()
    assert resolve_start(view, options, committed=None, timestamp_offset=None) == 50
    assert resolve_start(view, options, committed=70, timestamp_offset=None) == 70
    earliest = parse_read_options(BASE)
    assert resolve_start(view, earliest, committed=None, timestamp_offset=None) == 10
    assert resolve_start(view, earliest, committed=None, timestamp_offset=33) == 33
    latest = parse_read_options({**BASE, "startingOffsets": "latest"})
    assert resolve_start(view, latest, committed=None, timestamp_offset=None) == 100


def test_offsets_outside_the_log_are_errors_with_the_range() -> None:
    options = parse_read_options(BASE)
    with pytest.raises(DataLoss) as lost:
        resolve_start(listing(), options, committed=5, timestamp_offset=None)
    assert lost.value.log_start_offset == 10
    lenient = parse_read_options({**BASE, "failOnDataLoss": "false"})
    assert resolve_start(listing(), lenient, committed=5, timestamp_offset=None) == 10
    with pytest.raises(OffsetOutOfRange) as beyond:
        resolve_start(listing(), options, committed=101, timestamp_offset=None)
    assert (beyond.value.oldest, beyond.value.newest) == (10, 100)
    ending = parse_read_options({**BASE, "endingOffsets": '{"orders": {"0": 500}}'})
    with pytest.raises(OffsetOutOfRange):
        resolve_end(listing(), ending, timestamp_offset=None)
    assert resolve_end(listing(), options, timestamp_offset=None) == 100


@given(st.integers(0, 120), st.integers(0, 120), st.integers(1, 50))
def test_tasks_cover_the_range_exactly_once(start: int, length: int, split: int) -> None:
    options = parse_read_options({**BASE, "maxRecordsPerPartition": str(split)})
    end = start + length
    view = listing(hw=300, log_start=0)
    tasks = plan_tasks([view], Ranges({("orders", 0): (start, end)}), options, OffsetBounds())
    covered = [o for task in tasks for o in range(task.start, task.end)]
    assert covered == list(range(start, end))
    for task in tasks:
        assert task.end - task.start <= split
        assert task.files is not None and task.files.segments
        assert task.files.segments[0].base_offset <= task.start


def test_compacted_latest_keeps_one_task_per_partition() -> None:
    options = parse_read_options({**BASE, "maxRecordsPerPartition": "5", "compacted": "latest"})
    tasks = plan_tasks([listing()], Ranges({("orders", 0): (10, 100)}), options, OffsetBounds())
    assert [(t.start, t.end, t.compacted_latest) for t in tasks] == [(10, 100, True)]


def test_filters_this_source_applies_are_taken() -> None:
    moment = datetime(2026, 1, 1, tzinfo=UTC)
    bounds, rest = push_filters(OffsetBounds(), [
        EqualTo(("partition",), 1), GreaterThanOrEqual(("offset",), 20), LessThan(("offset",), 40),
        GreaterThan(("timestamp",), moment), In(("stream",), ("a", "b")),
        EqualTo(("value",), b"x"), GreaterThan(("partition",), 0)])
    assert bounds.partitions == frozenset({1}) and bounds.streams == frozenset({"a", "b"})
    assert (bounds.low, bounds.high) == (20, 40)
    assert bounds.timestamp_min_ms == int(moment.timestamp() * 1000) + 1
    assert [type(f).__name__ for f in rest] == ["EqualTo", "GreaterThan"]
    assert rest[0].attribute == ("value",)


def test_a_compacted_read_takes_only_filters_choosing_partitions() -> None:
    bounds, rest = push_filters(OffsetBounds(), [
        EqualTo(("partition",), 1), GreaterThanOrEqual(("offset",), 20),
        GreaterThan(("timestamp",), datetime(2026, 1, 1, tzinfo=UTC))], rows=False)
    assert bounds == OffsetBounds(partitions=frozenset({1}))
    assert [type(f).__name__ for f in rest] == ["GreaterThanOrEqual", "GreaterThan"]


@given(st.dictionaries(st.integers(0, 5), st.tuples(st.integers(0, 100), st.integers(0, 100)),
                       min_size=1), st.integers(1, 300))
def test_the_trigger_cap_takes_at_most_the_limit(spans: dict[int, tuple[int, int]],
                                                  limit: int) -> None:
    start = {("s", p): min(a, b) for p, (a, b) in spans.items()}
    latest = {("s", p): max(a, b) for p, (a, b) in spans.items()}
    end = cap(start, latest, limit)
    moved = sum(end[k] - start[k] for k in start)
    backlog = sum(latest[k] - start[k] for k in start)
    assert all(start[k] <= end[k] <= latest[k] for k in start)
    assert moved == backlog if backlog <= limit else moved <= limit + len(start)
    assert from_json(offsets_json(end)) == end


def test_writes_are_idempotent_unless_turned_off() -> None:
    base = {"brokers": "127.0.0.1:1", "stream": "out"}
    assert parse_write_options(base).idempotent is True
    assert parse_write_options({**base, "idempotent": "false"}).idempotent is False
    with pytest.raises(InvalidSparkOption):
        parse_write_options({**base, "idempotent": "maybe"})


def test_each_task_attempt_and_micro_batch_has_its_own_producer_session() -> None:
    from jetstream.idempotence.headers import PRODUCER_ID
    from jetstream.spark.writer import STREAMING_BATCH_ID, _session

    class Task:
        def __init__(self, partition: int, attempt: int, batch: str | None) -> None:
            self.partition, self.attempt, self.batch = partition, attempt, batch

        def partitionId(self) -> int:
            return self.partition

        def attemptNumber(self) -> int:
            return self.attempt

        def getLocalProperty(self, key: str) -> str | None:
            return self.batch if key == STREAMING_BATCH_ID else None

    write = "0123456789abcdef"
    assert _session(write, Task(3, 0, None)) == (f"spark-{write}-3", 0)  # type: ignore[arg-type]
    assert _session(write, Task(3, 2, None)) == (f"spark-{write}-3", 2)  # type: ignore[arg-type]
    batches = {_session(write, Task(0, 0, str(b)))[0] for b in (0, 1)}  # type: ignore[arg-type]
    assert len(batches) == 2
    longest = _session(write, Task(2**31 - 1, 0, str(2**63 - 1)))  # type: ignore[arg-type]
    assert PRODUCER_ID.fullmatch(longest[0])
