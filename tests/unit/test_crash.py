"""Crashes and damage: files cut at random byte positions, random bits flipped, a writer killed
with SIGKILL. After reopening, every record the log serves is exactly one that was appended at
that offset, in order; recovery never invents or reorders data; and the log takes appends
again.

Two kinds of damage, because the recovery point makes sealed segments below it trusted (not
CRC-scanned at open):
- damage past the recovery point (the active segment, what a crash can tear): found at open,
  the log keeps an exact prefix and reads never fail;
- damage anywhere (a bad disk): trusted segments are checked when read, so a read may stop
  with CorruptRecord but never returns a wrong record; without the recovery point (a full
  scan) the log keeps an exact prefix again.

Every case is seeded: a failure names the seed that reproduces it.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from jetstream.errors import CorruptRecord
from jetstream.stream import format as fmt
from jetstream.stream.config import FsyncPolicy, LogConfig
from jetstream.stream.handles import HandlePool
from jetstream.stream.log import Log
from jetstream.stream.recovery import RECOVERY_POINT_FILE

REPO = Path(__file__).resolve().parents[2]
T0 = 1_700_000_000_000


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        self.now += 1
        return self.now


def value(offset: int, size: int) -> bytes:
    head = b"%d|" % offset
    return (head * (size // len(head) + 1))[:size]


def open_log(directory: Path, config: LogConfig) -> Log:
    return Log(directory, config, pool=HandlePool(16), clock=Clock())


def build(directory: Path, config: LogConfig, seed: int,
          count: int) -> tuple[Log, dict[int, bytes]]:
    """A log of `count` random batches (1-4 records of 0-900 bytes), a new epoch every 10."""
    rng = random.Random(seed)
    log = open_log(directory, config)
    expected: dict[int, bytes] = {}
    for n in range(count):
        base = log.log_end_offset
        vals = [value(base + i, rng.randrange(0, 900)) for i in range(rng.randrange(1, 5))]
        log.append([fmt.Record(v) for v in vals], n // 10)
        expected.update((base + i, v) for i, v in enumerate(vals))
    return log, expected


def crash(log: Log) -> None:
    """Drop the log as a killed process would: no seal, no recovery point, no close."""
    for segment in log._segments:
        segment.close()
    log._release_lock()
    log._closed = True


def batch_boundaries(path: Path) -> list[int]:
    """Where the whole batches at the start of a segment file end (0 included)."""
    data = path.read_bytes()
    ends = [0]
    try:
        for position, header in fmt.iter_batches(data, verify=False):
            ends.append(position + header.size)
    except fmt.BatchFormatError:
        pass
    return ends


def cut(path: Path, rng: random.Random) -> str:
    size = path.stat().st_size
    if path.suffix == ".log" and rng.random() < 0.3:
        # Exactly between two batches: the shorter file is well-formed on its own.
        at = rng.choice(batch_boundaries(path))
    else:
        at = rng.randrange(0, size + 1)
    os.truncate(path, at)
    return f"cut {path.name} at {at}/{size}"


def flip(path: Path, rng: random.Random) -> str:
    data = bytearray(path.read_bytes())
    if not data:
        return f"{path.name} is empty"
    bits = sorted(rng.randrange(len(data) * 8) for _ in range(rng.randrange(1, 9)))
    for bit in bits:
        data[bit // 8] ^= 1 << (bit % 8)
    path.write_bytes(bytes(data))
    return f"flip {path.name} bits {bits}"


def served(log: Log) -> Iterator[fmt.StoredRecord | CorruptRecord]:
    """Every record the log serves from its start, in order; on CorruptRecord, the error and
    then the records from the next segment on."""
    offset = log.log_start_offset
    end = log.log_end_offset
    while offset < end:
        try:
            records = log.read_records(offset, 4000)
        except CorruptRecord as exc:
            yield exc
            later = [b for b in log.segment_base_offsets if b > offset]
            if not later:
                return
            offset = later[0]
            continue
        assert records, f"no record at {offset} below the log end {end}"
        yield from records
        offset = records[-1].offset + 1


def check_exact_prefix(log: Log, expected: dict[int, bytes], start: int, why: str) -> None:
    """The log holds exactly the records appended at [start, LEO): nothing else, no gap."""
    assert log.log_start_offset == start, why
    assert start <= log.log_end_offset <= max(expected) + 1, why
    got = list(served(log))
    assert not any(isinstance(r, CorruptRecord) for r in got), why
    assert [r.offset for r in got] == list(range(start, log.log_end_offset)), why
    for record in got:
        assert isinstance(record, fmt.StoredRecord)
        assert record.value == expected[record.offset], (why, record.offset)


def check_appends_again(log: Log, why: str) -> None:
    end = log.log_end_offset
    info = log.append([fmt.Record(b"after the crash")], log.latest_epoch + 1)
    assert info.base_offset == end, why
    assert [(r.offset, r.value) for r in log.read_records(end)] == [
        (end, b"after the crash")], why


@pytest.fixture(autouse=True, scope="module")
def no_fsync() -> Iterator[None]:
    """A simulated crash in this process keeps the page cache, and damage is applied by hand:
    fsync changes nothing here but the run time (the killed writer below does its own)."""
    real = os.fsync
    os.fsync = lambda fd: None
    try:
        yield
    finally:
        os.fsync = real


# -- damage past the recovery point ------------------------------------------------------------

CONFIGS = {
    "always": LogConfig(segment_bytes_max=4096, index_interval_bytes=700),
    "interval": LogConfig(segment_bytes_max=4096, index_interval_bytes=1,
                          fsync=FsyncPolicy.INTERVAL),
}


@pytest.fixture(scope="module")
def crashed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict[int, bytes],
                                                                    list[int]]]:
    """For each config: a crashed log's directory, what was appended, its segment bases."""
    out = {}
    for name, config in CONFIGS.items():
        directory = tmp_path_factory.mktemp(f"crashed-{name}")
        log, expected = build(directory, config, seed=len(name), count=30)
        bases = log.segment_base_offsets
        assert len(bases) >= 6
        crash(log)
        out[name] = (directory, expected, bases)
    return out


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_a_torn_or_damaged_tail_leaves_an_exact_prefix(
    tmp_path: Path, crashed: dict[str, tuple[Path, dict[int, bytes], list[int]]], name: str
) -> None:
    source, expected, bases = crashed[name]
    config = CONFIGS[name]
    for seed in range(80):
        rng = random.Random(seed)
        directory = tmp_path / str(seed)
        shutil.copytree(source, directory)
        active = directory / f"{bases[-1]:020d}.log"
        damage = [cut(active, rng)] if rng.random() < 0.7 else []
        if rng.random() < 0.5 or not damage:
            damage.append(flip(active, rng))
        why = f"seed {seed}: {damage}"
        log = open_log(directory, config)
        # Everything below the active segment survives; the active one keeps a prefix.
        assert log.log_end_offset >= bases[-1], why
        assert log.recovery.dropped_segments == 0, why
        check_exact_prefix(log, expected, 0, why)
        check_appends_again(log, why)
        end = log.log_end_offset
        log.close()
        log = open_log(directory, config)
        assert log.recovery.scanned_segments == 0, why
        assert log.log_end_offset == end, why
        log.close()
        shutil.rmtree(directory)


