"""The benches' load generator: a compiled NATS client (loadgen.c) driven from Python.

Theory of operation: `bench/loadgen/loadgen.c` speaks the NATS text protocol over plain
sockets (no client library), so one process on one core sends and times several hundred
thousand requests a second, far past nats-py's ~130k. `make loadgen` builds it into
`bench/loadgen/build/` (ignored by git); `ensure_built` runs that on demand and says what to
install when no C compiler is there. `run_load` starts `Load.processes` copies of it, each
with `Load.conns` connections (threads) of `Load.inflight` requests outstanding, all told to
start sending at one CLOCK_MONOTONIC instant, and merges what they print: counts, CPU and
their latency histograms (bench/loadgen/histogram.py), into one `LoadResult`. `responder`
runs the same program as the no-op peer: it answers every request with "+OK" and stores
nothing, so a request run against it through core NATS is the generator's own ceiling,
which a bench compares with the rates it reports for the systems it measures. A load may
name a file of messages (`write_messages`) instead of one subject and payload: each process
sends its share of the list in turn, so a counted run sends each listed message once.
With `LoadTls` the generator (and the responder) speak TLS to a server that requires it,
presenting a client certificate when given one. With `Load.frames` it sends a list of
socket-API request frames (`write_frames`: the HELLO first) to a broker instead, and
`frames_responder` is the no-op peer of that protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import struct
import subprocess
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.loadgen.histogram import Histogram

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "loadgen.c"
BINARY = HERE / "build" / "loadgen"
REPO = HERE.parent.parent
#: Processes start sending this long after being launched: time to connect and subscribe.
START_DELAY_S = 0.3
RESPONDER_READY_S = 10.0
#: A run may take this much longer than its duration (draining, start-up) before it is stopped.
RUN_SLACK_S = 30.0


class LoadgenUnavailable(RuntimeError):
    """The load generator could not be built: the message says what to install."""


class LoadgenFailed(RuntimeError):
    """A generator process exited with an error (its stderr is in the message)."""


def ensure_built() -> Path:
    """The generator's binary, built with `make loadgen` when missing or older than its
    source."""
    if BINARY.exists() and BINARY.stat().st_mtime >= SOURCE.stat().st_mtime:
        return BINARY
    compiler = os.environ.get("CC", "cc")
    missing = [tool for tool in ("make", compiler) if shutil.which(tool) is None]
    if missing:
        raise LoadgenUnavailable(
            f"the load generator is a C program and {' and '.join(missing)} was not found: "
            "install a C compiler and make (Debian/Ubuntu: apt install build-essential), "
            "then run `make loadgen`")
    built = subprocess.run(["make", "-s", "-C", str(REPO), "loadgen"], capture_output=True,
                           text=True, check=False)
    if built.returncode != 0 or not BINARY.exists():
        raise LoadgenUnavailable(f"`make loadgen` failed:\n{built.stdout}{built.stderr}")
    return BINARY


@dataclass(frozen=True, slots=True)
class LoadTls:
    """TLS for the generator's connections: the CA that signed the server's certificate, and
    the client's certificate and key when the server asks for one."""

    ca: str
    cert: str | None = None
    key: str | None = None

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise ValueError("a client certificate comes with its key")

    def args(self) -> list[str]:
        out = ["--tls-ca", self.ca]
        if self.cert is not None and self.key is not None:
            out += ["--tls-cert", self.cert, "--tls-key", self.key]
        return out


@dataclass(frozen=True, slots=True)
class Load:
    """One run of requests: `count` in all or for `duration_s` after `warmup_s`; `rate`
    (messages a second in all) paces them; `stamp` puts the send time in each payload.
    `messages` (a file of `write_messages`) replaces `subject` and `size`: the requests are
    its messages in turn (`size` then only counts MB/s)."""

    subject: str
    size: int = 128
    inflight: int = 1
    conns: int = 1
    processes: int = 1
    count: int | None = None
    duration_s: float | None = None
    warmup_s: float = 0.0
    rate: float | None = None
    stamp: bool = False
    timeout_s: float = 60.0
    messages: Path | None = None
    tls: LoadTls | None = None
    #: Requests to a broker's socket API (`url`: its address) instead of NATS: `messages`
    #: holds whole frames, the HELLO first (`write_frames`).
    frames: bool = False

    def __post_init__(self) -> None:
        if (self.count is None) == (self.duration_s is None):
            raise ValueError("a load has a count or a duration, not both")
        if self.count is not None and self.count < self.conns * self.processes:
            raise ValueError("a counted load sends at least one request per connection")
        if min(self.inflight, self.conns, self.processes) < 1:
            raise ValueError("inflight, conns and processes are at least 1")
        if self.messages is not None and self.stamp:
            raise ValueError("listed messages carry no send time")
        if self.frames and (self.messages is None or self.tls is not None or
                            self.rate is not None):
            raise ValueError("a load of frames is a list of them, without TLS or a rate")

    @property
    def total_inflight(self) -> int:
        return self.inflight * self.conns * self.processes


