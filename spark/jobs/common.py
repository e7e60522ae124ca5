"""What the jobs share: a local SparkSession with format("jetstream") registered, the schema
of the demo's JSON values, and the command line's --brokers."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import jetstream.spark

ORDER_SCHEMA = ("order_id long, customer_id long, product string, quantity int, "
                "unit_price double, ordered_at long")
CUSTOMER_SCHEMA = "customer_id long, name string, tier string, country string, version int"


def arguments(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--brokers", default=os.environ.get("JETSTREAM_BROKERS",
                                                            "127.0.0.1:7400"),
                        help="broker addresses (default $JETSTREAM_BROKERS or 127.0.0.1:7400, "
                             "the first broker of `jetstream dev`)")
    parser.add_argument("--master", default="local[2]")
    return parser


def session(app: str, master: str) -> SparkSession:
    return jetstream.spark.local_session(app, master, **{
        "spark.sql.shuffle.partitions": "4", "spark.sql.session.timeZone": "UTC"})


def main_of(app: str, parse: Callable[[], argparse.Namespace],
            run: Callable[[SparkSession, argparse.Namespace], dict[str, object]]) -> None:
    """A job's command line: its arguments, a Spark of its own, the job, and what it did as
    one JSON line."""
    args = parse()
    spark = session(app, args.master)
    try:
        print(json.dumps(run(spark, args)))
    finally:
        spark.stop()


def orders(df: DataFrame) -> DataFrame:
    """The demo's orders (JSON values) as columns, with the record's offset and partition."""
    parsed = F.from_json(F.col("value").cast("string"), ORDER_SCHEMA)
    return df.select("partition", "offset", parsed.alias("o")).select("partition", "offset",
                                                                       "o.*")


def hourly_revenue(orders_df: DataFrame) -> DataFrame:
    """Revenue and units per product per hour of the orders' event time."""
    hour = F.date_trunc("hour", F.timestamp_millis("ordered_at")).alias("hour")
    return (orders_df.groupBy(hour, "product")
            .agg(F.round(F.sum(F.col("quantity") * F.col("unit_price")), 2).alias("revenue"),
                 F.sum("quantity").alias("units"), F.count("*").alias("orders"))
            .orderBy("hour", "product"))