# -- damage anywhere ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def closed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, bytes]]:
    """A cleanly closed log (every segment trusted), with epochs and a high watermark."""
    directory = tmp_path_factory.mktemp("closed")
    log, expected = build(directory, CLOSED_CONFIG, seed=99, count=35)
    assert len(log.segment_base_offsets) >= 6
    assert len(log.epochs.entries) >= 2
    log.write_high_watermark(log.log_end_offset - 5)
    log.close()
    return directory, expected


CLOSED_CONFIG = LogConfig(segment_bytes_max=4096, index_interval_bytes=900)


def damage_anywhere(directory: Path, rng: random.Random) -> list[str]:
    files = sorted(p for p in directory.iterdir() if p.name != ".lock")
    logs = [p for p in files if p.suffix == ".log"]
    done = []
    for _ in range(rng.randrange(1, 4)):
        # Mostly the segment files themselves, sometimes indexes and checkpoints.
        path = rng.choice(logs) if rng.random() < 0.6 else rng.choice(files)
        done.append(cut(path, rng) if rng.random() < 0.4 else flip(path, rng))
    return done


def test_random_damage_never_serves_a_wrong_record(
    tmp_path: Path, closed: tuple[Path, dict[int, bytes]]
) -> None:
    source, expected = closed
    corrupt_seen = 0
    for seed in range(120):
        rng = random.Random(1000 + seed)
        directory = tmp_path / str(seed)
        shutil.copytree(source, directory)
        why = f"seed {1000 + seed}: {damage_anywhere(directory, rng)}"
        rescan = tmp_path / f"{seed}-rescan"
        shutil.copytree(directory, rescan)

        # As found: trusted segments are checked when read.
        log = open_log(directory, CLOSED_CONFIG)
        start = log.log_start_offset
        assert start == 0, why
        last = start - 1
        for item in served(log):
            if isinstance(item, CorruptRecord):
                assert item.code == "CORRUPT_RECORD", why
                corrupt_seen += 1
                continue
            assert item.offset > last, why
            assert item.value == expected[item.offset], (why, item.offset)
            last = item.offset
        check_appends_again(log, why)
        end = log.log_end_offset
        log.close()
        log = open_log(directory, CLOSED_CONFIG)
        assert log.log_end_offset == end, why
        log.close()

        # Without the recovery point every segment is scanned: an exact prefix remains.
        (rescan / RECOVERY_POINT_FILE).unlink(missing_ok=True)
        log = open_log(rescan, CLOSED_CONFIG)
        assert log.recovery.scanned_segments >= 1, why
        check_exact_prefix(log, expected, 0, why)
        epochs = [(e.epoch, e.start_offset) for e in log.epochs.entries]
        if log.log_end_offset > 0:
            assert epochs[0][1] == 0, why
            for record in log.read_records(log.log_end_offset - 1):
                assert record.leader_epoch == epochs[-1][0], why
        check_appends_again(log, why)
        log.close()
        shutil.rmtree(directory)
        shutil.rmtree(rescan)
    assert corrupt_seen > 5  # the trusted path was exercised


