"""The datastream service of one broker: management, diagnostics and health.

Theory of operation: the socket API's DATASTREAMS requests land here (any broker answers).
Changes are checked (definition, connector settings: jetstream.datastreams.registry) and
proposed to the metadata; reads answer from this broker's copy of it. Diagnostics gather the
task views of every broker that runs a task of the datastream (this one directly, the others
with a `tasks` request), so an operator asks one broker. The coordinator (on the metadata
leader) and the runner (tasks here) start and stop with the service.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from typing import Any

from jetstream.datastreams import registry
from jetstream.datastreams.commands import (
    CreateDatastream,
    DatastreamCreated,
    DeleteDatastream,
    PauseDatastream,
    UpdateDatastreams,
)
from jetstream.datastreams.connector import Endpoints
from jetstream.datastreams.coordinator import Coordinator
from jetstream.datastreams.model import (
    DatastreamConfig,
    DatastreamState,
    TaskStatus,
    check_name,
    check_partitions,
)
from jetstream.datastreams.runner import Runner
from jetstream.datastreams.selector import is_selector
from jetstream.datastreams.updates import batch_names, batch_updates, merged
from jetstream.errors import JetstreamError, UnknownDatastream
from jetstream.protocol import messages as m
from jetstream.raft_meta.fsm import MetadataState

log = logging.getLogger(__name__)

DIAGNOSTICS_TIMEOUT_S = 5.0


class DatastreamService:
    def __init__(self, broker_id: int, metadata: Any, live: Callable[[], tuple[int, ...]],
                 address_of: Callable[[int], str | None], own_address: Callable[[], str],
                 tls: ssl.SSLContext | None = None) -> None:
        self.broker_id = broker_id
        self._metadata = metadata
        self._address_of = address_of
        self._own_address = own_address
        self._tls = tls
        self.runner = Runner(broker_id, self._state, metadata.propose, self._endpoints)
        self.coordinator = Coordinator(self._state, lambda: bool(metadata.is_leader), live,
                                       metadata.propose, self._endpoints)
        metadata.add_listener(self._applied)

    def _applied(self, _command: object, _result: object) -> None:
        self.coordinator.wake()
        self.runner.wake()

    def _state(self) -> MetadataState:
        state: MetadataState = self._metadata.state
        return state

    def _endpoints(self) -> Endpoints:
        return Endpoints(self._own_address())

    def start(self) -> None:
        self.coordinator.start()
        self.runner.start()

    async def stop(self, *, hand_off: bool = False) -> None:
        """Stop; with `hand_off` (a broker stopping alone) first hand the tasks it runs to
        other live brokers (Runner.hand_off)."""
        if hand_off:
            try:
                await self.runner.hand_off()
            except JetstreamError as exc:  # no metadata: they move once this broker is gone
                log.warning("datastream tasks not handed off: %s", exc)
        await self.coordinator.stop()
        await self.runner.stop()

    # -- the socket API's handler ---------------------------------------------------------------

    async def handle(self, request: m.DatastreamRequest) -> m.DatastreamResponse:
        action = request.action
        if action == "create":
            return m.DatastreamResponse(await self.create(request.body))
        if action == "list":
            return m.DatastreamResponse({"datastreams": [
                self.describe(d) for _, d in sorted(self._state().datastreams.items())]})
        if action == "tasks":
            return m.DatastreamResponse({"tasks": self.runner.describe(request.name or None)})
        if action == "batch_get":
            return m.DatastreamResponse(self.batch_get(batch_names(request.body)))
        if action == "batch_update":
            return m.DatastreamResponse({"datastreams": await self.update(
                [(u["name"], u) for u in batch_updates(request.body)])})
        name = check_name(request.name)
        if action == "get":
            return m.DatastreamResponse(self.describe(self._get(name)))
        if action == "delete":
            await self._metadata.propose(DeleteDatastream(name))
            return m.DatastreamResponse({"name": name, "deleted": True})
        if action in ("pause", "resume"):
            partitions = check_partitions(request.body.get("partitions"))
            self._get(name)
            state = await self._metadata.propose(
                PauseDatastream(name, action == "pause", partitions))
            return m.DatastreamResponse(self.describe(state))
        if action == "update":
            [updated] = await self.update([(name, request.body)])
            return m.DatastreamResponse(updated)
        assert action == "diagnostics", action
        return m.DatastreamResponse(await self.diagnostics(name))

    async def create(self, body: dict[str, Any]) -> dict[str, Any]:
        config = DatastreamConfig.from_dict(body)
        registry.check(config)
        created: DatastreamCreated = await self._metadata.propose(CreateDatastream(config))
        return {**self.describe(created.state), "created": not created.existed}

    async def update(self, updates: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
        """Apply every update (name, changes) or none: each is merged into its current
        definition and checked (fixed fields, connector settings) before one command is
        proposed."""
        configs = []
        for name, changes in updates:
            config = merged(self._get(name).config, changes)
            registry.check(config)
            configs.append(config)
        states = await self._metadata.propose(UpdateDatastreams(tuple(configs)))
        return [self.describe(state) for state in states]

    def batch_get(self, names: list[str]) -> dict[str, Any]:
        """The named datastreams' descriptions; an unknown name is reported in `errors`
        (name -> {code, message}) instead of failing the others."""
        found, errors = [], {}
        for name in names:
            state = self._state().datastreams.get(name)
            if state is None:
                error = UnknownDatastream(name)
                errors[name] = {"code": error.code, "message": str(error)}
            else:
                found.append(self.describe(state))
        return {"datastreams": found, "errors": errors}

    def _get(self, name: str) -> DatastreamState:
        state = self._state().datastreams.get(name)
        if state is None:
            raise UnknownDatastream(name)
        return state

    def describe(self, state: DatastreamState) -> dict[str, Any]:
        return {**state.config.shown(), "status": _status(state),
                "paused": state.paused, "paused_partitions": list(state.paused_partitions),
                "source_partitions": state.source_partitions,
                **({"source_streams": [list(s) for s in state.source_streams]}
                   if is_selector(state.config) else {}),
                "tasks": [{**t.to_dict(), "status": TaskStatus.UNASSIGNED.value}
                          if t.broker is None else t.to_dict() for t in state.tasks]}

    # -- diagnostics and health -----------------------------------------------------------------

    async def diagnostics(self, name: str) -> dict[str, Any]:
        """Every task of the datastream as the broker running it sees it: status, per source
        partition the position, the source's end, lag, records in and out."""
        state = self._get(name)
        brokers = sorted({t.broker for t in state.tasks if t.broker is not None})
        views = await asyncio.gather(*(self._tasks_of(b, name) for b in brokers))
        running = {(v["task"], v["epoch"]): v for found in views for v in found}
        tasks = []
        for t in state.tasks:
            view = running.get((t.task, t.epoch))
            if view is None:
                status = TaskStatus.UNASSIGNED.value if t.broker is None else "starting"
                view = {"datastream": name, "task": t.task, "epoch": t.epoch,
                        "partitions": list(t.partitions), "status": status,
                        "partitions_progress": []}
            tasks.append({**view, "broker_id": t.broker})
        lag = sum(max(p["lag_records"], 0) for v in tasks for p in v["partitions_progress"])
        return {"name": name, "status": _status(state), "lag_records": lag, "tasks": tasks}

    async def _tasks_of(self, broker: int, name: str) -> list[dict[str, Any]]:
        if broker == self.broker_id:
            return self.runner.describe(name)
        address = self._address_of(broker)
        if address is None:
            return []
        from jetstream.client.connection import BrokerConnection

        conn = BrokerConnection(address, client_id=f"broker-{self.broker_id}-diagnostics",
                                connect_timeout_s=DIAGNOSTICS_TIMEOUT_S,
                                request_timeout_s=DIAGNOSTICS_TIMEOUT_S, tls=self._tls)
        try:
            await conn.open()
            answer = await conn.request(m.DatastreamRequest("tasks", name))
            assert isinstance(answer, m.DatastreamResponse)
            tasks: list[dict[str, Any]] = answer.result.get("tasks", [])
            return tasks
        except (JetstreamError, OSError):
            return []
        finally:
            await conn.close()

    def health(self) -> dict[str, Any]:
        """For /health: the connectors this broker has and the tasks it runs."""
        return {"connectors": {"sources": sorted(registry.SOURCES),
                               "destinations": sorted(registry.DESTINATIONS)},
                "tasks": self.runner.describe()}

    def render_metrics(self) -> list[str]:
        return self.runner.render_metrics() + self.coordinator.render_metrics()


def _status(state: DatastreamState) -> str:
    if state.paused:
        return TaskStatus.PAUSED.value
    if not state.tasks or any(t.broker is None for t in state.tasks):
        return TaskStatus.UNASSIGNED.value
    return TaskStatus.RUNNING.value
