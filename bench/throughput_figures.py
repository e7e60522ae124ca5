"""The pure half of bench/throughput.py: cell names, ratios to NATS JetStream, the headline
figures and targets of a sweep, its table, its plot and the summary of a py-spy profile.

Nothing here starts a process or opens a socket: a run's raw results (nested dicts, as the
JSON holds them) come in, figures come out, so they can be checked with made-up numbers.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bench.common import JsonObject

FSYNCS = ("lazy", "durable")
TARGET_HEADROOM = 2.0
TARGET_RATIO_HIGH = 1.0       # at 256 and 4096 in flight
TARGET_RATIO_16 = 0.8
TARGET_P50_RATIO_R1 = 1.5     # ack p50 at 1 in flight
TARGET_P50_RATIO_R3 = 2.0
TARGET_CPU_RATIO = 1.0        # CPU per acked message at 256 in flight, R1
TARGET_DURABLE_R1 = 5.0
TARGET_E2E_RATIO = 1.5        # end to end, ours ÷ JetStream's push consumer


def cell_key(replicas: int, fsync: str, size: int, inflight: int) -> str:
    """The name of one cell of the sweep: `r3_lazy_128b_inflight_256`."""
    assert fsync in FSYNCS
    return f"r{replicas}_{fsync}_{size}b_inflight_{inflight}"


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def compare(ours: Mapping[str, Any], js: Mapping[str, Any]) -> JsonObject:
    """One cell: ours and JetStream's figures side by side and ours ÷ theirs (rate, ack
    latency, CPU per acked message)."""
    return {"ours": dict(ours), "jetstream": dict(js),
            "ratio": ratio(ours.get("msgs_per_s"), js.get("msgs_per_s")),
            "p50_ratio": ratio(ours.get("ack_p50_ms"), js.get("ack_p50_ms")),
            "p99_ratio": ratio(ours.get("ack_p99_ms"), js.get("ack_p99_ms")),
            "cpu_per_msg_ratio": ratio(ours.get("cpu_per_msg_us"), js.get("cpu_per_msg_us"))}


def cpu_per_msg_us(cpu_before: Mapping[str, float], cpu_after: Mapping[str, float],
                   acked: int) -> JsonObject:
    """CPU microseconds per acked message of each process and of all of them, from their
    CPU seconds before and after a run."""
    spent = {name: cpu_after[name] - cpu_before[name] for name in cpu_before}
    per = {name: 1e6 * s / acked if acked else None for name, s in spent.items()}
    return {"cpu_per_msg_us": 1e6 * sum(spent.values()) / acked if acked else None,
            "cpu_per_msg_us_by_process": per}


def generator_headroom(noop_msgs_per_s: float, cells: Mapping[str, JsonObject],
                       sides: tuple[str, ...] = ("ours", "jetstream")) -> float | None:
    """The no-op rate ÷ the highest rate reported for either system (or for `sides`)."""
    rates = [cell[side]["msgs_per_s"] for cell in cells.values() for side in sides
             if cell[side].get("msgs_per_s")]
    return ratio(noop_msgs_per_s, max(rates)) if rates else None


def generator_figures(noop: Mapping[str, Any], cells: Mapping[str, JsonObject]) -> JsonObject:
    """The generator's headroom (the bar: the no-op rate ÷ the highest rate of either
    system), the same over ours alone, and its own CPU: the requests one CPU second of the
    generator makes in the no-op run ÷ that highest rate (a core NATS request takes two
    hops through nats-server where JetStream answers in one, so on two shared cores the
    no-op rate is bounded by nats-server before the generator)."""
    rate = float(noop["msgs_per_s"])
    cpu_s = float(noop.get("generator_cpu_s") or 0.0)
    per_cpu_s = int(noop["acked"]) / cpu_s if cpu_s else None
    return {"generator_headroom": generator_headroom(rate, cells),
            "generator_headroom_vs_ours": generator_headroom(rate, cells, ("ours",)),
            "generator_msgs_per_cpu_s": per_cpu_s,
            "generator_cpu_headroom": generator_headroom(per_cpu_s, cells)
            if per_cpu_s else None}


def _figure(cells: Mapping[str, JsonObject], key: str, figure: str) -> float | None:
    cell = cells.get(key)
    value = cell.get(figure) if cell else None
    return float(value) if value is not None else None


def headline(cells: Mapping[str, JsonObject], e2e: Mapping[str, JsonObject],
             headroom: float | None) -> JsonObject:
    """The figures the issue names (128 B, lazy unless named durable)."""
    def lazy(replicas: int, inflight: int) -> str:
        return cell_key(replicas, "lazy", 128, inflight)

    def e2e_ratio(replicas: int, percentile: str) -> float | None:
        ours = e2e.get(f"r{replicas}", {}).get("ours_subscribe", {})
        push = e2e.get(f"r{replicas}", {}).get("js_push", {})
        return ratio(ours.get(f"{percentile}_ms"), push.get(f"{percentile}_ms"))

    return {
        "generator_headroom": headroom,
        "generator_bottleneck": headroom is not None and headroom < TARGET_HEADROOM,
        **{f"r{r}_ratio_inflight_{n}": _figure(cells, lazy(r, n), "ratio")
           for r in (1, 3) for n in (16, 256, 4096)},
        "r1_p50_ratio_inflight_1": _figure(cells, lazy(1, 1), "p50_ratio"),
        "r3_p50_ratio_inflight_1": _figure(cells, lazy(3, 1), "p50_ratio"),
        "cpu_per_msg_ratio_r1_256": _figure(cells, lazy(1, 256), "cpu_per_msg_ratio"),
        "durable_r1_ratio_inflight_256": _figure(cells, cell_key(1, "durable", 128, 256),
                                                 "ratio"),
        "e2e_p50_vs_js_push_r1": e2e_ratio(1, "p50"),
        "e2e_p99_vs_js_push_r1": e2e_ratio(1, "p99"),
        "e2e_p50_vs_js_push_r3": e2e_ratio(3, "p50"),
        "e2e_p99_vs_js_push_r3": e2e_ratio(3, "p99"),
    }


def _bar(name: str, value: float | None, bar: float, at_least: bool) -> JsonObject:
    met = None if value is None else (value >= bar if at_least else value <= bar)
    return {"target": name, "value": value, "bar": f"{'>=' if at_least else '<='} {bar}",
            "met": met}


def check_targets(cells: Mapping[str, JsonObject], e2e: Mapping[str, JsonObject],
                  headroom: float | None) -> list[JsonObject]:
    """Every target of every measured cell: `met` compares the figure with its bar (None:
    not measured); `passed` also asks, of a rate or latency bar, that the generator had its
    headroom: without it those figures say nothing and the bar fails."""
    bars: list[JsonObject] = [_bar("generator_headroom", headroom, TARGET_HEADROOM, True)]
    for key, cell in sorted(cells.items()):
        inflight = int(key.rsplit("_", 1)[1])
        durable_r1 = key.startswith("r1_durable")
        if inflight >= 256:
            bars.append(_bar(f"{key} ratio", cell.get("ratio"),
                             TARGET_DURABLE_R1 if durable_r1 else TARGET_RATIO_HIGH, True))
        elif inflight == 16:
            bars.append(_bar(f"{key} ratio", cell.get("ratio"), TARGET_RATIO_16, True))
        elif inflight == 1:
            bars.append(_bar(f"{key} ack p50 ratio", cell.get("p50_ratio"),
                             TARGET_P50_RATIO_R1 if key.startswith("r1") else TARGET_P50_RATIO_R3,
                             False))
        if inflight == 256 and key.startswith("r1_lazy"):
            bars.append(_bar(f"{key} CPU per message ratio", cell.get("cpu_per_msg_ratio"),
                             TARGET_CPU_RATIO, False))
    trusted = headroom is not None and headroom >= TARGET_HEADROOM
    bars = [{**b, "passed": bool(b["met"]) and (trusted or "CPU" in b["target"])}
            for b in bars]
    for replicas in (1, 3):
        row = e2e.get(f"r{replicas}", {})
        for percentile in ("p50", "p99"):
            bar = _bar(f"e2e r{replicas} {percentile} vs JetStream push",
                       ratio(row.get("ours_subscribe", {}).get(f"{percentile}_ms"),
                             row.get("js_push", {}).get(f"{percentile}_ms")),
                       TARGET_E2E_RATIO, False)
            bars.append({**bar, "passed": bool(bar["met"])})
    return bars


# -- the table -----------------------------------------------------------------------------------

def _num(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def table(r: JsonObject) -> str:
    lines = [(f"{'cell':30} {'ours msg/s':>11} {'JS msg/s':>11} {'ratio':>6} "
              f"{'p50 ms ours/JS':>15} {'p99 ms ours/JS':>15} {'p99.9 ms ours/JS':>17} "
              f"{'CPU us/msg ours/JS':>19}")]
    for key, cell in r["cells"].items():
        ours, js = cell["ours"], cell["jetstream"]
        lines.append(
            f"{key:30} {_num(ours.get('msgs_per_s'), 0):>11} {_num(js.get('msgs_per_s'), 0):>11} "
            f"{_num(cell.get('ratio')):>6} "
            f"{_num(ours.get('ack_p50_ms')) + '/' + _num(js.get('ack_p50_ms')):>15} "
            f"{_num(ours.get('ack_p99_ms')) + '/' + _num(js.get('ack_p99_ms')):>15} "
            f"{_num(ours.get('ack_p999_ms')) + '/' + _num(js.get('ack_p999_ms')):>17} "
            f"{_num(ours.get('cpu_per_msg_us'), 1) + '/' + _num(js.get('cpu_per_msg_us'), 1):>19}")
    lines.append("")
    for replicas, row in r["e2e"].items():
        lines.append(f"end to end {replicas} at {r['e2e_rate']}/s: " + ", ".join(
            f"{name} p50 {_num(f.get('p50_ms'))} p99 {_num(f.get('p99_ms'))} ms "
            f"({f.get('messages')} msgs)" for name, f in row.items()))
    noop = r.get("noop", {})
    lines.append(f"load generator: core NATS + no-op responder {_num(noop.get('msgs_per_s'), 0)} "
                 f"msg/s = {_num(r.get('generator_headroom'))}x the highest rate reported "
                 f"({_num(r.get('generator_headroom_vs_ours'))}x ours'); its own CPU: "
                 f"{_num(r.get('generator_msgs_per_cpu_s'), 0)} requests per CPU second = "
                 f"{_num(r.get('generator_cpu_headroom'))}x"
                 + (" -- THE GENERATOR IS THE BOTTLENECK: rate figures are not trusted"
                    if r.get("generator_bottleneck") else ""))
    missed = [b for b in r["targets"] if b["met"] is False]
    lines.append(f"targets: {sum(b['met'] is True for b in r['targets'])} met, "
                 f"{len(missed)} missed, {sum(b['passed'] for b in r['targets'])} passed"
                 + ("" if not r.get("generator_bottleneck") else
                    " (a rate or latency bar passes only when the generator has its headroom)")
                 + "".join(f"\n  missed {b['target']}: {_num(b['value'])} (bar {b['bar']})"
                           for b in missed))
    return "\n".join(lines)


# -- the plot ------------------------------------------------------------------------------------

def plot(r: JsonObject, path: Path, size: int = 128) -> str:
    """Rate and ack p99 against messages in flight, ours beside JetStream (R1 and R3, lazy
    and durable), as a PNG at `path`; what was done (matplotlib is in the dev extras)."""
    if importlib.util.find_spec("matplotlib") is None:
        return "no plot: matplotlib is not installed"
    pyplot: Any = importlib.import_module("matplotlib.pyplot")
    inflights = r["inflights"]
    figure, axes = pyplot.subplots(1, 2, figsize=(11, 4.2))
    panels = (("acked msg/s", "msgs_per_s"), ("ack p99 (ms)", "ack_p99_ms"))
    for ax, (title, figure_key) in zip(axes, panels, strict=True):
        for replicas in (1, 3):
            for fsync, style in (("lazy", "-"), ("durable", ":")):
                for side, label, colour in (("ours", "Jetstream", "C0" if replicas == 1 else "C2"),
                                            ("jetstream", "NATS JetStream",
                                             "C1" if replicas == 1 else "C3")):
                    points = [(n, r["cells"][k][side][figure_key]) for n in inflights
                              if (k := cell_key(replicas, fsync, size, n)) in r["cells"]
                              and r["cells"][k][side].get(figure_key)]
                    if points:
                        ax.plot(*zip(*points, strict=True), style, marker="o", color=colour,
                                label=f"{label} R{replicas} {fsync}")
        ax.set_xscale("log")
        ax.set_xticks(inflights, [str(n) for n in inflights], minor=False)
        ax.minorticks_off()
        ax.set_yscale("log")
        ax.grid(True, which="major", alpha=0.3)
        ax.set_xlabel(f"requests in flight ({size} B)")
        ax.set_title(title)
    axes[0].legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path)
    pyplot.close(figure)
    return f"plot: {path}"


# -- profiles ------------------------------------------------------------------------------------

def _frame_name(frame: str) -> str:
    """`append (jetstream/server/partition.py:120)` -> `append (partition.py)`."""
    name, _, where = frame.partition(" (")
    file = where.rsplit(":", 1)[0].rsplit("/", 1)[-1].rstrip(")")
    return f"{name} ({file})" if file else name


#: Frames every sample of a thread passes through (start-up, the event loop, thread entry):
#: left out of the inclusive shares, where they would only crowd the top.
_STRUCTURAL_FILES = frozenset({"<frozen runpy>", "runpy.py", "runners.py", "cli.py",
                               "__main__.py", "base_events.py", "events.py", "threading.py"})
#: Leaf frames that wait for work (a selector, pysyncobj's poller, an idle executor thread).
_WAITING = frozenset({"EpollSelector.select (selectors.py)", "PollPoller.poll (poller.py)",
                      "_worker (thread.py)"})


def summarize_profile(collapsed: str, top: int = 15) -> JsonObject:
    """Shares of samples from py-spy's raw (collapsed) output, one `a;b;c count` stack a
    line: waiting (a leaf that waits for IO or work), by leaf function (self time), by leaf
    file, and by any function on the stack (inclusive time, less the structural frames),
    each the `top` largest."""
    self_time: Counter[str] = Counter()
    files: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in collapsed.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [_frame_name(f) for f in stack.split(";") if " (" in f]
        if not frames:
            continue
        total += count
        self_time[frames[-1]] += count
        files[frames[-1].rsplit("(", 1)[-1].rstrip(")")] += count
        for name in set(frames):
            if name.rsplit("(", 1)[-1].rstrip(")") not in _STRUCTURAL_FILES:
                inclusive[name] += count

    def shares(counter: Counter[str]) -> list[list[Any]]:
        return [[name, round(count / total, 4)] for name, count in counter.most_common(top)]

    waiting = sum(self_time[name] for name in _WAITING)
    return {"samples": total, "waiting": round(waiting / total, 4) if total else None,
            "self": shares(self_time) if total else [],
            "files": shares(files) if total else [],
            "inclusive": shares(inclusive) if total else []}
