"""The broker's NATS connection for ingest and acks, behind one small interface.

Theory of operation: a partition leader needs three things from NATS: subscribe to its
subject (a queue subscription for a group), take what arrived in batches, and publish many
small acks at once. `FastNats` does it over jetstream.server.nats_ingest, a minimal NATS
client that parses the protocol in bulk (about 3x less CPU per message than nats-py, see
bench/nats_ingest_compare.py). `NatsPyNats` does the same over nats-py, for what the fast
client does not speak (a creds file's nkey signature, WebSocket). `connect_nats` picks the
fast one when it can.
Both report their connection `state` (connected, reconnecting, closed) for the broker's
status answers.

Messages are tuples (subject, reply, headers, data): a batch of thousands is built and read
without an object per message.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Sequence
from typing import Any, Literal, Protocol

import nats
from nats.aio.client import Client as NatsPyClient
from nats.aio.msg import Msg as NatsPyMsg
from nats.aio.subscription import Subscription as NatsPySubscription

from jetstream.server import nats_ingest
from jetstream.server.nats_dial import NatsAuth
from jetstream.server.nats_errors import NatsUnsupported
from jetstream.server.nats_subscription import IngestSubscription
from jetstream.server.nats_wire import NatsMsg, pub_commands

log = logging.getLogger(__name__)

#: A NATS connection's state as the broker reports it: "reconnecting" covers every moment
#: between losing the server and getting one back (nats-py's disconnected and connecting).
NatsState = Literal["connected", "reconnecting", "closed"]


class Subscription(Protocol):
    @property
    def dropped(self) -> int:
        """Messages NATS delivered that the subscription's buffer could not hold."""

    async def next_batch(self, max_msgs: int, max_bytes: int) -> list[NatsMsg]: ...

    def take_batch(self, max_msgs: int, max_bytes: int) -> list[NatsMsg]: ...

    async def close(self) -> None: ...


class NatsPort(Protocol):
    async def subscribe(self, subject: str, queue: str | None, pending_msgs_max: int,
                        pending_bytes_max: int) -> Subscription: ...

    async def publish_many(self, messages: Sequence[tuple[str, bytes]]) -> None: ...

    @property
    def state(self) -> NatsState: ...

    @property
    def confirm_pings(self) -> int:
        """Round trips that confirmed subscriptions to the server, since connecting."""

    async def close(self) -> None: ...


# -- the fast client -----------------------------------------------------------------------------


class _FastSubscription:
    def __init__(self, sub: IngestSubscription) -> None:
        self._sub = sub

    @property
    def dropped(self) -> int:
        return self._sub.dropped

    async def next_batch(self, max_msgs: int, max_bytes: int) -> list[NatsMsg]:
        return await self._sub.next_batch(max_msgs, max_bytes)

    def take_batch(self, max_msgs: int, max_bytes: int) -> list[NatsMsg]:
        return self._sub.take_batch(max_msgs, max_bytes)

    async def close(self) -> None:
        self._sub.unsubscribe()


class FastNats:
    def __init__(self, conn: nats_ingest.IngestConnection) -> None:
        self._conn = conn

    async def subscribe(self, subject: str, queue: str | None, pending_msgs_max: int,
                        pending_bytes_max: int) -> Subscription:
        sub = self._conn.subscribe(subject, queue or None, pending_msgs_max=pending_msgs_max,
                                   pending_bytes_max=pending_bytes_max)
        # A PING answered after the SUB proves the server has the subscription: a message
        # published after `subscribe` returns is received. Leaders starting together share it.
        await self._conn.confirm()
        return _FastSubscription(sub)

    @property
    def confirm_pings(self) -> int:
        return self._conn.confirm_pings

    @property
    def state(self) -> NatsState:
        if self._conn.is_connected:
            return "connected"
        return "closed" if self._conn.is_closed else "reconnecting"

    async def publish_many(self, messages: Sequence[tuple[str, bytes]]) -> None:
        if messages:
            self._conn.publish_many(messages)
            await self._conn.drain()

    async def close(self) -> None:
        await self._conn.close()


# -- nats-py ---------------------------------------------------------------------------------------


