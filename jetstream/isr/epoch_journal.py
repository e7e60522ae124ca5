"""The journal of the highest-epochs table: changes appended, the table rewritten now and then.

Theory of operation: the table of the highest leader epoch per partition
(jetstream.isr.highest_epochs) must be durable before a broker takes a role at a new epoch.
Rewriting the whole table for each change costs bytes and an fsync proportional to the
number of partitions; so changes are appended to a journal beside the table file (one
checksummed line each, fsynced), and the table is rewritten whole (a compaction) only when
the journal holds more than twice as many records as the table has marks (and at least
COMPACT_RECORDS_MIN): the bytes written per change stay constant, whatever the number of
partitions.

The journal belongs to one table file: both carry a generation, and a compaction writes the
table at the next generation (atomic rename) and then a new, empty journal of that
generation. A journal of another generation (a crash between the two) is stale: everything
in it is in the table already, and it is ignored.

Reading back: records apply in order on top of the table. A record that does not parse or
fails its CRC ends the journal: it and everything after it are ignored (a torn tail, left by
a crash during an append; that append had not been fsynced, so no role was taken on it). The
shell then compacts before its next append, so nothing is ever appended after damage. Pure:
bytes in, values out; the shell (jetstream.server.epoch_fence) does the IO.

    Journal (text, UTF-8; stream names have no spaces; <crc>: crc32c, 8 hex digits, of the
    line before its last space):
      line 1:  "leader-epochs-journal 1 <generation> <crc>"
      records: "set <stream> <partition> <created_version> <leader_epoch> <crc>"
               "forget <stream> <partition> <crc>"
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from jetstream.isr.highest_epochs import (
    Change,
    CorruptEpochFile,
    EpochMark,
    HighestEpochs,
)
from jetstream.stream.checkpoint import checked_line, line_text

FILE_NAME = "leader-epochs.journal"
HEADER = "leader-epochs-journal 1"
#: The journal is compacted past max(this, 2 x the marks held) records.
COMPACT_RECORDS_MIN = 256


def encode_header(generation: int) -> bytes:
    """A new, empty journal of `generation`."""
    assert generation >= 0
    return checked_line(f"{HEADER} {generation}")


def encode_changes(changes: Sequence[Change]) -> bytes:
    """The records of `changes`, to append."""
    return b"".join(
        checked_line(f"set {stream} {partition} {mark.created_version} {mark.leader_epoch}")
        if mark is not None else checked_line(f"forget {stream} {partition}")
        for (stream, partition), mark in changes)


@dataclass(frozen=True, slots=True)
class Replay:
    """A journal read back: its generation, its valid records, and how many bytes at its end
    were ignored (a torn tail)."""

    generation: int
    changes: tuple[Change, ...]
    ignored_bytes: int


def replay(data: bytes) -> Replay:
    """The journal's records up to the first damaged one. Raises CorruptEpochFile when the
    header line itself is damaged (then nothing says which table it belongs to)."""
    end = data.find(b"\n")
    header = line_text(data[:end]) if end >= 0 else None
    parts = header.split(" ") if header is not None else []
    if len(parts) != 3 or " ".join(parts[:2]) != HEADER or not _number(parts[2]):
        raise CorruptEpochFile("damaged journal header")
    changes: list[Change] = []
    position = end + 1
    while position < len(data):
        end = data.find(b"\n", position)
        change = _record(data[position:end]) if end >= 0 else None
        if change is None:
            break
        changes.append(change)
        position = end + 1
    return Replay(int(parts[2]), tuple(changes), len(data) - position)


def _number(text: str) -> bool:
    return text.isascii() and text.isdigit()


def _record(line: bytes) -> Change | None:
    text = line_text(line)
    if text is None:
        return None
    parts = text.split(" ")
    if parts[0] == "set" and len(parts) == 5 and parts[1] and all(map(_number, parts[2:])):
        return (parts[1], int(parts[2])), EpochMark(int(parts[3]), int(parts[4]))
    if parts[0] == "forget" and len(parts) == 3 and parts[1] and _number(parts[2]):
        return (parts[1], int(parts[2])), None
    return None


@dataclass(frozen=True, slots=True)
class Loaded:
    """The table as the files hold it: its generation, the journal records on top of it,
    and `compact` when the next write must be a compaction (no journal of this generation,
    or a damaged one: nothing may be appended to it). `damage` says what was ignored."""

    table: HighestEpochs
    generation: int
    journal_records: int
    compact: bool
    damage: str = ""


def load(table_file: bytes | None, journal: bytes | None) -> Loaded:
    """The table from its file and its journal (None: the file is absent). Raises
    CorruptEpochFile for a damaged table file; a journal whose header is damaged is ignored
    (the table alone is the best left), and so is a journal's torn tail."""
    if table_file is None:
        table, generation = HighestEpochs(), 0
    else:
        table, generation = HighestEpochs.parse_generation(table_file)
    if journal is None:
        return Loaded(table, generation, 0, compact=True)
    try:
        read = replay(journal)
    except CorruptEpochFile as exc:
        return Loaded(table, generation, 0, compact=True, damage=f"journal ignored: {exc}")
    if read.generation != generation:
        return Loaded(table, generation, 0, compact=True)  # stale: in the table already
    table.apply(read.changes)
    damage = (f"the last {read.ignored_bytes} bytes of the journal ignored (a torn write)"
              if read.ignored_bytes else "")
    return Loaded(table, generation, len(read.changes), compact=bool(damage), damage=damage)


def should_compact(journal_records: int, marks: int) -> bool:
    """Rewrite the table whole once the journal outgrows it (see the module docstring)."""
    return journal_records > max(COMPACT_RECORDS_MIN, 2 * marks)
