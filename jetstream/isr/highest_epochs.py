"""The highest leader epoch this broker has seen for each partition, kept across restarts.

Theory of operation: the metadata (Raft, through pysyncobj) names each partition's leader
and leader epoch, but pysyncobj does not fsync its journal, so after a power cut a broker may
replay an older metadata state than the one it already acted on. Acting on it again would
undo a fence: a broker could lead or follow at an epoch the cluster has left behind. So a
broker records, durably and before it takes a role at an epoch, the highest epoch it has seen
per partition, and refuses any role or epoch-checked request below it until the metadata
catches up.

An epoch is only comparable within one life of a stream: a stream deleted and created again
under the same name starts over at epoch 0. So each partition's mark is the pair
(`created_version`: the metadata version that created the stream, `leader_epoch`), compared in
that order; a re-created stream has a larger `created_version` and supersedes the old marks.
Marks of a stream the metadata no longer holds are forgotten (`retain_streams`), as its logs
are deleted.

The table is pure: `observe` decides and records in memory, and remembers what changed since
the shell last took the changes (`take_changes`); the shell makes them durable before it
acts on an accepted change: appended to a journal (jetstream.isr.epoch_journal), and now and
then the whole table rewritten with `serialize()` (fsync and atomic rename), so the bytes
written per change do not grow with the number of partitions.

    File (text, UTF-8; stream names have no spaces):
      line 1: "leader-epochs 2 <generation>"   ("leader-epochs 1": generation 0, no journal)
      lines:  "<stream> <partition> <created_version> <leader_epoch>", sorted
      last:   "crc <crc32c of the previous lines, 8 hex digits>"
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass

import crc32c as _crc32c

FILE_NAME = "leader-epochs"
HEADER = "leader-epochs 2"
HEADER_V1 = "leader-epochs 1"

#: (stream, partition)
Key = tuple[str, int]


class CorruptEpochFile(ValueError):
    """The file does not parse or fails its CRC: the broker cannot tell which epochs it saw.
    It logs this and starts from an empty table (the metadata is trusted as before)."""


@dataclass(frozen=True, slots=True, order=True)
class EpochMark:
    """A point in a partition's history: the stream's life, then the leader epoch in it."""

    created_version: int
    leader_epoch: int

    def __post_init__(self) -> None:
        assert self.created_version >= 0 and self.leader_epoch >= 0, self


@dataclass(frozen=True, slots=True)
class Accepted:
    """The mark is at or above the recorded one. `changed`: it is higher and now recorded;
    persist the table before acting on it."""

    changed: bool


@dataclass(frozen=True, slots=True)
class Refused:
    """The mark is below `recorded`: the metadata is older than what this broker acted on.
    Do not act on it; wait for the metadata to catch up."""

    recorded: EpochMark


Observation = Accepted | Refused

#: One change of the table: the key's new mark, or None when it was forgotten.
Change = tuple[Key, EpochMark | None]


class HighestEpochs:
    def __init__(self, marks: Mapping[Key, EpochMark] | None = None) -> None:
        self._marks: dict[Key, EpochMark] = dict(marks or {})
        #: What changed since `take_changes` (the last change of each key).
        self._changes: dict[Key, EpochMark | None] = {}

    def __len__(self) -> int:
        return len(self._marks)

    def __iter__(self) -> Iterator[tuple[Key, EpochMark]]:
        return iter(sorted(self._marks.items()))

    def highest(self, key: Key) -> EpochMark | None:
        return self._marks.get(key)

    def admits(self, key: Key, mark: EpochMark) -> bool:
        """True when `mark` is not below the recorded one (nothing is recorded)."""
        recorded = self._marks.get(key)
        return recorded is None or mark >= recorded

    def observe(self, key: Key, mark: EpochMark) -> Observation:
        """Accept and record `mark` when it is not below the recorded one; refuse it
        otherwise (the table is unchanged)."""
        recorded = self._marks.get(key)
        if recorded is not None and mark < recorded:
            return Refused(recorded)
        if recorded == mark:
            return Accepted(changed=False)
        self._marks[key] = self._changes[key] = mark
        return Accepted(changed=True)

    def retain_streams(self, streams: Collection[str]) -> bool:
        """Forget the marks of streams not in `streams` (deleted); True when any was."""
        return self.forget([key for key in self._marks if key[0] not in streams])

    def forget(self, keys: Iterable[Key]) -> bool:
        """Forget the marks of `keys` (their stream was deleted); True when any was held."""
        forgotten = False
        for key in keys:
            if self._marks.pop(key, None) is not None:
                self._changes[key] = None
                forgotten = True
        return forgotten

    def apply(self, changes: Iterable[Change]) -> None:
        """Replay changes read back from a journal (they are not changes to persist)."""
        for key, mark in changes:
            if mark is None:
                self._marks.pop(key, None)
            else:
                self._marks[key] = mark

    def take_changes(self) -> list[Change]:
        """The changes since the last call, to persist; forgotten here."""
        changes, self._changes = list(self._changes.items()), {}
        return changes

    # -- persistence ----------------------------------------------------------------------------

    def serialize(self, generation: int = 0) -> bytes:
        """The whole table; `generation` names the journal that may follow it."""
        assert generation >= 0
        body = f"{HEADER} {generation}\n" + "".join(
            f"{stream} {partition} {mark.created_version} {mark.leader_epoch}\n"
            for (stream, partition), mark in self)
        return (body + f"crc {_crc32c.crc32c(body.encode()):08x}\n").encode()

    @classmethod
    def parse(cls, data: bytes) -> HighestEpochs:
        """The table `serialize` wrote. Raises CorruptEpochFile."""
        return cls.parse_generation(data)[0]

    @classmethod
    def parse_generation(cls, data: bytes) -> tuple[HighestEpochs, int]:
        """The table `serialize` wrote, and its generation. Raises CorruptEpochFile."""
        try:
            text = data.decode()
        except UnicodeDecodeError:
            raise CorruptEpochFile("not UTF-8") from None
        lines = text.split("\n")
        if len(lines) < 3 or lines[-1] != "" or not lines[-2].startswith("crc "):
            raise CorruptEpochFile("no CRC line at the end")
        body = "\n".join(lines[:-2]) + "\n"
        try:
            crc = int(lines[-2][4:], 16)
        except ValueError:
            raise CorruptEpochFile(f"bad CRC line {lines[-2]!r}") from None
        if crc != _crc32c.crc32c(body.encode()):
            raise CorruptEpochFile("CRC mismatch")
        generation = _generation(lines[0])
        marks: dict[Key, EpochMark] = {}
        for line in lines[1:-2]:
            parts = line.split(" ")
            numbers = parts[1:]
            if len(parts) != 4 or not parts[0] or not all(
                    n.isascii() and n.isdigit() for n in numbers):
                raise CorruptEpochFile(f"bad entry {line!r}")
            key = (parts[0], int(parts[1]))
            if key in marks:
                raise CorruptEpochFile(f"{key} recorded twice")
            marks[key] = EpochMark(int(parts[2]), int(parts[3]))
        return cls(marks), generation


def _generation(header: str) -> int:
    if header == HEADER_V1:
        return 0
    number = header[len(HEADER) + 1:]
    if not header.startswith(HEADER + " ") or not (number.isascii() and number.isdigit()):
        raise CorruptEpochFile(f"unknown header {header!r}")
    return int(number)
