"""Job 2: the hourly revenue job as an incremental nightly run: each run reads only the orders
the consumer group `nightly-orders` has not read yet, appends their revenue to Parquet, and then
commits its end offsets to the group.

    python spark/jobs/nightly_orders.py --out /tmp/jetstream-nightly   # reads everything
    jetstream demo --orders 500                                       # more orders arrive
    python spark/jobs/nightly_orders.py --out /tmp/jetstream-nightly   # reads only those 500

Offsets are committed only after the output is written: a run that fails reads its range
again next time. Each run writes its own run=<n> subdirectory (n: where its range starts), so
a failed run's partial output is replaced, not duplicated, when it runs again.
"""

from __future__ import annotations

import argparse

from common import arguments, hourly_revenue, main_of, orders
from pyspark.sql import SparkSession

import jetstream.spark


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = arguments(__doc__.splitlines()[0])
    parser.add_argument("--stream", default="orders")
    parser.add_argument("--group", default="nightly-orders")
    parser.add_argument("--out", required=True, help="Parquet output directory")
    return parser.parse_args(argv)


def run(spark: SparkSession, args: argparse.Namespace) -> dict[str, object]:
    """The job on `spark`; what it prints."""
    this_run = jetstream.spark.incremental(spark, args.group, brokers=args.brokers,
                                           stream=args.stream)
    source = this_run.load("partition int, offset long, value binary")
    new_orders = orders(source).cache()
    count = new_orders.count()
    if count:
        # Named by where the range starts: a retried run replaces its own output.
        start = sum(o for parts in this_run.starting_offsets.values() for o in parts.values())
        hourly_revenue(new_orders).write.mode("overwrite").parquet(f"{args.out}/run={start}")
    this_run.commit()
    new_orders.unpersist()
    return {"job": "nightly_orders", "orders_read": count, "from": this_run.starting_offsets,
            "to": this_run.ending_offsets}


def main() -> None:
    main_of("nightly-orders", parse, run)

if __name__ == "__main__":
    main()
