"""The fault suite's checker for compacted streams. Pure: no IO.

A compacted stream keeps only the newest record of each key, each replica compacting its own
copy, so the plain checker's promises (every acked record committed; replicas identical
below the HW) do not hold by design. Its promises are:
- latest_lost: for every key, the newest acked write (by offset) is still there on every
  replica below the HW — or something newer for the key is (a later write, acked or not, that
  the workload did invoke).
- deleted_returned: a key whose newest acked write is a tombstone has no value on any replica
  from before that tombstone (a deletion never comes undone).
- phantoms: records whose write (the `w` header) the workload never invoked, or stored at
  another offset than its ack said.
- divergent_replicas: replicas whose live keys below the HW (key -> offset and write) differ.
  Tombstones are left out: each replica drops them on its own schedule.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tests.faults.checker import Findings, Record, Replica

OFFSET, KEY, VALUE, HEADERS = 0, 3, 4, 5


@dataclass
class CompactedReport(Findings):
    invoked: int = 0
    acked: int = 0
    deletes_acked: int = 0
    keys: int = 0
    latest_lost: int = 0
    deleted_returned: int = 0
    phantoms: int = 0
    divergent_replicas: int = 0

    @property
    def safe(self) -> bool:
        return not (self.latest_lost or self.deleted_returned or self.phantoms
                    or self.divergent_replicas)


def _write_of(record: Record) -> str | None:
    for name, value in record[HEADERS]:
        if name == "w":
            return value.decode(errors="replace")
    return None


def check_compacted(history: list[dict[str, Any]],
                    replicas: Mapping[int, list[Replica]]) -> CompactedReport:
    report = CompactedReport()
    key_of: dict[str, str] = {}
    deletes: set[str] = set()
    acked: dict[str, tuple[int, int]] = {}
    for event in history:
        if event["e"] == "i":
            key_of[event["v"]] = event["k"]
            if event.get("d"):
                deletes.add(event["v"])
        elif event["e"] == "a":
            acked[event["v"]] = (event["p"], event["o"])
    report.invoked, report.acked = len(key_of), len(acked)
    report.deletes_acked = len(deletes & acked.keys())
    for partition, copies in replicas.items():
        newest: dict[str, tuple[int, str]] = {}  # key -> newest acked (offset, write)
        for write, (p, offset) in acked.items():
            key = key_of[write]
            if p == partition and offset > newest.get(key, (-1, ""))[0]:
                newest[key] = (offset, write)
        report.keys += len(newest)
        views = []
        for replica in copies:
            latest: dict[str, tuple[int, str, bool]] = {}
            for record in replica.records:
                if record[OFFSET] >= replica.high_watermark:
                    continue
                write = _write_of(record)
                if write is None or write not in key_of or (
                        write in acked and acked[write] != (partition, record[OFFSET])):
                    report.phantoms += 1
                    report.example("phantoms", f"broker {replica.broker} p{partition} "
                                               f"@{record[OFFSET]}: {write!r}")
                    continue
                assert record[KEY] is not None
                latest[record[KEY].decode()] = (record[OFFSET], write, record[VALUE] is None)
            for key, (offset, write) in newest.items():
                got = latest.get(key)
                if write in deletes:
                    if got is not None and got[0] < offset:
                        report.deleted_returned += 1
                        report.example("deleted_returned", f"broker {replica.broker} "
                                       f"{key}: {got} before tombstone @{offset}")
                elif got is None or got[0] < offset:
                    report.latest_lost += 1
                    report.example("latest_lost", f"broker {replica.broker} {key}: "
                                   f"newest acked {write}@{offset}, replica has {got}")
            views.append({k: v[:2] for k, v in latest.items() if not v[2]})
        if any(view != views[0] for view in views[1:]):
            report.divergent_replicas += sum(1 for view in views[1:] if view != views[0])
            report.example("divergent_replicas", f"partition {partition}")
    return report
