"""Which NATS server the ingest connection dials, and when: the URL list and reconnecting.

Theory of operation: a connection is given a list of servers (`parse_url` turns each URL
into a ServerAddress with the credentials it carries). `Dialer` owns the order of attempts;
the connection (jetstream.server.nats_ingest) owns what one attempt is (TCP connect and
handshake: the `dial` callable).
- The first connect (`dial_first`) tries each server once, in order, and fails with
  `NatsConnectFailed` listing every server's reason; `NatsUnsupported` (a server requiring
  TLS of a connection given no TLS context) ends it at once, as no other server would change
  that answer for the broker's fallback to nats-py.
- A reconnect (`redial`) goes round-robin from the server after the one that was lost. After
  each round where every server failed it sleeps, starting at `wait_s` and doubling up to
  `wait_max_s`, with jitter (x0.5..1.5) so that brokers that lost the same server do not
  come back in lockstep. It stops when a server accepts, when the connection is closing, or
  after `attempts_max` attempts (None: never gives up; a broker keeps trying).
"""

from __future__ import annotations

import asyncio
import logging
import random
import urllib.parse
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Final

from jetstream.errors import JetstreamError
from jetstream.server.nats_errors import NatsConnectFailed, NatsConnectionClosed, NatsUnsupported
from jetstream.server.nats_wire import NatsProtocolError

log = logging.getLogger(__name__)

DEFAULT_PORT: Final = 4222


@dataclass(frozen=True, slots=True)
class NatsAuth:
    """Credentials for servers whose URLs carry none: a user and password, a token, or a
    creds file (JWT and nkey seed; only nats-py signs with it)."""

    user: str | None = None
    password: str | None = None
    token: str | None = None
    creds_file: str | None = None


@dataclass(frozen=True, slots=True)
class ServerAddress:
    """One server of the URL list, with the credentials its URL carries."""

    host: str
    port: int
    user: str | None = None
    password: str | None = None
    auth_token: str | None = None
    #: A tls:// URL: the connection must be TLS even if the server does not ask for it.
    tls: bool = False

    def __str__(self) -> str:
        return f"{'tls' if self.tls else 'nats'}://{self.host}:{self.port}"

    def with_auth(self, auth: NatsAuth) -> ServerAddress:
        """This address with `auth`'s user or token where its URL carries none."""
        if self.user is not None or self.auth_token is not None:
            return self
        return ServerAddress(self.host, self.port, auth.user, auth.password, auth.token,
                             self.tls)


def parse_url(url: str) -> ServerAddress:
    """`nats://[user:pass@|token@]host[:port]` (or `tls://`, or bare `host:port`) as a
    ServerAddress."""
    if "://" not in url:
        url = "nats://" + url
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("nats", "tls"):
        raise NatsUnsupported(f"NATS URL scheme {parts.scheme!r} is not supported (only "
                              f"nats:// and tls://; WebSocket needs nats-py): {url}",
                              url=url)
    tls = parts.scheme == "tls"
    if not parts.hostname:
        raise NatsConnectFailed(f"NATS URL without a host: {url}", url=url)
    try:
        port = parts.port or DEFAULT_PORT
    except ValueError as exc:
        raise NatsConnectFailed(f"bad port in NATS URL {url}", url=url) from exc
    user = urllib.parse.unquote(parts.username) if parts.username else None
    if user is not None and parts.password is None:
        return ServerAddress(parts.hostname, port, auth_token=user, tls=tls)
    password = urllib.parse.unquote(parts.password) if parts.password is not None else None
    return ServerAddress(parts.hostname, port, user=user, password=password, tls=tls)


#: One attempt: connect to the server and complete the handshake, or raise.
Dial = Callable[[ServerAddress], Awaitable[None]]


class Dialer:
    """The order and pace of connection attempts over a list of servers (see the module
    docstring). `index` is the server of the last successful attempt."""

    def __init__(self, servers: Sequence[ServerAddress], dial: Dial, *, wait_s: float,
                 wait_max_s: float, attempts_max: int | None) -> None:
        if not servers:
            raise ValueError("at least one NATS server is needed")
        self.servers = list(servers)
        self.index = 0
        self._dial = dial
        self._wait_s = wait_s
        self._wait_max_s = wait_max_s
        self._attempts_max = attempts_max

    async def dial_first(self) -> None:
        """One attempt per server, in order; raise NatsConnectFailed if none accepts."""
        reasons: list[str] = []
        for index, server in enumerate(self.servers):
            try:
                await self._dial(server)
            except NatsUnsupported:
                raise
            except (OSError, TimeoutError, NatsConnectFailed, NatsProtocolError) as exc:
                reasons.append(f"{server}: {exc or type(exc).__name__}")
                continue
            self.index = index
            return
        raise NatsConnectFailed("could not connect to any NATS server: " + "; ".join(reasons),
                                reasons=reasons)

    async def redial(self, stopping: Callable[[], bool]) -> tuple[ServerAddress, int] | None:
        """Dial until a server accepts: returns it and the attempts it took. None when
        `stopping()` turned true; NatsConnectionClosed after `attempts_max` attempts."""
        wait_s = self._wait_s
        attempts = 0
        while not stopping():
            for _ in range(len(self.servers)):
                if self._attempts_max is not None and attempts >= self._attempts_max:
                    raise NatsConnectionClosed(
                        f"gave up reconnecting to NATS after {attempts} attempts")
                self.index = (self.index + 1) % len(self.servers)
                server = self.servers[self.index]
                attempts += 1
                try:
                    await self._dial(server)
                except (OSError, TimeoutError, JetstreamError) as exc:
                    log.debug("reconnect to %s failed: %s", server, exc)
                    continue
                return server, attempts
            await asyncio.sleep(wait_s * (0.5 + random.random()))
            wait_s = min(wait_s * 2, self._wait_max_s)
        return None
