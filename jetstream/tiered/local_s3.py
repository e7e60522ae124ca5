"""A local S3 endpoint for tests, benches and trying tiered storage out: moto's server.

Theory of operation: `python -m moto.server` (the `moto[server]` package, a development
dependency) serves the S3 API over HTTP. `LocalS3` starts it on a free 127.0.0.1 port, waits
until it answers, creates buckets with plain unsigned requests (moto accepts them), gives the
environment the store library reads (jetstream.tiered.store: `AWS_ENDPOINT_URL`,
`AWS_ALLOW_HTTP`, dummy credentials) and stops the process by its PID.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Self

from jetstream.natsd import free_ports

HOST = "127.0.0.1"
START_TIMEOUT_S = 30.0


class LocalS3:
    def __init__(self, log_path: Path | None = None) -> None:
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_path = log_path

    @property
    def endpoint(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        """What a process needs in its environment to reach this store."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ALLOW_HTTP": "true",
                "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1"}

    def apply_env(self) -> None:
        """Put `env` into this process's environment (for stores made in-process)."""
        os.environ.update(self.env)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self) -> Self:
        self.port = free_ports(1)[0]
        out = open(self._log_path, "wb") if self._log_path else subprocess.DEVNULL  # noqa: SIM115
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", HOST, "-p", str(self.port)],
                stdout=out, stderr=subprocess.STDOUT)
        finally:
            if self._log_path:
                out.close()  # type: ignore[union-attr]
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self._proc.poll() is not None:
                raise RuntimeError(f"moto server exited with {self._proc.returncode}")
            with contextlib.suppress(OSError):
                urllib.request.urlopen(self.endpoint + "/", timeout=1).close()
                return self
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"moto server did not answer on {self.endpoint}")
            time.sleep(0.05)

    def create_bucket(self, bucket: str) -> str:
        """Create `bucket` (idempotent); returns `s3://bucket`."""
        request = urllib.request.Request(f"{self.endpoint}/{bucket}", method="PUT")
        try:
            urllib.request.urlopen(request, timeout=10).close()
        except urllib.error.HTTPError as exc:
            if exc.code != 409:  # already there
                raise
        return f"s3://{bucket}"

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def pause(self) -> None:
        """SIGSTOP: the store stops answering (an outage) until `resume`."""
        if self._proc is not None:
            os.kill(self._proc.pid, 19)

    def resume(self) -> None:
        if self._proc is not None:
            os.kill(self._proc.pid, 18)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
