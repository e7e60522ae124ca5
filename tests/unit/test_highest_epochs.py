"""The table of the highest leader epoch seen per partition: accept, refuse, forget, persist."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jetstream.isr.highest_epochs import (
    Accepted,
    CorruptEpochFile,
    EpochMark,
    HighestEpochs,
    Refused,
)

KEY = ("orders", 0)


@pytest.mark.parametrize(("recorded", "seen", "outcome", "after"), [
    (None, (0, 0), Accepted(changed=True), (0, 0)),
    ((0, 3), (0, 3), Accepted(changed=False), (0, 3)),
    ((0, 3), (0, 4), Accepted(changed=True), (0, 4)),
    ((0, 3), (0, 2), Refused(EpochMark(0, 3)), (0, 3)),
    # A stream created again starts over at epoch 0: its larger created_version wins.
    ((5, 7), (9, 0), Accepted(changed=True), (9, 0)),
    # An older life of the stream, whatever its epoch, is below.
    ((9, 0), (5, 7), Refused(EpochMark(9, 0)), (9, 0)),
])
def test_observe(recorded: tuple[int, int] | None, seen: tuple[int, int],
                 outcome: object, after: tuple[int, int]) -> None:
    table = HighestEpochs({KEY: EpochMark(*recorded)} if recorded else None)
    assert table.admits(KEY, EpochMark(*seen)) == isinstance(outcome, Accepted)
    assert table.observe(KEY, EpochMark(*seen)) == outcome
    assert table.highest(KEY) == EpochMark(*after)


def test_partitions_are_independent() -> None:
    table = HighestEpochs()
    table.observe(("orders", 0), EpochMark(1, 5))
    assert table.observe(("orders", 1), EpochMark(1, 0)) == Accepted(changed=True)
    assert table.highest(("orders", 0)) == EpochMark(1, 5)
    assert table.highest(("other", 0)) is None


def test_retain_streams_forgets_deleted_streams() -> None:
    table = HighestEpochs({("a", 0): EpochMark(1, 2), ("a", 1): EpochMark(1, 0),
                           ("b", 0): EpochMark(3, 4)})
    assert table.retain_streams({"b", "c"}) is True
    assert list(table) == [(("b", 0), EpochMark(3, 4))]
    assert table.retain_streams({"b"}) is False
    # A deleted stream's marks are gone: its re-creation at any version is accepted.
    table.retain_streams(set())
    assert table.observe(("b", 0), EpochMark(0, 0)) == Accepted(changed=True)


def test_serialized_form_is_declared_text_with_a_crc() -> None:
    table = HighestEpochs({("orders", 1): EpochMark(4, 2), ("orders", 0): EpochMark(4, 9)})
    lines = table.serialize(7).decode().splitlines()
    assert lines[:3] == ["leader-epochs 2 7", "orders 0 4 9", "orders 1 4 2"]
    assert lines[3].startswith("crc ") and len(lines) == 4
    assert HighestEpochs.parse_generation(table.serialize(7))[1] == 7


def test_a_file_of_the_first_format_reads_as_generation_0() -> None:
    import crc32c

    body = "leader-epochs 1\norders 0 4 9\n"
    data = (body + f"crc {crc32c.crc32c(body.encode()):08x}\n").encode()
    table, generation = HighestEpochs.parse_generation(data)
    assert (list(table), generation) == ([(("orders", 0), EpochMark(4, 9))], 0)


def test_changes_are_remembered_until_taken() -> None:
    table = HighestEpochs({("a", 0): EpochMark(1, 2), ("b", 0): EpochMark(3, 4)})
    assert table.take_changes() == []  # what it was built with is not a change
    table.observe(("a", 0), EpochMark(1, 3))
    table.observe(("a", 0), EpochMark(1, 5))  # the last change of a key is what counts
    table.observe(("b", 0), EpochMark(3, 4))  # no change
    assert table.forget([("b", 0), ("c", 0)]) is True
    assert table.take_changes() == [(("a", 0), EpochMark(1, 5)), (("b", 0), None)]
    assert table.take_changes() == []
    assert table.forget([("b", 0)]) is False


names = st.from_regex(r"[A-Za-z0-9_-]{1,64}", fullmatch=True)
marks = st.builds(EpochMark, st.integers(0, 2**40), st.integers(0, 2**32 - 1))


@given(st.dictionaries(st.tuples(names, st.integers(0, 1023)), marks, max_size=20))
def test_round_trip(entries: dict[tuple[str, int], EpochMark]) -> None:
    table = HighestEpochs(entries)
    assert list(HighestEpochs.parse(table.serialize())) == sorted(entries.items())


@pytest.mark.parametrize("data", [
    b"",
    b"leader-epochs 1\n",
    b"\xff\xfe",
    b"leader-epochs 1\norders 0 1 2\ncrc 00000000\n",  # wrong CRC
])
def test_damaged_files_are_refused(data: bytes) -> None:
    with pytest.raises(CorruptEpochFile):
        HighestEpochs.parse(data)


def test_every_flipped_byte_is_detected() -> None:
    good = HighestEpochs({("orders", 0): EpochMark(4, 9), ("x", 3): EpochMark(0, 1)}).serialize()
    for i in range(len(good)):
        bad = bytearray(good)
        bad[i] ^= 0x04
        with pytest.raises(CorruptEpochFile):
            HighestEpochs.parse(bytes(bad))


def test_well_formed_but_bad_entries_are_refused() -> None:
    import crc32c

    for body in ("leader-epochs 2\n", "leader-epochs 3 1\n", "leader-epochs 2 x\n",
                 "leader-epochs 1\norders 0 1\n",
                 "leader-epochs 1\norders 0 1 -2\n", "leader-epochs 1\norders 0 1 ²\n",
                 "leader-epochs 1\norders 0 1 2\norders 0 1 3\n"):
        data = (body + f"crc {crc32c.crc32c(body.encode()):08x}\n").encode()
        with pytest.raises(CorruptEpochFile):
            HighestEpochs.parse(data)
