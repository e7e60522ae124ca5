"""The relay: bytes flow when up, connections die when down, and a blackhole holds bytes
(delivering them in order once healed) without closing anything."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator

import pytest

from tests.faults.proxy import Mode, Relays

DEADLINE_S = 5.0


@pytest.fixture
def echo() -> Iterator[int]:
    """A tiny echo server on its own thread loop; yields its port."""
    relays = Relays()  # reuse its loop thread to run the echo server

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(1024):
            writer.write(data)
            await writer.drain()
        writer.close()

    async def start() -> asyncio.Server:
        return await asyncio.start_server(handle, "127.0.0.1", 0)

    server = relays._call(start())
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        relays.close()


def read_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    deadline = time.monotonic() + DEADLINE_S
    while len(data) < n and time.monotonic() < deadline:
        chunk = sock.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


def closed(sock: socket.socket) -> bool:
    """The peer closed the connection (an orderly close or a reset)."""
    try:
        return sock.recv(16) == b""
    except ConnectionResetError:
        return True


def test_up_down_blackhole(echo: int) -> None:
    relays = Relays()
    try:
        link = relays.add("l", f"127.0.0.1:{echo}")
        with socket.create_connection(("127.0.0.1", link.port), timeout=DEADLINE_S) as sock:
            sock.sendall(b"ping")
            assert read_exactly(sock, 4) == b"ping"
            relays.set_mode(["l"], Mode.BLACKHOLE)
            sock.sendall(b"held")
            sock.settimeout(0.3)
            with pytest.raises(TimeoutError):
                sock.recv(16)
            sock.settimeout(DEADLINE_S)
            relays.heal()
            assert read_exactly(sock, 4) == b"held"
            relays.set_mode(["l"], Mode.DOWN)
            assert closed(sock)  # closed by the relay
        with socket.create_connection(("127.0.0.1", link.port), timeout=DEADLINE_S) as sock:
            assert closed(sock)  # down: accepted and closed at once
        relays.heal()
        with socket.create_connection(("127.0.0.1", link.port), timeout=DEADLINE_S) as sock:
            sock.sendall(b"again")
            assert read_exactly(sock, 5) == b"again"
    finally:
        relays.close()
