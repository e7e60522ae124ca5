"""`format("jetstream")`: the Python data source Spark reads and writes streams through.

Theory of operation: Spark instantiates `JetstreamDataSource` with the query's options and
asks it for a reader (batch or streaming) or a writer. The batch reader takes the filters it
can apply (jetstream.spark.filters), plans the read once (jetstream.spark.cluster_view: fixed
end offsets at or below each high watermark), and each Spark task decodes its offset range
into Arrow record batches (jetstream.spark.task_reader). A user schema with a subset of the
columns, e.g. `.schema("partition int, offset long, key binary")`, is what the tasks decode:
columns not asked for are never decoded. The schema's names and types must be the source's.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    Filter,
    InputPartition,
)
from pyspark.sql.types import StructType

from jetstream.errors import InvalidSparkOption
from jetstream.spark.arrow_decode import SPARK_DDL
from jetstream.spark.cluster_view import run_plan
from jetstream.spark.filters import push_filters
from jetstream.spark.options import ReadOptions, parse_read_options, parse_write_options
from jetstream.spark.planning import OffsetBounds
from jetstream.spark.task_reader import TaskPartition, read_task

NAME = "jetstream"

#: Each column's Spark type, as StructType's simpleString spells it.
SPARK_TYPES = {
    "stream": "string",
    "partition": "int",
    "offset": "bigint",
    "timestamp": "timestamp",
    "subject": "string",
    "key": "binary",
    "value": "binary",
    "headers": "map<string,binary>",
    "leader_epoch": "bigint",
}


def read_columns(schema: StructType) -> list[str]:
    """The columns a (user-given) schema asks for. Raises InvalidSparkOption for a column the
    source does not have or a type it does not produce."""
    columns: list[str] = []
    for column in schema.fields:
        expected = SPARK_TYPES.get(column.name)
        if expected is None:
            raise InvalidSparkOption(f"schema: no column {column.name!r}; the columns are "
                                     f"{SPARK_DDL}", field="schema")
        if column.dataType.simpleString() != expected:
            raise InvalidSparkOption(f"schema: column {column.name} is {expected}, not "
                                     f"{column.dataType.simpleString()}", field="schema")
        columns.append(column.name)
    return columns


class BatchReader(DataSourceReader):
    """A batch read; Spark evaluates every filter itself (see FilteringBatchReader)."""

    def __init__(self, options: ReadOptions, columns: Sequence[str]) -> None:
        self.options = options
        self.columns = list(columns)
        self.bounds = OffsetBounds()

    def partitions(self) -> Sequence[InputPartition]:
        plan = run_plan(self.options, self.bounds)
        return [TaskPartition(task) for task in plan.tasks]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, TaskPartition):
            return  # a plan of no tasks: Spark runs one empty partition of its own
        yield from read_task(partition.task, self.columns, self.options.brokers,
                             verify=self.options.verify_crc, tls=self.options.tls)


class FilteringBatchReader(BatchReader):
    """A batch read that takes the filters it can apply (jetstream.spark.filters). PySpark
    refuses a reader with pushFilters while spark.sql.python.filterPushdown.enabled is
    false, so only the registered source (`register` sets it) reads with this one."""

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        self.bounds, rest = push_filters(self.bounds, filters,
                                         rows=not self.options.compacted_latest)
        return rest


class JetstreamDataSource(DataSource):
    """Spark's `format("jetstream")`; see jetstream.spark."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return SPARK_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        return FilteringBatchReader(parse_read_options(self.options), read_columns(schema))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from jetstream.spark.streaming import StreamReader
        return StreamReader(parse_read_options(self.options, streaming=True),
                            read_columns(schema))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from jetstream.spark.writer import BatchWriter
        return BatchWriter(parse_write_options(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool
                     ) -> DataSourceStreamWriter:
        from jetstream.spark.writer import StreamWriter
        return StreamWriter(parse_write_options(self.options), schema)


def options_of(options: dict[str, Any]) -> dict[str, str]:
    """Keyword options as Spark passes them: strings (JSON for dicts)."""
    import json
    return {name: json.dumps(value) if isinstance(value, dict) else str(value)
            for name, value in options.items() if value is not None}


class DiscoveredDataSource(JetstreamDataSource):
    """format("jetstream") as PySpark finds it unregistered (the `pyspark_jetstream` module):
    the same source, its batch reads leaving filters to Spark, since filter pushdown may be
    off in that session. `jetstream.spark.register(spark)` replaces it with the filtering one."""

    def reader(self, schema: StructType) -> DataSourceReader:
        return BatchReader(parse_read_options(self.options), read_columns(schema))
