"""The asyncio client: `async with jetstream.connect("127.0.0.1:4300") as js:`.

Theory of operation: the client talks to brokers over their socket API and publishes
through NATS. `connect` takes bootstrap addresses ("host:port,host:port", a list, or the
JETSTREAM_BROKERS environment variable); starting opens a connection to the first one that
answers and reads the metadata: the brokers (id, address, NATS URL) and every stream with
its partitions and their leaders.

A `Client` is composed of one part per concern, each in its own module, all reaching the
cluster through one router (routing.py: connections, the metadata cache, leaders, retries):
- StreamAdmin (admin.py): create, delete, list and describe streams; describe the cluster.
- Publishing (publishing.py): publish and publish_batch through NATS, waiting for acks.
- Reading (reading.py): fetch, subscribe, offsets by timestamp; segment listings and raw
  fetches for bulk readers.
- KeyValueReads (kv.py): get and keys on compacted streams.
- ConsumerGroups (groups.py, offsets.py): group members, committed offsets, group admin.
- DatastreamAdmin (datastreams.py): datastreams' management and diagnostics.
A new concern is a new part: a module with its calls, named in the `Client` bases and
started in `__init__`. This module holds only what ties the parts together: construction,
start, close, and `subscribe`, which is a partition's or a consumer group's.
"""

from __future__ import annotations

import os
import ssl
import uuid
from collections.abc import Generator, Mapping, Sequence
from typing import Any, overload

from jetstream.client.acls import AclCalls
from jetstream.client.admin import StreamAdmin
from jetstream.client.connection import (
    CONNECT_TIMEOUT_S,
    REQUEST_TIMEOUT_S,
    REQUESTS_MAX,
    split_address,
)
from jetstream.client.datastreams import DatastreamAdmin
from jetstream.client.group_subscription import Callback, GroupSubscription
from jetstream.client.groups import ConsumerGroups
from jetstream.client.kv import KeyValueReads
from jetstream.client.mirror import MirrorCopying
from jetstream.client.publishing import Publishing
from jetstream.client.reading import FETCH_BYTES_DEFAULT, Reading
from jetstream.client.routing import Router
from jetstream.client.subscription import StopAt, Subscription
from jetstream.client.types import Start
from jetstream.errors import ProtocolError
from jetstream.protocol import messages as m
from jetstream.security.tls import client_context

BROKERS_ENV = "JETSTREAM_BROKERS"
PLAIN_SCHEME = "jetstream://"
TLS_SCHEME = "jetstreams://"
METADATA_MAX_AGE_S = 30.0


def parse_brokers(brokers: str | Sequence[str] | None) -> list[str]:
    """Bootstrap addresses from "host:port,host:port", a list of them, or (None) the
    JETSTREAM_BROKERS environment variable; each may carry a `jetstream://` or
    `jetstreams://` (TLS) prefix. Raises ProtocolError when there are none or one is not
    host:port."""
    addresses = [_strip_scheme(item) for item in _broker_items(brokers)]
    if not addresses:
        raise ProtocolError(f"no broker addresses: pass brokers= or set {BROKERS_ENV}",
                            field="brokers")
    for address in addresses:
        try:
            split_address(address)
        except ValueError as exc:
            raise ProtocolError(str(exc), field="brokers") from None
    return addresses


def _broker_items(brokers: str | Sequence[str] | None) -> list[str]:
    if brokers is None:
        brokers = os.environ.get(BROKERS_ENV, "")
    items = brokers.split(",") if isinstance(brokers, str) else list(brokers)
    return [item.strip() for item in items if item.strip()]


def _strip_scheme(item: str) -> str:
    for scheme in (TLS_SCHEME, PLAIN_SCHEME):
        if item.startswith(scheme):
            return item[len(scheme):]
    return item


def wants_tls(brokers: str | Sequence[str] | None) -> bool:
    """Whether the broker list asks for TLS (a `jetstreams://` address)."""
    return any(item.startswith(TLS_SCHEME) for item in _broker_items(brokers))


def connect(
    brokers: str | Sequence[str] | None = None,
    *,
    nats_url: str | None = None,
    client_id: str | None = None,
    connect_timeout_s: float = CONNECT_TIMEOUT_S,
    request_timeout_s: float = REQUEST_TIMEOUT_S,
    requests_max: int = REQUESTS_MAX,
    metadata_max_age_s: float = METADATA_MAX_AGE_S,
    tls: ssl.SSLContext | None = None,
    tls_ca: str | None = None,
    tls_cert: str | None = None,
    tls_key: str | None = None,
    nats_options: Mapping[str, Any] | None = None,
    user: str | None = None,
    password: str | None = None,
    token: str | None = None,
    credentials: m.Credentials | None = None,
) -> Client:
    """A client for the brokers at `brokers` (see `parse_brokers`). Use it as
    `async with connect(...) as js:` or `js = await connect(...)` then `await js.close()`.
    Starting raises BrokerUnavailable when no bootstrap broker answers.

    TLS: `tls_ca` (the CA bundle that signed the brokers' certificates; default: the
    system's), `tls_cert` and `tls_key` (this client's, for brokers that verify clients), or
    a ready `tls` context; a `jetstreams://` broker address asks for TLS with the defaults.
    `nats_options` go to nats-py's `connect` for publishing (`user`, `password`, `token`,
    `user_credentials`, `tls`); a `tls://` NATS URL without a `tls` option uses the
    client's TLS context.

    Authentication (brokers with `authentication` on): `user` and `password`, or a `token`
    (`user:secret`), or ready `credentials`; a client certificate (`tls_cert`) the broker
    trusts needs none."""
    if tls is None and (tls_ca or tls_cert or tls_key or wants_tls(brokers)):
        tls = client_context(tls_ca, tls_cert, tls_key)
    return Client(parse_brokers(brokers), nats_url=nats_url,
                  client_id=client_id or f"jetstream-py-{os.getpid()}-{uuid.uuid4().hex[:8]}",
                  connect_timeout_s=connect_timeout_s, request_timeout_s=request_timeout_s,
                  requests_max=requests_max, metadata_max_age_s=metadata_max_age_s, tls=tls,
                  nats_options=nats_options,
                  credentials=credentials or credentials_of(user, password, token))


