"""Fixtures shared by the unit tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from jetstream.stream.log import Log
from tests.unit.log_helpers import Clock, append_n, make


@pytest.fixture
def clock() -> Clock:
    """A settable clock for logs (ms), starting at `log_helpers.T0`."""
    return Clock()


@pytest.fixture
def segmented(tmp_path: Path, clock: Clock) -> Iterator[Log]:
    """120 offsets in 40 batches of 3, over several segments, epochs 0, 1, 2."""
    log = make(tmp_path, clock, segment_bytes_max=4096)
    for i in range(40):
        clock.now += 1
        append_n(log, 1, per_batch=3, epoch=i // 15)
    assert len(log.segment_base_offsets) >= 4
    yield log
    log.close()