class _NatsPySubscription:
    """nats-py keeps a subscription without a callback in a bounded asyncio.Queue; reading
    it directly lets one wake-up take everything that arrived."""

    def __init__(self, sub: NatsPySubscription) -> None:
        self._sub = sub
        self._queue: asyncio.Queue[NatsPyMsg] = sub._pending_queue
        self.dropped = 0

    async def next_batch(self, max_msgs: int, max_bytes: int) -> list[NatsMsg]:
        first = await self._queue.get()
        return self._drain([first], max_msgs, max_bytes)

    def take_batch(self, max_msgs: int, max_bytes: int) -> list[NatsMsg]:
        return self._drain([], max_msgs, max_bytes)

    def _drain(self, msgs: list[NatsPyMsg], max_msgs: int, max_bytes: int) -> list[NatsMsg]:
        size = sum(len(m.data) for m in msgs)
        while len(msgs) < max_msgs and size < max_bytes:
            try:
                msg = self._queue.get_nowait()
            except asyncio.QueueEmpty:
                break
            msgs.append(msg)
            size += len(msg.data)
        # nats-py counts pending bytes for its slow-consumer limit; give them back.
        self._sub._pending_size = max(0, self._sub._pending_size - size)
        return [(m.subject, m.reply or None, m.headers, m.data) for m in msgs]

    async def close(self) -> None:
        await self._sub.unsubscribe()


class NatsPyNats:
    def __init__(self, nc: NatsPyClient) -> None:
        self._nc = nc
        self.confirm_pings = 0

    @property
    def state(self) -> NatsState:
        if self._nc.is_connected:
            return "connected"
        return "closed" if self._nc.is_closed else "reconnecting"

    async def subscribe(self, subject: str, queue: str | None, pending_msgs_max: int,
                        pending_bytes_max: int) -> Subscription:
        sub = await self._nc.subscribe(subject, queue=queue or "",
                                       pending_msgs_limit=pending_msgs_max,
                                       pending_bytes_limit=pending_bytes_max)
        # nats-py's flush PING can overtake the SUB still in its buffer (FIELD_NOTES): the
        # second round trip is the one that proves the subscription is registered.
        await self._nc.flush()
        await self._nc.flush()
        self.confirm_pings += 2
        return _NatsPySubscription(sub)

    async def publish_many(self, messages: Sequence[tuple[str, bytes]]) -> None:
        """Build the PUB commands of the whole batch and queue them as one write through
        nats-py's pending buffer (its `_send_command`/`_flush_pending`; nats-py is pinned
        below 3); plain `publish` when those are missing or during a reconnect."""
        if not messages:
            return
        nc = self._nc
        send = getattr(nc, "_send_command", None)
        flush = getattr(nc, "_flush_pending", None)
        if send is None or flush is None or not nc.is_connected:
            for subject, payload in messages:
                await nc.publish(subject, payload)
            return
        await send(pub_commands(messages))
        await flush()

    async def close(self) -> None:
        await self._nc.drain()


async def connect_nats(urls: list[str], name: str, *, tls: ssl.SSLContext | None = None,
                       auth: NatsAuth | None = None, fast: bool = True) -> NatsPort:
    """The fast client when `fast` and it speaks what the servers ask for (a creds file
    needs nats-py's nkey signing), else nats-py. `tls` is used with servers that require
    TLS and tls:// URLs; `auth` where a URL carries no credentials."""
    auth = auth or NatsAuth()
    if fast and auth.creds_file is None:
        try:
            return FastNats(await nats_ingest.connect(urls, name=name, tls=tls, auth=auth))
        except NatsUnsupported as exc:
            log.info("NATS at %s needs nats-py (%s)", urls, exc)
    options: dict[str, Any] = {"user": auth.user, "password": auth.password,
                               "token": auth.token, "user_credentials": auth.creds_file}
    if tls is not None:
        options["tls"] = tls
    nc = await nats.connect(servers=urls, name=name, max_reconnect_attempts=-1,
                            reconnect_time_wait=0.5, pending_size=64 * 1024 * 1024,
                            flusher_queue_size=16384,
                            **{k: v for k, v in options.items() if v is not None})
    return NatsPyNats(nc)