def command(binary: Path, url: str, load: Load, process: int, start_at_ns: int) -> list[str]:
    """The argv of generator process `process` (0-based) of `load`: the count and the rate
    are shared out over the processes."""
    args = [str(binary), "--url", url, "--subject", load.subject, "--size", str(load.size),
            "--inflight", str(load.inflight), "--conns", str(load.conns),
            "--timeout", str(load.timeout_s), "--start-at", str(start_at_ns)]
    if load.count is not None:
        share = load.count // load.processes + (process < load.count % load.processes)
        args += ["--count", str(share)]
    else:
        args += ["--duration", str(load.duration_s), "--warmup", str(load.warmup_s)]
    if load.messages is not None:
        before = sum(load.count // load.processes + (p < load.count % load.processes)
                     for p in range(process)) if load.count is not None else 0
        args += ["--messages", str(load.messages), "--first-message", str(before)]
    if load.rate is not None:
        args += ["--rate", str(load.rate / load.processes)]
    if load.stamp:
        args.append("--stamp")
    if load.tls is not None:
        args += load.tls.args()
    if load.frames:
        args += ["--protocol", "frames"]
    return args


def write_messages(path: Path,
                   messages: Iterable[tuple[str, bytes, Mapping[str, str] | None]]) -> int:
    """Write (subject, payload, headers) messages as the generator's `--messages` file:
    per message a u16 subject length and the subject, a u32 length and the NATS header block
    (empty without headers), a u32 length and the payload. Returns how many it wrote."""
    count = 0
    with path.open("wb") as out:
        for subject, payload, headers in messages:
            name = subject.encode()
            block = (b"NATS/1.0\r\n" + b"".join(f"{k}: {v}\r\n".encode()
                                                for k, v in headers.items()) + b"\r\n"
                     if headers else b"")
            out.write(struct.pack(">H", len(name)) + name + struct.pack(">I", len(block))
                      + block + struct.pack(">I", len(payload)) + payload)
            count += 1
    return count


def write_frames(path: Path, hello: bytes, requests: Iterable[bytes]) -> int:
    """Write the HELLO frame and request frames (each with any correlation id: the generator
    sets its own) as a `--messages` file for `Load.frames`. Returns the requests written."""
    return write_messages(path, (("frame", frame, None) for frame in (hello, *requests))) - 1


@dataclass(frozen=True, slots=True)
class LoadResult:
    """What the processes of one run measured together. `messages` are the acks counted
    (those after the warm-up), `acked` every ack; `start_ns` the CLOCK_MONOTONIC time the
    run started sending (with a count: its request i on one connection was due at
    `start_ns + i / rate`) or, with a duration, the end of its warm-up."""

    messages: int
    acked: int
    sent: int
    errors: int
    no_responders: int
    timed_out: bool
    elapsed_s: float
    msgs_per_s: float
    mb_per_s: float
    histogram: Histogram
    generator_cpu_s: float
    start_ns: int

    def figures(self) -> dict[str, Any]:
        """The result as JSON: rates, ack latency percentiles (ms), counts."""
        return {"msgs_per_s": self.msgs_per_s, "mb_per_s": self.mb_per_s,
                **{f"ack_{k}": v for k, v in self.histogram.summary_ms().items()},
                "messages": self.messages, "acked": self.acked, "sent": self.sent,
                "errors": self.errors, "no_responders": self.no_responders,
                "timed_out": self.timed_out, "elapsed_s": self.elapsed_s,
                "generator_cpu_s": self.generator_cpu_s}


def merge_runs(runs: Sequence[dict[str, Any]], size: int) -> LoadResult:
    """One result of the JSON objects the generator processes printed: counts add up, the
    rate is the counted acks over the span from the earliest start to the latest end, the
    histograms merge."""
    if not runs:
        raise ValueError("no generator output to merge")
    start = min(int(r["start_ns"]) for r in runs)
    end = max(int(r["end_ns"]) for r in runs)
    elapsed_s = max(end - start, 1) / 1e9
    messages = sum(int(r["counted"]) for r in runs)
    rate = messages / elapsed_s
    return LoadResult(
        messages=messages, acked=sum(int(r["acked"]) for r in runs),
        sent=sum(int(r["sent"]) for r in runs), errors=sum(int(r["errors"]) for r in runs),
        no_responders=sum(int(r["no_responders"]) for r in runs),
        timed_out=any(bool(r["timed_out"]) for r in runs), elapsed_s=elapsed_s,
        msgs_per_s=rate, mb_per_s=rate * size / 1e6,
        histogram=Histogram.merged(Histogram.from_json(r["histogram"]) for r in runs),
        generator_cpu_s=sum(float(r["cpu_user_s"]) + float(r["cpu_sys_s"]) for r in runs),
        start_ns=start)


