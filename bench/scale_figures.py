"""The pure half of bench/scale.py: which partitions are served, the figures of a process
and of a run, the headline figures of a sweep, its targets, its table and its plot.

Nothing here starts a process or opens a socket: a run's raw results (nested dicts, as the
JSON holds them) come in, figures come out, so they can be checked with made-up numbers.
"""

from __future__ import annotations

import argparse
import importlib
import re
import statistics
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.common import JsonObject, percentile
from jetstream.client import StreamInfo

TARGET_IDLE_CPU_PCT = 5.0
TARGET_CREATE_P99_GROWTH = 1.5
TARGET_PUBLISH_EACH_VS_JS = 1.0
TARGET_RECOVERY_GROWTH = 2.0
TARGET_GENERATOR_HEADROOM = 2.0


def latency_summary(samples_s: Sequence[float]) -> JsonObject:
    return {"p50_ms": percentile(samples_s, 50) * 1000, "p99_ms": percentile(samples_s, 99) * 1000,
            "max_ms": max(samples_s, default=0.0) * 1000, "count": len(samples_s)}


def cpu_pct(times: Sequence[float], cpu: Sequence[float]) -> JsonObject:
    """One process's CPU over readings at `times` (seconds) of its CPU seconds `cpu`, in % of
    one core: over the whole window (the figure: /proc counts in 10 ms ticks, so a longer
    span is finer) and in each slice between readings (to see a neighbour's burst)."""
    assert len(times) == len(cpu) >= 2
    slices = [100 * (cpu[i + 1] - cpu[i]) / (times[i + 1] - times[i])
              for i in range(len(times) - 1)]
    return {"cpu_pct": 100 * (cpu[-1] - cpu[0]) / (times[-1] - times[0]),
            "cpu_pct_slice_median": statistics.median(slices),
            "cpu_pct_slices": [round(s, 3) for s in slices]}


def parse_status(text: str) -> tuple[int, int]:
    """(VmRSS in KiB, threads) from the text of /proc/PID/status."""
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]), int(fields["Threads"])


def spread(values: Sequence[float]) -> JsonObject:
    return {"median": statistics.median(values), "max": max(values)}


#: A line of a broker's /metrics for each partition whose leader role it runs.
_LEADER_METRIC = re.compile(
    r'^jetstream_partition_log_end_offset\{stream="([^"]+)",partition="(\d+)"\}', re.M)


def led_partitions(metrics: str) -> set[tuple[str, int]]:
    """(stream, partition) of every leader role a broker runs, from its /metrics text."""
    return {(stream, int(partition)) for stream, partition in _LEADER_METRIC.findall(metrics)}


def not_led(led: Collection[tuple[str, int]], expected: Mapping[str, int]) -> list[str]:
    """The partitions of `expected` (stream -> partition count) no broker leads."""
    return [f"{name}/{p}" for name, count in expected.items() for p in range(count)
            if (name, p) not in led]


def short_isr(streams: Sequence[StreamInfo], expected: Mapping[str, int]) -> list[str]:
    """What of `expected` the metadata does not show with every replica in the ISR: a
    stream it lacks, or a partition whose ISR is short of its replicas (and which)."""
    by_name = {stream.name: stream for stream in streams}
    missing = [name for name in expected if name not in by_name]
    return missing + [f"{p.stream}/{p.partition} without {sorted(set(p.replicas) - set(p.isr))}"
                      for name in expected if name in by_name
                      for p in by_name[name].partitions if set(p.isr) != set(p.replicas)]


def js_unserved(reports: Mapping[str, Sequence[Mapping[str, Any]]], expected: Collection[str],
                *, current: bool) -> list[str]:
    """What of the `expected` streams JetStream does not serve yet. `reports` holds each
    server's stream details (/jsz?streams=true&config=true) by server name; a stream is
    served once a server reports itself its leader with the time it became leader and, with
    `current`, that leader sees every other replica current (a follower's view of the other
    follower means nothing). A server that has just started reports itself the leader of
    every stream it holds, with no `leader_since`, until it has loaded the cluster's state:
    that claim does not count."""

    def leads(server: str, cluster: Mapping[str, Any]) -> bool:
        return cluster.get("leader") == server and bool(cluster.get("leader_since"))

    led = {detail["name"]: detail for server, details in reports.items() for detail in details
           if leads(server, detail.get("cluster") or {})}
    missing = []
    for name in expected:
        detail = led.get(name)
        if detail is None:
            missing.append(name)
            continue
        peers = detail["cluster"].get("replicas") or []
        replicas = int((detail.get("config") or {}).get("num_replicas") or 1)
        if current and (len(peers) != replicas - 1 or not all(p.get("current") for p in peers)):
            missing.append(name)
    return missing


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def _get(run: JsonObject | None, *path: str) -> Any:
    """run[path[0]][path[1]]... or None where a step is missing (a failed phase)."""
    value: Any = run
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


