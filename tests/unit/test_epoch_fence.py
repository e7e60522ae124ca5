"""The epoch fence's files: a role change appends what changed, the table is rewritten only
once the journal outgrew it, and what was admitted is there after a restart."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from jetstream.isr import epoch_journal
from jetstream.isr.highest_epochs import EpochMark
from jetstream.raft_meta.model import PartitionState
from jetstream.server import epoch_fence
from jetstream.server.epoch_fence import EpochFence, load_epochs


@pytest.fixture
def executor() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(1) as pool:
        yield pool


def states(count: int, epoch: int = 0, stream: str = "s") -> dict[tuple[str, int], PartitionState]:
    return {(stream, p): PartitionState(stream, p, (0, 1), 0, (0, 1), epoch, created_version=1)
            for p in range(count)}


async def bytes_for_one_change(fence: EpochFence, epoch: int) -> int:
    before = fence.metrics.bytes_written
    await fence.admit(states(1, epoch, stream="t"), set())
    return fence.metrics.bytes_written - before


@pytest.mark.parametrize("existing", [10, 2000])
async def test_a_role_change_writes_bytes_for_itself_only(
        tmp_path: Path, executor: ThreadPoolExecutor, existing: int) -> None:
    fence = EpochFence(tmp_path, executor)
    await fence.admit(states(existing), set(), streams={"s", "t"})  # the first write: a table
    assert fence.metrics.compactions == 1
    written = [await bytes_for_one_change(fence, epoch) for epoch in range(1, 50)]
    assert fence.metrics.compactions == 1 and fence.metrics.appends == 49
    assert max(written) < 64  # one journal record, whatever the partitions
    loaded = load_epochs(tmp_path)
    assert loaded.table.highest(("t", 0)) == EpochMark(1, 49)
    assert len(loaded.table) == existing + 1 and loaded.journal_records == 49


async def test_the_table_is_rewritten_once_the_journal_outgrows_it(
        tmp_path: Path, executor: ThreadPoolExecutor) -> None:
    fence = EpochFence(tmp_path, executor)
    changes = epoch_journal.COMPACT_RECORDS_MIN + 10
    for epoch in range(changes):
        await bytes_for_one_change(fence, epoch)
    # The first write and one compaction when the journal passed its floor.
    assert fence.metrics.compactions == 2
    loaded = load_epochs(tmp_path)
    assert loaded.table.highest(("t", 0)) == EpochMark(1, changes - 1)
    assert loaded.journal_records < epoch_journal.COMPACT_RECORDS_MIN


async def test_a_torn_journal_tail_is_ignored_and_never_appended_to(
        tmp_path: Path, executor: ThreadPoolExecutor, caplog: pytest.LogCaptureFixture) -> None:
    fence = EpochFence(tmp_path, executor)
    await fence.admit(states(3), set())
    await fence.admit(states(3, epoch=1), set())
    journal = tmp_path / epoch_journal.FILE_NAME
    data = journal.read_bytes()
    journal.write_bytes(data[:-5])  # the last record torn
    again = EpochFence(tmp_path, executor)
    assert "torn write" in caplog.text
    assert again.refused() == []
    admitted = await again.admit(states(3, epoch=1), set())
    assert sorted(admitted) == [("s", 0), ("s", 1), ("s", 2)]
    assert again.metrics.compactions == 1  # the torn record's change, written as a table
    loaded = load_epochs(tmp_path)
    assert not loaded.damage and loaded.table.highest(("s", 2)) == EpochMark(1, 1)


async def test_below_the_recorded_epoch_after_a_restart_no_role(
        tmp_path: Path, executor: ThreadPoolExecutor) -> None:
    fence = EpochFence(tmp_path, executor)
    await fence.admit(states(2, epoch=5), set())
    await fence.admit({}, set(), gone=[("s", 1)])  # its stream was deleted
    again = EpochFence(tmp_path, executor)
    assert await again.admit(states(2, epoch=4), set()) == {("s", 1): states(2, 4)[("s", 1)]}
    assert again.refused() == [(("s", 0), 4, 5)]


async def test_a_failed_write_is_made_again_before_a_role_is_taken(
        tmp_path: Path, executor: ThreadPoolExecutor, monkeypatch: pytest.MonkeyPatch) -> None:
    fence = EpochFence(tmp_path, executor)
    await fence.admit(states(1), set())

    def full(path: Path, data: bytes) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(epoch_fence, "append_fsynced", full)
    with pytest.raises(OSError):
        await fence.admit(states(1, epoch=1), set())
    monkeypatch.undo()
    # The mark is in memory already (no change to take), but not durable: written now.
    assert await fence.admit(states(1, epoch=1), set()) == states(1, 1)
    assert load_epochs(tmp_path).table.highest(("s", 0)) == EpochMark(1, 1)
