"""The in-process parts of bench/scrub.py: a whole-log scrub tells `pace` of every byte, a
catch-up checks only the slices no one checked yet, the checks-off switch is undone, and
/metrics series are read by name."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from bench.scrub import (
    MB,
    QUICK,
    build_log,
    catchup,
    metric,
    scrub_pass,
    verification_off,
)
from jetstream.stream.verified import VerifiedRanges


def test_a_scrub_pass_paces_every_byte(tmp_path: Path) -> None:
    log = build_log(tmp_path / "log", 2 * MB)
    try:
        sample = scrub_pass(log, log.size_bytes)
        assert sample.size == sample.paced == log.size_bytes
    finally:
        log.close()


def test_only_a_first_read_checks_slices(tmp_path: Path) -> None:
    build_log(tmp_path / "log", 2 * MB).close()
    result = catchup(tmp_path / "log", "devnull", replace(QUICK, repeats=2,
                                                          read_seconds_min=0.0))
    assert result["first_read"]["checked_slices"] >= 2  # 1 MiB reads of a 2 MB log
    assert result["verified"]["checked_slices"] == result["off"]["checked_slices"] == 0
    assert result["verified_ratio"] > 0 and result["first_read_ratio"] > 0


def test_checks_off_lasts_for_its_block_only() -> None:
    ranges = VerifiedRanges()
    with verification_off():
        assert ranges.covers(0, 10)
    assert not ranges.covers(0, 10)


def test_a_metric_is_read_by_its_name_and_labels() -> None:
    text = ("# TYPE jetstream_scrub_bytes_total counter\n"
            "jetstream_scrub_bytes_total 4194304\n"
            'jetstream_partition_appended_bytes_total{stream="s",partition="0"} 77\n')
    assert metric(text, "jetstream_scrub_bytes_total") == 4194304
    assert metric(text, 'jetstream_partition_appended_bytes_total{stream="s",'
                        'partition="0"}') == 77
