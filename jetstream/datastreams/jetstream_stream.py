"""The `jetstream` connector and transport: a Jetstream stream, on this cluster or another.

Source settings: `stream` (required), `brokers` ("host:port,...": another cluster; default
this one), `start` (`earliest`, the default, or `latest`: where a partition without a
checkpoint starts). It reads committed records with Fetch, one partition at a time, and
keeps checkpoints as the committed offsets of the datastream's consumer group
(`__datastream_<name>`) in the **source** cluster's `__offsets`: a checkpoint is the next
offset to read, and it never moves backwards (OFFSET_BEHIND_COMMITTED refuses that), so an
older owner cannot undo a newer one's progress.

Destination settings: `stream` (required), `brokers` (default this cluster), `mode`
(`records`, the default, described here, or `mirror`: a batch-for-batch copy that keeps the
source's offsets, jetstream.datastreams.batch_copy). Both take the
settings that secure the connection to another cluster (jetstream.datastreams.security):
`tls_ca`, `tls_cert`, `tls_key`, and `user` with `password` or a `token` (`user:secret`);
a `tls://` NATS URL the brokers report uses the same TLS context. A destination publishes
through the other cluster's NATS: `nats_user` with `nats_password`, or `nats_token`, are its
credentials there. Each record
keeps its key, value and headers and gains `Jetstream-Source` (`<stream>/<partition>`) and
`Jetstream-Source-Offset`; the headers a leader writes itself (`Nats-Msg-Id`,
`Jetstream-Producer`, `Jetstream-Registers`) are not copied (a source message id is kept as
`Jetstream-Source-Msg-Id`). Exactly once: every record is published with the message id
`<datastream>/<partition>/<offset>`, so a record written again after a crash or a task move
is acknowledged as a duplicate and not stored, within the destination stream's
`duplicate_window_ms`; and as an idempotent producer per source partition
(`ds.<datastream>.<partition>`) whose epoch is the task's epoch, so records are stored in
order with no gaps and a newer owner fences an older one (PRODUCER_FENCED). A batch is one
ordered pipeline of publishes (up to `in_flight_max` unacknowledged); the first error ends
it, and a writer that failed is never used again: the task renews its epoch in the metadata
and opens another, so a producer's sequences never start over within one epoch.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from jetstream.client.publisher import ExpectingItem, Stamp
from jetstream.datastreams.batch_copy import MODES, BatchWriter
from jetstream.datastreams.connector import (
    Endpoints,
    SourceBatch,
    SourceRecord,
    WriterContext,
    check_known,
    setting_str,
)
from jetstream.datastreams.security import (
    NATS_CREDENTIAL_SETTINGS,
    SECURITY_SETTINGS,
    check_nats_credentials,
    check_security,
    credential,
    nats_options,
    tls_context,
)
from jetstream.errors import InvalidDatastreamConfig, InvalidStreamConfig, OffsetOutOfRange
from jetstream.idempotence import headers as h
from jetstream.protocol import names
from jetstream.protocol.names import check_stream_name

if TYPE_CHECKING:
    from jetstream.client import Client
    from jetstream.client.types import StreamInfo

SOURCE_SETTINGS = ("stream", "brokers", "start", *SECURITY_SETTINGS)
DESTINATION_SETTINGS = ("stream", "brokers", "mode", *SECURITY_SETTINGS,
                        *NATS_CREDENTIAL_SETTINGS)
SOURCE_HEADER = "Jetstream-Source"
SOURCE_OFFSET_HEADER = "Jetstream-Source-Offset"
SOURCE_MSG_ID_HEADER = "Jetstream-Source-Msg-Id"
#: Headers a partition leader writes itself: never copied as they are.
LEADER_HEADERS = frozenset({h.MSG_ID, h.PRODUCER, h.REGISTERS})
#: Bytes one Fetch asks for, and how long one write may retry before the task is faulty.
FETCH_BYTES = 4 * 1024 * 1024
WRITE_TIMEOUT_S = 10.0


def _check_stream(settings: Mapping[str, Any], where: str) -> None:
    stream = setting_str(settings, "stream", where, required=True)
    try:
        check_stream_name(stream)
    except InvalidStreamConfig as exc:
        raise InvalidDatastreamConfig(str(exc), field=f"{where}.stream") from None
    setting_str(settings, "brokers", where)
    check_security(settings, where, token_is_user_secret=True)
    check_nats_credentials(settings, where)


async def _connect(settings: Mapping[str, Any], endpoints: Endpoints, client_id: str) -> Client:
    from jetstream.client import connect

    brokers = settings.get("brokers") or endpoints.local_brokers
    return await connect(brokers, client_id=client_id, tls=tls_context(settings, "settings"),
                         nats_options=nats_options(settings),
                         user=credential(settings, "user"),
                         password=credential(settings, "password"),
                         token=credential(settings, "token")).start()


class JetstreamSource:
    def check(self, settings: Mapping[str, Any]) -> None:
        check_known(settings, SOURCE_SETTINGS, "source.settings")
        _check_stream(settings, "source.settings")
        setting_str(settings, "start", "source.settings", choices=("earliest", "latest"))

    async def open(self, settings: Mapping[str, Any], endpoints: Endpoints,
                   client_id: str) -> StreamReader:
        return StreamReader(await _connect(settings, endpoints, client_id), settings["stream"],
                            settings.get("start", "earliest"))


class StreamReader:
    def __init__(self, client: Client, stream: str, start: str) -> None:
        self._js = client
        self.stream = stream
        self._start = start

    @property
    def client(self) -> Client:
        return self._js

    async def partitions(self) -> int:
        return (await self._js.stream_info(self.stream)).partition_count

    async def checkpoint(self, group: str, partition: int) -> int | None:
        return await self._js.fetch_offset(group, self.stream, partition)

    async def start_position(self, partition: int) -> int:
        from jetstream.protocol.messages import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP

        at = LATEST_TIMESTAMP if self._start == "latest" else EARLIEST_TIMESTAMP
        return await self._js.offset_for_timestamp(self.stream, partition, at)

    async def read(self, partition: int, position: int, max_records: int,
                   wait_ms: int) -> SourceBatch:
        try:
            result = await self._js.fetch(self.stream, partition, position,
                                          max_bytes=FETCH_BYTES, max_wait_ms=wait_ms)
        except OffsetOutOfRange as exc:
            if position < exc.oldest:  # retention removed it: go on from the log start
                return SourceBatch([], exc.oldest, exc.newest)
            raise
        records = [SourceRecord(partition, msg.offset, msg.value, msg.key, msg.headers,
                                msg.timestamp_ms)
                   for msg in result.messages[:max_records] if msg.offset >= position]
        next_position = records[-1].position + 1 if records else result.next_offset
        return SourceBatch(records, next_position, result.high_watermark)

    async def commit(self, group: str, partition: int, position: int) -> None:
        await self._js.commit_offset(group, self.stream, partition, position)

    async def close(self) -> None:
        await self._js.close()


class JetstreamDestination:
    def check(self, settings: Mapping[str, Any]) -> None:
        check_known(settings, DESTINATION_SETTINGS, "destination.settings")
        _check_stream(settings, "destination.settings")
        setting_str(settings, "mode", "destination.settings", choices=MODES)

    async def open(self, settings: Mapping[str, Any], endpoints: Endpoints,
                   context: WriterContext, client_id: str) -> StreamWriter:
        client = await _connect(settings, endpoints, client_id)
        return StreamWriter(client, settings["stream"], context)

    async def open_mirror(self, settings: Mapping[str, Any], endpoints: Endpoints,
                          context: WriterContext, client_id: str, source: str) -> BatchWriter:
        """The writer of the `mirror` mode (jetstream.datastreams.batch_copy)."""
        client = await _connect(settings, endpoints, client_id)
        return BatchWriter(client, settings["stream"], context, source)


class StreamWriter:
    def __init__(self, client: Client, stream: str, context: WriterContext) -> None:
        self._js = client
        self.stream = stream
        self._context = context
        #: The next sequence of each source partition's producer, per destination subject.
        self._sequences: dict[tuple[int, str], int] = {}
        self._info: StreamInfo | None = None

    async def write(self, records: Sequence[SourceRecord]) -> None:
        if not records:
            return
        info = self._info
        if info is None:
            info = self._info = await self._js.stream_info(self.stream)
        firsts: set[tuple[int, str]] = set()
        items = [self._item(record, info, firsts) for record in records]
        # One ordered pipeline: each producer's sequences reach the leader in order, so a
        # record lost on the way makes the ones after it refused (OUT_OF_ORDER_SEQUENCE),
        # never stored out of order. Any error ends this writer (the task takes a new epoch).
        try:
            _, error = await self._js.publish_expecting(
                items, window=self._context.in_flight_max, timeout=WRITE_TIMEOUT_S)
        except BaseException:
            self._info = None  # the stream may have changed: describe it again next time
            raise
        if error is not None:
            self._info = None
            raise error

    def _item(self, record: SourceRecord, info: StreamInfo, firsts: set[tuple[int, str]]
              ) -> ExpectingItem:
        """The publish of `record`; the first of each producer and target in a write says
        `resume` (every earlier write was acked, or this writer would not be used again)."""
        context = self._context
        count = info.partition_count
        if context.partition_mapping == "key_hash" and record.key is not None:
            partition = zlib.crc32(record.key) % count
        else:
            partition = record.partition % count
        headers = {k: v for k, v in record.headers.items() if k not in LEADER_HEADERS}
        source_id = record.headers.get(h.MSG_ID)
        if source_id is not None:
            headers[SOURCE_MSG_ID_HEADER] = source_id
        headers[SOURCE_HEADER] = f"{context.source_name}/{record.partition}".encode()
        headers[SOURCE_OFFSET_HEADER] = str(record.position).encode()
        target = names.partition_subject(info.subject, partition)
        lane = (record.partition, target)
        sequence = self._sequences.get(lane, 0)
        self._sequences[lane] = sequence + 1
        producer: Stamp = (f"ds.{context.datastream}.{record.partition}", context.epoch,
                           sequence)
        if lane not in firsts:
            firsts.add(lane)
            producer = (*producer, True)
        return ((target, record.value, record.key, headers),
                {"msg_id": f"{context.datastream}/{record.partition}/{record.position}",
                 "producer": producer})

    def checkpointable(self, partition: int, position: int) -> int | None:
        return position  # `write` returned: the destination acknowledged all of it

    async def close(self) -> None:
        await self._js.close()
