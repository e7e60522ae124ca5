"""A `jetstream server` child process (tests, benchmarks, `jetstream dev`): started as
`python -m jetstream server`, ready when it has written <data_dir>/broker.json naming its own
PID (a broker killed with SIGKILL leaves a stale file behind, so the PID must match). Waiting
polls that file and the process until a deadline; a broker that exits or misses it raises
BrokerStartFailed with the tail of its output. Stopping sends SIGTERM to the PID, waits with a
deadline, then SIGKILLs: never by name. A restarted broker comes back on the same ports, so
clients and the test keep their addresses.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

from jetstream.errors import JetstreamError

READY_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 10.0
#: How long a broker that did not stop in time gets to write its threads' stacks.
STACKS_WAIT_S = 0.5
POLL_S = 0.02
LOG_TAIL_BYTES = 4000
HOST = "127.0.0.1"


class BrokerStartFailed(JetstreamError):
    """A broker child process exited or was not ready before its deadline. `log_tail` holds
    the end of its output, which says why."""

    code = "BROKER_START_FAILED"

    def __init__(self, message: str, *, log_tail: str = "") -> None:
        super().__init__(message, log_tail=log_tail)


class BrokerProcess:
    """One `jetstream server` child process and its data directory."""

    def __init__(self, data_dir: Path, nats_url: str, *, broker_id: int = 0,
                 extra_args: tuple[str, ...] = ()) -> None:
        self.data_dir = data_dir
        self.nats_url = nats_url
        self.broker_id = broker_id
        self.extra_args = extra_args
        self.log_path = data_dir.parent / f"{data_dir.name}.log"
        self.port = 0
        self.http_port = 0
        self.info: dict[str, Any] = {}
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self._proc is not None, "broker not started"
        return self._proc.pid

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def http_url(self) -> str:
        scheme = "https" if self.info.get("http_tls") else "http"
        return f"{scheme}://{HOST}:{self.http_port}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, *, wait: bool = True) -> BrokerProcess:
        """Launch the broker (on the ports of its last run, if any) and wait until ready
        (with `wait=False`, call `wait_ready()` later: brokers of a cluster become ready only
        together, once a majority of them runs)."""
        assert not self.running, "already running"
        argv = [sys.executable, "-m", "jetstream", "server", "--data-dir", str(self.data_dir),
                "--nats-url", self.nats_url, "--broker-id", str(self.broker_id),
                "--host", HOST, "--port", str(self.port), "--http-port", str(self.http_port),
                *self.extra_args]
        with open(self.log_path, "ab") as log:
            log.write(f"--- start {' '.join(argv)}\n".encode())
            log.flush()
            self._proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL)
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Wait until the started broker is ready (BrokerStartFailed when it is not)."""
        ready_file = self.data_dir / "broker.json"
        deadline = time.monotonic() + timeout_s
        while True:
            info = _read_json(ready_file)
            if info is not None and info.get("pid") == self.pid:
                break
            if self._proc is not None and self._proc.poll() is not None:
                self._fail(f"broker exited with {self._proc.returncode} before it was ready")
            if time.monotonic() > deadline:
                self.stop(signal.SIGKILL)
                self._fail(f"broker not ready within {timeout_s} s")
            time.sleep(POLL_S)
        self.info = info
        self.port, self.http_port = info["port"], info["http_port"]

    def stop(self, sig: int = signal.SIGTERM) -> int | None:
        """Send `sig` to the broker's PID, wait for it to exit (after the deadline: SIGUSR1,
        which writes every thread's stack to its log, then SIGKILL); its exit code, or None
        when it was not running."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return None if proc is None else proc.returncode
        os.kill(proc.pid, sig)
        try:
            return proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGUSR1)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(STACKS_WAIT_S)
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            return proc.wait(STOP_TIMEOUT_S)

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def restart(self, *, sig: int = signal.SIGTERM) -> BrokerProcess:
        """Stop with `sig` (SIGKILL: a crash), start again on the same data dir and ports."""
        self.stop(sig)
        return self.start()

    def log_tail(self) -> str:
        try:
            data = self.log_path.read_bytes()
        except FileNotFoundError:
            return ""
        return data[-LOG_TAIL_BYTES:].decode(errors="replace")

    def _fail(self, why: str) -> NoReturn:
        tail = self.log_tail()
        raise BrokerStartFailed(f"{why}; output of {self.log_path} ends with:\n{tail}",
                                log_tail=tail)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        info: dict[str, Any] = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return info
