"""Bounded reads of the commit log: max_bytes, the upper bound (HW), whole batches, sendfile,
decoded records."""

from __future__ import annotations

import os
import random
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from jetstream.errors import (
    OffsetOutOfRange,
)
from jetstream.stream import format as fmt
from jetstream.stream.file_slice import INLINE_BYTES_MAX
from jetstream.stream.log import Log
from tests.unit.log_helpers import (
    T0,
    Clock,
    append_n,
    assert_dense,
    make,
    read_all,
    value,
)

# -- reads -------------------------------------------------------------------------------------


@pytest.fixture
def batched(tmp_path: Path, clock: Clock) -> Iterator[tuple[Log, list[tuple[int, int, int]]]]:
    """One segment of batches of 1 to 4 records; yields the log and (base, last, size) of each
    batch."""
    rng = random.Random(3)
    log = make(tmp_path, clock, segment_bytes_max=1 << 20, index_interval_bytes=300)
    layout = []
    for _ in range(25):
        base = log.log_end_offset
        count = rng.randrange(1, 5)
        info = log.append([fmt.Record(value(base + i)) for i in range(count)], 0)
        layout.append((info.base_offset, info.last_offset, info.size_bytes))
        clock.now += 10
    yield log, layout
    log.close()


def expected_span(layout: list[tuple[int, int, int]], offset: int, max_bytes: int,
                  bound: int) -> tuple[int, int, int]:
    """(first offset, next offset, length) of a read, from the batch layout."""
    k = next(i for i, (_b, last, _s) in enumerate(layout) if last >= offset)
    base, last, size = layout[k]
    if last >= bound:
        return offset, offset, 0
    total, next_offset = size, last + 1
    for _b_base, b_last, b_size in layout[k + 1:]:
        if b_last >= bound or total + b_size > max_bytes:
            break
        total, next_offset = total + b_size, b_last + 1
    return base, next_offset, total