def credentials_of(user: str | None, password: str | None,
                   token: str | None) -> m.Credentials | None:
    """The credentials a user, password or token give; None for none. A user without a
    password (or the reverse), or both and a token, is a ValueError."""
    if token:
        if user or password:
            raise ValueError("give a token or a user and password, not both")
        return m.Credentials.from_token(token)
    if bool(user) != bool(password):
        raise ValueError("a user and a password go together")
    return m.Credentials(user, password) if user and password else None


def _nats_options(options: Mapping[str, Any] | None,
                  tls: ssl.SSLContext | None) -> dict[str, Any]:
    """nats-py options; the client's TLS context serves NATS too unless one is given (it is
    used only for tls:// URLs or a server that requires TLS)."""
    out = dict(options or {})
    if tls is not None:
        out.setdefault("tls", tls)
    return out


class Client(StreamAdmin, Publishing, Reading, KeyValueReads, ConsumerGroups, AclCalls,
             DatastreamAdmin, MirrorCopying):
    """A Jetstream client. Build it with `connect`; every method is a coroutine except
    `subscribe`, which returns an async iterator."""

    def __init__(self, bootstrap: list[str], *, nats_url: str | None, client_id: str,
                 connect_timeout_s: float, request_timeout_s: float, requests_max: int,
                 metadata_max_age_s: float, tls: ssl.SSLContext | None = None,
                 nats_options: Mapping[str, Any] | None = None,
                 credentials: m.Credentials | None = None) -> None:
        self.bootstrap = bootstrap
        self.client_id = client_id
        #: The TLS context of every broker connection (None: plain TCP).
        self.tls = tls
        #: What every broker connection authenticates with (None: nothing).
        self.credentials = credentials
        self._router = Router(bootstrap, client_id=client_id,
                              connect_timeout_s=connect_timeout_s,
                              request_timeout_s=request_timeout_s, requests_max=requests_max,
                              metadata_max_age_s=metadata_max_age_s, tls=tls,
                              credentials=credentials)
        Publishing.__init__(self, nats_url=nats_url, connect_timeout_s=connect_timeout_s,
                            partition_count=self._router.metadata.partition_count,
                            nats_options=_nats_options(nats_options, tls))
        Reading.__init__(self)
        ConsumerGroups.__init__(self, self.partition_subscription)

    async def start(self) -> Client:
        """Connect to a bootstrap broker and read the metadata. Raises BrokerUnavailable."""
        await self._router.refresh_metadata()
        return self

    def __await__(self) -> Generator[Any, None, Client]:
        return self.start().__await__()

    async def __aenter__(self) -> Client:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop subscriptions, fail publishes still waiting for acks, close every
        connection. Idempotent."""
        self._router.stop()
        await self._close_members()
        await self._close_subscriptions()
        await self._close_publisher()
        await self._router.close()

    @overload
    def subscribe(self, stream: str, partition: int = 0, *, start: Start = Start.EARLIEST,
                  offset: int | None = None, timestamp_ms: int | None = None,
                  stop: StopAt = None, max_bytes: int = FETCH_BYTES_DEFAULT,
                  max_wait_ms: int = 1000, read_isr_replica: bool = False,
                  group: None = None) -> Subscription: ...

    @overload
    def subscribe(self, stream: str | Sequence[str] | None = None, *, group: str,
                  selector: str = "", reset: str = "earliest", auto_commit: bool = True,
                  auto_commit_interval_ms: int = 5_000, session_timeout_ms: int = 10_000,
                  heartbeat_interval_ms: int = 1_000, rebalance_timeout_ms: int = 30_000,
                  max_bytes: int = FETCH_BYTES_DEFAULT, max_wait_ms: int = 500,
                  on_assign: Callback | None = None,
                  on_revoke: Callback | None = None) -> GroupSubscription: ...

    def subscribe(self, stream: str | Sequence[str] | None = None, partition: int = 0,
                  **options: Any) -> Subscription | GroupSubscription:
        """Without `group`: one partition's committed messages (Reading.subscribe).

        With `group="name"`: a member of that consumer group. `stream` is a stream name or
        several (and/or `selector`, a label selector); the group's coordinator shares their
        partitions among its members (sticky; revoke before assign: no partition is read by
        two members at once), each resuming from the group's committed offset or by `reset`
        (`earliest`, `latest`, `error`) where none is committed. `auto_commit` commits the
        positions of finished messages every `auto_commit_interval_ms`, on revoke and on
        close; `await sub.commit()` commits what was handed out, `await msg.commit()` one
        message. `on_assign`/`on_revoke` are called with the partitions (stream, partition)
        that arrive or leave. Use `async with js.subscribe(..., group=...) as sub:` (joins,
        then leaves on exit). At least once: see README "Consumer groups"."""
        group = options.pop("group", None)
        if group is None:
            if not isinstance(stream, str):
                raise TypeError("a partition subscription names one stream")
            return Reading.subscribe(self, stream, partition, **options)
        return self.subscribe_group(stream, group, **options)

