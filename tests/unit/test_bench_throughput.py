"""The pure parts of bench/throughput.py (bench/throughput_figures.py): cell names, ratios to
JetStream, CPU per message, the generator's headroom, the headline keys, the targets, the
table, the plot and the summary of a py-spy profile."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.throughput import QUICK, layout
from bench.throughput_figures import (
    cell_key,
    check_targets,
    compare,
    cpu_per_msg_us,
    generator_figures,
    generator_headroom,
    headline,
    plot,
    summarize_profile,
    table,
)

#: The keys the quick run's last JSON line must hold.
REQUIRED = ("generator_headroom", "r1_ratio_inflight_16", "r1_ratio_inflight_256",
            "r3_ratio_inflight_16", "r3_ratio_inflight_256", "r1_p50_ratio_inflight_1",
            "r3_p50_ratio_inflight_1", "cpu_per_msg_ratio_r1_256",
            "durable_r1_ratio_inflight_256", "e2e_p50_vs_js_push_r1", "e2e_p99_vs_js_push_r1",
            "e2e_p50_vs_js_push_r3")


def side(rate: float, p50: float = 1.0, p99: float = 2.0, cpu: float = 10.0) -> dict[str, Any]:
    return {"msgs_per_s": rate, "ack_p50_ms": p50, "ack_p99_ms": p99, "ack_p999_ms": p99 * 2,
            "cpu_per_msg_us": cpu}


def quick_cells(ours_rate: float, js_rate: float) -> dict[str, Any]:
    return {cell_key(r, fsync, 128, n): compare(side(ours_rate * n, p50=0.3, cpu=12.0),
                                                side(js_rate * n, p50=0.2, cpu=8.0))
            for r in (1, 3) for fsync in ("lazy", "durable") for n in QUICK.inflights}


E2E = {f"r{r}": {"ours_subscribe": {"p50_ms": 1.0, "p99_ms": 3.0},
                 "js_push": {"p50_ms": 0.5, "p99_ms": 1.0},
                 "js_pull": {"p50_ms": 0.7, "p99_ms": 1.5}} for r in (1, 3)}


def test_cell_names_and_the_ratios_of_a_cell() -> None:
    assert cell_key(3, "durable", 4096, 256) == "r3_durable_4096b_inflight_256"
    cell = compare(side(50_000, p50=0.4, cpu=12), side(100_000, p50=0.2, cpu=8))
    assert cell["ratio"] == 0.5 and cell["p50_ratio"] == 2.0 and cell["p99_ratio"] == 1.0
    assert cell["cpu_per_msg_ratio"] == 1.5
    assert compare({"msgs_per_s": 1.0}, {"msgs_per_s": 0.0})["ratio"] is None


def test_cpu_per_acked_message_over_every_process() -> None:
    figures = cpu_per_msg_us({"broker0": 1.0, "nats": 2.0}, {"broker0": 1.5, "nats": 2.25},
                             acked=50_000)
    assert figures["cpu_per_msg_us"] == pytest.approx(15.0)
    assert figures["cpu_per_msg_us_by_process"] == pytest.approx({"broker0": 10.0, "nats": 5.0})
    assert cpu_per_msg_us({"a": 1.0}, {"a": 2.0}, acked=0)["cpu_per_msg_us"] is None


def test_headroom_is_against_the_fastest_side_of_any_cell() -> None:
    cells = quick_cells(100.0, 200.0)  # fastest: JetStream at 256 in flight, 51,200 msg/s
    assert generator_headroom(102_400.0, cells) == pytest.approx(2.0)
    assert generator_headroom(1.0, {}) is None
    figures = generator_figures({"msgs_per_s": 102_400.0, "acked": 300_000,
                                 "generator_cpu_s": 0.5}, cells)
    assert figures["generator_headroom"] == pytest.approx(2.0)
    assert figures["generator_headroom_vs_ours"] == pytest.approx(4.0)  # ours peaks at 25,600
    assert figures["generator_msgs_per_cpu_s"] == pytest.approx(600_000)
    assert figures["generator_cpu_headroom"] == pytest.approx(600_000 / 51_200)


def test_the_headline_holds_every_key_the_quick_run_promises() -> None:
    cells = quick_cells(100.0, 200.0)
    figures = headline(cells, E2E, 3.0)
    for key in REQUIRED:
        assert figures[key] is not None, key
    assert figures["r1_ratio_inflight_16"] == 0.5
    assert figures["r3_p50_ratio_inflight_1"] == pytest.approx(1.5)
    assert figures["cpu_per_msg_ratio_r1_256"] == pytest.approx(1.5)
    assert figures["e2e_p50_vs_js_push_r1"] == 2.0 and figures["e2e_p99_vs_js_push_r3"] == 3.0
    assert figures["r1_ratio_inflight_4096"] is None  # not in a quick run
    assert not figures["generator_bottleneck"]


def test_targets_cell_by_cell() -> None:
    cells = quick_cells(100.0, 80.0)  # ours 1.25x everywhere, p50 1.5x, CPU 1.5x
    checked = check_targets(cells, E2E, 5.0)
    assert all(b["passed"] == bool(b["met"]) for b in checked)  # the generator had headroom
    bars = {b["target"]: b["met"] for b in checked}
    assert bars["generator_headroom"] is True
    assert bars["r1_lazy_128b_inflight_256 ratio"] is True
    assert bars["r1_durable_128b_inflight_256 ratio"] is False  # durable R1 must stay >= 5x
    assert bars["r3_lazy_128b_inflight_16 ratio"] is True
    assert bars["r1_lazy_128b_inflight_1 ack p50 ratio"] is True   # 1.5 <= 1.5
    assert bars["r3_lazy_128b_inflight_1 ack p50 ratio"] is True   # 1.5 <= 2
    assert bars["r1_lazy_128b_inflight_256 CPU per message ratio"] is False
    assert bars["e2e r1 p50 vs JetStream push"] is False


def test_a_generator_without_headroom_fails_every_rate_bar() -> None:
    cells = quick_cells(100.0, 80.0)
    bars = check_targets(cells, E2E, 1.5)
    rate_bars = [b for b in bars if "ratio" in b["target"] and "CPU" not in b["target"]
                 and not b["target"].startswith("e2e")]
    assert rate_bars and not any(b["passed"] for b in rate_bars)
    assert any(b["met"] for b in rate_bars)  # the comparison itself is still reported
    cpu = next(b for b in bars if "CPU" in b["target"])
    assert cpu["passed"] == cpu["met"]  # CPU per message does not depend on the generator
    figures = headline(cells, E2E, 1.5)
    results = {"cells": cells, "e2e": E2E, "e2e_rate": 500, "noop": {"msgs_per_s": 1.0},
               "targets": bars, **figures}
    assert figures["generator_bottleneck"]
    assert "THE GENERATOR IS THE BOTTLENECK" in table(results)


def test_table_and_plot(tmp_path: Path) -> None:
    cells = quick_cells(100.0, 80.0)
    results = {"cells": cells, "e2e": E2E, "e2e_rate": 500, "noop": {"msgs_per_s": 9e5},
               "inflights": list(QUICK.inflights), "targets": check_targets(cells, E2E, 5.0),
               **headline(cells, E2E, 5.0)}
    text = table(results)
    assert "r3_durable_128b_inflight_256" in text and "1.25" in text
    assert "missed e2e r1 p50 vs JetStream push" in text
    path = tmp_path / "plot.png"
    assert plot(results, path) == f"plot: {path}"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_layout_of_connections() -> None:
    assert layout(1) == (1, 1) and layout(16) == (1, 16)
    assert layout(256) == (4, 64) and layout(4096) == (4, 1024)


def test_profile_summary_from_collapsed_stacks() -> None:
    loop = "MainThread;run (asyncio/base_events.py:600);_run_once (asyncio/base_events.py:1900)"
    collapsed = "\n".join([
        f"{loop};append (jetstream/server/partition.py:120) 30",
        f"{loop};encode_ack (jetstream/protocol/ack.py:80) 10",
        "MainThread;run (asyncio/base_events.py:600);EpollSelector.select (selectors.py:468) 60",
        "garbage line",
    ])
    summary = summarize_profile(collapsed)
    assert summary["samples"] == 100
    assert summary["self"][0] == ["EpollSelector.select (selectors.py)", 0.6]
    assert ["append (partition.py)", 0.3] in summary["self"]
    assert ["partition.py", 0.3] in summary["files"]
    assert summary["waiting"] == 0.6  # the selector's share
    inclusive = dict(summary["inclusive"])  # the event loop's own frames left out
    assert inclusive == {"append (partition.py)": 0.3, "encode_ack (ack.py)": 0.1,
                         "EpollSelector.select (selectors.py)": 0.6}
    assert summarize_profile("")["self"] == []
