"""PeerLinks: one kept connection per peer address, shared by concurrent requests, dropped
and dialled again after a failure, all closed on close."""

from __future__ import annotations

import asyncio
from typing import cast

import pytest

from jetstream.client.connection import BrokerConnection
from jetstream.errors import BrokerUnavailable
from jetstream.protocol import messages as m
from jetstream.server.peer_links import LINKS_MAX, PeerLinks


class FakeConnection:
    def __init__(self, address: str, fail: list[bool]) -> None:
        self.address = address
        self.opens = 0
        self.requests = 0
        self.closed = True
        self._fail = fail

    async def open(self) -> None:
        await asyncio.sleep(0)  # a concurrent caller gets in here
        self.opens += 1
        self.closed = False

    async def request(self, request: m.Request) -> m.Response:
        self.requests += 1
        if self._fail and self._fail.pop(0):
            self.closed = True
            raise BrokerUnavailable(self.address, "connection reset")
        return m.EmptyResponse()

    async def close(self) -> None:
        self.closed = True


def links(fail: list[bool] | None = None) -> tuple[PeerLinks, list[FakeConnection]]:
    dialled: list[FakeConnection] = []
    failures = fail if fail is not None else []

    def dial(address: str) -> BrokerConnection:
        conn = FakeConnection(address, failures)
        dialled.append(conn)
        return cast(BrokerConnection, conn)

    return PeerLinks(dial), dialled


def request() -> m.Request:
    return m.MetadataRequest(["s"])


async def test_concurrent_requests_share_one_connection_per_address() -> None:
    peers, dialled = links()
    await asyncio.gather(*(peers.request("b1:1", request()) for _ in range(5)),
                         peers.request("b2:1", request()))
    await peers.request("b1:1", request())
    assert sorted(c.address for c in dialled) == ["b1:1", "b2:1"]
    assert [c.requests for c in dialled if c.address == "b1:1"] == [6]
    assert peers.opened == 2
    await peers.close()
    assert all(c.closed for c in dialled)


async def test_a_failed_request_drops_the_connection_and_the_next_dials_again() -> None:
    peers, dialled = links(fail=[True])
    with pytest.raises(BrokerUnavailable):
        await peers.request("b1:1", request())
    assert dialled[0].closed
    await peers.request("b1:1", request())
    assert len(dialled) == 2 and not dialled[1].closed and peers.opened == 2
    await peers.close()


async def test_the_opening_locks_of_gone_addresses_are_forgotten() -> None:
    """Brokers that restart on other ports leave addresses behind: the kept connections
    stay within LINKS_MAX, and so do the locks that serialise opening them."""
    peers, dialled = links()
    for i in range(3 * LINKS_MAX):
        await peers.request(f"b{i}:1", request())
    assert len(peers._links) <= LINKS_MAX
    assert len(peers._opening) <= 2 * LINKS_MAX
    assert len(dialled) == 3 * LINKS_MAX
    await peers.close()
