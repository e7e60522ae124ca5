"""Spark finds `format("jetstream")` here without a call: on the first use of a Python data
source, PySpark imports every top-level module named `pyspark_*` and registers its
`DefaultSource`. (`jetstream.spark.register(spark)` also turns on filter pushdown.)"""

from jetstream.spark.source import JetstreamDataSource as DefaultSource

__all__ = ["DefaultSource"]
