"""Counters of a broker, rendered in the Prometheus text format for `GET /metrics`.

Each partition this broker leads has one `PartitionMetrics`; the broker adds its own
connection and request counters, and its scheduler (jetstream.server.scheduler) its own.
Counters only grow; gauges (HW, LEO, lag, scheduled entries) are read live.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields


@dataclass(slots=True)
class PartitionMetrics:
    appended_records: int = 0
    appended_bytes: int = 0
    fetched_records: int = 0
    fetched_bytes: int = 0
    acked: int = 0
    errors: int = 0
    dropped: int = 0
    isr_shrinks: int = 0
    isr_expands: int = 0
    high_watermark: int = 0


_HELP = {
    "appended_records": ("counter", "Records appended to the partition's log."),
    "appended_bytes": ("counter", "Bytes of record batches appended."),
    "fetched_records": ("counter", "Records served to fetches (upper bound: whole batches)."),
    "fetched_bytes": ("counter", "Bytes of record batches served to fetches."),
    "acked": ("counter", "Publish acks sent."),
    "errors": ("counter", "Messages refused (too large, append failures)."),
    "dropped": ("counter", "Messages NATS delivered that ingest could not buffer (never acked)."),
    "isr_shrinks": ("counter", "ISR changes committed that removed a replica (this leader)."),
    "isr_expands": ("counter", "ISR changes committed that added a replica (this leader)."),
    "high_watermark": ("gauge", "Offset below which records are committed."),
}


@dataclass(slots=True)
class BrokerMetrics:
    connections_total: int = 0
    connections_open: int = 0
    requests_total: int = 0
    request_errors_total: int = 0
    #: Connections closed at once for `connections_max`, and for a stalled request frame.
    connections_refused_total: int = 0
    stalled_requests_total: int = 0
    #: Certificate reloads (SIGHUP), and those where a file was bad (old certificate kept).
    tls_reloads_total: int = 0
    tls_reload_failures_total: int = 0
    #: Credentials refused, requests refused by the ACLs, and requests refused for their
    #: principal's `principal_requests_max`.
    authentication_failures_total: int = 0
    authorization_refusals_total: int = 0
    in_flight_refusals_total: int = 0


def render(partitions: Iterable[tuple[str, int, PartitionMetrics, int]],
           broker: BrokerMetrics) -> str:
    """Prometheus text: (stream, partition, metrics, log end offset) per led partition."""
    rows = list(partitions)
    lines: list[str] = []
    for f in fields(PartitionMetrics):
        kind, text = _HELP[f.name]
        name = f"jetstream_partition_{f.name}" + ("_total" if kind == "counter" else "")
        lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
        for stream, partition, metrics, _leo in rows:
            lines.append(f'{name}{{stream="{stream}",partition="{partition}"}} '
                         f"{getattr(metrics, f.name)}")
    lines += ["# HELP jetstream_partition_log_end_offset Next offset to be written.",
              "# TYPE jetstream_partition_log_end_offset gauge"]
    for stream, partition, _metrics, leo in rows:
        lines.append(f'jetstream_partition_log_end_offset{{stream="{stream}",'
                     f'partition="{partition}"}} {leo}')
    lines += [("# HELP jetstream_partition_uncommitted_records Records appended but not yet "
              "committed (LEO - HW)."), "# TYPE jetstream_partition_uncommitted_records gauge"]
    for stream, partition, metrics, leo in rows:
        lines.append(f'jetstream_partition_uncommitted_records{{stream="{stream}",'
                     f'partition="{partition}"}} {leo - metrics.high_watermark}')
    for f in fields(BrokerMetrics):
        kind = "gauge" if f.name.endswith("_open") else "counter"
        lines += [f"# TYPE jetstream_broker_{f.name} {kind}",
                  f"jetstream_broker_{f.name} {getattr(broker, f.name)}"]
    return "\n".join(lines) + "\n"


@dataclass(slots=True)
class SchedulerMetrics:
    """What the broker's scheduler did: wake-ups of its task, executor calls (one per batch
    of due work that does IO), and per kind of work the runs (one per partition) and the
    runs that failed."""

    wakeups: int = 0
    executor_calls: int = 0
    runs: dict[str, int] = field(default_factory=dict)
    failures: dict[str, int] = field(default_factory=dict)


def render_scheduler(metrics: SchedulerMetrics, entries: Mapping[str, int]) -> list[str]:
    """Prometheus lines of the scheduler's counters and of its entries per kind of work."""
    lines = [
        "# HELP jetstream_scheduler_wakeups_total Wake-ups of the broker's scheduler task.",
        "# TYPE jetstream_scheduler_wakeups_total counter",
        f"jetstream_scheduler_wakeups_total {metrics.wakeups}",
        ("# HELP jetstream_scheduler_executor_calls_total Executor calls of the scheduler "
         "(one per batch of due work doing IO)."),
        "# TYPE jetstream_scheduler_executor_calls_total counter",
        f"jetstream_scheduler_executor_calls_total {metrics.executor_calls}",
    ]
    for name, counts, text in (
            ("runs", metrics.runs, "Partition work the scheduler ran, by kind."),
            ("failures", metrics.failures, "Partition work that failed, by kind.")):
        lines += [f"# HELP jetstream_scheduler_{name}_total {text}",
                  f"# TYPE jetstream_scheduler_{name}_total counter"]
        lines += [f'jetstream_scheduler_{name}_total{{work="{work}"}} {count}'
                  for work, count in sorted(counts.items())]
    lines += ["# HELP jetstream_scheduler_entries Partition work scheduled, by kind.",
              "# TYPE jetstream_scheduler_entries gauge"]
    lines += [f'jetstream_scheduler_entries{{work="{work}"}} {count}'
              for work, count in sorted(entries.items())]
    return lines
