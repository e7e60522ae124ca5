"""How the socket API sends the slices of an answer after the frame's prefix: small ones
copied together into one write (with the prefix), larger ones with sendfile, in order; a slice
whose file shrank ends the frame."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

from jetstream.server.socket_api import COPY_PIECE_BYTES_MAX, Connection
from jetstream.stream.file_slice import FileSlice


def slices(path: Path, lengths: list[int]) -> tuple[bytes, list[FileSlice]]:
    data = os.urandom(sum(lengths))
    path.write_bytes(data)
    out, position = [], 0
    for length in lengths:
        fd = os.open(path, os.O_RDONLY)
        out.append(FileSlice(fd, position, length, position, position + length))
        position += length
    return data, out


HEAD = b"frame prefix"


async def send(pieces: list[FileSlice]) -> tuple[bool, bytes]:
    ours, theirs = socket.socketpair()
    _reader, writer = await asyncio.open_connection(sock=ours)
    loop = asyncio.get_running_loop()
    received = bytearray()

    def drain_other_end() -> None:
        theirs.settimeout(2.0)
        while chunk := theirs.recv(1 << 16):
            received.extend(chunk)

    reading = loop.run_in_executor(None, drain_other_end)
    try:
        ok = await Connection._send_pieces(loop, writer, HEAD, pieces)
    finally:
        writer.close()
        await writer.wait_closed()
        await reading
        theirs.close()
        for piece in pieces:
            piece.close()
    return ok, bytes(received)


def test_small_and_large_slices_arrive_in_order(tmp_path: Path) -> None:
    big = COPY_PIECE_BYTES_MAX + 1
    data, pieces = slices(tmp_path / "segment", [100, big, 50, 60, 3 * big, 7])
    ok, received = asyncio.run(send(pieces))
    assert ok and received == HEAD + data


def test_a_slice_past_the_end_of_its_file_is_reported_short(tmp_path: Path) -> None:
    _data, pieces = slices(tmp_path / "segment", [100, 200])
    os.truncate(tmp_path / "segment", 150)  # a truncation under the reader
    ok, received = asyncio.run(send(pieces))
    assert not ok and received == b""  # nothing of a run is sent once a slice fails