# -- a writer killed with SIGKILL -------------------------------------------------------------

WRITER = r"""
import sys
from jetstream.stream import format as fmt
from jetstream.stream.config import FsyncPolicy, LogConfig
from jetstream.stream.log import Log

directory, policy = sys.argv[1], sys.argv[2]
log = Log(directory, LogConfig(segment_bytes_max=4096, fsync=FsyncPolicy(policy)))
offset = log.log_end_offset
while True:
    count = 1 + offset % 3
    vals = [(b"%d|" % (offset + i)) * (1 + (offset + i) % 97) for i in range(count)]
    info = log.append([fmt.Record(v) for v in vals], 0)
    offset = info.log_end_offset
    sys.stdout.write("%d\n" % offset)
    sys.stdout.flush()
"""


def writer_value(offset: int) -> bytes:
    return (b"%d|" % offset) * (1 + offset % 97)


@pytest.mark.parametrize("policy", ["always", "never"])
def test_a_killed_writer_loses_nothing_it_acked(tmp_path: Path, policy: str) -> None:
    config = LogConfig(segment_bytes_max=4096, fsync=FsyncPolicy(policy))
    for seed in range(4):
        rng = random.Random(seed)
        directory = tmp_path / str(seed)
        acked = 0
        for round_ in range(2):  # the second round appends to a recovered log
            proc = subprocess.Popen([sys.executable, "-c", WRITER, str(directory), policy],
                                    cwd=REPO, stdout=subprocess.PIPE, text=True)
            assert proc.stdout is not None
            target = acked + rng.randrange(20, 400)
            try:
                for line in proc.stdout:
                    acked = int(line)
                    if acked >= target:
                        break
            finally:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(30)
                proc.stdout.close()
            assert proc.returncode == -signal.SIGKILL
            why = f"seed {seed} round {round_} policy {policy}: killed after {acked}"
            log = open_log(directory, config)
            # A process crash loses nothing the OS has: every acked record is there.
            assert log.log_end_offset >= acked, why
            records = [r for r in served(log) if isinstance(r, fmt.StoredRecord)]
            assert [r.offset for r in records] == list(range(log.log_end_offset)), why
            assert all(r.value == writer_value(r.offset) for r in records), why
            acked = log.log_end_offset
            log.close()
        # Then tear the tail as a power loss might, and recover again.
        bases = sorted(int(p.name[:20]) for p in directory.glob("*.log"))
        why = f"seed {seed}: " + cut(directory / f"{bases[-1]:020d}.log", rng)
        (directory / RECOVERY_POINT_FILE).unlink()
        log = open_log(directory, config)
        expected = {o: writer_value(o) for o in range(acked)}
        check_exact_prefix(log, expected, 0, why)
        assert log.log_end_offset >= bases[-1], why
        check_appends_again(log, why)
        log.close()
