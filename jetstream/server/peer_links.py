"""Kept-open socket API connections from this broker to its peers, for cluster requests.

A create asks the brokers that lead its partitions whether they serve them yet, and a
follower reports a silent leader to the metadata leader. Opening a connection for each (TCP,
TLS and SASL handshakes) cost more than the request, on every create. `PeerLinks` keeps one
connection per peer address, opened on first use; requests are pipelined on it
(jetstream.client.connection), so concurrent callers share it. A request that fails drops
the connection, and the next one dials again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from jetstream.client.connection import BrokerConnection
from jetstream.errors import JetstreamError
from jetstream.protocol import messages as m

#: Connections kept open at most (the cluster's brokers; a bound on a misconfigured map).
LINKS_MAX = 256


class PeerLinks:
    def __init__(self, dial: Callable[[str], BrokerConnection]) -> None:
        """`dial(address)`: an unopened connection to a peer (timeouts, TLS, credentials)."""
        self._dial = dial
        self._links: dict[str, BrokerConnection] = {}
        self._opening: dict[str, asyncio.Lock] = {}
        #: Connections opened (`jetstream_cluster_peer_links_opened_total`).
        self.opened = 0

    async def request(self, address: str, request: m.Request) -> m.Response:
        """`request` to the broker at `address` over its kept connection; a failure
        (JetstreamError, OSError) drops the connection and is raised."""
        conn = await self._link(address)
        try:
            return await conn.request(request)
        except (JetstreamError, OSError):
            await self._drop(address, conn)
            raise

    async def _link(self, address: str) -> BrokerConnection:
        conn = self._links.get(address)
        if conn is not None and not conn.closed:
            return conn
        if address not in self._opening and len(self._opening) >= 2 * LINKS_MAX:
            # Addresses of brokers that restarted on other ports: forget their idle locks.
            self._opening = {a: lk for a, lk in self._opening.items()
                             if lk.locked() or a in self._links}
        lock = self._opening.setdefault(address, asyncio.Lock())
        async with lock:
            conn = self._links.get(address)
            if conn is not None and not conn.closed:
                return conn
            if len(self._links) >= LINKS_MAX:
                await self._drop(*next(iter(self._links.items())))
            conn = self._dial(address)
            await conn.open()
            self._links[address] = conn
            self.opened += 1
            return conn

    async def _drop(self, address: str, conn: BrokerConnection) -> None:
        if self._links.get(address) is conn:
            del self._links[address]
        with contextlib.suppress(JetstreamError, OSError):
            await conn.close()

    async def close(self) -> None:
        links, self._links = self._links, {}
        for conn in links.values():
            with contextlib.suppress(JetstreamError, OSError):
                await conn.close()
