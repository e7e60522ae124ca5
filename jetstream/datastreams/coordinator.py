"""The datastream coordinator: on the metadata leader, keep every datastream's tasks planned.

Theory of operation (Brooklin's leader coordinator): every TICK_S, and as soon as a metadata
change is applied (`wake`: a datastream created or changed is planned at once; changes that
come together are planned together, at most one pass per WAKE_S), the broker that leads
the metadata learns each datastream's source partition count (asked of the source through its
connector at most every PARTITIONS_REFRESH_S, remembered between asks), takes the live
brokers (this one and those whose metadata Raft connection is up, as failover does), plans
with the pure planner (jetstream.datastreams.planner) and proposes `AssignTasks` for each
datastream whose plan differs from its tasks. The proposal is compare-and-set on the
datastream's generation, so a plan made on stale state is refused and made again next tick.
A broker that dies drops out of the live set and its tasks move at the next tick, and so do
those of a broker that stops (it marks itself draining in the metadata first: `DrainTasks`,
jetstream.datastreams.runner); a source
that grows partitions gets them split into tasks at the next ask. A source that cannot be
asked keeps its last known count. A label-selector source is asked for its matching streams
instead (jetstream.datastreams.selector): its layout is committed with the plan.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from jetstream.datastreams import registry, selector
from jetstream.datastreams.commands import AssignTasks
from jetstream.datastreams.connector import Endpoints, SourceReader
from jetstream.datastreams.model import DatastreamState, Endpoint
from jetstream.datastreams.planner import PlanInput, changed, plan
from jetstream.datastreams.security import scrub, secret_values
from jetstream.errors import JetstreamError
from jetstream.raft_meta.fsm import MetadataState
from jetstream.tasks import cancel_and_wait, wait_event

log = logging.getLogger(__name__)

TICK_S = 0.25
#: How often the coordinator looks whether the metadata changed (a new or changed datastream
#: is planned then, not at the next tick).
WAKE_S = 0.02
PARTITIONS_REFRESH_S = 5.0
ASK_TIMEOUT_S = 5.0


class Coordinator:
    def __init__(self, state: Callable[[], MetadataState], is_leader: Callable[[], bool],
                 live: Callable[[], tuple[int, ...]], propose: Callable[[Any], Any],
                 endpoints: Callable[[], Endpoints]) -> None:
        self._state = state
        self._is_leader = is_leader
        self._live = live
        self._propose = propose
        self._endpoints = endpoints
        #: Per datastream (name, created version): source partitions (and a selector's layout)
        #: and when they were asked.
        self._partitions: dict[tuple[str, int], tuple[int, selector.Layout, float]] = {}
        self._readers: dict[tuple[str, int], SourceReader | selector.Lister] = {}
        #: The source each reader was opened for (an update may rotate its settings).
        self._opened_for: dict[tuple[str, int], Endpoint] = {}
        self._loop: asyncio.Task[None] | None = None
        self._woken = asyncio.Event()
        self.proposals = 0
        #: Per datastream: committed assignments that changed its tasks (the first included).
        self.rebalances: dict[str, int] = {}

    def start(self) -> None:
        self._loop = asyncio.get_running_loop().create_task(self._run(), name="datastreams")

    async def stop(self) -> None:
        await cancel_and_wait(self._loop)
        await self._close_readers(set(self._readers))

    def wake(self) -> None:
        """A metadata command was applied: plan again now."""
        self._woken.set()

    async def _run(self) -> None:
        while True:
            await wait_event(self._woken, TICK_S)
            if self._woken.is_set():
                await asyncio.sleep(WAKE_S)  # what else comes with it joins this pass
                self._woken.clear()
            if not self._is_leader():
                await self._close_readers(set(self._readers))
                continue
            try:
                await self.tick()
            except Exception:
                log.exception("datastream coordinator tick failed")

    async def tick(self) -> None:
        datastreams = list(self._state().datastreams.values())
        keys = {(d.name, d.created_version) for d in datastreams}
        await self._close_readers(set(self._readers) - keys)
        inputs, layouts = [], []
        for ds in datastreams:
            count, layout = await self._source_partitions(ds)
            inputs.append(PlanInput(ds.name, count, ds.config.max_tasks, ds.tasks))
            layouts.append(layout)
        draining = self._state().datastream_draining
        planned = plan(inputs, tuple(b for b in self._live() if b not in draining))
        for ds, wanted, layout in zip(datastreams, inputs, layouts, strict=True):
            tasks = planned[ds.name]
            if wanted.source_partitions == ds.source_partitions and not changed(ds.tasks, tasks) \
                    and layout == ds.source_streams:
                continue
            log.info("datastream %s: %d source partitions, tasks on brokers %s", ds.name,
                     wanted.source_partitions, [t.broker for t in tasks])
            self.proposals += 1
            try:
                await self._propose(AssignTasks(ds.name, ds.generation, ds.created_version,
                                                wanted.source_partitions, tasks, layout))
            except JetstreamError as exc:  # stale or unavailable: plan again next tick
                log.info("datastream %s: assignment not committed: %s", ds.name, exc)
                continue
            if changed(ds.tasks, tasks):
                self.rebalances[ds.name] = self.rebalances.get(ds.name, 0) + 1

    async def _source_partitions(self, ds: DatastreamState) -> tuple[int, selector.Layout]:
        key = (ds.name, ds.created_version)
        known = self._partitions.get(key)
        now = time.monotonic()
        if known is not None and now - known[2] < PARTITIONS_REFRESH_S:
            return known[0], known[1]
        count, layout = (known[0], known[1]) if known is not None \
            else (ds.source_partitions, ds.source_streams)
        if self._opened_for.get(key, ds.config.source) != ds.config.source:
            await self._close_readers({key})  # updated settings: ask the source anew
        try:
            reader = self._readers.get(key)
            if reader is None:
                self._opened_for[key] = ds.config.source
                reader = self._readers[key] = await asyncio.wait_for(
                    self._open(ds), ASK_TIMEOUT_S)
            if isinstance(reader, selector.Lister):
                layout = await asyncio.wait_for(reader.layout(), ASK_TIMEOUT_S)
                count = sum(partitions for _, partitions in layout)
            else:
                count = await asyncio.wait_for(reader.partitions(), ASK_TIMEOUT_S)
        except (JetstreamError, OSError, TimeoutError) as exc:
            log.warning("datastream %s: source partitions unknown (%s); keeping %d", ds.name,
                        scrub(str(exc), secret_values(ds.config.source.settings)), count)
            await self._close_readers({key})
        self._partitions[key] = (count, layout, now)
        return count, layout

    async def _open(self, ds: DatastreamState) -> SourceReader | selector.Lister:
        client_id = f"datastream-coordinator-{ds.name}"
        if selector.is_selector(ds.config):
            return await selector.open_lister(ds.config, self._endpoints(), client_id)
        return await registry.source(ds.config.source.type).open(
            ds.config.source.settings, self._endpoints(), client_id)

    def render_metrics(self) -> list[str]:
        """Prometheus lines of this broker's time as the coordinator."""
        lines = [("# HELP jetstream_datastream_rebalances_total Task assignments the "
                  "coordinator changed (tasks moved, split or added), counted on the metadata "
                  "leader that made them."),
                 "# TYPE jetstream_datastream_rebalances_total counter"]
        lines += [f'jetstream_datastream_rebalances_total{{datastream="{name}"}} {count}'
                  for name, count in sorted(self.rebalances.items())]
        return lines

    async def _close_readers(self, keys: set[tuple[str, int]]) -> None:
        for key in keys:
            reader = self._readers.pop(key, None)
            self._opened_for.pop(key, None)
            self._partitions.pop(key, None)
            if reader is not None:
                with contextlib.suppress(Exception):
                    await reader.close()
