"""The `nats_jetstream` connector: a NATS JetStream stream as a datastream's source, the
migration path into Jetstream without a flag day (nats-py).

Settings: `url` (required: the NATS server, `nats://host:port`), `stream` (required: the
NATS JetStream stream), `start` (`earliest`, the default: the stream's first sequence; or
`latest`: only what comes next), and what secures the connection
(jetstream.datastreams.security): `tls_ca`, `tls_cert`, `tls_key` (a `tls://` URL asks for
TLS with the system's CAs), `user` with `password`, or a NATS `token`. A NATS JetStream
stream is one sequence, so the source has one partition, 0, and a position is a stream
sequence (the next one to read).

Reads go through an ephemeral pull consumer that starts at the position asked for (kept
while reads follow on from each other, made again when they do not), with no acks: the
checkpoint is kept apart, as the key `<group>.<partition>` of the NATS key-value bucket
`jetstream_datastreams` (created on first use) in the source's own JetStream, written only
after the destination acknowledged. Each record's value is the message's data, its headers
the message's headers plus `Nats-Subject` (the subject it was published on); it has no key.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from jetstream.datastreams.connector import (
    Endpoints,
    SourceBatch,
    SourceRecord,
    check_known,
    setting_str,
)
from jetstream.datastreams.security import (
    SECURITY_SETTINGS,
    check_security,
    credential,
    redacted,
    scrub,
    secret_values,
    tls_context,
)
from jetstream.errors import BrokerUnavailable, InvalidDatastreamConfig

if TYPE_CHECKING:
    from nats.aio.client import Client as Nats
    from nats.js.client import JetStreamContext
    from nats.js.kv import KeyValue

SETTINGS = ("url", "stream", "start", *SECURITY_SETTINGS)
BUCKET = "jetstream_datastreams"
SUBJECT_HEADER = "Nats-Subject"
CONNECT_TIMEOUT_S = 5.0
#: Records one fetch asks the pull consumer for, at most.
FETCH_RECORDS_MAX = 1000


def check_url(settings: Mapping[str, Any], where: str) -> None:
    """The `url` setting of a NATS connector (`where`: source.settings, ...): required, a
    `nats://` or `tls://` URL."""
    url = setting_str(settings, "url", where, required=True)
    assert url is not None
    if not url.startswith(("nats://", "tls://")):
        raise InvalidDatastreamConfig(f"{where}.url must be a nats:// URL", field=f"{where}.url")


async def connect_nats(settings: Mapping[str, Any], where: str, client_id: str) -> Nats:
    """A NATS connection to the endpoint's `url`, with its TLS settings and credentials
    (`where`: source.settings, ...), that does not reconnect (a task that loses it fails and
    retries from its checkpoint). Raises BrokerUnavailable, without secrets."""
    import nats

    url = str(settings["url"])
    tls = tls_context(settings, where)
    if tls is None and url.startswith("tls://"):
        tls = ssl.create_default_context()
    options: dict[str, Any] = {"tls": tls} if tls is not None else {}
    try:
        return await nats.connect(url, name=client_id, connect_timeout=CONNECT_TIMEOUT_S,
                                  max_reconnect_attempts=0, allow_reconnect=False,
                                  error_cb=_quiet, user=credential(settings, "user"),
                                  password=credential(settings, "password"),
                                  token=credential(settings, "token"), **options)
    except Exception as exc:  # nats-py raises several unrelated types
        where_to = redacted({"url": url})["url"]
        raise BrokerUnavailable(where_to, scrub(f"NATS: {exc!r}", secret_values(settings))
                                ) from None


class NatsJetstreamSource:
    def check(self, settings: Mapping[str, Any]) -> None:
        check_known(settings, SETTINGS, "source.settings")
        check_url(settings, "source.settings")
        setting_str(settings, "stream", "source.settings", required=True)
        setting_str(settings, "start", "source.settings", choices=("earliest", "latest"))
        check_security(settings, "source.settings", token_is_user_secret=False)

    async def open(self, settings: Mapping[str, Any], endpoints: Endpoints,
                   client_id: str) -> NatsStreamReader:
        nc = await connect_nats(settings, "source.settings", client_id)
        return NatsStreamReader(nc, str(settings["stream"]), settings.get("start", "earliest"))


async def _quiet(exc: Exception) -> None:
    """nats-py logs connection errors itself unless given a callback; a failed connect is
    reported by the exception `open` raises (without secrets)."""


class NatsStreamReader:
    def __init__(self, nc: Nats, stream: str, start: str) -> None:
        self._nc = nc
        self._js: JetStreamContext = nc.jetstream()
        self.stream = stream
        self._start = start
        self._kv: KeyValue | None = None
        self._sub: Any = None
        self._next = -1

    async def partitions(self) -> int:
        await self._js.stream_info(self.stream)  # raises when it does not exist
        return 1

    async def _bucket(self) -> KeyValue:
        if self._kv is None:
            from nats.js.errors import BucketNotFoundError

            try:
                self._kv = await self._js.key_value(BUCKET)
            except BucketNotFoundError:
                self._kv = await self._js.create_key_value(bucket=BUCKET)
        return self._kv

    async def checkpoint(self, group: str, partition: int) -> int | None:
        from nats.js.errors import KeyNotFoundError

        try:
            entry = await (await self._bucket()).get(f"{group}.{partition}")
        except KeyNotFoundError:
            return None
        return int(entry.value or b"0")

    async def commit(self, group: str, partition: int, position: int) -> None:
        await (await self._bucket()).put(f"{group}.{partition}", str(position).encode())

    async def start_position(self, partition: int) -> int:
        info = await self._js.stream_info(self.stream)
        state = info.state
        return int(state.last_seq) + 1 if self._start == "latest" else max(1, int(
            state.first_seq))

    async def read(self, partition: int, position: int, max_records: int,
                   wait_ms: int) -> SourceBatch:
        from nats.errors import TimeoutError as NatsTimeout
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        if self._sub is None or position != self._next:
            await self._unsubscribe()
            self._sub = await self._js.pull_subscribe(
                "", stream=self.stream, config=ConsumerConfig(
                    deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=position,
                    ack_policy=AckPolicy.NONE, inactive_threshold=60.0))
            self._next = position
        try:
            messages = await self._sub.fetch(min(max_records, FETCH_RECORDS_MAX),
                                             timeout=max(wait_ms, 1) / 1000)
        except (TimeoutError, NatsTimeout):
            messages = []
        records = []
        end = position
        for msg in messages:
            meta = msg.metadata
            headers = {k: v.encode() for k, v in (msg.headers or {}).items()}
            headers[SUBJECT_HEADER] = msg.subject.encode()
            records.append(SourceRecord(partition, meta.sequence.stream, msg.data, None,
                                        headers, int(meta.timestamp.timestamp() * 1000)))
            end = max(end, meta.num_pending + meta.sequence.stream + 1)
        if records:
            self._next = records[-1].position + 1
        return SourceBatch(records, self._next, end)

    async def _unsubscribe(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None

    async def close(self) -> None:
        await self._unsubscribe()
        with contextlib.suppress(Exception):
            await self._nc.close()
