"""A log's integrity: checking stored bytes against their CRCs, recording the damage found,
and repairing it in place (jetstream.stream.verified, .check and .repair hold the rules).

`LogIntegrity` is a part of jetstream.stream.log.Log, apart to keep each file to one concern:
it uses the log's lock, segments and damage ledger.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from jetstream.errors import CorruptRecord
from jetstream.stream import repair
from jetstream.stream.check import Pace, check_segment, locate_damage
from jetstream.stream.config import FsyncPolicy, LogConfig
from jetstream.stream.file_slice import FileSlice
from jetstream.stream.segment import Segment
from jetstream.stream.segment_list import SegmentList
from jetstream.stream.verified import Damage, first_bad_batch

log = logging.getLogger(__name__)


class LogIntegrity:
    directory: Path
    config: LogConfig
    _lock: threading.RLock
    _segments: SegmentList
    _damage: repair.DamageLedger

    def _check_open(self) -> None:
        raise NotImplementedError

    @property
    def log_start_offset(self) -> int:
        raise NotImplementedError

    @property
    def log_end_offset(self) -> int:
        raise NotImplementedError

    def _check_piece(self, segment: Segment, piece: FileSlice, data: bytes | None = None
                     ) -> None:
        """Check the batches of `piece` (outside the lock: appends go on), given its bytes
        when the caller read them already; raise CorruptRecord, closing it, when they fail."""
        try:
            if data is None:
                data = piece.read()
            if len(data) != piece.length:
                raise CorruptRecord("segment shrank while being read")
            bad = first_bad_batch(data, piece.first_offset)
            if bad is None:
                with self._lock:
                    if segment in self._segments:
                        segment.verified.add(piece.position, piece.position + piece.length)
                return
            damage = locate_damage(segment, piece.fd, piece.position + bad.position,
                                   bad.expected_offset, bad.reason)
        except BaseException:
            piece.close()
            raise
        piece.close()
        self._record_damage(segment, damage)
        raise CorruptRecord(f"{self.directory}: {damage.describe()}", path=damage.path,
                            position=damage.position, first_offset=damage.first_offset,
                            end_offset=damage.end_offset)

    def _record_damage(self, segment: Segment, damage: Damage) -> None:
        with self._lock:
            if segment not in self._segments:
                return
            segment.verified.discard(damage.position, damage.end_position)
            new = self._damage.record(damage, segment)
        if new:
            log.error("damage found in %s: %s", self.directory, damage.describe())

    @property
    def damage(self) -> list[Damage]:
        """Damage found and not healed yet, oldest offsets first."""
        with self._lock:
            return self._damage.current(self._segments)

    def base_offset_of_segment_for(self, offset: int) -> int:
        """The base offset of the segment holding `offset` (the log start's when below)."""
        with self._lock:
            self._check_open()
            return self._segments.segment_for(max(offset, self.log_start_offset)).base_offset

    def check_segment(self, base_offset: int, pace: Pace | None = None) -> Damage | None:
        """Check every byte of the segment at `base_offset` as it is now (a sealed one whole;
        the active one up to its end now) against its CRCs and the indexes it implies
        (jetstream.stream.check; damaged indexes are rebuilt at once). The damage found
        first (recorded, see `damage`), or None. Call from a thread: it reads the file."""
        with self._lock:
            self._check_open()
            segment = next((s for s in self._segments if s.base_offset == base_offset), None)
            if segment is None:
                return None
            end = segment.size
        result = check_segment(segment, 0, end, pace=pace)
        damage = result.damage
        if damage is not None:
            self._record_damage(segment, damage)
            with self._lock:
                if segment in self._segments:
                    segment.verified.add(0, damage.position)
            return damage
        with self._lock:
            if segment not in self._segments or segment.size < end:
                return None  # deleted or cut meanwhile: nothing to record
            segment.verified.add(0, end)
            if segment.size == end:
                self._damage.passed(segment)
            if (result.indexes is not None and segment.size == end
                    and not segment.indexes_match(result.indexes)):
                log.error("%s: the indexes of %s disagree with its log file: rebuilt from "
                          "it", self.directory, segment.log_path.name)
                segment.adopt_indexes(result.indexes)
                if segment is not self._segments.active:
                    segment.seal(self.config.fsync is not FsyncPolicy.NEVER)
        return None

    def repair(self, damage: Damage, good: bytes) -> str | None:
        """Write `good`, a healthy replica's checked batches for the damaged offsets, over
        the damage in place (jetstream.stream.repair); None when done, else why it cannot
        be (the caller truncates or hands over instead)."""
        with self._lock:
            self._check_open()
            segment = next((s for s in self._segments
                            if s.base_offset == damage.segment_base), None)
            if segment is None:
                return "the segment is no longer in the log"
            why = repair.why_not_write_over(segment, damage, good)
            if why is not None:
                return why
            repair.write_over(segment, damage, good, self.config.fsync is not FsyncPolicy.NEVER)
            self._damage.healed(damage)
        log.warning("%s: repaired offsets [%d, %d) in %s from a healthy replica",
                    self.directory, damage.first_offset, damage.end_offset,
                    segment.log_path.name)
        return None

