"""Incremental batch reads: each run of a job reads what its consumer group has not read yet.

Theory of operation: `IncrementalRead.plan` fixes the read's offsets on the driver when the
job starts: for every partition, from the group's committed offset (startingOffsets where the
group has none) to the high watermark of that moment. `load()` is an ordinary batch read of
exactly that range (the offsets are passed as startingOffsets/endingOffsets, so every action
on the DataFrame reads the same records), and `commit()`, called after the job's output is
written, commits the end offsets to the group. A job that fails before committing reads the
same range again next time: output is written at least once, and exactly once when the output
is replaced rather than appended (e.g. a Parquet partition overwritten per run).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from jetstream.client.client import connect
from jetstream.spark.cluster_view import plan_read, run_sync
from jetstream.spark.options import parse_read_options, tls_option
from jetstream.spark.planning import OffsetBounds, Ranges
from jetstream.spark.source import NAME, options_of


@dataclass(frozen=True)
class IncrementalRead:
    spark: SparkSession
    group: str
    #: The read's options (strings), without the group's: the offsets below replace it.
    options: Mapping[str, str]
    ranges: Ranges

    @classmethod
    def plan(cls, spark: SparkSession, group: str, options: Mapping[str, Any]
             ) -> IncrementalRead:
        text = options_of(dict(options))
        parsed = parse_read_options({**text, "group": group})

        async def run() -> Ranges:
            async with connect(parsed.brokers, **parsed.tls.connect_options()) as client:
                return (await plan_read(client, parsed, OffsetBounds())).ranges

        return cls(spark, group, text, run_sync(run()))

    @property
    def starting_offsets(self) -> dict[str, dict[str, int]]:
        return self.ranges.starts()

    @property
    def ending_offsets(self) -> dict[str, dict[str, int]]:
        return self.ranges.ends()

    @property
    def record_count(self) -> int:
        """Offsets in the range (compacted streams may hold fewer records)."""
        return sum(end - start for start, end in self.ranges.ranges.values())

    def load(self, schema: str | None = None) -> DataFrame:
        """The DataFrame of the planned range (with `schema`, only those columns)."""
        reader = self.spark.read.format(NAME).options(**self.options)
        reader = reader.option("startingOffsets", json.dumps(self.starting_offsets))
        reader = reader.option("endingOffsets", json.dumps(self.ending_offsets))
        if schema is not None:
            reader = reader.schema(schema)
        return reader.load()

    def commit(self) -> None:
        """Commit the range's end offsets to the group: the next run starts there."""
        offsets = {key: end for key, (_start, end) in self.ranges.ranges.items()}
        if not offsets:
            return

        async def run() -> None:
            async with connect(self.options.get("brokers"),
                               **tls_option(self.options).connect_options()) as client:
                await client.commit_offsets(self.group, offsets)

        run_sync(run())
