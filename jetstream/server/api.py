"""What the broker's APIs may ask of the broker: one dispatch table and one narrow interface.

Theory of operation: the socket API (jetstream.server.socket_api) and the HTTP API
(jetstream.server.http_api) are transports; they know nothing of the broker module. The
broker wires them at start-up:
- The socket API gets a `Dispatcher`: a table from request type to the handler that answers
  it, `{m.FetchRequest: reads.fetch, m.CreateStreamRequest: admin.create_stream, ...}`. Each
  handler lives in the module of its concern (reads, stream admin, cluster); adding an
  operation is a handler in its module plus one line in the broker's table. A request type
  without a handler is answered BAD_REQUEST (an operation this broker does not serve).
- The HTTP API gets an object that satisfies `HttpServices`: exactly the calls its routes
  make, typed; the broker's stream admin (jetstream.server.admin) is that object.
A handler answers a Response, or for a Fetch (and a REPLICA_RANGE) the response and the slice
of the segment file its records are sent from (`FetchResult`), which the socket API sends
with sendfile; a REPLICA_FETCH answers a list of slices, sent one after another.

A request type may also have an immediate handler (`at_once`): a plain function that answers
when it can without waiting and says None when the request must wait (a GET for an offset
the key index does not cover yet), which the async handler then serves. The socket API calls
it as it reads the frame, so the usual answer costs no task.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol, TypeAlias, TypeVar, cast

from jetstream.errors import ProtocolError
from jetstream.protocol import messages as m
from jetstream.raft_meta.model import StreamConfig
from jetstream.server.partition import PartitionLeader
from jetstream.stream.file_slice import FileSlice

#: A Fetch's answer: the response, and the batches it carries as a slice of a segment file.
FetchResult: TypeAlias = tuple[m.FetchResponse, FileSlice]
#: Any answer with a payload of batches (a Fetch's, a REPLICA_RANGE's).
PayloadResult: TypeAlias = tuple[m.Response, FileSlice]
#: An answer whose payload is several slices one after another (REPLICA_FETCH).
SlicesResult: TypeAlias = tuple[m.Response, list[FileSlice]]
Result: TypeAlias = m.Response | FetchResult | PayloadResult | SlicesResult
Handler: TypeAlias = Callable[[m.Request], Awaitable[Result]]
#: Answers at once, or None when the request must wait for the async handler.
ImmediateHandler: TypeAlias = Callable[[m.Request], Result | None]

R = TypeVar("R", bound=m.Request)


def on(kind: type[R], handler: Callable[[R], Awaitable[Result]]
       ) -> tuple[type[m.Request], Handler]:
    """One entry of a dispatch table: `handler` answers requests of type `kind`."""
    # The cast is sound: Dispatcher looks a handler up by the exact type of the request, so
    # `handler` is only ever called with an instance of `kind`.
    return kind, cast(Handler, handler)


def at_once(kind: type[R], handler: Callable[[R], Result | None]
            ) -> tuple[type[m.Request], ImmediateHandler]:
    """One entry of an immediate table: `handler` answers requests of type `kind` that need
    no wait, and returns None for those the async handler must serve."""
    return kind, cast(ImmediateHandler, handler)  # sound as in `on`


class Dispatcher:
    """Answers each request with the handler registered for its exact type (and, for the
    types of `immediate`, first with its immediate handler)."""

    def __init__(self, table: Mapping[type[m.Request], Handler],
                 immediate: Mapping[type[m.Request], ImmediateHandler] | None = None) -> None:
        self._table = dict(table)
        self._immediate = dict(immediate or {})
        unserved = set(self._immediate) - set(self._table)
        if unserved:
            raise ValueError(f"immediate handlers without an async one: {unserved}")

    @property
    def kinds(self) -> frozenset[type[m.Request]]:
        return frozenset(self._table)

    @property
    def immediate_kinds(self) -> frozenset[type[m.Request]]:
        return frozenset(self._immediate)

    def handle_now(self, request: m.Request) -> Result | None:
        """The answer to `request` when it needs no wait; None when `handle` must serve it
        (no immediate handler, or one that would have to wait)."""
        handler = self._immediate.get(type(request))
        return None if handler is None else handler(request)

    async def handle(self, request: m.Request) -> Result:
        handler = self._table.get(type(request))
        if handler is None:
            raise ProtocolError(f"{type(request).__name__} is not served by this broker "
                                "version", field="op")
        return await handler(request)


class RequestHandler(Protocol):
    """What the socket API calls for each decoded request: `handle_now` first for the types
    of `immediate_kinds`, `handle` for the rest and for those it returns None for."""

    @property
    def immediate_kinds(self) -> frozenset[type[m.Request]]: ...

    def handle_now(self, request: m.Request) -> Result | None: ...

    async def handle(self, request: m.Request) -> Result: ...


class HttpServices(Protocol):
    """Everything the HTTP API's routes call. JSON documents are `dict[str, Any]`."""

    @property
    def broker_id(self) -> int: ...

    def health(self) -> dict[str, Any]:
        """This broker's id, status and stream count."""
        ...

    def render_metrics(self, high_watermarks: Mapping[tuple[str, int], int]) -> str:
        """The Prometheus text of the broker's, its led partitions' and its consumer groups'
        counters (`high_watermarks`: of the groups' partitions, for their lag)."""
        ...

    def group_partitions(self) -> list[tuple[str, int]]:
        """The partitions the groups this broker coordinates have committed offsets of."""
        ...

    def high_watermarks(self) -> dict[tuple[str, int], int]:
        """The high watermark of each partition this broker leads."""
        ...

    def cluster_view(self) -> dict[str, Any]:
        """Brokers, the metadata leader, every stream and this broker's roles."""
        ...

    def describe_streams(self, names: list[str] | None = None, *,
                         internal: bool = False) -> list[dict[str, Any]]:
        """The named streams, or all (the internal `__*` ones only with `internal`)."""
        ...

    def describe_stream(self, name: str) -> dict[str, Any]: ...

    def stream_config(self, fields: Mapping[str, Any]) -> StreamConfig:
        """A create request's config, with the cluster's defaults filled in."""
        ...

    async def create_stream(self, config: StreamConfig) -> bool:
        """Create the stream; False when an identical one existed."""
        ...

    async def delete_stream(self, name: str) -> None: ...

    async def update_stream(self, name: str, changes: Mapping[str, Any]) -> StreamConfig:
        """Change settings of a stream; the new config."""
        ...

    async def get_key(self, request: m.GetRequest) -> m.GetResponse:
        """A key's newest committed record in a compacted stream."""
        ...

    async def list_keys(self, request: m.KeysRequest) -> m.KeysResponse:
        """Live keys of a compacted stream's partition."""
        ...

    async def on_fragments(self, request: m.FragmentsRequest) -> m.FragmentsResponse:
        """A partition's fragments and extents (a prune first, if asked) at its leader."""
        ...

    async def on_registers(self, request: m.RegistersRequest) -> m.RegistersResponse:
        """A partition's registers at its leader."""
        ...

    def leader_for(self, stream: str, partition: int) -> PartitionLeader:
        """This broker's leader of the partition, else UnknownStream, UnknownPartition or
        NotLeader."""
        ...
