"""The Spark source and writer."""

from __future__ import annotations

from jetstream.errors.base import InvalidConfig, JetstreamError


class InvalidSparkOption(InvalidConfig):
    """An option of format("jetstream") is missing, malformed, or not allowed here."""

    code = "INVALID_SPARK_OPTION"


class DataLoss(JetstreamError):
    """Records a read needs are gone: retention (or a deleted and re-created stream) removed
    them. Batch reads fail; a streaming query fails unless failOnDataLoss is false, in which
    case it goes on from the log start offset."""

    code = "DATA_LOSS"

    def __init__(self, stream: str, partition: int, offset: int, log_start_offset: int) -> None:
        super().__init__(f"{stream}/{partition}: offset {offset} is gone; the partition now "
                         f"starts at {log_start_offset} (set failOnDataLoss=false to go on "
                         "from there)", stream=stream, partition=partition, offset=offset,
                         log_start_offset=log_start_offset)


class UnwritableSchema(JetstreamError):
    """A DataFrame written to a stream must have a binary or string `value` column, and may
    have `key` (binary or string), `headers` (map<string, binary or string>), `partition`
    (int) and `subject` (string); nothing else."""

    code = "UNWRITABLE_SCHEMA"


class SparkWriteFailed(JetstreamError):
    """A Spark task could not append its rows to a stream partition. Rows acked before the
    failure are stored; Spark's retry of the task appends them again (at-least-once)."""

    code = "SPARK_WRITE_FAILED"
    retriable = True

    def __init__(self, stream: str, partition: int | None, cause: str) -> None:
        where = stream if partition is None else f"{stream}/{partition}"
        super().__init__(f"writing to {where} failed: {cause}", stream=stream,
                         partition=partition, cause=cause)
