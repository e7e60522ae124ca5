"""Spark finds `format("jetstream")` here without a call: on the first use of a Python data
source, PySpark imports every top-level module named `pyspark_*` and registers its
`DefaultSource`. Filters are then Spark's to apply; `jetstream.spark.register(spark)` turns
filter pushdown on and registers the source that takes them."""

from jetstream.spark.source import DiscoveredDataSource as DefaultSource

__all__ = ["DefaultSource"]
