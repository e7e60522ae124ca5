"""The pure parts of the load generator's Python side: the log-linear histogram (buckets,
percentiles, merge), the argv of each generator process and the merge of their outputs, and
the error when no C compiler can build it."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import bench.loadgen as loadgen
from bench.loadgen import Load, command, merge_runs
from bench.loadgen.histogram import BITS, Histogram, bucket_bounds, bucket_of


@given(st.integers(min_value=0, max_value=2**62))
def test_a_value_falls_inside_its_bucket_and_the_bucket_is_narrow(value: int) -> None:
    lowest, highest = bucket_bounds(bucket_of(value))
    assert lowest <= value <= highest
    assert highest - lowest <= max(0, lowest >> BITS)  # within 1/128 of the value


def test_buckets_are_ordered_and_contiguous() -> None:
    previous_highest = -1
    for index in range(40 * (1 << BITS)):
        lowest, highest = bucket_bounds(index)
        assert lowest == previous_highest + 1
        assert bucket_of(lowest) == bucket_of(highest) == index
        previous_highest = highest


def test_percentiles_of_known_values() -> None:
    histogram = Histogram()
    for value in range(1, 1001):
        histogram.record(value * 1000)  # 1 µs .. 1 ms
    assert histogram.total == 1000
    assert histogram.value_at(50) == pytest.approx(500_000, rel=1 / 128)
    assert histogram.value_at(99) == pytest.approx(990_000, rel=1 / 128)
    assert histogram.value_at(99.9) == pytest.approx(999_000, rel=1 / 128)
    assert histogram.value_at(100) == histogram.max() >= 1_000_000
    assert histogram.value_at(50) >= 500_000  # the bucket's highest value: never below
    assert Histogram().value_at(50) == 0


def test_merging_equals_recording_everything_in_one() -> None:
    rng = random.Random(7)
    values = [rng.randrange(10**9) for _ in range(5000)]
    parts = [Histogram(), Histogram(), Histogram()]
    for i, value in enumerate(values):
        parts[i % 3].record(value)
    whole = Histogram()
    for value in values:
        whole.record(value)
    merged = Histogram.merged(parts)
    assert merged.counts == whole.counts == parts[0].merge(parts[1]).merge(parts[2]).counts
    for p in (50, 90, 99, 99.9):
        assert merged.value_at(p) == whole.value_at(p)


def test_json_round_trip_and_other_precisions_refused() -> None:
    histogram = Histogram({3: 2, 1500: 7})
    assert Histogram.from_json(histogram.to_json()).counts == histogram.counts
    with pytest.raises(ValueError, match="sub-bucket bits"):
        Histogram.from_json({"sub_bucket_bits": 5, "unit": "ns", "counts": []})


def test_counts_and_rates_are_shared_out_over_processes() -> None:
    load = Load("s", size=64, inflight=8, conns=2, processes=3, count=1000, rate=300.0)
    argvs = [command(Path("/bin/lg"), "127.0.0.1:4222", load, i, 42) for i in range(3)]
    counts = [int(a[a.index("--count") + 1]) for a in argvs]
    assert counts == [334, 333, 333]
    assert all(a[a.index("--rate") + 1] == "100.0" for a in argvs)
    assert all(a[a.index("--start-at") + 1] == "42" for a in argvs)
    assert "--duration" not in argvs[0] and "--stamp" not in argvs[0]
    timed = command(Path("/bin/lg"), "u", Load("s", duration_s=2.0, warmup_s=0.5,
                                               stamp=True), 0, 1)
    assert timed[timed.index("--duration") + 1] == "2.0" and "--stamp" in timed
    assert Load("s", inflight=16, conns=4, processes=2, count=8).total_inflight == 128


def test_listed_messages_are_shared_out_over_processes(tmp_path: Path) -> None:
    """Each process starts where the shares of those before it end; the file holds each
    message's subject, header block and payload behind their lengths."""
    path = tmp_path / "m"
    assert loadgen.write_messages(path, [("a.b", b"xyz", None), ("c", b"", {"K": "v"})]) == 2
    assert path.read_bytes() == (b"\0\x03a.b" + b"\0\0\0\0" + b"\0\0\0\x03xyz"
                                 + b"\0\x01c" + b"\0\0\0\x12NATS/1.0\r\nK: v\r\n\r\n"
                                 + b"\0\0\0\0")
    load = Load("s", conns=2, processes=3, count=10, messages=path)
    argvs = [command(Path("/bin/lg"), "u", load, i, 0) for i in range(3)]
    assert [a[a.index("--first-message") + 1] for a in argvs] == ["0", "4", "7"]
    assert all(a[a.index("--messages") + 1] == str(path) for a in argvs)
    with pytest.raises(ValueError):
        Load("s", count=1, stamp=True, size=64, messages=path)


@pytest.mark.parametrize("bad", [
    {"count": None}, {"count": 10, "duration_s": 1.0}, {"count": 1, "conns": 2},
    {"inflight": 0}])
def test_a_load_says_what_it_is(bad: dict[str, object]) -> None:
    options: dict[str, object] = {"count": 10, **bad}
    with pytest.raises(ValueError):
        Load("s", **options)  # type: ignore[arg-type]


def generator_output(start: int, end: int, counted: int, values: list[int]) -> dict[str, object]:
    histogram = Histogram()
    for value in values:
        histogram.record(value)
    return {"start_ns": start, "end_ns": end, "counted": counted, "acked": counted + 1,
            "sent": counted + 1, "errors": 1, "no_responders": 0, "timed_out": False,
            "cpu_user_s": 0.25, "cpu_sys_s": 0.5, "histogram": histogram.to_json()}


def test_the_processes_outputs_merge_into_one_result() -> None:
    runs = [generator_output(1_000_000_000, 3_000_000_000, 100, [1000] * 100),
            generator_output(1_500_000_000, 5_000_000_000, 300, [9000] * 300)]
    result = merge_runs(runs, size=1000)
    assert result.messages == 400 and result.acked == 402 and result.errors == 2
    assert result.elapsed_s == pytest.approx(4.0)  # the earliest start to the latest end
    assert result.msgs_per_s == pytest.approx(100.0)
    assert result.mb_per_s == pytest.approx(0.1)
    assert result.generator_cpu_s == pytest.approx(1.5)
    assert result.histogram.total == 400
    assert result.histogram.value_at(50) == pytest.approx(9000, rel=1 / 128)
    figures = result.figures()
    assert figures["ack_p50_ms"] == pytest.approx(0.009, rel=1 / 128)
    with pytest.raises(ValueError):
        merge_runs([], size=1)


def test_no_compiler_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loadgen, "BINARY", tmp_path / "build" / "loadgen")
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CC", "no-such-cc")
    with pytest.raises(loadgen.LoadgenUnavailable, match="build-essential"):
        loadgen.ensure_built()
