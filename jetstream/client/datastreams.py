"""Datastream management from the client: create, list, describe, pause, resume, delete,
diagnostics (the socket API's DATASTREAMS, answered by any broker)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from jetstream.client.routing import Router
from jetstream.protocol import messages as m


class DatastreamAdmin:
    _router: Router

    async def _datastreams(self, action: str, name: str = "",
                           body: Mapping[str, Any] | None = None) -> dict[str, Any]:
        request = m.DatastreamRequest(action, name, dict(body or {}))
        return (await self._router.admin(request, m.DatastreamResponse)).result

    async def create_datastream(self, name: str, source: Mapping[str, Any],
                                destination: Mapping[str, Any], **options: Any
                                ) -> dict[str, Any]:
        """Create a datastream (a no-op when it exists with the same definition): `source`
        and `destination` are `{"type": ..., "settings": {...}}`; `options` are max_tasks,
        batch_records_max, in_flight_max, partition_mapping, labels. Answers its description
        (`created`: False when it existed). Raises InvalidDatastreamConfig, UnknownConnector,
        DatastreamExists."""
        return await self._datastreams("create", body={
            "name": name, "source": dict(source), "destination": dict(destination), **options})

    async def list_datastreams(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = (await self._datastreams("list"))["datastreams"]
        return found

    async def describe_datastream(self, name: str) -> dict[str, Any]:
        """Definition, status, paused partitions and tasks. Raises UnknownDatastream."""
        return await self._datastreams("get", name)

    async def update_datastream(self, name: str, changes: Mapping[str, Any] | None = None,
                                **options: Any) -> dict[str, Any]:
        """Change a datastream: `options` (or `changes`) may set max_tasks,
        batch_records_max, in_flight_max, labels, and `source`/`destination` as
        `{"settings": {...}}` merged into the current settings (None removes one). Its tasks
        restart with the new definition. Answers its description. Raises
        InvalidDatastreamConfig (also for a fixed field: name, types, partition_mapping,
        the `stream`/`selector`/`path` settings), UnknownDatastream, UnknownConnector."""
        return await self._datastreams("update", name, {**(changes or {}), **options})

    async def batch_get_datastreams(self, names: Sequence[str]) -> dict[str, Any]:
        """`{"datastreams": [descriptions], "errors": {name: {code, message}}}`: an unknown
        name is reported in `errors`, the others are described."""
        return await self._datastreams("batch_get", body={"names": list(names)})

    async def batch_update_datastreams(self, updates: Sequence[Mapping[str, Any]]
                                       ) -> list[dict[str, Any]]:
        """Apply every update (`{name, ...changes}` as `update_datastream` takes) or none:
        all are checked, then committed as one metadata command. Answers the descriptions."""
        found: list[dict[str, Any]] = (await self._datastreams(
            "batch_update", body={"datastreams": [dict(u) for u in updates]}))["datastreams"]
        return found

    async def pause_datastream(self, name: str,
                               partitions: Sequence[int] | None = None) -> dict[str, Any]:
        """Pause the whole datastream, or only these source partitions."""
        body = {} if partitions is None else {"partitions": list(partitions)}
        return await self._datastreams("pause", name, body)

    async def resume_datastream(self, name: str,
                                partitions: Sequence[int] | None = None) -> dict[str, Any]:
        body = {} if partitions is None else {"partitions": list(partitions)}
        return await self._datastreams("resume", name, body)

    async def delete_datastream(self, name: str) -> None:
        """Delete a datastream: its tasks stop (its checkpoints stay in `__offsets` under
        the group `__datastream_<name>`). Raises UnknownDatastream."""
        await self._datastreams("delete", name)

    async def datastream_diagnostics(self, name: str) -> dict[str, Any]:
        """Per task and source partition: status, positions, lag, records in and out,
        gathered from every broker running a task."""
        return await self._datastreams("diagnostics", name)
