"""Consumer groups over HTTP, and the high watermarks behind the group lag metrics.

Theory of operation: a group's requests belong to its coordinator, which may be another
broker, and its lag needs the high watermarks of partitions other brokers lead. So these
routes, like the command line, go through a client (jetstream.client) — this broker's own,
connected to its own socket API on first use (`BrokerClient`), which finds coordinators and
leaders and retries as any client does. Whichever broker a request reaches, the answer is
the same.

    GET    /groups                         every group (state, members, coordinator)
    GET    /groups/{group}                 state, members, offsets with HW and lag
    GET    /groups/{group}/offsets         committed offsets
    POST   /groups/{group}/offsets         commit {"offsets": [{stream, partition, offset,
                                           metadata?}]} (a consumer that manages its
                                           partitions itself; refused while the group has
                                           members)
    POST   /groups/{group}/offsets/reset   {"stream", "to": earliest|latest|offset|timestamp,
                                           "offset"?, "timestamp_ms"?, "partitions"?}
    DELETE /groups/{group}/offsets         delete the group's offsets
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from fastapi import Body, FastAPI

from jetstream.errors import JetstreamError, ProtocolError
from jetstream.protocol import messages as m

if TYPE_CHECKING:
    from jetstream.client import Client

#: How long a partition's high watermark is reused for the lag metrics, and the most
#: partitions whose high watermarks one scrape looks up.
HW_CACHE_S = 5.0
HW_LOOKUPS_MAX = 10_000


class BrokerClient:
    """This broker's client of its own socket API, opened on first use."""

    def __init__(self, address: Callable[[], str], tls: ssl.SSLContext | None = None,
                 credentials: m.Credentials | None = None) -> None:
        self._address = address
        self._tls = tls
        #: The broker principal's (the HTTP API checked the caller's ACLs already).
        self._credentials = credentials
        self._client: Client | None = None
        self._lock = asyncio.Lock()
        self._hws: dict[tuple[str, int], tuple[float, int]] = {}

    async def client(self) -> Client:
        async with self._lock:
            if self._client is None:
                from jetstream.client import connect

                self._client = await connect(self._address(), client_id="jetstream-broker-http",
                                             tls=self._tls, credentials=self._credentials
                                             ).start()
            return self._client

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def high_watermarks(self, partitions: Iterable[tuple[str, int]],
                              local: Mapping[tuple[str, int], int]
                              ) -> dict[tuple[str, int], int]:
        """The high watermark of each partition: this broker's own where it leads it, else
        asked of the leader (cached HW_CACHE_S; partitions that cannot be asked are left
        out)."""
        now = time.monotonic()
        out: dict[tuple[str, int], int] = {}
        remote = []
        for key in partitions:
            if key in local:
                out[key] = local[key]
            elif (cached := self._hws.get(key)) is not None and now - cached[0] < HW_CACHE_S:
                out[key] = cached[1]
            else:
                remote.append(key)
        if remote:
            client = await self.client()
            for stream, partition in remote[:HW_LOOKUPS_MAX]:
                try:
                    hw = await client.offset_for_timestamp(stream, partition,
                                                           m.LATEST_TIMESTAMP)
                except JetstreamError:
                    continue
                out[(stream, partition)] = hw
                self._hws[(stream, partition)] = (now, hw)
        return out


def _entries(body: Mapping[str, Any]) -> dict[tuple[str, int], int]:
    items = body.get("offsets")
    if not isinstance(items, list) or not items:
        raise ProtocolError("offsets must be a non-empty list", field="offsets")
    out = {}
    for i, item in enumerate(items):
        if not isinstance(item, dict) or not isinstance(item.get("stream"), str) \
                or not isinstance(item.get("partition"), int) \
                or not isinstance(item.get("offset"), int):
            raise ProtocolError("each offset is {stream, partition, offset}",
                                field=f"offsets[{i}]")
        out[(item["stream"], item["partition"])] = item["offset"]
    return out


def add_group_routes(app: FastAPI, broker_client: BrokerClient,
                     errors: Callable[..., dict[int | str, dict[str, Any]]]) -> None:
    """The routes of the module docstring; `errors(*statuses)` declares their error
    answers (jetstream.server.http_api)."""

    @app.get("/groups", responses=errors())
    async def list_groups() -> dict[str, Any]:
        js = await broker_client.client()
        return {"groups": [asdict(g) for g in await js.list_groups()]}

    @app.get("/groups/{group}", responses=errors(400, 503))
    async def describe_group(group: str) -> dict[str, Any]:
        js = await broker_client.client()
        return await js.describe_group(group)

    @app.get("/groups/{group}/offsets", responses=errors(400, 503))
    async def fetch_offsets(group: str) -> dict[str, Any]:
        js = await broker_client.client()
        found = await js.fetch_offsets(group)
        return {"group": group, "offsets": [asdict(v) for _k, v in sorted(found.items())]}

    @app.post("/groups/{group}/offsets", responses=errors(400, 404, 409, 503))
    async def commit_offsets(group: str,
                             body: dict[str, Any] = Body(...)) -> dict[str, Any]:  # noqa: B008
        js = await broker_client.client()
        metadata = body.get("metadata", "")
        if not isinstance(metadata, str):
            raise ProtocolError("metadata must be a string", field="metadata")
        failed = await js.commit_offsets(group, _entries(body), metadata=metadata)
        if failed:
            raise next(iter(failed.values()))
        return {"group": group, "committed": len(body["offsets"])}

    @app.post("/groups/{group}/offsets/reset", responses=errors(400, 404, 409, 503))
    async def reset_offsets(group: str,
                            body: dict[str, Any] = Body(...)) -> dict[str, Any]:  # noqa: B008
        stream, to = body.get("stream"), body.get("to")
        if not isinstance(stream, str):
            raise ProtocolError("stream must be a stream name", field="stream")
        if to not in m.RESET_TARGETS:
            raise ProtocolError(f"to must be one of {list(m.RESET_TARGETS)}", field="to")
        js = await broker_client.client()
        try:
            moved = await js.reset_offsets(group, stream, to=to, offset=body.get("offset"),
                                           timestamp_ms=body.get("timestamp_ms"),
                                           partitions=body.get("partitions"))
        except ValueError as exc:
            raise ProtocolError(str(exc), field="to") from None
        return {"group": group, "stream": stream,
                "offsets": {str(p): o for p, o in sorted(moved.items())}}

    @app.delete("/groups/{group}/offsets", responses=errors(400, 409, 503))
    async def delete_offsets(group: str) -> dict[str, Any]:
        js = await broker_client.client()
        return {"group": group, "deleted_offsets": await js.delete_group(group)}
