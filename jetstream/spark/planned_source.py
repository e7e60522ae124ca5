"""`format("jetstream_planned")`: a batch read of tasks planned before Spark asked for them.

Theory of operation: `format("jetstream")` plans its tasks when Spark asks for its input
partitions, which is at each action on the DataFrame. jetstream.spark.store_read plans the
live tail of a read once, on the driver, together with the Parquet part, so both halves meet
at the same offsets whenever (and however often) the DataFrame is computed. It hands the
planned ReadTasks (jetstream.spark.planning: segment files, else Fetch from the leader; a file
that is gone by then is read from the leader, which serves offsets below its local log start
from the fragment store) to this source in the option `tasks`: the pickled tasks, base64
encoded, made by `encode_tasks` in the same program. The other options are
`format("jetstream")`'s (brokers, TLS, credentials, verifyCrc).
"""

from __future__ import annotations

import base64
import pickle
from collections.abc import Sequence

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from jetstream.errors import InvalidSparkOption
from jetstream.spark.arrow_decode import SPARK_DDL
from jetstream.spark.options import ReadOptions, parse_read_options
from jetstream.spark.planning import ReadTask
from jetstream.spark.source import BatchReader, read_columns
from jetstream.spark.task_reader import TaskPartition

NAME = "jetstream_planned"
TASKS_OPTION = "tasks"


def encode_tasks(tasks: Sequence[ReadTask]) -> str:
    return base64.b64encode(pickle.dumps(list(tasks), pickle.HIGHEST_PROTOCOL)).decode()


def decode_tasks(text: str) -> list[ReadTask]:
    try:
        tasks = pickle.loads(base64.b64decode(text))  # made by encode_tasks, this program
    except Exception as exc:
        raise InvalidSparkOption(f"option {TASKS_OPTION} holds no planned tasks: {exc}",
                                 field=TASKS_OPTION) from None
    if not isinstance(tasks, list) or not all(isinstance(t, ReadTask) for t in tasks):
        raise InvalidSparkOption(f"option {TASKS_OPTION} holds no planned tasks",
                                 field=TASKS_OPTION)
    return tasks


class PlannedReader(BatchReader):
    """A batch read of tasks planned beforehand (read as format("jetstream") reads them)."""

    def __init__(self, options: ReadOptions, tasks: list[ReadTask], columns: Sequence[str]
                 ) -> None:
        super().__init__(options, columns)
        self.tasks = tasks

    def partitions(self) -> Sequence[InputPartition]:
        return [TaskPartition(task) for task in self.tasks]


class PlannedDataSource(DataSource):
    """See the module docstring."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return SPARK_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        options = {k: v for k, v in self.options.items() if k.lower() != TASKS_OPTION}
        text = next((v for k, v in self.options.items() if k.lower() == TASKS_OPTION), None)
        if text is None:
            raise InvalidSparkOption(f"{NAME} needs the option {TASKS_OPTION}",
                                     field=TASKS_OPTION)
        return PlannedReader(parse_read_options(options), decode_tasks(text),
                             read_columns(schema))