async def run_load(url: str, load: Load) -> LoadResult:
    """`load` against the nats-server at `url` (host:port or nats://host:port)."""
    binary = await asyncio.to_thread(ensure_built)
    start_at_ns = time.monotonic_ns() + int(START_DELAY_S * 1e9)
    procs = [await asyncio.create_subprocess_exec(
        *command(binary, url, load, i, start_at_ns), stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE) for i in range(load.processes)]
    limit_s = START_DELAY_S + RUN_SLACK_S + load.timeout_s + (
        load.warmup_s + load.duration_s if load.duration_s is not None else 0.0)
    try:
        outputs = await asyncio.wait_for(
            asyncio.gather(*(p.communicate() for p in procs)),
            None if load.count is not None else limit_s)
    finally:
        for p in procs:
            if p.returncode is None:
                p.kill()
                await p.wait()
    runs = []
    for p, (out, err) in zip(procs, outputs, strict=True):
        if p.returncode != 0:
            raise LoadgenFailed(f"loadgen exited with {p.returncode}: {err.decode().strip()}")
        runs.append(json.loads(out.decode().strip().splitlines()[-1]))
    return merge_runs(runs, load.size)


async def request_listed(url: str, messages: Sequence[tuple[str, bytes, Mapping[str, str] | None]],
                         window: int, work: Path) -> LoadResult:
    """`messages` as requests through NATS, in order on one connection, at most `window`
    unanswered (a file of them is written in `work`). Raises RuntimeError when not every
    request was answered."""
    path = work / "listed-messages"
    write_messages(path, messages)
    size = sum(len(payload) for _, payload, _ in messages) // max(len(messages), 1)
    return await _run_listed(url, Load("unused", size=size, inflight=window,
                                       count=len(messages), messages=path))


async def publish_listed(url: str, messages: Sequence[tuple[str, bytes, Mapping[str, str] | None]],
                         window: int, work: Path) -> dict[str, Any]:
    """`request_listed` as publishes: rate, ack latency, errors (acks saying "error") and
    the generator's CPU per message."""
    result = await request_listed(url, messages, window, work)
    return {"puts_per_s": result.msgs_per_s, "ack_p50_ms": result.histogram.value_at(50) / 1e6,
            "ack_p99_ms": result.histogram.value_at(99) / 1e6, "errors": result.errors,
            "generator_cpu_us_per_msg": result.generator_cpu_s / len(messages) * 1e6}


async def request_frames(address: str, hello: bytes, requests: Sequence[bytes], inflight: int,
                         work: Path) -> LoadResult:
    """`requests` (frames) in order to the broker at `address` on one connection, at most
    `inflight` unanswered (a file of them is written in `work`). Raises RuntimeError when not
    every request was answered."""
    path = work / "listed-frames"
    write_frames(path, hello, requests)
    return await _run_listed(address, Load("frames", size=0, inflight=inflight,
                                           count=len(requests), messages=path, frames=True))


async def _run_listed(url: str, load: Load) -> LoadResult:
    """Run a counted `load` of listed requests, then remove their file. Raises RuntimeError
    when not every request was answered."""
    assert load.messages is not None and load.count is not None
    result = await run_load(url, load)
    load.messages.unlink()
    if result.timed_out or result.acked != load.count:
        raise RuntimeError(f"{result.acked} of {load.count} requests answered")
    return result


@contextlib.contextmanager
def frames_responder() -> Iterator[str]:
    """The no-op peer of `Load.frames`: a process listening on 127.0.0.1 that answers every
    request frame with an empty response; yields its address, killed by PID on exit."""
    binary = ensure_built()
    proc = subprocess.Popen([str(binary), "--mode", "respond", "--protocol", "frames",
                             "--url", "127.0.0.1:0"], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE)
    try:
        line = _ready_line(proc)
        if not line.startswith("ready "):
            raise LoadgenFailed(f"the no-op responder said {line!r}")
        yield f"127.0.0.1:{int(line.split()[1])}"
    finally:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def responder(url: str, subject: str, conns: int = 1,
              tls: LoadTls | None = None) -> Iterator[int]:
    """The no-op peer: `conns` connections answering every request on `subject` with "+OK"
    (queue group "loadgen"), storing nothing; yields its PID, killed by PID on exit."""
    binary = ensure_built()
    proc = subprocess.Popen([str(binary), "--mode", "respond", "--url", url,
                             "--subject", subject, "--conns", str(conns),
                             *(tls.args() if tls is not None else ())],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
    try:
        line = _ready_line(proc)
        if line != "ready":
            raise LoadgenFailed(f"the no-op responder said {line!r}")
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def _ready_line(proc: subprocess.Popen[bytes]) -> str:
    """The first line a responder prints once it is ready (stripped)."""
    assert proc.stdout is not None
    os.set_blocking(proc.stdout.fileno(), False)
    deadline = time.monotonic() + RESPONDER_READY_S
    line = b""
    while not line.endswith(b"\n"):
        if proc.poll() is not None:
            raise LoadgenFailed(f"the no-op responder exited with {proc.returncode}")
        if time.monotonic() > deadline:
            raise LoadgenFailed(f"the no-op responder was not ready in {RESPONDER_READY_S} s")
        line += proc.stdout.read() or b""
        time.sleep(0.005)  # polling a pipe for the ready line, under a deadline
    return line.decode().strip()
