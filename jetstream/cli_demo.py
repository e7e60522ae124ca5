"""`jetstream demo`: the streams and data the Spark jobs in spark/jobs/ run on.

Theory of operation: creates, when missing, `orders` (3 partitions, JSON orders keyed by
customer so a customer's orders keep their order), `customers` (compacted: the latest profile
per customer id; some customers are updated, a few deleted with tombstones) and
`orders-enriched` (where the streaming job writes), then publishes `--orders` orders and
`--customers` customer records, deterministically from `--seed`. Orders carry their event time
(`ordered_at`, ms) spread over the last `--hours` hours. Running it again appends more orders
(new order ids) and updates the same customers, which is what the incremental job reads.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jetstream.client import Client

PRODUCTS = {"espresso": 2.5, "latte": 3.8, "croissant": 2.9, "bagel": 3.2, "muffin": 2.7,
            "tea": 2.1, "juice": 4.4, "sandwich": 6.9}
TIERS = ("bronze", "silver", "gold")
COUNTRIES = ("DE", "FR", "NL", "US", "JP")
STREAMS: dict[str, dict[str, Any]] = {
    "orders": {"subject": "orders", "partitions": 3},
    "customers": {"subject": "customers", "partitions": 1, "cleanup_policy": "compact"},
    "orders-enriched": {"subject": "orders-enriched", "partitions": 3},
}


def customer(rng: random.Random, customer_id: int, version: int) -> dict[str, Any]:
    return {"customer_id": customer_id, "name": f"customer-{customer_id}",
            "tier": rng.choice(TIERS), "country": rng.choice(COUNTRIES), "version": version}


async def demo(js: Client, args: argparse.Namespace) -> int:
    from jetstream.client.types import PublishMessage

    rng = random.Random(args.seed)
    for name, config in STREAMS.items():
        await js.create_stream(name, **config)
    now_ms = int(time.time() * 1000)
    first_id = int(time.time() * 1000) * 1000  # later runs add new order ids
    orders = []
    for i in range(args.orders):
        customer_id = rng.randrange(args.customers)
        product = rng.choice(sorted(PRODUCTS))
        order = {"order_id": first_id + i, "customer_id": customer_id, "product": product,
                 "quantity": rng.randint(1, 4), "unit_price": PRODUCTS[product],
                 "ordered_at": now_ms - rng.randrange(args.hours * 3_600_000)}
        orders.append(PublishMessage("orders", json.dumps(order).encode(),
                                     key=str(customer_id).encode()))
    await js.publish_batch(orders, window=1000)
    profiles = [PublishMessage("customers", json.dumps(customer(rng, c, 1)).encode(),
                               key=str(c).encode()) for c in range(args.customers)]
    updated = rng.sample(range(args.customers), args.customers // 5)
    profiles += [PublishMessage("customers", json.dumps(customer(rng, c, 2)).encode(),
                                key=str(c).encode()) for c in updated]
    deleted = rng.sample(range(args.customers), max(1, args.customers // 50))
    profiles += [PublishMessage("customers", None, key=str(c).encode()) for c in deleted]
    await js.publish_batch(profiles, window=1000)
    summary = {"orders": args.orders, "customers": args.customers,
               "customers_updated": len(updated), "customers_deleted": len(deleted),
               "streams": sorted(STREAMS)}
    if args.json:
        print(json.dumps(summary), flush=True)
    else:
        print(f"published {args.orders} orders and {args.customers} customers "
              f"({len(updated)} updated, {len(deleted)} deleted) to {', '.join(sorted(STREAMS))}",
              flush=True)
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--orders", type=int, default=10_000, help="orders to publish")
    parser.add_argument("--customers", type=int, default=200, help="customer ids")
    parser.add_argument("--hours", type=int, default=24, help="orders' event times span this")
    parser.add_argument("--seed", type=int, default=7)
