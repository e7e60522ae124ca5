"""Append expectations and idempotent publishing."""

from __future__ import annotations

from jetstream.errors.base import JetstreamError


class ExpectationFailed(JetstreamError):
    """An append stated what it expected of the partition and the partition differs: nothing
    of the append was written. Read the current state the error carries and decide again."""

    code = "EXPECTATION_FAILED"


class OffsetMismatch(ExpectationFailed):
    """The append expected its first record at `expected_offset`, but the partition's next
    offset (its log end offset, counting appends in flight before this one) is
    `log_end_offset`. Another writer got there first."""

    code = "OFFSET_MISMATCH"
    expected_offset: int
    log_end_offset: int

    def __init__(self, expected_offset: int, log_end_offset: int) -> None:
        super().__init__(f"expected offset {expected_offset}, the log ends at "
                         f"{log_end_offset}", expected_offset=expected_offset,
                         log_end_offset=log_end_offset)


class KeyOffsetMismatch(ExpectationFailed):
    """The append expected the latest record of its key at `expected_offset` (-1: no record
    with this key), but it is at `last_offset` (-1: none). Another writer updated the key."""

    code = "KEY_OFFSET_MISMATCH"
    key: str
    expected_offset: int
    last_offset: int

    def __init__(self, key: str, expected_offset: int, last_offset: int) -> None:
        super().__init__(f"expected the last record of key {key!r} at {expected_offset}, it "
                         f"is at {last_offset}", key=key, expected_offset=expected_offset,
                         last_offset=last_offset)


class RegisterMismatch(ExpectationFailed):
    """The partition's registers do not match the append's `check_registers` selector.
    `registers` holds their current values."""

    code = "REGISTER_MISMATCH"
    selector: str
    registers: dict[str, str]

    def __init__(self, selector: str, registers: dict[str, str]) -> None:
        super().__init__(f"registers {registers} do not match {selector!r}",
                         selector=selector, registers=registers)


class OutOfOrderSequence(JetstreamError):
    """An idempotent producer's publish skipped sequence numbers: the leader expected
    `expected_sequence` next from producer `producer_id` and got `sequence`. A publish before
    it was lost; the producer resends from `expected_sequence`."""

    code = "OUT_OF_ORDER_SEQUENCE"
    producer_id: str
    expected_sequence: int
    sequence: int

    def __init__(self, producer_id: str, expected_sequence: int, sequence: int) -> None:
        super().__init__(f"producer {producer_id!r} sent sequence {sequence}, expected "
                         f"{expected_sequence}", producer_id=producer_id,
                         expected_sequence=expected_sequence, sequence=sequence)


class ProducerFenced(JetstreamError):
    """A newer epoch of the same producer id has published to this partition: this producer
    (a zombie, or a task attempt that was replaced) must stop."""

    code = "PRODUCER_FENCED"
    producer_id: str
    epoch: int
    current_epoch: int

    def __init__(self, producer_id: str, epoch: int, current_epoch: int) -> None:
        super().__init__(f"producer {producer_id!r} epoch {epoch} is fenced by epoch "
                         f"{current_epoch}", producer_id=producer_id, epoch=epoch,
                         current_epoch=current_epoch)


class DuplicateSequence(JetstreamError):
    """A retry of a publish the partition stored long ago (older than the sequences it
    remembers per producer): it is not stored again, and its offset is no longer known."""

    code = "DUPLICATE_SEQUENCE"

    def __init__(self, producer_id: str, sequence: int) -> None:
        super().__init__(f"producer {producer_id!r} sequence {sequence} is stored already",
                         producer_id=producer_id, sequence=sequence)


class KeyNotTracked(JetstreamError):
    """A key expectation the leader cannot judge: the stream is not compacted (keys are
    tracked on compacted streams only), or the key is no longer tracked (more keys than
    `expectation_keys_max` were written since the leader started). Use a compacted stream,
    or raise the limit."""

    code = "KEY_NOT_TRACKED"

    def __init__(self, key: str, tracked_from: int) -> None:
        super().__init__(f"key {key!r} is not tracked (keys are tracked from offset "
                         f"{tracked_from})", key=key, tracked_from=tracked_from)
