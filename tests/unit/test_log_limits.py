"""Limits and bad input of the commit log, the shared descriptor pool, and a full disk."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from jetstream.errors import (
    BatchTooLarge,
    InvalidBatch,
    InvalidConfig,
    RecordTooLarge,
    StaleLeaderEpoch,
)
from jetstream.stream import format as fmt
from jetstream.stream.config import LogConfig
from jetstream.stream.handles import HandlePool
from jetstream.stream.log import Log
from tests.unit.log_helpers import (
    REPO,
    T0,
    Clock,
    append_n,
    assert_dense,
    batch_size,
    make,
    read_all,
    value,
)

# -- limits and bad input ----------------------------------------------------------------------


def assert_unchanged(log: Log, directory: Path, end: int) -> None:
    assert log.log_end_offset == end
    assert sum(p.stat().st_size for p in directory.glob("*.log")) == log.size_bytes
    assert_dense(read_all(log), 0, end, size=None)


def test_record_too_large(tmp_path: Path, clock: Clock) -> None:
    with make(tmp_path, clock, record_bytes_max=1024) as log:
        append_n(log, 2)
        log.append([fmt.Record(b"x" * (1024 - fmt.RECORD_HEADER.size))], 0)  # exactly the limit
        for record in (
            fmt.Record(b"x" * (1024 - fmt.RECORD_HEADER.size + 1)),
            fmt.Record(b"x" * 10, key=b"k" * 1000),
            fmt.Record(b"x" * 10, headers={"h": b"v" * 1000}),
            fmt.Record(b"x" * 10, subject="s" * 1000),
        ):
            with pytest.raises(RecordTooLarge) as err:
                log.append([fmt.Record(b"ok"), record], 0)
            assert err.value.code == "MESSAGE_TOO_LARGE"
            assert (err.value.size, err.value.limit) == (fmt.record_size(record), 1024)
            assert_unchanged(log, tmp_path, 3)


def test_batch_too_large(tmp_path: Path, clock: Clock) -> None:
    with make(tmp_path, clock, batch_records_max=5, batch_bytes_max=1000) as log:
        log.append([fmt.Record(b"x")] * 5, 0)
        with pytest.raises(BatchTooLarge) as err:
            log.append([fmt.Record(b"x")] * 6, 0)
        assert (err.value.size, err.value.limit, err.value.unit, err.value.code) == (
            6, 5, "records", "BATCH_TOO_LARGE")
        with pytest.raises(BatchTooLarge) as err:
            log.append([fmt.Record(b"x" * 300)] * 3, 0)
        assert (err.value.size, err.value.limit, err.value.unit) == (
            batch_size(300, 300, 300), 1000, "bytes")
        big = fmt.encode_batch(5, 0, [fmt.Record(b"x" * 300)] * 3, T0)
        with pytest.raises(BatchTooLarge):
            log.append_batches(big)
        assert_unchanged(log, tmp_path, 5)


def test_stale_leader_epoch(tmp_path: Path, clock: Clock) -> None:
    with make(tmp_path, clock) as log:
        log.append([fmt.Record(b"a")], 3)
        with pytest.raises(StaleLeaderEpoch) as err:
            log.append([fmt.Record(b"b")], 2)
        assert (err.value.epoch, err.value.latest) == (2, 3)
        good = fmt.encode_batch(1, 3, [fmt.Record(b"c")], T0)
        stale = fmt.encode_batch(2, 1, [fmt.Record(b"d")], T0)
        with pytest.raises(StaleLeaderEpoch):
            log.append_batches(good + stale)
        assert_unchanged(log, tmp_path, 1)
        log.append([fmt.Record(b"e")], 4)
        assert [(e.epoch, e.start_offset) for e in log.epochs.entries] == [(3, 0), (4, 1)]


def _recrc(batch: bytearray) -> bytes:
    """Give damaged batch bytes a CRC that matches them again."""
    crc = fmt.crc32c(bytes(batch[fmt.CRC_START:]),
                     fmt.crc32c(bytes(batch[:fmt.CRC_OFFSET])))
    batch[fmt.CRC_OFFSET:fmt.CRC_START] = crc.to_bytes(4, "big")
    return bytes(batch)


def invalid_follower_data() -> dict[str, bytes]:
    one = fmt.encode_batch(2, 0, [fmt.Record(b"x")], T0)
    two = fmt.encode_batch(3, 0, [fmt.Record(b"y"), fmt.Record(b"z")], T0)
    flipped = bytearray(one)
    flipped[-1] ^= 0x01
    bad_record = bytearray(one)
    bad_record[fmt.BATCH_HEADER.size + 3] ^= 0x01  # record length no longer matches
    return {
        "base_offset_ahead": fmt.encode_batch(3, 0, [fmt.Record(b"x")], T0),
        "base_offset_behind": fmt.encode_batch(1, 0, [fmt.Record(b"x")], T0),
        "gap_between_batches": one + fmt.encode_batch(4, 0, [fmt.Record(b"y")], T0),
        "bad_crc": bytes(flipped),
        "bad_crc_in_second": one + two[:-1] + bytes([two[-1] ^ 0x80]),
        "bad_record_with_good_crc": _recrc(bad_record),
        "trailing_bytes": one + b"\x00\x01",
        "partial_batch": one + two[:-5],
        "only_partial": one[:-1],
        "empty": b"",
        "garbage": random.Random(1).randbytes(100),
        "bad_magic": _recrc(bytearray(one[:16] + b"\x07" + one[17:])),
    }


@pytest.mark.parametrize("case", sorted(invalid_follower_data()))
def test_append_batches_rejects_bad_data(tmp_path: Path, clock: Clock, case: str) -> None:
    with make(tmp_path, clock) as log:
        append_n(log, 2)
        with pytest.raises(InvalidBatch) as err:
            log.append_batches(invalid_follower_data()[case])
        assert err.value.code == "INVALID_BATCH"
        assert_unchanged(log, tmp_path, 2)
        # The log still takes good data.
        info = log.append_batches(fmt.encode_batch(2, 0, [fmt.Record(b"ok")], T0))
        assert (info.base_offset, info.last_offset, info.log_end_offset) == (2, 2, 3)
        assert log.read_records(2)[0].value == b"ok"


def test_append_batches_accepts_several_batches(tmp_path: Path, clock: Clock) -> None:
    with make(tmp_path, clock) as log:
        data = b"".join(fmt.encode_batch(i * 2, 1, [fmt.Record(value(i * 2)),
                                                    fmt.Record(value(i * 2 + 1))], T0)
                        for i in range(10))
        info = log.append_batches(memoryview(data))
        assert (info.base_offset, info.last_offset, info.log_end_offset, info.size_bytes) == (
            0, 19, 20, len(data))
        assert (tmp_path / f"{0:020d}.log").read_bytes() == data
        assert_dense(read_all(log), 0, 20)


@pytest.mark.parametrize(
    ("records", "epoch"),
    [
        ([fmt.Record(b"x")], 2**32),
        ([fmt.Record(b"x", timestamp_ms=2**63)], 0),
        ([fmt.Record(b"x"), fmt.Record(b"y", timestamp_ms=-(2**63) - 1)], 0),
        ([fmt.Record(b"x", headers={"\ud800": b"v"})], 0),
        ([fmt.Record(b"x", subject="\udfff")], 0),
        ([fmt.Record(b"x", key=b"k" * 2000, subject="a\ud800")], 0),
        ([fmt.Record(b"x", headers={f"h{i}": b"" for i in range(70_000)})], 0),
    ],
)
def test_unencodable_records_are_invalid(tmp_path: Path, clock: Clock,
                                         records: list[fmt.Record], epoch: int) -> None:
    with make(tmp_path, clock, record_bytes_max=8 * 1024 * 1024) as log:
        append_n(log, 1)
        with pytest.raises(InvalidBatch) as err:
            log.append(records, epoch)
        assert err.value.code == "INVALID_BATCH"
        assert_unchanged(log, tmp_path, 1)


def test_a_negative_epoch_is_invalid(tmp_path: Path, clock: Clock) -> None:
    with make(tmp_path, clock) as log:
        with pytest.raises(InvalidBatch):
            log.append([fmt.Record(b"x")], -1)
        assert_unchanged(log, tmp_path, 0)
        assert log.epochs.entries == []


def test_an_empty_append_is_a_programming_error(tmp_path: Path, clock: Clock) -> None:
    with make(tmp_path, clock) as log, pytest.raises(ValueError):
        log.append([], 0)


@pytest.mark.parametrize(
    ("field", "bad"),
    [
        ("segment_bytes_max", 100),
        ("segment_bytes_max", 3 * 1024**3),
        ("segment_ms_max", 0),
        ("index_interval_bytes", 0),
        ("record_bytes_max", 10),
        ("batch_bytes_max", 1),
        ("batch_records_max", 0),
        ("fsync", "always"),
        ("fsync_interval_ms", 0),
        ("retention_ms", 0),
        ("retention_bytes", -1),
        ("retention_messages", True),
        ("segment_bytes_max", 4096.0),
    ],
)
def test_config_limits(field: str, bad: object) -> None:
    with pytest.raises(InvalidConfig) as err:
        LogConfig(**{field: bad})  # type: ignore[arg-type]
    assert err.value.code == "INVALID_CONFIG"
    assert err.value.field == field


# -- the descriptor pool -----------------------------------------------------------------------


def test_many_logs_share_a_small_descriptor_pool(tmp_path: Path, clock: Clock) -> None:
    pool = HandlePool(max_open=8)
    baseline = len(os.listdir("/proc/self/fd"))
    logs = []
    for p in range(50):
        log = Log(tmp_path / f"p{p}", LogConfig(segment_bytes_max=4096), pool=pool,
                  clock=clock)
        for i in range(12):
            log.append([fmt.Record(value(i, 1000))], 0)
        assert len(log.segment_base_offsets) == 4
        assert pool.open_count <= 8
        logs.append(log)
    # One lock file per log, and at most 8 segment files across all of them.
    assert len(os.listdir("/proc/self/fd")) - baseline <= 50 + 8
    rng = random.Random(5)
    for _ in range(400):
        log = rng.choice(logs)
        offset = rng.randrange(12)
        records = log.read_records(offset, 1)
        assert_dense(records, offset, offset + 1, size=1000)
        assert pool.open_count <= 8
    assert pool.opens > 400
    for log in logs[:25]:
        log.close()
    for log in logs[:25]:
        log = Log(log.directory, LogConfig(segment_bytes_max=4096), pool=pool, clock=clock)
        assert_dense(read_all(log), 0, 12, size=1000)
        assert pool.open_count <= 8
        logs.append(log)
    for log in logs[25:]:
        log.close()
    assert pool.open_count == 0
    assert len(os.listdir("/proc/self/fd")) <= baseline


def test_pool_does_not_close_a_pinned_descriptor(tmp_path: Path) -> None:
    pool = HandlePool(max_open=2)
    paths = [tmp_path / f"f{i}" for i in range(4)]
    for path in paths:
        path.write_bytes(path.name.encode())
    with pool.pinned(paths[0]) as fd0, pool.pinned(paths[1]) as fd1, \
            pool.pinned(paths[2]) as fd2:
        # Over the limit while all are pinned rather than closing one in use.
        assert pool.open_count == 3
        assert [os.pread(fd, 2, 0) for fd in (fd0, fd1, fd2)] == [b"f0", b"f1", b"f2"]
    assert pool.open_count == 2
    with pool.pinned(paths[3]) as fd3:
        assert os.pread(fd3, 2, 0) == b"f3"
    assert pool.open_count == 2
    with pytest.raises(ValueError):
        HandlePool(max_open=1)


# -- a full disk -------------------------------------------------------------------------------

DISK_FULL_SCRIPT = r"""
import json, os, resource, signal, sys
from jetstream.errors import DiskFull
from jetstream.stream import format as fmt
from jetstream.stream.config import LogConfig
from jetstream.stream.log import Log