def count_figures(n: int, sides: Mapping[str, JsonObject]) -> JsonObject:
    """The headline figures of one count; None where a phase did not finish."""
    ours, js, one = sides.get("ours"), sides.get("jetstream"), sides.get("ours_one_stream")
    f = {
        "idle_cpu_pct": _get(ours, "idle", "brokers", "cpu_pct", "median"),
        "idle_cpu_max_pct": _get(ours, "idle", "brokers", "cpu_pct", "max"),
        "js_idle_cpu_pct": _get(js, "idle", "brokers", "cpu_pct", "median"),
        "nats_idle_cpu_pct": _get(ours, "idle", "processes", "nats", "cpu_pct"),
        "rss_mib": _get(ours, "idle", "brokers", "rss_mib", "median"),
        "js_rss_mib": _get(js, "idle", "brokers", "rss_mib", "median"),
        "fds": _get(ours, "idle", "brokers", "fds", "max"),
        "js_fds": _get(js, "idle", "brokers", "fds", "max"),
        "create_p50_ms": _get(ours, "create", "p50_ms"),
        "create_p99_ms": _get(ours, "create", "p99_ms"),
        "create_total_s": _get(ours, "create", "total_s"),
        "js_create_p50_ms": _get(js, "create", "p50_ms"),
        "js_create_p99_ms": _get(js, "create", "p99_ms"),
        "js_create_total_s": _get(js, "create", "total_s"),
        "publish_each_s": _get(ours, "publish_each", "wall_s"),
        "publish_each_p99_ms": _get(ours, "publish_each", "ack_p99_ms"),
        "publish_each_fsync_as_js_s": _get(ours, "publish_each_fsync_as_peer", "wall_s"),
        "js_publish_each_s": _get(js, "publish_each", "wall_s"),
        "js_publish_each_p99_ms": _get(js, "publish_each", "ack_p99_ms"),
        "publish_each_warm_s": _get(ours, "publish_each", "warm_wall_s"),
        "publish_each_warm_p99_ms": _get(ours, "publish_each", "warm_ack_p99_ms"),
        "publish_each_fsync_as_js_warm_s": _get(ours, "publish_each_fsync_as_peer",
                                                "warm_wall_s"),
        "js_publish_each_warm_s": _get(js, "publish_each", "warm_wall_s"),
        "js_publish_each_warm_p99_ms": _get(js, "publish_each", "warm_ack_p99_ms"),
        "metadata_failover_s": _get(ours, "failover", "failover_s"),
        "js_metadata_failover_s": _get(js, "failover", "failover_s"),
        "restart_s": _get(ours, "restart", "led_s"),
        "js_restart_s": _get(js, "restart", "led_s"),
        "one_stream_create_s": _get(one, "create", "total_s"),
        "one_stream_idle_cpu_pct": _get(one, "idle", "brokers", "cpu_pct", "median"),
        "one_stream_fds": _get(one, "idle", "brokers", "fds", "max"),
    }
    f["idle_cpu_vs_js"] = ratio(f["idle_cpu_pct"], f["js_idle_cpu_pct"])
    f["publish_each_vs_js"] = ratio(f["publish_each_s"], f["js_publish_each_s"])
    f["publish_each_fsync_as_js_vs_js"] = ratio(f["publish_each_fsync_as_js_s"],
                                                f["js_publish_each_s"])
    f["publish_each_warm_vs_js"] = ratio(f["publish_each_warm_s"], f["js_publish_each_warm_s"])
    f["publish_each_fsync_as_js_warm_vs_js"] = ratio(f["publish_each_fsync_as_js_warm_s"],
                                                     f["js_publish_each_warm_s"])
    # The load generator's ceiling: the slower of the two no-op runs (one beside each side),
    # against the faster side.
    ceilings = [t for t in (_get(ours, "generator", "median_wall_s"),
                            _get(js, "generator", "median_wall_s")) if t is not None]
    sides_s = [t for t in (f["publish_each_s"], f["publish_each_fsync_as_js_s"],
                           f["js_publish_each_s"]) if t is not None]
    f["generator_each_s"] = max(ceilings, default=None)
    f["generator_headroom"] = ratio(min(sides_s, default=None), f["generator_each_s"])
    warm_s = [t for t in (f["publish_each_warm_s"], f["publish_each_fsync_as_js_warm_s"],
                          f["js_publish_each_warm_s"]) if t is not None]
    f["generator_headroom_warm"] = ratio(min(warm_s, default=None), f["generator_each_s"])
    # Per replica: at N R3 partitions on three brokers, each broker holds N replicas.
    # (1 % of a core is 10 ms of CPU a second.)
    f["idle_cpu_ms_per_s_per_replica"] = ratio(
        None if f["idle_cpu_pct"] is None else f["idle_cpu_pct"] * 10, n)
    f["fds_per_replica"] = ratio(f["fds"], n)
    return {f"{name}_{n}": value for name, value in f.items()}


