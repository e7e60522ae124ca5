"""The pure helpers of bench/scale.py (bench/scale_figures.py): CPU over a window, a process's
status, which partitions are served on either system, the headline figures of a sweep and
its targets."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from bench.scale_figures import (
    check_targets,
    cpu_pct,
    failures,
    flat_figures,
    js_unserved,
    led_partitions,
    not_led,
    parse_counts,
    parse_status,
    short_isr,
    table,
)
from jetstream.client import StreamInfo


def test_cpu_over_the_window_and_its_slices() -> None:
    figures = cpu_pct([0.0, 2.0, 4.0, 6.0], [10.0, 10.02, 10.02, 10.08])
    assert figures["cpu_pct"] == pytest.approx(100 * 0.08 / 6)
    assert figures["cpu_pct_slices"] == [1.0, 0.0, 3.0]
    assert figures["cpu_pct_slice_median"] == pytest.approx(1.0)


def test_rss_and_threads_from_proc_status() -> None:
    text = "Name:\tpython\nVmPeak:\t  9000 kB\nVmRSS:\t   68524 kB\nThreads:\t4\n"
    assert parse_status(text) == (68524, 4)


def stream(name: str, *isrs: list[int]) -> StreamInfo:
    """A stream whose partition i has ISR isrs[i], replicas 0, 1, 2."""
    return StreamInfo.from_dict({"name": name, "subject": f"scale.{name}", "partitions": [
        {"partition": i, "leader": 0, "leader_epoch": 0, "replicas": [0, 1, 2], "isr": isr}
        for i, isr in enumerate(isrs)]})


def test_a_partition_is_led_once_a_broker_runs_its_leader_role() -> None:
    metrics = ("# TYPE jetstream_partition_log_end_offset gauge\n"
               'jetstream_partition_log_end_offset{stream="a",partition="0"} 7\n'
               'jetstream_partition_high_watermark{stream="b",partition="0"} 0\n'
               'jetstream_partition_log_end_offset{stream="m",partition="12"} 0\n')
    led = led_partitions(metrics)
    assert led == {("a", 0), ("m", 12)}
    assert not_led(led, {"a": 1}) == []
    assert not_led(led, {"a": 1, "b": 1, "m": 13})[:2] == ["b/0", "m/0"]
    assert len(not_led(led, {"m": 13})) == 12


def test_a_full_isr_holds_every_replica() -> None:
    streams = [stream("a", [0, 1, 2]), stream("b", [2, 1], [0, 1, 2])]
    assert short_isr(streams, {"a": 1}) == []
    assert short_isr(streams, {"a": 1, "b": 2}) == ["b/0 without [0]"]
    assert short_isr(streams, {"c": 1}) == ["c"]  # not in the metadata yet


def js_detail(name: str, leader: str | None, current: list[bool], replicas: int = 3,
              since: bool = True) -> dict[str, Any]:
    """A stream as /jsz?streams=true&config=true describes it (`since`: with the time its
    leader was elected, which only the leader's own report carries)."""
    cluster: dict[str, Any] = {"leader": leader, "replicas": [
        {"name": f"n{i}", "current": c} for i, c in enumerate(current)]}
    if since:
        cluster["leader_since"] = "2026-11-25T15:11:54.514203925Z"
    return {"name": name, "config": {"name": name, "num_replicas": replicas},
            "cluster": cluster}


def test_a_jetstream_stream_is_served_by_the_server_that_says_it_leads_it() -> None:
    reports = {
        "n1": [js_detail("a", "n1", [True, True]), js_detail("b", "n2", [True, True]),
               js_detail("p", "n1", [True], replicas=2)],
        "n2": [js_detail("a", "n1", [True, False]), js_detail("b", "n2", [True, False]),
               js_detail("c", None, [])],
    }
    assert js_unserved(reports, ["a", "p"], current=True) == []
    assert js_unserved(reports, ["b"], current=False) == []
    assert js_unserved(reports, ["b"], current=True) == ["b"]  # its leader sees one behind
    assert js_unserved(reports, ["c", "d"], current=False) == ["c", "d"]  # no leader; absent


def test_a_jetstream_server_just_started_leads_nothing_yet() -> None:
    # Before it has loaded the cluster's state, each server names itself every stream's
    # leader, without a leader_since.
    reports = {"n1": [js_detail("a", "n1", [], since=False)],
               "n2": [js_detail("a", "n2", [], since=False)]}
    assert js_unserved(reports, ["a"], current=False) == ["a"]


def side(idle_cpu: float, fds: int, create_p99_ms: float, publish_s: float,
         failover_s: float, restart_s: float, generator_s: float = 0.001,
         warm_s: float | None = None) -> dict[str, Any]:
    return {"idle": {"brokers": {"cpu_pct": {"median": idle_cpu, "max": idle_cpu},
                                 "rss_mib": {"median": 60.0, "max": 61.0},
                                 "fds": {"median": fds, "max": fds}},
                     "processes": {"nats": {"cpu_pct": 0.1}}},
            "create": {"p50_ms": create_p99_ms / 2, "p99_ms": create_p99_ms, "total_s": 1.0},
            "publish_each": {"wall_s": publish_s, "ack_p99_ms": publish_s * 1000}
            | ({} if warm_s is None else {"warm_wall_s": warm_s}),
            "generator": {"median_wall_s": generator_s},
            "failover": {"failover_s": failover_s}, "restart": {"led_s": restart_s}}


def test_headline_figures_growth_and_targets() -> None:
    at_peer_fsync = {"publish_each_fsync_as_peer": {"wall_s": 0.04}}
    runs = {
        100: {"ours": side(1.0, 400, 20.0, 0.10, 1.0, 2.0) | at_peer_fsync,
              "jetstream": side(0.5, 200, 60.0, 0.05, 6.0, 1.0)},
        1000: {"ours": side(4.0, 1200, 28.0, 0.50, 1.5, 5.0, warm_s=0.45),
               "jetstream": side(5.0, 900, 65.0, 0.60, 7.0, 1.0, generator_s=0.3,
                                 warm_s=0.15),
               "ours_one_stream": {"error": "create: InvalidStreamConfig: ..."}},
    }
    flat = flat_figures(runs)
    assert flat["idle_cpu_pct_1000"] == 4.0
    assert flat["idle_cpu_vs_js_1000"] == pytest.approx(0.8)
    assert flat["publish_each_vs_js_100"] == pytest.approx(2.0)
    assert flat["publish_each_fsync_as_js_vs_js_100"] == pytest.approx(0.8)
    assert flat["publish_each_fsync_as_js_vs_js_1000"] is None  # not measured there
    assert flat["fds_per_replica_1000"] == pytest.approx(1.2)
    assert flat["idle_cpu_ms_per_s_per_replica_1000"] == pytest.approx(0.04)
    assert flat["generator_headroom_1000"] == pytest.approx(0.5 / 0.3)  # the slower ceiling
    # The later rounds, beside the first: JetStream's first message costs it more.
    assert flat["publish_each_warm_vs_js_1000"] == pytest.approx(3.0)
    assert flat["publish_each_warm_vs_js_100"] is None  # not measured there
    assert flat["generator_headroom_warm_1000"] == pytest.approx(0.15 / 0.3)
    assert flat["create_p99_ms_growth"] == pytest.approx(1.4)
    assert flat["restart_s_growth"] == pytest.approx(2.5)
    assert flat["one_stream_create_s_1000"] is None  # a failed run leaves its figures out
    targets = check_targets(flat, [100, 1000], fd_budget=1280)
    assert targets == {
        "idle_cpu_1000_at_most_5pct": True, "idle_cpu_1000_at_most_js": True,
        "create_p99_growth_at_most_1_5": True,
        "publish_each_at_most_js": False,  # 2.0x at 100
        "publish_each_warm_at_most_js": False,  # 3.0x at 1,000
        "fds_within_budget": True, "failover_growth_at_most_2": True,
        "restart_growth_at_most_2": False, "generator_headroom_at_least_2": False}
    results = {"counts": [100, 1000], "fd_budget": 1280, "targets": targets,
               "runs": {str(n): sides for n, sides in runs.items()}, **flat}
    assert "FAILED 1000 ours_one_stream: create: InvalidStreamConfig" in table(results)
    assert "the same, ours fsync interval (s)" in table(results)


def test_failures_of_runs_and_of_their_phases() -> None:
    runs = {"100": {"ours": {"failover": {"failover_s": 1.0, "error": "TimeoutError: x"},
                             "restart": {"led_s": 2.0}},
                    "jetstream": {"error": "create: y"}},
            "1000": {"ours": {"publish_each": {"errors": 0, "first_errors": []}}},
            "3000": {"ours": {"publish_each_fsync_as_peer": {
                "errors": 2, "first_errors": ["s1: NotEnoughReplicas()", "s2: x"]}}}}
    assert failures(runs) == [
        "100 ours failover: TimeoutError: x", "100 jetstream: create: y",
        ("3000 ours publish_each_fsync_as_peer: 2 publishes failed, first: "
         "['s1: NotEnoughReplicas()']")]
    assert failures(runs, "1000") == []


def test_a_target_without_figures_is_not_measured() -> None:
    targets = check_targets({}, [100], fd_budget=1280)
    assert set(targets.values()) == {None}


def test_counts() -> None:
    assert parse_counts("1000,100, 1000") == (100, 1000)
    for bad in ("", "0,100", "x"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_counts(bad)


async def test_publish_each_reports_the_first_round_and_the_warm_median() -> None:
    """Rounds of one publish to each: the first round's figures (the first message of every
    stream), the median of the later rounds beside them, every round's wall time, and a
    failed publish counted, not timed."""
    import asyncio

    from bench.scale import publish_each

    delays = iter([0.06, 0.01, 0.03, 0.05, 0.02, 0.04])
    round_delay = [0.0]
    seen = [0]

    async def publish(subject: str) -> None:
        if seen[0] % 2 == 0:  # the first of the round's two publishes sets its pace
            round_delay[0] = next(delays)
        seen[0] += 1
        if subject == "bad":
            raise RuntimeError("refused")
        await asyncio.sleep(round_delay[0])

    out = await publish_each(publish, ["good", "bad"], [], rounds=6)
    walls = out["round_walls_s"]
    assert out["rounds"] == 6 and len(walls) == 6
    assert out["wall_s"] == walls[0] >= 0.06 and out["ack_p50_ms"] >= 60.0
    # The later rounds took 0.01, 0.03, 0.05, 0.02, 0.04 s: the median is the third fastest.
    assert sorted(walls[1:]).index(out["warm_wall_s"]) == 2
    assert out["warm_wall_s"] >= 0.03 and out["warm_ack_p50_ms"] >= 30.0
    assert out["errors"] == 6 and out["first_errors"][0] == "bad: RuntimeError('refused')"
