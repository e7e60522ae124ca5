"""The highest-epochs journal: records appended, read back up to a torn tail, compaction."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from jetstream.isr import epoch_journal as journal
from jetstream.isr.highest_epochs import Change, EpochMark, HighestEpochs

names = st.from_regex(r"[A-Za-z0-9_-]{1,20}", fullmatch=True)
keys = st.tuples(names, st.integers(0, 1023))
marks = st.builds(EpochMark, st.integers(0, 2**40), st.integers(0, 2**32 - 1))
changes = st.lists(st.tuples(keys, st.none() | marks), max_size=30)


def table_of(items: list[Change]) -> HighestEpochs:
    table = HighestEpochs()
    table.apply(items)
    return table


@given(changes, changes)
def test_a_table_and_its_journal_read_back_as_the_changes_applied(
        first: list[Change], then: list[Change]) -> None:
    base = table_of(first)
    data = journal.encode_header(3) + journal.encode_changes(then)
    loaded = journal.load(base.serialize(3), data)
    assert list(loaded.table) == list(table_of(first + then))
    assert (loaded.generation, loaded.journal_records, loaded.compact) == (3, len(then), False)


def test_records_are_one_checksummed_line_each() -> None:
    data = journal.encode_changes([(("orders", 1), EpochMark(4, 2)), (("gone", 0), None)])
    first, second = data.decode().splitlines()
    assert first.startswith("set orders 1 4 2 ") and len(first.rsplit(" ", 1)[1]) == 8
    assert second.startswith("forget gone 0 ")


def test_a_torn_tail_is_ignored_at_every_cut() -> None:
    items: list[Change] = [(("s", p), EpochMark(1, p)) for p in range(4)]
    header = journal.encode_header(1)
    data = header + journal.encode_changes(items)
    ends = [len(header) + len(journal.encode_changes(items[:n])) for n in range(5)]
    for cut in range(len(header), len(data) + 1):
        read = journal.replay(data[:cut])
        whole = max(n for n, end in enumerate(ends) if end <= cut)
        assert read.changes == tuple(items[:whole])
        assert read.ignored_bytes == cut - ends[whole]
        loaded = journal.load(HighestEpochs().serialize(1), data[:cut])
        # Nothing may follow a torn tail: the next write rewrites the table.
        assert loaded.compact == (cut != ends[whole])
        assert bool(loaded.damage) == loaded.compact


def test_a_damaged_record_ends_the_journal() -> None:
    items: list[Change] = [(("s", p), EpochMark(1, p)) for p in range(3)]
    data = bytearray(journal.encode_header(1) + journal.encode_changes(items))
    second = data.index(b"set s 1")
    data[second + 4] ^= 0x01
    read = journal.replay(bytes(data))
    assert read.changes == tuple(items[:1])
    assert read.ignored_bytes == len(data) - second


def test_a_journal_of_another_generation_is_stale() -> None:
    base = table_of([(("s", 0), EpochMark(1, 5))])
    old = journal.encode_header(1) + journal.encode_changes([(("s", 0), EpochMark(1, 2))])
    loaded = journal.load(base.serialize(2), old)
    assert list(loaded.table) == [(("s", 0), EpochMark(1, 5))]
    assert loaded.compact and not loaded.damage and loaded.journal_records == 0


def test_missing_files_and_a_damaged_header() -> None:
    empty = journal.load(None, None)
    assert len(empty.table) == 0 and empty.compact
    base = table_of([(("s", 0), EpochMark(1, 5))]).serialize(4)
    assert journal.load(base, None).compact  # no journal yet: the next write creates it
    bad = bytearray(journal.encode_header(4))
    bad[0] ^= 0x20
    loaded = journal.load(base, bytes(bad) + journal.encode_changes([(("s", 1), None)]))
    assert list(loaded.table) == [(("s", 0), EpochMark(1, 5))]
    assert loaded.compact and "journal ignored" in loaded.damage


def test_compaction_once_the_journal_outgrows_twice_the_table() -> None:
    floor = journal.COMPACT_RECORDS_MIN
    assert not journal.should_compact(floor, 10)
    assert journal.should_compact(floor + 1, 10)
    assert not journal.should_compact(2 * 1000, 1000)
    assert journal.should_compact(2 * 1000 + 1, 1000)
