"""The disk high watermark: refused at and above it, with the figures in the error; the
records refused are counted, and the figures rendered for Prometheus."""

from __future__ import annotations

from pathlib import Path

import pytest

from jetstream.errors import DiskFull
from jetstream.server.disk import DiskMonitor


def test_appends_are_refused_at_the_high_watermark(tmp_path: Path) -> None:
    disk = DiskMonitor(tmp_path, 90)
    disk.refresh()
    assert 0 <= disk.used_percent <= 100 and disk.free_bytes > 0
    disk.used_percent = 89.9
    disk.check()
    assert not disk.describe()["full"]
    disk.used_percent = 90.0
    with pytest.raises(DiskFull) as refused:
        disk.check()
    assert refused.value.code == "DISK_FULL" and refused.value.retriable
    assert refused.value.used_percent == 90.0 and refused.value.high_watermark_percent == 90
    assert disk.describe() == {"used_percent": 90.0, "free_bytes": disk.free_bytes,
                               "high_watermark_percent": 90, "full": True}


def test_refusals_are_counted_and_the_figures_rendered(tmp_path: Path) -> None:
    disk = DiskMonitor(tmp_path, 90)
    disk.used_percent, disk.free_bytes = 50.0, 4096
    disk.check(7)
    assert disk.refused_records == 0
    disk.used_percent = 95.5
    for records in (3, 4):
        with pytest.raises(DiskFull):
            disk.check(records)
    samples = {line.split()[0]: line.split()[1] for line in disk.render_metrics()
               if not line.startswith("#")}
    assert samples == {"jetstream_disk_used_percent": "95.5",
                       "jetstream_disk_free_bytes": "4096", "jetstream_disk_full": "1",
                       "jetstream_disk_refused_records_total": "7"}
    assert "# TYPE jetstream_disk_refused_records_total counter" in disk.render_metrics()
