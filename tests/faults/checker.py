"""The fault suite's checker: what the history and the final logs say about safety. Pure: no IO.

Inputs: the workload's history (tests/faults/workload.py: invokes, acks, failures, consumer
reads), every replica's final log of every partition (every field of every record) with the
partition's final high watermark, and the times of the leader kills (fault name, time). The
committed log of a partition is the first replica's records below the HW (all replicas must
agree there).

Counts (the first five must be 0):
- acked_lost: acked values not in the committed log of their partition.
- offset_conflicts: acked values committed at another offset than their ack said, plus
  offsets acked for two different values.
- phantom_reads: values in any replica's log (committed or not) or read by a consumer that
  the workload never sent.
- divergent_replicas: replicas whose records below the HW differ from the committed log in
  any field (or which lack some of them).
- truncated_reads: consumer reads of (offset, value) that the committed log does not hold:
  a consumer saw something that was later truncated.
Reported besides: duplicates (values committed at more than one offset: the workload never
retries, so 0 is expected), acks, failures, unknown outcomes, and failover times: from each
leader kill (or cut) to the first ack received more than ACK_IN_FLIGHT_S after it (a dead
or cut-off leader cannot ack: only the new one can).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

#: A stored record: (offset, timestamp_ms, leader_epoch, key, value, headers, subject).
Record = tuple[int, int, int, bytes | None, bytes, tuple[tuple[str, bytes], ...], str]
VALUE = 4
#: Acks a leader sent just before it was killed arrive within this (loopback): an ack
#: received later than this after the kill comes from the new leader.
ACK_IN_FLIGHT_S = 0.1
#: Faults that stop every broker: the time to the next ack is a whole-cluster restart, shown
#: per fault but not counted as a failover.
WHOLE_CLUSTER_FAULTS = frozenset({"kill_all"})


@dataclass(frozen=True, slots=True)
class Replica:
    broker: int
    high_watermark: int
    records: list[Record]


@dataclass
class Findings:
    """What every checker's report has: up to five examples of each kind of violation, and
    its figures as a dict with `safe`."""

    examples: dict[str, list[str]] = field(default_factory=dict)

    @property
    def safe(self) -> bool:
        raise NotImplementedError

    def example(self, kind: str, text: str) -> None:
        shown = self.examples.setdefault(kind, [])
        if len(shown) < 5:
            shown.append(text)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "safe": self.safe}


@dataclass
class Report(Findings):
    invoked: int = 0
    acked: int = 0
    failed: int = 0
    unknown: int = 0
    committed: int = 0
    acked_lost: int = 0
    offset_conflicts: int = 0
    phantom_reads: int = 0
    divergent_replicas: int = 0
    truncated_reads: int = 0
    duplicates: int = 0
    consumer_reads: int = 0
    failovers: list[float] = field(default_factory=list)
    failover_by_fault: dict[str, list[float]] = field(default_factory=dict)

    @property
    def safe(self) -> bool:
        return not (self.acked_lost or self.offset_conflicts or self.phantom_reads
                    or self.divergent_replicas or self.truncated_reads)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("failovers")
        out["failover_s"] = [round(f, 3) for f in self.failovers]
        out["failover_p50_s"] = round(percentile(self.failovers, 50), 3)
        out["failover_p99_s"] = round(percentile(self.failovers, 99), 3)
        out["failover_max_s"] = round(max(self.failovers, default=0.0), 3)
        out["safe"] = self.safe
        return out


def percentile(values: Iterable[float], q: float) -> float:
    """The q-th percentile by nearest rank (0.0 for no values); with few values p99 = max."""
    ordered = sorted(values)
    if not ordered:
        return 0.0
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


def check(history: list[dict[str, Any]], replicas: Mapping[int, list[Replica]],
          leader_kills: Iterable[tuple[str, float]] = ()) -> Report:
    report = Report()
    invoked: dict[str, float] = {}
    acked: dict[str, tuple[int, int]] = {}
    ack_times: list[tuple[float, str]] = []
    failed: dict[str, str] = {}
    reads: list[tuple[int, int, str]] = []
    for event in history:
        kind, value = event["e"], event["v"]
        if kind == "i":
            invoked[value] = event["t"]
        elif kind == "a":
            acked[value] = (event["p"], event["o"])
            ack_times.append((event["t"], value))
        elif kind == "f":
            failed[value] = event["c"]
        elif kind == "r":
            reads.append((event["p"], event["o"], value))
    report.invoked = len(invoked)
    report.acked = len(acked)
    report.failed = len(failed)
    report.unknown = sum(1 for c in failed.values() if c == "ACK_TIMEOUT") + \
        len(set(invoked) - set(acked) - set(failed))
    report.consumer_reads = len(reads)

    committed: dict[int, dict[int, str]] = {}
    for partition, copies in replicas.items():
        committed[partition] = _check_replicas(partition, copies, invoked, report)
    report.committed = sum(len(c) for c in committed.values())

    where: dict[str, list[tuple[int, int]]] = {}
    for partition, log in committed.items():
        for offset, value in log.items():
            where.setdefault(value, []).append((partition, offset))
    report.duplicates = sum(len(places) - 1 for places in where.values() if len(places) > 1)

    by_offset: dict[tuple[int, int], str] = {}
    for value, (partition, offset) in acked.items():
        other = by_offset.setdefault((partition, offset), value)
        if other != value:
            report.offset_conflicts += 1
            report.example("offset_conflicts", f"{partition}/{offset} acked {other} and {value}")
        places = where.get(value, [])
        if not places:
            report.acked_lost += 1
            report.example("acked_lost", f"{value} acked at {partition}/{offset}")
        elif (partition, offset) not in places:
            report.offset_conflicts += 1
            report.example("offset_conflicts",
                           f"{value} acked at {partition}/{offset}, committed at {places}")

    for partition, offset, value in reads:
        if value not in invoked:
            report.phantom_reads += 1
            report.example("phantom_reads", f"consumer read {value!r} at {partition}/{offset}")
        if committed.get(partition, {}).get(offset) != value:
            report.truncated_reads += 1
            report.example("truncated_reads", f"consumer read {value} at {partition}/{offset}, "
                           f"committed there: {committed.get(partition, {}).get(offset)}")

    ack_times.sort()
    for fault, kill in sorted(leader_kills, key=lambda k: k[1]):
        first = next((t for t, _ in ack_times if t >= kill + ACK_IN_FLIGHT_S), None)
        if first is not None:
            if fault not in WHOLE_CLUSTER_FAULTS:
                report.failovers.append(first - kill)
            report.failover_by_fault.setdefault(fault, []).append(round(first - kill, 3))
    return report


def _check_replicas(partition: int, copies: list[Replica], invoked: Mapping[str, float],
                    report: Report) -> dict[int, str]:
    """The committed log (offset -> value) of one partition; counts divergent replicas and
    phantoms in every replica's log."""
    assert copies, "no replica"
    hw = copies[0].high_watermark
    reference = [r for r in copies[0].records if r[0] < hw]
    for copy in copies:
        below = [r for r in copy.records if r[0] < hw]
        if below != reference:
            report.divergent_replicas += 1
            report.example("divergent_replicas", _first_difference(partition, copy.broker,
                                                                   below, reference))
        for record in copy.records:
            value = record[VALUE].decode(errors="replace")
            if value not in invoked:
                report.phantom_reads += 1
                report.example("phantom_reads", f"broker {copy.broker} holds {value!r} at "
                               f"{partition}/{record[0]}")
    offsets = [r[0] for r in reference]
    if offsets != list(range(len(offsets))):
        report.divergent_replicas += 1
        report.example("divergent_replicas",
                       f"partition {partition}: offsets are not 0, 1, 2, ... up to the HW")
    return {r[0]: r[VALUE].decode(errors="replace") for r in reference}


def _first_difference(partition: int, broker: int, mine: list[Record],
                      reference: list[Record]) -> str:
    for a, b in zip(mine, reference, strict=False):
        if a != b:
            return f"broker {broker} {partition}/{a[0]}: {a!r} != {b!r}"
    return (f"broker {broker} partition {partition}: {len(mine)} records below the HW, "
            f"the first replica has {len(reference)}")
