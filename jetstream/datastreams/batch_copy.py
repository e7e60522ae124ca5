"""The `jetstream` transport's `mirror` mode: a stream copied batch by batch into a mirror
stream that keeps the source's offsets (NATS JetStream's `mirror`, Kafka's byte copy).

Theory of operation: with `"mode": "mirror"` in a `jetstream` destination's settings (the
source a `jetstream` stream, the mapping `same`), a task reads each source partition with
undecoded Fetches (`BatchReader`: whole record batches as the source's leader stores them,
below its high watermark, with an empty batch standing for a range the answer skips — a
range compaction emptied, or one retention removed before it was copied; see
jetstream.stream.copying) and hands the bytes to the same partition of the destination with
MIRROR_APPEND (`BatchWriter`, in pieces of at most the destination's request size). The
destination's leader checks every batch's CRC, re-stamps its leader epoch, leaves out what
it holds already and refuses a gap (jetstream.server.mirror_api): no record is decoded,
built or encoded on the way, and the copy is the source's records byte for byte — offsets
(a compacted source's gaps too), timestamps, keys, values, headers and subjects.

Exactly once falls out of the offsets: a copy sent again (a crash between the append and
the checkpoint, a task that moved) finds its batches in the destination and appends
nothing. The task's epoch fences an older owner (MIRROR_FENCED). A task resumes each
partition at its checkpoint, or at the destination's end when that is before it (what a
destination lost in a failover is copied again), so the source's `start` setting does not
apply: a mirror holds its source from the source's log start.

The destination stream must be new or empty, with at least the source's partitions. The
first write of a task makes it a mirror: its `mirror` setting becomes `<cluster>/<stream>`
(`brokers` of the source's settings, or `local`, then the source stream), so it refuses
every other write (STREAM_IS_MIRROR) and says what it mirrors in its description; a stream
that holds records and is not that mirror is refused (MIRROR_MISMATCH, the task is faulty).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from jetstream.datastreams.connector import (
    SourceBatch,
    SourceReader,
    SourceRecord,
    WriterContext,
)
from jetstream.errors import (
    InvalidBatch,
    InvalidDatastreamConfig,
    MirrorMismatch,
    OffsetOutOfRange,
)
from jetstream.stream import format as fmt
from jetstream.stream.copying import CopiedRange, committed_batches, empty_range

if TYPE_CHECKING:
    from jetstream.client import Client
    from jetstream.datastreams.model import DatastreamConfig

MODES = ("records", "mirror")
#: Bytes one undecoded Fetch asks for: what one MIRROR_APPEND to a broker with the default
#: `request_bytes_max` (1 MiB) carries, so a read is one append.
FETCH_BYTES = 960 * 1024
WRITE_TIMEOUT_S = 10.0


def is_mirror(config: DatastreamConfig) -> bool:
    return config.destination.type == "jetstream" and \
        config.destination.settings.get("mode") == "mirror"


def check(config: DatastreamConfig) -> None:
    """INVALID_DATASTREAM_CONFIG for a mirror no task could copy."""
    if not is_mirror(config):
        return
    if config.source.type != "jetstream" or "stream" not in config.source.settings:
        raise InvalidDatastreamConfig("destination.settings.mode mirror copies a `jetstream` "
                                      "source with a `stream`", field="destination.settings.mode")
    if config.partition_mapping.value != "same":
        raise InvalidDatastreamConfig("destination.settings.mode mirror keeps the source's "
                                      "partitions: partition_mapping must be `same`",
                                      field="partition_mapping")


def mirror_name(source_settings: Mapping[str, Any]) -> str:
    """The `mirror` setting of the destination: `<cluster>/<stream>` of the source."""
    return f"{source_settings.get('brokers') or 'local'}/{source_settings['stream']}"


class BatchReader:
    """A `jetstream` source read as undecoded batches through `client`; `reader` (the
    source's StreamReader) keeps the checkpoints."""

    def __init__(self, reader: SourceReader, client: Client, stream: str) -> None:
        self._reader = reader
        self._js = client
        self.stream = stream
        self.fetch_bytes = FETCH_BYTES

    async def partitions(self) -> int:
        return await self._reader.partitions()

    async def checkpoint(self, group: str, partition: int) -> int | None:
        return await self._reader.checkpoint(group, partition)

    async def start_position(self, partition: int) -> int:
        return await self._reader.start_position(partition)

    async def commit(self, group: str, partition: int, position: int) -> None:
        await self._reader.commit(group, partition, position)

    async def close(self) -> None:
        await self._reader.close()

    async def read(self, partition: int, position: int, max_records: int,
                   wait_ms: int) -> SourceBatch:
        """Whole batches from `position` (`max_records` does not apply: a batch is copied
        whole), at most `fetch_bytes` of them unless one batch alone is larger."""
        try:
            response, data = await self._js.fetch_batches(
                self.stream, partition, position, max_bytes=self.fetch_bytes,
                max_wait_ms=wait_ms)
        except OffsetOutOfRange as exc:
            if position < exc.oldest:  # retention removed them: an empty batch holds the range
                return SourceBatch([], exc.oldest, exc.newest,
                                   empty_range(position, exc.oldest, 0))
            raise
        copied = committed_batches(data, position, response.high_watermark)
        if copied is None:
            return SourceBatch([], position, response.high_watermark)
        return SourceBatch([], copied.next_offset, response.high_watermark, copied)


class BatchWriter:
    """Copies undecoded batches into the same partitions of a mirror stream."""

    def __init__(self, client: Client, stream: str, context: WriterContext,
                 source: str) -> None:
        self._js = client
        self.stream = stream
        self._context = context
        self.source = source
        self._checked = False

    async def write(self, records: Sequence[SourceRecord]) -> None:
        if records:
            raise InvalidBatch("a mirror copies whole batches, not records")

    async def write_copied(self, partition: int, copied: CopiedRange) -> None:
        """Append `copied` to `partition` of the mirror, in pieces the destination takes;
        return once every piece is acknowledged (the stream's ack policy)."""
        if not self._checked:
            await self._make_mirror(partition)
            self._checked = True
        limit = await self._js.copy_bytes_max(self.stream, partition)
        for piece in _pieces(copied.data, limit):
            await self._js.append_copied(
                self.stream, partition, piece, source=self.source,
                owner=self._context.datastream, epoch=self._context.epoch,
                timeout_s=WRITE_TIMEOUT_S)

    async def _make_mirror(self, partition: int) -> None:
        info = await self._js.stream_info(self.stream)
        if partition >= info.partition_count:
            raise MirrorMismatch(self.stream, info.mirror or "", self.source,
                                 f"stream {self.stream!r} has {info.partition_count} "
                                 f"partitions: a mirror needs partition {partition}")
        if info.mirror == self.source:
            return
        if info.mirror is None:
            held = [await self._js.partition_status(self.stream, p)
                    for p in range(info.partition_count)]
            if all(not p.log_end_offset for p in held):
                await self._js.update_stream(self.stream, mirror=self.source)
                return
        raise MirrorMismatch(self.stream, info.mirror or "", self.source,
                             f"stream {self.stream!r} is not empty and not a mirror of "
                             f"{self.source!r}" if info.mirror is None else "")

    async def end_offset(self, partition: int) -> int:
        """Where the mirror's partition ends: its log end offset (its offsets are the
        source's)."""
        return (await self._js.partition_status(self.stream, partition)).log_end_offset or 0

    def checkpointable(self, partition: int, position: int) -> int | None:
        return position  # `write_copied` returned: the destination holds all of it

    async def close(self) -> None:
        await self._js.close()


def _pieces(data: bytes, limit: int) -> list[bytes | memoryview]:
    """`data` (whole batches) cut at batch boundaries into pieces of at most `limit` bytes.
    Raises InvalidBatch for a batch larger than `limit` alone."""
    if len(data) <= limit:
        return [data]
    view = memoryview(data)
    pieces: list[bytes | memoryview] = []
    start = end = 0
    for pos, header in fmt.iter_batches(data, verify=False):
        if header.size > limit:
            raise InvalidBatch(f"a source batch of {header.size} bytes at offset "
                               f"{header.base_offset} exceeds the {limit} bytes the "
                               "destination takes in one request (its request_bytes_max)")
        if pos + header.size - start > limit:
            pieces.append(view[start:end])
            start = pos
        end = pos + header.size
    pieces.append(view[start:end])
    return pieces
