"""Which partition a published message goes to, chosen on the publisher's side.

Theory of operation: a partition p > 0 of a stream reads `<subject>.<p>` and partition 0
the subject itself, so choosing a partition is choosing the subject to publish on. The
partition is the one given; else, when a known stream reads exactly this subject with N > 1
partitions, `zlib.crc32(key) % N` for a keyed message (every message of a key lands in one
partition, in order) and round-robin per subject without a key; else the subject as is
(partition 0 of every stream on it). The partition counts come from the client's metadata;
the choice itself is pure. A subject is checked once (no wildcards, a valid NATS subject) and
remembered, in a bounded set: publishers repeat a few subjects, and the check is slow.
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Callable

from jetstream.errors import ProtocolError
from jetstream.protocol import names

#: Publish subjects whose syntax check is remembered.
VALID_SUBJECTS_MAX = 4096


def key_partition(key: bytes, partition_count: int) -> int:
    """The partition of a keyed message: every message of a key goes to one partition, and
    reads by key look there."""
    return zlib.crc32(key) % partition_count


class Partitioner:
    """Picks the subject each message is published on; `partition_count(subject)` is the
    partition count of the stream that reads exactly `subject` (1: do not partition)."""

    def __init__(self, partition_count: Callable[[str], int]) -> None:
        self._partition_count = partition_count
        self._round_robin: dict[str, itertools.count[int]] = {}
        self._valid_subjects: set[str] = set()

    def subject_for(self, subject: str, key: bytes | None, partition: int | None) -> str:
        """The subject to publish a message for `subject` on. Raises ProtocolError when
        `subject` is not a NATS subject without wildcards."""
        self._check(subject)
        if partition is not None:
            return names.partition_subject(subject, partition)
        count = self._partition_count(subject)
        if count <= 1:
            return subject
        if key is not None:
            chosen = key_partition(key, count)
        else:
            chosen = next(self._round_robin.setdefault(subject, itertools.count())) % count
        return names.partition_subject(subject, chosen)

    def _check(self, subject: str) -> None:
        if subject in self._valid_subjects:
            return
        if not names.is_subject(subject, wildcards=False):
            raise ProtocolError(f"cannot publish on {subject!r}: not a NATS subject "
                                "without wildcards", field="subject")
        if len(self._valid_subjects) >= VALID_SUBJECTS_MAX:
            self._valid_subjects.clear()
        self._valid_subjects.add(subject)
