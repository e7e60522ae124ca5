"""The single broker's metadata on disk: a snapshot of the state and a journal of commands.

Theory of operation: rewriting the whole state for every command costs bytes, JSON work and
an fsync proportional to the number of streams, so creating the n-th stream would cost n
times the first. Instead each applied command is appended to a journal (one checksummed
line, fsynced), and the snapshot is rewritten whole (a compaction) only when the journal
holds more records than the state has streams and partitions together (and at least
COMPACT_RECORDS_MIN): the bytes written per command stay constant, like the highest-epochs
journal (jetstream.isr.epoch_journal).

The journal belongs to one snapshot: both carry a generation, and a compaction writes the
snapshot at the next generation (atomic rename) and then a new, empty journal of that
generation. A journal of another generation (a crash between the two) is stale: everything in
it is in the snapshot already, and it is ignored.

Reading back: records apply in order on top of the snapshot (they were applied once before,
so they apply again: `apply` is deterministic). A record that does not parse or fails its
CRC ends the journal: it and everything after it are ignored (a torn tail, left by a crash
during an append that had not been fsynced, so its command was never answered). The shell
then compacts before its next append, so nothing is ever appended after damage. Pure: bytes
in, values out; the shell (jetstream.raft_meta.local) does the IO.

    Snapshot (JSON): {"format": 2, "generation": <int>, "state": MetadataState.to_dict()}
                     (a file of format 1 is the state itself, generation 0)
    Journal (text, UTF-8; <crc>: crc32c, 8 hex digits, of the line before its last space):
      line 1:  "metadata-journal 1 <generation> <crc>"
      records: "<encode_command(command) as compact JSON> <crc>"
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from jetstream.errors import StorageError
from jetstream.raft_meta.codec import decode_command, encode_command
from jetstream.raft_meta.fsm import Command, MetadataState
from jetstream.stream.checkpoint import checked_line, line_text

SNAPSHOT_FORMAT = 2
JOURNAL_HEADER = "metadata-journal 1"
#: The journal is compacted past max(this, streams + partitions) records.
COMPACT_RECORDS_MIN = 256


def encode_snapshot(state: MetadataState, generation: int) -> bytes:
    return json.dumps({"format": SNAPSHOT_FORMAT, "generation": generation,
                       "state": state.to_dict()}, separators=(",", ":")).encode()


def decode_snapshot(data: bytes) -> tuple[MetadataState, int]:
    """The state and generation of a snapshot file (format 1: the bare state)."""
    try:
        value: Any = json.loads(data)
        if "format" not in value:
            return MetadataState.from_dict(value), 0
        if value["format"] != SNAPSHOT_FORMAT:
            raise StorageError(f"metadata snapshot of unknown format {value['format']!r}")
        return MetadataState.from_dict(value["state"]), int(value["generation"])
    except (ValueError, KeyError, TypeError) as exc:
        raise StorageError(f"the metadata snapshot is damaged: {exc!r}") from exc


def encode_header(generation: int) -> bytes:
    """A new, empty journal of `generation`."""
    assert generation >= 0
    return checked_line(f"{JOURNAL_HEADER} {generation}")


def encode_record(command: Command) -> bytes:
    return checked_line(json.dumps(encode_command(command), separators=(",", ":")))


@dataclass(frozen=True, slots=True)
class JournalRead:
    """The commands of a journal, in order; `complete`: no torn or damaged tail, so appending
    may go on (else compact first). A journal of another generation reads as no commands,
    not complete."""

    commands: tuple[Command, ...]
    complete: bool


def decode_journal(data: bytes, generation: int) -> JournalRead:
    lines = data.split(b"\n")
    header = line_text(lines[0]) if lines else None
    if header != f"{JOURNAL_HEADER} {generation}" or len(lines) < 2:
        return JournalRead((), False)
    commands: list[Command] = []
    for line in lines[1:-1]:  # the last item is what follows the last newline
        text = line_text(line)
        if text is None:
            return JournalRead(tuple(commands), False)
        try:
            commands.append(decode_command(json.loads(text)))
        except (ValueError, KeyError, TypeError) as exc:
            raise StorageError(f"a metadata journal record does not decode: {exc!r}") from exc
    return JournalRead(tuple(commands), lines[-1] == b"")


def compact_due(records: int, state: MetadataState) -> bool:
    """Whether the journal, holding `records`, is due to be folded into a new snapshot."""
    return records >= max(COMPACT_RECORDS_MIN, len(state.streams) + len(state.partitions))
