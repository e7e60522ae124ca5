"""The pipelines in spark/jobs run as documented against a broker seeded by `jetstream demo`:
hourly revenue to Parquet, the incremental nightly run (twice: the second reads only what is
new), and the streaming enrichment that writes back to a stream."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

from pyspark.sql import SparkSession

from jetstream.client import Client
from jetstream.server.process import BrokerProcess
from tests.spark.helpers import stored

JOBS = Path(__file__).resolve().parents[2] / "spark" / "jobs"
JOB_TIMEOUT_S = 240


def run(broker: BrokerProcess, *argv: str) -> dict[str, object]:
    """Run a command with the broker in JETSTREAM_BROKERS; its last stdout line (JSON)."""
    env = dict(os.environ, JETSTREAM_BROKERS=broker.address, PYSPARK_PYTHON=sys.executable,
               SPARK_LOCAL_IP="127.0.0.1")
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=JOB_TIMEOUT_S,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"{argv} failed:\n{done.stdout}\n{done.stderr[-4000:]}"
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def job(name: str, *args: str) -> list[str]:
    return [sys.executable, str(JOBS / name), *args]


def in_session(spark: SparkSession, broker: BrokerProcess, name: str, *args: str
               ) -> dict[str, object]:
    """Run a job's `run` on the shared session (what its command line does, without a Spark
    of its own to start)."""
    if str(JOBS) not in sys.path:
        sys.path.insert(0, str(JOBS))
    module = importlib.import_module(name)
    result: dict[str, object] = module.run(spark, module.parse(["--brokers", broker.address,
                                                                *args]))
    return result


async def test_the_jobs_run_on_the_demo_data(spark: SparkSession, shared_broker: BrokerProcess,
                                             js: Client, tmp_path: Path) -> None:
    run(shared_broker, "jetstream", "demo", "--orders", "3000", "--customers", "50", "--json")
    orders = [json.loads(r[6]) for r in await stored(js, "orders", 3)]
    assert len(orders) == 3000

    # One job as its command line runs it (a Spark of its own), the rest on the shared session.
    revenue = run(shared_broker, *job("hourly_revenue.py", "--out", str(tmp_path / "rev")))
    expected = sum(o["quantity"] * o["unit_price"] for o in orders)
    assert abs(float(revenue["revenue"]) - expected) < 0.05 * len(orders) / 100 + 1
    table = spark.read.parquet(str(tmp_path / "rev"))
    assert table.agg({"orders": "sum"}).first()[0] == 3000

    nightly = ("nightly_orders", "--out", str(tmp_path / "nightly"))
    assert in_session(spark, shared_broker, *nightly)["orders_read"] == 3000
    run(shared_broker, "jetstream", "demo", "--orders", "120", "--customers", "50", "--json")
    assert in_session(spark, shared_broker, *nightly)["orders_read"] == 120
    assert in_session(spark, shared_broker, *nightly)["orders_read"] == 0
    runs = spark.read.parquet(str(tmp_path / "nightly"))
    assert runs.agg({"orders": "sum"}).first()[0] == 3120

    enriched = in_session(spark, shared_broker, "enrich_orders_stream", "--checkpoint",
                          str(tmp_path / "checkpoint"), "--once")
    assert enriched["rows_written"] == 3120
    out = [json.loads(r[6]) for r in await stored(js, "orders-enriched", 3)]
    assert len(out) == 3120
    customers: dict[int, dict[str, object]] = {}
    for record in await stored(js, "customers", 1):
        key = int(record[5])
        if record[6] is None:
            customers.pop(key, None)
        else:
            customers[key] = json.loads(record[6])
    for order in out:
        profile = customers.get(order["customer_id"])
        assert order.get("tier") == (profile["tier"] if profile else None)
