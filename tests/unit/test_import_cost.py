"""What a broker imports at start: pyarrow (with numpy, about 0.3 s on this machine) only once
it writes Parquet (tiered storage's Parquet fragments, a Parquet datastream sink)."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("pyarrow", "numpy", "pyspark")


def test_a_broker_starts_without_importing_pyarrow() -> None:
    code = ("import sys, jetstream.cli, jetstream.server.broker, jetstream.server.config; "
            f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    assert out.stdout.strip() == ""


def test_the_parquet_sink_schema_is_built_on_first_use() -> None:
    from jetstream.datastreams.parquet_sink import schema
    assert schema().names == ["source", "partition", "offset", "timestamp_ms", "key", "value",
                              "headers"]
    assert schema() is schema()
