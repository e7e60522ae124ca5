"""The data disk's fill level, and the high watermark above which appends are refused.

Theory of operation: as Elasticsearch's disk watermarks and Kafka's log-dir checks do, the
broker stops taking appends before the filesystem is truly full, so that it always has room
to recover, checkpoint, write metadata and delete. `DiskMonitor.refresh` reads the
filesystem's usage (statvfs) and runs every `disk_check_ms` off the event loop's hot path;
partition leaders call `check` before each append, which is a comparison of two numbers.
Above `disk_high_watermark_percent` an append is refused with DISK_FULL; once space is freed
(retention, a deleted stream) the next refresh lets appends in again.

In a cluster the same monitor keeps a full follower out of the ISR and makes a full leader
hand its partitions over (jetstream.isr.disk_full). Its figures are rendered for
`GET /metrics` (`render_metrics`) and described for `/health` and `cluster status`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jetstream.errors import DiskFull

#: The metrics of the data disk (`jetstream_disk_<name>`): kind and help text.
_HELP = {
    "used_percent": ("gauge", "Share of the data disk in use."),
    "free_bytes": ("gauge", "Bytes free on the data disk."),
    "full": ("gauge", ("1 while the data disk is above its high watermark: appends refused, "
                       "leaderships handed over, out of the ISRs.")),
    "refused_records_total": ("counter", ("Records refused with DISK_FULL because the data "
                                          "disk was above its high watermark.")),
}


@dataclass
class DiskMonitor:
    path: Path
    high_watermark_percent: int
    used_percent: float = 0.0
    free_bytes: int = 0
    #: Records refused (DISK_FULL) because the disk was above its high watermark.
    refused_records: int = 0

    def refresh(self) -> None:
        stats = os.statvfs(self.path)
        total = stats.f_blocks * stats.f_frsize
        self.free_bytes = stats.f_bavail * stats.f_frsize
        self.used_percent = 100.0 * (total - self.free_bytes) / total if total else 0.0

    @property
    def full(self) -> bool:
        return self.used_percent >= self.high_watermark_percent

    def check(self, records: int = 1) -> None:
        """Raise DiskFull while the disk is above its high watermark (and count the
        `records` the append would have written as refused)."""
        if self.full:
            self.refused_records += records
            raise DiskFull(f"the data disk is {self.used_percent:.1f} % used, above "
                           f"disk_high_watermark_percent ({self.high_watermark_percent} %): "
                           "free space (retention, delete a stream) and appends resume",
                           used_percent=round(self.used_percent, 1),
                           high_watermark_percent=self.high_watermark_percent)

    def describe(self) -> dict[str, Any]:
        return {"used_percent": round(self.used_percent, 1), "free_bytes": self.free_bytes,
                "high_watermark_percent": self.high_watermark_percent, "full": self.full}

    def render_metrics(self) -> list[str]:
        """Prometheus text lines of the data disk's figures."""
        values = {"used_percent": round(self.used_percent, 2), "free_bytes": self.free_bytes,
                  "full": int(self.full), "refused_records_total": self.refused_records}
        lines: list[str] = []
        for name, (kind, text) in _HELP.items():
            metric = f"jetstream_disk_{name}"
            lines += [f"# HELP {metric} {text}", f"# TYPE {metric} {kind}",
                      f"{metric} {values[name]}"]
        return lines
