"""The in-process parts of bench/security.py: the metadata Raft measurement with and without
the password (three real nodes on loopback), and how sides are summarised."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from bench.security import QUICK, median, raft, ratio

TINY = replace(QUICK, raft_serial=20, raft_concurrent=64)


async def test_raft_commits_with_and_without_the_password(tmp_path: Path) -> None:
    plain = await raft(tmp_path / "off", TINY, None)
    secured = await raft(tmp_path / "on", TINY, "a-password")
    for result in (plain, secured):
        assert 0 < result["commit_p50_ms"] <= result["commit_p99_ms"]
        assert result["commits_per_s_64"] > 0


def test_sides_are_summarised_by_their_medians() -> None:
    runs = [{"msgs_per_s": rate, "broker_cpu_us_per_msg": cpu}
            for rate, cpu in ((100.0, 3.0), (300.0, 1.0), (200.0, 2.0))]
    summary = median(runs)
    assert summary == {"msgs_per_s": 200.0, "broker_cpu_us_per_msg": 2.0,
                       "runs": [100, 300, 200]}
    assert ratio({"on": {"msgs_per_s": 75.0}, "off": summary}) == 0.375