def test_reads_follow_max_bytes_and_the_bound(
    batched: tuple[Log, list[tuple[int, int, int]]]
) -> None:
    log, layout = batched
    leo = log.log_end_offset
    bounds = sorted({leo, leo - 1, leo // 2, layout[3][0], layout[3][0] + 1, 1, 0})
    checked = 0
    for bound in bounds:
        for offset in range(bound):
            for max_bytes in (0, 1, 300, 700, 1500, 10_000):
                first, next_offset, length = expected_span(layout, offset, max_bytes, bound)
                with log.read(offset, max_bytes, upper_bound=bound) as piece:
                    assert (piece.first_offset, piece.next_offset, piece.length) == (
                        first, next_offset, length), (offset, max_bytes, bound)
                    data = piece.read()
                records = fmt.decode_batches(data, min_offset=offset)
                assert_dense(records, offset, next_offset if length else offset)
                assert all(r.offset < bound for r in records)
                assert log.read_records(offset, max_bytes, bound) == records
                checked += 1
    assert checked > 1000


def test_a_read_returns_at_least_one_whole_batch(
    batched: tuple[Log, list[tuple[int, int, int]]]
) -> None:
    log, layout = batched
    for base, last, size in layout:
        for offset in range(base, last + 1):
            piece = log.read(offset, 1)
            assert (piece.first_offset, piece.next_offset, piece.length) == (base, last + 1, size)
            assert fmt.parse_header(piece.read()).base_offset == base
            piece.close()
            assert piece.fd == -1


def test_reads_at_the_bound_are_empty_and_past_it_out_of_range(
    batched: tuple[Log, list[tuple[int, int, int]]]
) -> None:
    log, layout = batched
    leo = log.log_end_offset
    hw = layout[10][0]
    for offset, bound in ((leo, None), (hw, hw), (0, 0)):
        piece = log.read(offset, 1000, bound)
        assert (piece.length, piece.first_offset, piece.next_offset) == (0, offset, offset)
        assert piece.read() == b""
        piece.close()
        assert log.read_records(offset, 1000, bound) == []
    # A bound inside a batch: that batch is not returned at all.
    inside = layout[10][0] + 1 if layout[10][1] > layout[10][0] else layout[11][0] + 1
    records = read_all(log, upper_bound=inside)
    assert records and all(r.offset < inside for r in records)
    # A bound past the log end is the log end.
    assert_dense(read_all(log, upper_bound=leo + 100), 0, leo)
    for offset, bound, newest in ((leo + 1, None, leo), (hw + 1, hw, hw), (leo + 5, leo + 9, leo)):
        with pytest.raises(OffsetOutOfRange) as err:
            log.read(offset, 1000, bound)
        assert (err.value.offset, err.value.oldest, err.value.newest) == (offset, 0, newest)
        assert err.value.code == "OFFSET_OUT_OF_RANGE"
    with pytest.raises(OffsetOutOfRange):
        log.read_records(-1)


def test_reads_stop_at_the_end_of_a_segment(tmp_path: Path, clock: Clock) -> None:
    with make(tmp_path, clock, segment_bytes_max=4096) as log:
        append_n(log, 40, size=400)
        bases = log.segment_base_offsets
        piece = log.read(0, 1 << 20)
        assert (piece.first_offset, piece.next_offset) == (0, bases[1])
        piece.close()
        offset, reads = 0, 0
        while offset < log.log_end_offset:
            with log.read(offset, 1 << 20) as piece:
                assert piece.first_offset == offset and piece.next_offset in [*bases, 40]
                offset = piece.next_offset
            reads += 1
        assert reads == len(bases)
        assert_dense(read_all(log), 0, 40, size=400)


def test_read_slice_works_with_sendfile(tmp_path: Path, clock: Clock) -> None:
    with make(tmp_path, clock, segment_bytes_max=64 * 1024, retention_messages=1) as log:
        append_n(log, 800, per_batch=2)
        assert len(log.segment_base_offsets) > 2
        piece = log.read(5, 3 * INLINE_BYTES_MAX)
        assert piece.position > 0 and piece.length > INLINE_BYTES_MAX
        assert piece.data is None and piece.fd >= 0
        # The segment goes away (retention); the slice owns a descriptor and stays readable.
        assert log.apply_retention() and log.log_start_offset > piece.next_offset
        a, b = socket.socketpair()
        try:
            sent = 0
            while sent < piece.length:
                sent += os.sendfile(a.fileno(), piece.fd, piece.position + sent,
                                    piece.length - sent)
            received = b""
            while len(received) < piece.length:
                received += b.recv(65536)
        finally:
            a.close()
            b.close()
            piece.close()
        records = fmt.decode_batches(received, min_offset=5)
        assert records[0].offset == 5
        assert_dense(records, 5, piece.next_offset)


def test_a_small_slice_comes_already_read_and_outlives_its_segment(tmp_path: Path,
                                                                   clock: Clock) -> None:
    with make(tmp_path, clock, segment_bytes_max=8192, retention_messages=1) as log:
        append_n(log, 100, per_batch=2)
        piece = log.read(5, 3000)
        assert piece.data is not None and piece.fd == -1
        assert 0 < piece.length == len(piece.data) <= INLINE_BYTES_MAX
        assert log.apply_retention() and log.log_start_offset > piece.next_offset
        records = fmt.decode_batches(piece.read(), min_offset=5)
        assert records[0].offset == 5
        assert_dense(records, 5, piece.next_offset)
        # Bytes not checked yet (or a read that asks for a check) come as a descriptor.
        with log.read(log.log_start_offset, 3000, verify=True) as checked:
            assert checked.data is None and checked.fd >= 0


def test_read_records_returns_all_fields(tmp_path: Path, clock: Clock) -> None:
    with make(tmp_path, clock) as log:
        records = [
            fmt.Record(b"v1", key=b"k1", headers={"h": b"x", "ü": b""}, subject="orders.eu"),
            fmt.Record(b"", key=None, subject="", timestamp_ms=T0 - 5),
            fmt.Record(b"v3", key=b""),
        ]
        log.append(records, 4)
        got = log.read_records(0)
        assert [(r.offset, r.value, r.key, dict(r.headers), r.subject, r.timestamp_ms,
                 r.leader_epoch) for r in got] == [
            (0, b"v1", b"k1", {"h": b"x", "ü": b""}, "orders.eu", T0, 4),
            (1, b"", None, {}, "", T0 - 5, 4),
            (2, b"v3", b"", {}, "", T0, 4),
        ]
        assert log.read_records(1) == got[1:]