directory, limit = sys.argv[1], int(sys.argv[2])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
log = Log(directory, LogConfig(segment_bytes_max=1 << 20))
values = []
error = None
for i in range(10_000):
    v = (b"%06d" % i) * 170
    try:
        log.append([fmt.Record(v)], 0)
    except DiskFull as exc:
        error = exc
        break
    values.append(v)
end = log.log_end_offset
read = []
offset = 0
while offset < end:
    records = log.read_records(offset, 1 << 20)
    read.extend(r.value for r in records)
    offset = records[-1].offset + 1
size = os.path.getsize(os.path.join(directory, "%020d.log" % 0))
# Still full: close and reopen.
log.close()
log = Log(directory, LogConfig(segment_bytes_max=1 << 20))
reopened = [log.log_end_offset, log.recovery.scanned_segments, log.recovery.truncated_bytes]
# Room again (the soft limit goes up): the same append now succeeds.
resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
retry = log.append([fmt.Record(b"after")], 0)
log.close()
print(json.dumps({
    "code": error.code if error else None, "retriable": error.retriable if error else None,
    "appended": len(values), "end": end, "reads_match": read == values, "size": size,
    "reopened": reopened, "retry_base": retry.base_offset,
}))
"""


def test_disk_full(tmp_path: Path) -> None:
    limit = 50_000
    out = subprocess.run(
        [sys.executable, "-c", DISK_FULL_SCRIPT, str(tmp_path / "log"), str(limit)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    batch = batch_size(1020)
    assert result["code"] == "DISK_FULL" and result["retriable"] is True
    assert result["appended"] == limit // batch
    assert result["end"] == result["appended"]
    assert result["reads_match"]
    # The batch that did not fit left nothing behind.
    assert result["size"] == result["appended"] * batch
    # It reopens cleanly (nothing to scan or cut) with the same log end offset.
    assert result["reopened"] == [result["appended"], 0, 0]
    assert result["retry_base"] == result["appended"]
    log = Log(tmp_path / "log", LogConfig(segment_bytes_max=1 << 20), pool=HandlePool(8))
    assert log.recovery.scanned_segments == 0
    assert log.log_end_offset == result["appended"] + 1
    records = read_all(log)
    assert [r.value for r in records[:-1]] == [(b"%06d" % i) * 170
                                               for i in range(result["appended"])]
    assert records[-1].value == b"after"
    log.close()
