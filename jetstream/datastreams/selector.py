"""Label-selector sources: one datastream mirrors every stream whose labels match.

Theory of operation: a `jetstream` source may name `selector` (a label selector, the syntax of
`jetstream stream list --selector`) instead of `stream`. The coordinator lists the source
cluster's streams and keeps the matching ones, sorted by name, with their partition counts:
the datastream's **layout** (`DatastreamState.source_streams`), committed with its task
assignment. Its source partitions are the layout's (stream, partition) pairs in that order,
numbered 0..n-1, and split into tasks like any source's partitions, so a task owns pairs of
several streams. A stream created later that matches joins the layout at the coordinator's
next look (every few seconds), a deleted one leaves it; any change of the layout gives every
task of the datastream a new epoch, so they restart on the new one, each pair from its own
checkpoint (kept per source stream and partition, as for a single stream).

Each source stream gets its own destination from the destination's settings, in which
`{stream}` is replaced by the source stream's name (`"stream": "mirror-{stream}"`, a Parquet
`path` of `/lake/{stream}`, a subject `dr.{stream}.{partition}`). The setting that names where
the data goes (`stream`, `path` or `subject`) must contain `{stream}`: two source streams in
one destination would mix their partitions and message ids.

Pure here, except `Lister` (the coordinator's look at the source); a task's readers and
writers per source stream are opened by jetstream.datastreams.ends.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from jetstream.datastreams.connector import Endpoints
from jetstream.datastreams.model import (
    SOURCE_PARTITIONS_MAX,
    DatastreamConfig,
)
from jetstream.errors import InvalidDatastreamConfig, InvalidStreamConfig
from jetstream.protocol.names import Selector, parse_selector

if TYPE_CHECKING:
    from jetstream.client import Client
    from jetstream.client.types import StreamInfo

#: (stream, partition count) of each matching stream, sorted by name.
Layout = tuple[tuple[str, int], ...]
PLACEHOLDER = "{stream}"
#: Destination settings that say where the data goes: with a selector, each has {stream}.
TARGET_SETTINGS = ("stream", "path", "subject")
SELECTOR_SOURCES = ("jetstream",)


def is_selector(config: DatastreamConfig) -> bool:
    return "selector" in config.source.settings


def parsed(config: DatastreamConfig) -> Selector:
    try:
        return parse_selector(config.source.settings["selector"], "source.settings.selector")
    except InvalidStreamConfig as exc:
        raise InvalidDatastreamConfig(str(exc), field="source.settings.selector") from None


def check(config: DatastreamConfig) -> DatastreamConfig:
    """The checks a selector datastream needs besides its connectors' (which
    jetstream.datastreams.registry runs on the returned sample: the definition as it is for
    a stream named `sample`)."""
    source = config.source
    if source.type not in SELECTOR_SOURCES:
        raise InvalidDatastreamConfig(f"only {list(SELECTOR_SOURCES)} sources take a selector",
                                      field="source.settings.selector")
    if "stream" in source.settings:
        raise InvalidDatastreamConfig("a source names a stream or a selector, not both",
                                      field="source.settings.stream")
    parsed(config)
    targets = [k for k in TARGET_SETTINGS if k in config.destination.settings]
    for key in targets:
        if PLACEHOLDER not in str(config.destination.settings[key]):
            raise InvalidDatastreamConfig(
                f"with a selector, destination.settings.{key} must contain {PLACEHOLDER} (each "
                "source stream needs its own destination)", field=f"destination.settings.{key}")
    return config_for(config, "sample")


def config_for(config: DatastreamConfig, stream: str) -> DatastreamConfig:
    """The definition as it applies to one source stream (pure)."""
    settings = {k: v for k, v in config.source.settings.items() if k != "selector"}
    destination = {k: v.replace(PLACEHOLDER, stream) if isinstance(v, str) else v
                   for k, v in config.destination.settings.items()}
    return DatastreamConfig.from_dict({
        **config.to_dict(), "source": {"type": config.source.type,
                                       "settings": {**settings, "stream": stream}},
        "destination": {"type": config.destination.type, "settings": destination}})


def layout_of(streams: Sequence[StreamInfo], selector: Selector) -> Layout:
    """The matching streams (internal ones never), sorted by name, as many as fit in
    SOURCE_PARTITIONS_MAX partitions (the rest are left out) (pure)."""
    layout: list[tuple[str, int]] = []
    total = 0
    for name, count in sorted((s.name, s.partition_count) for s in streams
                              if not s.name.startswith("__") and selector(s.labels)):
        if total + count > SOURCE_PARTITIONS_MAX:
            break
        layout.append((name, count))
        total += count
    return tuple(layout)


def resolve(layout: Layout, partition: int) -> tuple[str, int]:
    """The (stream, partition) of a datastream partition number (pure)."""
    first = 0
    for stream, count in layout:
        if partition < first + count:
            return stream, partition - first
        first += count
    raise IndexError(f"partition {partition} is beyond the layout {layout}")


class Lister:
    """The coordinator's view of a selector source: the matching streams now."""

    def __init__(self, client: Client, selector: Selector) -> None:
        self._js = client
        self._selector = selector

    async def layout(self) -> Layout:
        return layout_of(await self._js.list_streams(), self._selector)

    async def close(self) -> None:
        await self._js.close()


async def open_lister(config: DatastreamConfig, endpoints: Endpoints, client_id: str) -> Lister:
    from jetstream.client import connect

    brokers = config.source.settings.get("brokers") or endpoints.local_brokers
    return Lister(await connect(brokers, client_id=client_id).start(), parsed(config))
