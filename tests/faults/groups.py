"""The fault suite's checker for a consumer group. Pure: no IO.

The workload's group members record what they consume (`g`: value, partition, offset,
member), every commit the coordinator acknowledged (`c`: partition, offset) and every one it
refused (`cf`), and an observer records the group's committed offsets as the coordinator
answers them (`o`: partition, offset, with `ts`, the time its request was sent). The promises:
- missing: every acked publish is consumed by some member at least once (at least once);
- commits_lost: no observation of a partition's committed offset, asked after a commit of
  it was acknowledged, is below that commit (no acknowledged commit lost);
- offsets_backwards: a partition's observed committed offset never decreases;
- out_of_window: no member consumes an offset below a commit of that partition acknowledged
  before (redeliveries come only from what was not committed yet);
- duplicates (counted, not a failure): consumptions of a value already consumed — the
  redeliveries the at-least-once contract allows.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from tests.faults.checker import Findings


@dataclass
class GroupReport(Findings):
    acked: int = 0
    consumed: int = 0
    missing: int = 0
    duplicates: int = 0
    out_of_window: int = 0
    commits_acked: int = 0
    commits_refused: int = 0
    commits_lost: int = 0
    offsets_backwards: int = 0
    observations: int = 0
    members: int = 0

    @property
    def safe(self) -> bool:
        return not (self.missing or self.out_of_window or self.commits_lost
                    or self.offsets_backwards)


def check_group(history: list[dict[str, Any]]) -> GroupReport:
    report = GroupReport()
    acked = {e["v"]: (e["p"], e["o"]) for e in history if e["e"] == "a"}
    report.acked = len(acked)
    events = sorted((e for e in history if e["e"] in ("g", "c", "cf", "o")),
                    key=lambda e: e.get("ts", e["t"]))
    committed: dict[int, int] = {}  # partition -> highest acknowledged commit so far
    observed: dict[int, int] = {}
    seen: Counter[str] = Counter()
    members: set[str] = set()
    for e in events:
        kind, p = e["e"], e.get("p")
        if kind == "c":
            report.commits_acked += 1
            committed[p] = max(committed.get(p, 0), e["o"])
        elif kind == "cf":
            report.commits_refused += 1
        elif kind == "o":
            report.observations += 1
            if e["o"] < committed.get(p, 0):
                report.commits_lost += 1
                report.example("commits_lost", f"p{p}: observed {e['o']} after a commit of "
                                               f"{committed[p]} was acknowledged")
            if e["o"] < observed.get(p, 0):
                report.offsets_backwards += 1
                report.example("offsets_backwards", f"p{p}: {observed[p]} then {e['o']}")
            observed[p] = max(observed.get(p, 0), e["o"])
        else:
            report.consumed += 1
            members.add(e["m"])
            seen[e["v"]] += 1
            if seen[e["v"]] > 1:
                report.duplicates += 1
            if e["o"] < committed.get(p, 0):
                report.out_of_window += 1
                report.example("out_of_window", f"p{p} offset {e['o']} consumed by {e['m']} "
                                                f"after a commit of {committed[p]}")
    missing = sorted(v for v in acked if v not in seen)
    report.missing = len(missing)
    for value in missing[:5]:
        report.example("missing", f"{value} at p{acked[value][0]} offset {acked[value][1]}")
    report.members = len(members)
    return report