GROWTH = ("create_p99_ms", "metadata_failover_s", "restart_s", "js_create_p99_ms",
          "js_metadata_failover_s", "js_restart_s")


def flat_figures(runs: Mapping[int, Mapping[str, JsonObject]]) -> JsonObject:
    """The headline figures of each count, `<figure>_<count>`, and their growth from the
    smallest count to the largest."""
    flat: JsonObject = {}
    for n, sides in sorted(runs.items()):
        flat.update(count_figures(n, sides))
    counts = sorted(runs)
    if len(counts) >= 2:
        low, high = counts[0], counts[-1]
        for name in GROWTH:
            flat[f"{name}_growth"] = ratio(flat.get(f"{name}_{high}"), flat.get(f"{name}_{low}"))
        flat["growth_counts"] = [low, high]
    return flat


def check_targets(flat: Mapping[str, Any], counts: Sequence[int], fd_budget: int) -> JsonObject:
    """Each target of the issue: met (True), not met (False), or not measured (None). A
    target over every count looks at the counts that measured it."""

    def every(figure: str, test: Callable[[float], bool]) -> bool | None:
        values = [flat[f"{figure}_{n}"] for n in counts if flat.get(f"{figure}_{n}") is not None]
        return all(test(v) for v in values) if values else None

    def at_most(figure: str, limit: float) -> bool | None:
        value = flat.get(figure)
        return None if value is None else bool(value <= limit)

    return {
        "idle_cpu_1000_at_most_5pct": at_most("idle_cpu_pct_1000", TARGET_IDLE_CPU_PCT),
        "idle_cpu_1000_at_most_js": at_most("idle_cpu_vs_js_1000", 1.0),
        "create_p99_growth_at_most_1_5": at_most("create_p99_ms_growth",
                                                 TARGET_CREATE_P99_GROWTH),
        "publish_each_at_most_js": every("publish_each_vs_js",
                                         lambda r: r <= TARGET_PUBLISH_EACH_VS_JS),
        # Beside it, not the issue's: the later rounds, where JetStream's first-message
        # cost is gone.
        "publish_each_warm_at_most_js": every("publish_each_warm_vs_js",
                                              lambda r: r <= TARGET_PUBLISH_EACH_VS_JS),
        "fds_within_budget": every("fds", lambda f: f <= fd_budget),
        "failover_growth_at_most_2": at_most("metadata_failover_s_growth",
                                             TARGET_RECOVERY_GROWTH),
        "restart_growth_at_most_2": at_most("restart_s_growth", TARGET_RECOVERY_GROWTH),
        "generator_headroom_at_least_2": every("generator_headroom",
                                               lambda h: h >= TARGET_GENERATOR_HEADROOM),
    }


