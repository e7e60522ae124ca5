"""A blocking facade over the asyncio client, for scripts and notebooks.

    from jetstream.client import sync

    with sync.connect("127.0.0.1:4300") as js:
        js.create_stream("orders", "orders.*")
        js.publish("orders.new", b"hello")
        for message in js.subscribe("orders", stop="latest"):
            print(message.offset, message.value)
        with js.subscribe("orders", group="billing") as member:
            for message in member:  # the partitions the group gives this member
                handle(message)

Theory of operation: a `SyncClient` runs its own event loop in a daemon thread and owns an
asyncio `Client` that lives on that loop. Each method hands the matching coroutine to the
loop (`run_coroutine_threadsafe`) and blocks the calling thread until it is done, so
results, errors and timeouts are the async client's. A subscription becomes a plain
iterator that asks the loop for one batch at a time (Subscription.next_batch), so the
thread hop costs once per batch, not per message. A consumer-group member is iterated one
message per hop: asking for the next message is what tells it the previous one is done
(its auto-commit commits only finished messages). `close()` closes the client, stops the
loop and joins the thread.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import ssl
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping, Sequence
from typing import Any, Concatenate, ParamSpec, TypeVar, overload

from jetstream.client.client import METADATA_MAX_AGE_S, Client
from jetstream.client.client import connect as connect_async
from jetstream.client.connection import CONNECT_TIMEOUT_S, REQUEST_TIMEOUT_S, REQUESTS_MAX
from jetstream.client.group_subscription import GroupMessage, GroupSubscription
from jetstream.client.subscription import Subscription
from jetstream.client.types import BrokerInfo, Message
from jetstream.protocol import messages as m

_P = ParamSpec("_P")
_T = TypeVar("_T")

CLOSE_TIMEOUT_S = 10.0


def _blocking(method: Callable[Concatenate[Client, _P], Awaitable[_T]]
              ) -> Callable[Concatenate[SyncClient, _P], _T]:
    """A SyncClient method that runs the Client coroutine `method` on the client's loop."""

    def call(self: SyncClient, /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        async def run() -> _T:
            return await method(self._client, *args, **kwargs)

        return self._run(run())

    functools.update_wrapper(call, method)  # name, docstring and signature of the original
    return call


class SyncSubscription:
    """A blocking iterator of Messages over a Subscription (see Client.subscribe)."""

    def __init__(self, owner: SyncClient, subscription: Subscription) -> None:
        self._owner = owner
        self._subscription = subscription
        self._buffer: collections.deque[Message] = collections.deque()

    def __iter__(self) -> Iterator[Message]:
        return self

    def __next__(self) -> Message:
        while not self._buffer:
            batch = self._owner._run(self._subscription.next_batch())
            if batch is None:
                raise StopIteration
            self._buffer.extend(batch)
        return self._buffer.popleft()

    @property
    def position(self) -> int | None:
        return self._subscription.position

    def close(self) -> None:
        self._owner._run(self._subscription.close())

    def __enter__(self) -> SyncSubscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SyncGroupSubscription:
    """A blocking iterator over a consumer-group member (see Client.subscribe(group=))."""

    def __init__(self, owner: SyncClient, member: GroupSubscription) -> None:
        self._owner = owner
        self._member = member

    def __iter__(self) -> Iterator[GroupMessage]:
        return self

    def __next__(self) -> GroupMessage:
        try:
            return self._owner._run(self._member.__anext__())
        except StopAsyncIteration:
            raise StopIteration from None

    @property
    def assignment(self) -> frozenset[tuple[str, int]]:
        return self._member.assignment

    def commit(self, offsets: Mapping[tuple[str, int], int] | None = None) -> None:
        self._owner._run(self._member.commit(offsets))

    def close(self) -> None:
        self._owner._run(self._member.close())

    def __enter__(self) -> SyncGroupSubscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SyncClient:
    """The blocking mirror of Client: same methods, same arguments, same errors."""

    def __init__(self, make_client: Callable[[], Client]) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="jetstream-sync-client")
        self._thread.start()

        async def start() -> Client:
            return await make_client().start()

        try:
            self._client = self._run(start())
        except BaseException:
            self._stop_loop()
            raise

    def _run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    @property
    def brokers(self) -> list[BrokerInfo]:
        return self._client.brokers

    refresh_metadata = _blocking(Client.refresh_metadata)
    create_stream = _blocking(Client.create_stream)
    delete_stream = _blocking(Client.delete_stream)
    update_stream = _blocking(Client.update_stream)
    delete = _blocking(Client.delete)
    get = _blocking(Client.get)
    keys = _blocking(Client.keys)
    list_streams = _blocking(Client.list_streams)
    stream_info = _blocking(Client.stream_info)
    publish = _blocking(Client.publish)
    publish_batch = _blocking(Client.publish_batch)
    fetch = _blocking(Client.fetch)
    offset_for_timestamp = _blocking(Client.offset_for_timestamp)
    list_segments = _blocking(Client.list_segments)
    fetch_raw = _blocking(Client.fetch_raw)
    commit_offset = _blocking(Client.commit_offset)
    commit_offsets = _blocking(Client.commit_offsets)
    fetch_offset = _blocking(Client.fetch_offset)
    fetch_offsets = _blocking(Client.fetch_offsets)
    reset_offsets = _blocking(Client.reset_offsets)
    delete_group = _blocking(Client.delete_group)
    list_groups = _blocking(Client.list_groups)
    describe_group = _blocking(Client.describe_group)
    acl_list = _blocking(Client.acl_list)
    acl_add = _blocking(Client.acl_add)
    acl_remove = _blocking(Client.acl_remove)

    @overload
    def subscribe(self, stream: str, partition: int = 0, *, group: None = None,
                  **options: Any) -> SyncSubscription: ...

    @overload
    def subscribe(self, stream: str | Sequence[str] | None = None, *, group: str,
                  **options: Any) -> SyncGroupSubscription: ...

    def subscribe(self, stream: str | Sequence[str] | None = None, partition: int = 0, *,
                  group: str | None = None, **options: Any
                  ) -> SyncSubscription | SyncGroupSubscription:
        """Client.subscribe, started on the client's loop, iterated from this thread: a
        partition's messages, or with `group=` a consumer-group member's."""
        async def make() -> Subscription | GroupSubscription:
            if group is None:
                if not isinstance(stream, str):
                    raise TypeError("a partition subscription names one stream")
                return await self._client.subscribe(stream, partition, **options).start()
            return await self._client.subscribe(stream, group=group, **options).start()

        made = self._run(make())
        if isinstance(made, GroupSubscription):
            return SyncGroupSubscription(self, made)
        return SyncSubscription(self, made)

    def close(self) -> None:
        """Close the client and stop its thread. Idempotent."""
        if self._thread.is_alive():
            try:
                asyncio.run_coroutine_threadsafe(self._client.close(), self._loop).result(
                    CLOSE_TIMEOUT_S)
            finally:
                self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(CLOSE_TIMEOUT_S)
        if not self._thread.is_alive():
            self._loop.close()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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
) -> SyncClient:
    """A started SyncClient; takes the arguments of jetstream.client.connect. Raises
    BrokerUnavailable when no bootstrap broker answers."""
    return SyncClient(lambda: connect_async(
        brokers, nats_url=nats_url, client_id=client_id, connect_timeout_s=connect_timeout_s,
        request_timeout_s=request_timeout_s, requests_max=requests_max,
        metadata_max_age_s=metadata_max_age_s, tls=tls, tls_ca=tls_ca, tls_cert=tls_cert,
        tls_key=tls_key, nats_options=nats_options, user=user, password=password,
        token=token, credentials=credentials))
