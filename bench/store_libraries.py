"""Raw put and get of segment-sized objects with obstore and with fsspec (s3fs for S3),
against moto's S3 server and `file://`: the measurement behind tiered storage's choice of one
storage library.

Each library writes the same N objects of `object_bytes` random bytes under its own prefix,
one after another (an offload uploads one segment at a time per partition), then reads them
back; MB/s is bytes over wall time, with the CPU seconds of this process (the client side)
per MB. s3fs is not a dependency of Jetstream: install it (`pip install s3fs`) to measure
it; without it the fsspec S3 row says so. `python -m bench.store_libraries --quick --json`.
"""

from __future__ import annotations

import os
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.common import JsonObject, bench_main
from jetstream.tiered.local_s3 import LocalS3

MB = 1_000_000
BUCKET = "libraries"
TARGET_NOTE = "the chosen library is the faster on S3 puts (the offload path)"


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _measure(put: Callable[[str, bytes], None], get: Callable[[str], bytes],
             payloads: Sequence[bytes], prefix: str, rounds: int) -> JsonObject:
    size = sum(len(p) for p in payloads)
    put_rates, get_rates, put_cpu, get_cpu = [], [], [], []
    for r in range(rounds):
        cpu, start = _cpu_s(), time.perf_counter()
        for i, payload in enumerate(payloads):
            put(f"{prefix}/{r}/{i:06d}", payload)
        put_rates.append(size / MB / (time.perf_counter() - start))
        put_cpu.append((_cpu_s() - cpu) / (size / MB))
        cpu, start = _cpu_s(), time.perf_counter()
        for i, payload in enumerate(payloads):
            if len(get(f"{prefix}/{r}/{i:06d}")) != len(payload):
                raise AssertionError("short read")
        get_rates.append(size / MB / (time.perf_counter() - start))
        get_cpu.append((_cpu_s() - cpu) / (size / MB))
    return {"put_mb_s": statistics.median(put_rates), "get_mb_s": statistics.median(get_rates),
            "put_cpu_s_per_mb": statistics.median(put_cpu),
            "get_cpu_s_per_mb": statistics.median(get_cpu)}


def _obstore(url: str) -> tuple[Callable[[str, bytes], None], Callable[[str], bytes]]:
    from jetstream.tiered.store import FragmentStore

    store = FragmentStore(url)
    return store.put, store.get


def _fsspec(url: str, s3: LocalS3) -> tuple[Callable[[str, bytes], None],
                                             Callable[[str], bytes]] | str:
    import importlib.util

    import fsspec

    if url.startswith("file://"):
        fs, root = fsspec.url_to_fs(url)
    elif importlib.util.find_spec("s3fs") is None:  # not a dependency: measured if installed
        return "s3fs is not installed (pip install s3fs to measure it)"
    else:
        fs, root = fsspec.url_to_fs(url, endpoint_url=s3.endpoint, key="testing",
                                    secret="testing",
                                    client_kwargs={"region_name": "us-east-1"})

    def put(key: str, data: bytes) -> None:
        path = f"{root}/{key}"
        if url.startswith("file://"):
            fs.makedirs(os.path.dirname(path), exist_ok=True)
        fs.pipe_file(path, data)

    def get(key: str) -> bytes:
        return bytes(fs.cat_file(f"{root}/{key}"))

    return put, get


async def run(quick: bool) -> JsonObject:
    object_bytes = 8 * 1024 * 1024 if quick else 64 * 1024 * 1024
    count, rounds = (4, 3) if quick else (8, 3)
    payloads = [os.urandom(object_bytes) for _ in range(count)]
    results: dict[str, Any] = {"object_bytes": object_bytes, "objects": count,
                               "rounds": rounds}
    with tempfile.TemporaryDirectory() as tmp, LocalS3(Path(tmp) / "moto.log") as s3:
        s3.apply_env()
        s3_url = s3.create_bucket(BUCKET)
        file_url = f"file://{tmp}/store"
        for backend, url in (("s3", s3_url), ("file", file_url)):
            put, get = _obstore(url)
            results[f"obstore_{backend}"] = _measure(put, get, payloads, "obstore", rounds)
            made = _fsspec(url, s3)
            if isinstance(made, str):
                results[f"fsspec_{backend}"] = {"skipped": made}
            else:
                results[f"fsspec_{backend}"] = _measure(*made, payloads, "fsspec", rounds)
    for backend in ("s3", "file"):
        ob, fs = results[f"obstore_{backend}"], results[f"fsspec_{backend}"]
        if "put_mb_s" in fs:
            results[f"obstore_vs_fsspec_{backend}_put"] = ob["put_mb_s"] / fs["put_mb_s"]
            results[f"obstore_vs_fsspec_{backend}_get"] = ob["get_mb_s"] / fs["get_mb_s"]
    return results


def table(results: JsonObject) -> str:
    head = (f"{'library':<10}{'backend':<8}{'put MB/s':>10}{'get MB/s':>10}"
            f"{'put CPU s/MB':>14}{'get CPU s/MB':>14}")
    lines = [head]
    for lib in ("obstore", "fsspec"):
        for backend in ("s3", "file"):
            row = results[f"{lib}_{backend}"]
            if "skipped" in row:
                lines.append(f"{lib:<10}{backend:<8}  {row['skipped']}")
                continue
            lines.append(f"{lib:<10}{backend:<8}{row['put_mb_s']:>10.1f}{row['get_mb_s']:>10.1f}"
                         f"{row['put_cpu_s_per_mb']:>14.4f}{row['get_cpu_s_per_mb']:>14.4f}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    return bench_main("store_libraries", __doc__, argv, run, table)


if __name__ == "__main__":
    sys.exit(main())
