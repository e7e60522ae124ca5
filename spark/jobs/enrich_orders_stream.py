"""Job 3: Structured Streaming: orders as they arrive, joined with each customer's latest
profile from the compacted `customers` stream, written back to the `orders-enriched` stream.

    python spark/jobs/enrich_orders_stream.py --checkpoint /tmp/jetstream-enrich
    jetstream sub orders-enriched --follow

Each micro-batch reads the customers' latest state (compacted=latest: one row per live key,
deleted customers gone) and joins the batch's orders with it; orders of deleted or unknown
customers keep null profile fields. The query resumes from its checkpoint after a restart, and
commits its progress to the consumer group `enrich-orders`, so
`jetstream groups describe enrich-orders` shows its lag. Stop it with Ctrl-C, or pass
--once to process what is there and exit.
"""

from __future__ import annotations

import argparse
from typing import Any

from common import CUSTOMER_SCHEMA, arguments, main_of, orders
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F


def enrich(spark: SparkSession, brokers: str, batch: DataFrame) -> DataFrame:
    customers = (spark.read.format("jetstream").option("brokers", brokers)
                 .option("stream", "customers").option("compacted", "latest")
                 .schema("key binary, value binary").load()
                 .select(F.from_json(F.col("value").cast("string"), CUSTOMER_SCHEMA).alias("c"))
                 .select("c.customer_id", "c.name", "c.tier", "c.country"))
    joined = orders(batch).join(customers, "customer_id", "left")
    return joined.select(
        F.col("customer_id").cast("string").alias("key"),
        F.to_json(F.struct("order_id", "customer_id", "product", "quantity", "unit_price",
                           "ordered_at", "name", "tier", "country")).alias("value"))


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = arguments(__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True, help="the query's checkpoint directory")
    parser.add_argument("--group", default="enrich-orders")
    parser.add_argument("--once", action="store_true",
                        help="process what the stream holds now, then stop")
    return parser.parse_args(argv)


def run(spark: SparkSession, args: argparse.Namespace) -> dict[str, object]:
    """The query on `spark` until it is stopped (or, with --once, has processed what the
    stream holds); what it prints."""
    written = {"rows": 0}

    def write_batch(batch: DataFrame, batch_id: int) -> None:
        out = enrich(spark, args.brokers, batch).cache()
        (out.write.format("jetstream").option("brokers", args.brokers)
         .option("stream", "orders-enriched").mode("append").save())
        written["rows"] += out.count()
        out.unpersist()

    source = (spark.readStream.format("jetstream").option("brokers", args.brokers)
              .option("stream", "orders").option("startingOffsets", "earliest")
              .option("group", args.group).option("maxOffsetsPerTrigger", "20000")
              .schema("partition int, offset long, value binary").load())
    query: Any = (source.writeStream.foreachBatch(write_batch)
                  .option("checkpointLocation", args.checkpoint).start())
    try:
        if args.once:
            query.processAllAvailable()
        else:
            query.awaitTermination()
    except KeyboardInterrupt:
        pass
    finally:
        query.stop()
    return {"job": "enrich_orders_stream", "rows_written": written["rows"]}


def main() -> None:
    main_of("enrich-orders", parse, run)

if __name__ == "__main__":
    main()
