"""Job 1: the `orders` stream (JSON values) → hourly revenue per product, as Parquet.

    python spark/jobs/hourly_revenue.py --out /tmp/jetstream-revenue

Reads every committed order straight from the segment files (the brokers say which files and
up to which offset), decodes the JSON with Spark, and overwrites the output directory.
"""

from __future__ import annotations

import argparse

from common import arguments, hourly_revenue, main_of, orders
from pyspark.sql import SparkSession


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = arguments(__doc__.splitlines()[0])
    parser.add_argument("--stream", default="orders")
    parser.add_argument("--out", required=True, help="Parquet output directory")
    return parser.parse_args(argv)


def run(spark: SparkSession, args: argparse.Namespace) -> dict[str, object]:
    """The job on `spark`; what it prints."""
    source = (spark.read.format("jetstream").option("brokers", args.brokers)
              .option("stream", args.stream)
              .schema("partition int, offset long, value binary").load())
    revenue = hourly_revenue(orders(source))
    revenue.write.mode("overwrite").parquet(args.out)
    written = spark.read.parquet(args.out)
    total = written.agg({"revenue": "sum"}).first()
    return {"job": "hourly_revenue", "rows": written.count(),
            "revenue": total[0] if total else 0.0, "out": args.out}


def main() -> None:
    main_of("hourly-revenue", parse, run)

if __name__ == "__main__":
    main()
