"""The disk high watermark: refused at and above it, with the figures in the error."""

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