def parse_counts(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        counts = ()
    if not counts or counts[0] < 1:
        raise argparse.ArgumentTypeError(f"counts must be positive integers, not {text!r}")
    return counts


def failures(runs: Mapping[str, Mapping[str, JsonObject]], count: str | None = None
             ) -> list[str]:
    """Every error recorded in a sweep's runs (of one `count`, or all): a run's, or one of
    its phases' ("failover", "restart"), or publishes that failed in a publish phase, as
    `<count> <run> [<phase>]: <error>`."""
    found = []
    for n, sides in runs.items():
        for side, result in sides.items():
            if count is not None and n != count:
                continue
            if "error" in result:
                found.append(f"{n} {side}: {result['error']}")
            found += [f"{n} {side} {phase}: {result[phase]['error']}"
                      for phase in ("failover", "restart")
                      if isinstance(result.get(phase), dict) and "error" in result[phase]]
            found += [f"{n} {side} {phase}: {result[phase]['errors']} publishes failed, "
                      f"first: {result[phase].get('first_errors', [])[:1]}"
                      for phase in ("publish_each", "publish_each_fsync_as_peer")
                      if isinstance(result.get(phase), dict) and result[phase].get("errors")]
    return found


# -- the table and the plot --------------------------------------------------------------------


def _cell(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


ROWS = (  # label, our key, JetStream's key, digits
    ("idle CPU per broker, median (% core)", "idle_cpu_pct", "js_idle_cpu_pct", 2),
    ("idle CPU per broker, max (% core)", "idle_cpu_max_pct", None, 2),
    ("idle CPU of ours' nats-server (% core)", "nats_idle_cpu_pct", None, 2),
    ("RSS per broker, median (MiB)", "rss_mib", "js_rss_mib", 0),
    ("fds per broker, max", "fds", "js_fds", 0),
    ("create p50 (ms)", "create_p50_ms", "js_create_p50_ms", 1),
    ("create p99 (ms)", "create_p99_ms", "js_create_p99_ms", 1),
    ("create, all (s)", "create_total_s", "js_create_total_s", 1),
    ("one publish to each, wall (s)", "publish_each_s", "js_publish_each_s", 3),
    ("one publish to each, ack p99 (ms)", "publish_each_p99_ms", "js_publish_each_p99_ms", 1),
    ("the same, ours fsync interval (s)", "publish_each_fsync_as_js_s", "js_publish_each_s",
     3),
    ("again, warm: median round (s)", "publish_each_warm_s", "js_publish_each_warm_s", 3),
    ("again, warm: ack p99 (ms)", "publish_each_warm_p99_ms", "js_publish_each_warm_p99_ms",
     1),
    ("again, warm, ours fsync interval (s)", "publish_each_fsync_as_js_warm_s",
     "js_publish_each_warm_s", 3),
    ("metadata failover, kill -> create (s)", "metadata_failover_s", "js_metadata_failover_s",
     2),
    ("whole-cluster restart -> all led (s)", "restart_s", "js_restart_s", 2),
    ("one stream of N: create (s)", "one_stream_create_s", None, 2),
    ("one stream of N: idle CPU per broker (%)", "one_stream_idle_cpu_pct", None, 2),
    ("one stream of N: fds per broker, max", "one_stream_fds", None, 0),
)


def table(r: JsonObject) -> str:
    lines = []
    for n in r["counts"]:
        lines.append(f"{n:>5} R3 partitions{'':25} {'ours':>10} {'JetStream':>10} {'ratio':>7}")
        for label, key, js_key, digits in ROWS:
            ours_value = r.get(f"{key}_{n}")
            js_value = r.get(f"{js_key}_{n}") if js_key else None
            lines.append(f"  {label:40} {_cell(ours_value, digits):>10} "
                         f"{_cell(js_value, digits):>10} "
                         f"{_cell(ratio(ours_value, js_value)):>7}")
        lines.append(f"  load generator: the same publishes as no-op requests "
                     f"{_cell(r.get(f'generator_each_s_{n}'), 3)} s, headroom "
                     f"{_cell(r.get(f'generator_headroom_{n}'))}x "
                     f"(warm {_cell(r.get(f'generator_headroom_warm_{n}'))}x)")
        lines += [f"  FAILED {failure[:300]}" for failure in failures(r["runs"], str(n))]
        lines.append("")
    growth = r.get("growth_counts")
    if growth:
        lines.append(f"growth {growth[0]} -> {growth[1]}: create p99 "
                     f"{_cell(r.get('create_p99_ms_growth'))}x (JetStream "
                     f"{_cell(r.get('js_create_p99_ms_growth'))}x), failover "
                     f"{_cell(r.get('metadata_failover_s_growth'))}x (JetStream "
                     f"{_cell(r.get('js_metadata_failover_s_growth'))}x), restart "
                     f"{_cell(r.get('restart_s_growth'))}x (JetStream "
                     f"{_cell(r.get('js_restart_s_growth'))}x)")
    lines.append(f"fd budget {r['fd_budget']}; targets: " + ", ".join(
        f"{name} {'-' if met is None else 'met' if met else 'NOT met'}"
        for name, met in r["targets"].items()))
    return "\n".join(lines)


def plot(r: JsonObject, path: Path) -> str:
    """Idle CPU and create p99 against N, ours beside JetStream, as a PNG at `path`; what
    was done. matplotlib comes with the dev extras (`make install-dev`)."""
    try:
        pyplot: Any = importlib.import_module("matplotlib.pyplot")
    except ImportError:
        return "no plot: matplotlib is not installed"
    counts = r["counts"]
    figure, axes = pyplot.subplots(1, 2, figsize=(10, 4))
    for ax, (title, key) in zip(axes, (("idle CPU per broker (% of a core)", "idle_cpu_pct"),
                                       ("create p99 (ms)", "create_p99_ms")), strict=True):
        for label, prefix in (("Jetstream", ""), ("NATS JetStream", "js_")):
            points = [(n, r[f"{prefix}{key}_{n}"]) for n in counts
                      if r.get(f"{prefix}{key}_{n}") is not None]
            if points:
                ax.plot(*zip(*points, strict=True), marker="o", label=label)
        ax.set_xscale("log")
        ax.set_xticks(counts, [str(n) for n in counts], minor=False)
        ax.minorticks_off()
        ax.set_ylim(bottom=0)
        ax.set_xlabel("R3 partitions (one stream each)")
        ax.set_title(title)
        ax.legend()
    figure.tight_layout()
    figure.savefig(path)
    pyplot.close(figure)
    return f"plot: {path}"
