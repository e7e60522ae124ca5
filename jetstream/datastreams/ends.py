"""A task's readers and writers: what each of its partitions reads from and writes to.

Theory of operation: a task of a single-stream source opens one reader and one writer for
all of its partitions. A task of a label-selector source (jetstream.datastreams.selector)
owns (stream, partition) pairs of several streams: it opens a reader and a writer per source
stream, each from the definition as it applies to that stream (`{stream}` in the
destination's settings replaced), and each partition of the task reads and writes through its
stream's pair with its partition number at the source. A mirror's task
(jetstream.datastreams.batch_copy) opens an undecoded batch reader and a batch writer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from jetstream.datastreams import registry
from jetstream.datastreams.batch_copy import BatchReader, BatchWriter, is_mirror, mirror_name
from jetstream.datastreams.connector import (
    DestinationWriter,
    Endpoints,
    SourceReader,
    WriterContext,
)
from jetstream.datastreams.jetstream_stream import JetstreamDestination, JetstreamSource
from jetstream.datastreams.model import DatastreamConfig, DatastreamState
from jetstream.datastreams.selector import config_for, is_selector, resolve


@dataclass(frozen=True, slots=True)
class PartitionEnds:
    """Where one of a task's partitions reads and writes, and its number at the source."""

    reader: SourceReader
    writer: DestinationWriter
    source_partition: int
    #: The writer of a mirror (its reads are undecoded batches); None: records are copied.
    copier: BatchWriter | None = None


Closer = Any  # a reader or writer: something with `async close()`


async def open_ends(state: DatastreamState, partitions: Sequence[int], epoch: int,
                    endpoints: Endpoints, client_id: str, opened: list[Closer]
                    ) -> dict[int, PartitionEnds]:
    """Readers and writers for a task's partitions: one pair for a single-stream source, one
    per source stream for a selector. Everything opened is appended to `opened` (the caller
    closes it, also when this fails half way)."""
    config = state.config
    by_stream: dict[str, list[tuple[int, int]]] = {}
    for p in partitions:
        stream, source_partition = resolve(state.source_streams, p) if is_selector(config) \
            else (str(config.source.settings.get("stream", "")), p)
        by_stream.setdefault(stream, []).append((p, source_partition))
    ends: dict[int, PartitionEnds] = {}
    context = WriterContext(config.name, epoch, "", config.partition_mapping.value,
                            config.in_flight_max)
    if is_mirror(config):
        return await _open_mirror(config, partitions, context, endpoints, client_id, opened)
    for stream, pairs in by_stream.items():
        applied = config_for(config, stream) if is_selector(config) else config
        reader = await registry.source(applied.source.type).open(
            applied.source.settings, endpoints, client_id)
        opened.append(reader)
        context = replace(context, source_name=stream)
        writer = await registry.destination(applied.destination.type).open(
            applied.destination.settings, endpoints, context, client_id)
        opened.append(writer)
        ends.update({p: PartitionEnds(reader, writer, sp) for p, sp in pairs})
    return ends


async def _open_mirror(config: DatastreamConfig, partitions: Sequence[int],
                       context: WriterContext, endpoints: Endpoints, client_id: str,
                       opened: list[Closer]) -> dict[int, PartitionEnds]:
    """One undecoded reader and one batch writer for a mirror's task (batch_copy)."""
    source = config.source.settings
    stream_reader = await JetstreamSource().open(source, endpoints, client_id)
    opened.append(stream_reader)
    reader = BatchReader(stream_reader, stream_reader.client, stream_reader.stream)
    writer = await JetstreamDestination().open_mirror(
        config.destination.settings, endpoints, replace(context, source_name=source["stream"]),
        client_id, mirror_name(source))
    opened.append(writer)
    return {p: PartitionEnds(reader, writer, p, writer) for p in partitions}
