"""Spark's `format("jetstream")`: bulk reads of committed segments, streaming reads, writes.

    import jetstream.spark
    jetstream.spark.register(spark)
    df = spark.read.format("jetstream").option("brokers", "127.0.0.1:9292") \\
        .option("stream", "orders").load()

`register` adds the data source to the session and turns on Spark's filter pushdown for
Python data sources, so filters on partition, offset and timestamp narrow what is read.
`incremental` is a batch read that starts at a consumer group's committed offsets and, once
the job's output is written, commits where it ended, so each run reads only new records.
`read(spark, **options)` is a batch read as one DataFrame that takes the history of streams
with Parquet fragments (tiered storage, `fragment_format` parquet or both) through Spark's
native Parquet reader and only the rest through the source (jetstream.spark.store_read).

The modules below this package import pyspark only where Spark needs it: the decoder and the
segment reader run in Spark's Python workers without the rest of the client.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from jetstream.spark.incremental_read import IncrementalRead

__all__ = ["incremental", "local_session", "read", "register"]

#: Spark's switch for pushFilters on Python data sources (off by default in Spark 4.3).
FILTER_PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


def register(spark: SparkSession) -> None:
    """Make `format("jetstream")` available in `spark` and enable filter pushdown."""
    from jetstream.spark.source import JetstreamDataSource
    spark.conf.set(FILTER_PUSHDOWN_CONF, "true")
    spark.dataSource.register(JetstreamDataSource)


def local_session(app: str = "jetstream", master: str = "local[2]", **conf: str
                  ) -> SparkSession:
    """A local SparkSession on 127.0.0.1 (no web UI), its Python workers running this
    interpreter, with format("jetstream") registered; `conf`: more Spark settings."""
    from pyspark.sql import SparkSession
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = (SparkSession.builder.master(master).appName(app)
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.ui.enabled", "false"))
    for name, value in conf.items():
        builder = builder.config(name, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def incremental(spark: SparkSession, group: str, **options: Any) -> IncrementalRead:
    """A batch read of what `group` has not read yet; see jetstream.spark.incremental_read."""
    from jetstream.spark.incremental_read import IncrementalRead
    return IncrementalRead.plan(spark, group, options)


def read(spark: SparkSession, *, parquet: bool = True, **options: Any) -> DataFrame:
    """A batch read as one DataFrame, history from Parquet fragments where the streams have
    them; see jetstream.spark.store_read."""
    from jetstream.spark.store_read import read as store_read
    return store_read(spark, parquet=parquet, **options)
