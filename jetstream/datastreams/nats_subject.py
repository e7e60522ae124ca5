"""The `nats_subject` transport: republish each record of a datastream to a NATS subject.

Settings: `url` (required: the NATS server, `nats://host:port` or `tls://...`), `subject`
(required: a subject, or a template of one with `{stream}` (the source stream),
`{partition}` (the source partition) and `{key}` (the record's key: its text when that is a
valid subject token, `_` when it has none, `0x<hex>` otherwise)).

Each record becomes one message: its value as the data (empty when it has none), its headers
kept (those a partition leader writes itself are not copied, like the `jetstream`
destination: a source `Nats-Msg-Id` travels as `Jetstream-Source-Msg-Id`), plus
`Jetstream-Source` (`<stream>/<partition>`), `Jetstream-Source-Offset`, `Jetstream-Key` (when
the record has a key) and `Nats-Msg-Id` = `<datastream>/<partition>/<offset>`. NATS headers
are text: a value that is not printable UTF-8 is sent base64-encoded under its name with
`-Base64` appended.

At least once: `write` publishes the batch and then flushes (a PING the server answers only
after it processed everything before it); the checkpoint moves only after that. After a
crash or a task restart the records since the last checkpoint are published again. A NATS
JetStream stream that captures the subject drops those repeats within its duplicate window
(`Nats-Msg-Id`); core NATS subscribers may see them twice. NATS core has no end-to-end
acknowledgement: a subscriber that is slow or absent misses what it was not there for.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from jetstream.datastreams.connector import (
    Endpoints,
    SourceRecord,
    WriterContext,
    check_known,
    setting_str,
)
from jetstream.datastreams.jetstream_stream import (
    LEADER_HEADERS,
    SOURCE_HEADER,
    SOURCE_MSG_ID_HEADER,
    SOURCE_OFFSET_HEADER,
)
from jetstream.datastreams.nats_jetstream import check_url, connect_nats
from jetstream.datastreams.security import SECURITY_SETTINGS, check_security
from jetstream.errors import InvalidDatastreamConfig
from jetstream.idempotence import headers as h

if TYPE_CHECKING:
    from nats.aio.client import Client as Nats

SETTINGS = ("url", "subject", *SECURITY_SETTINGS)
KEY_HEADER = "Jetstream-Key"
BASE64_SUFFIX = "-Base64"
PLACEHOLDERS = ("stream", "partition", "key")
SUBJECT_CHARS_MAX = 256
#: How long a batch's flush may wait for the server's answer before the task is faulty.
FLUSH_TIMEOUT_S = 10
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
_TOKEN = re.compile(r"[^\s.*>{}]+")


def subject_of(template: str, stream: str, partition: int, key: bytes | None) -> str:
    """The subject a record goes to (pure)."""
    values = {"stream": stream, "partition": str(partition), "key": _key_token(key)}
    return _PLACEHOLDER.sub(lambda match: values[match.group(1)], template)


def _key_token(key: bytes | None) -> str:
    if key is None:
        return "_"
    try:
        text = key.decode()
    except UnicodeDecodeError:
        text = ""
    return text if _TOKEN.fullmatch(text) and text.isprintable() else "0x" + key.hex()


def check_template(template: str) -> None:
    """InvalidDatastreamConfig unless `template` names only known placeholders and renders
    to a subject without wildcards, spaces or empty tokens."""
    where = "destination.settings.subject"
    unknown = [n for n in _PLACEHOLDER.findall(template) if n not in PLACEHOLDERS]
    if unknown:
        raise InvalidDatastreamConfig(f"{where}: unknown placeholder {{{unknown[0]}}} (known: "
                                      f"{['{' + p + '}' for p in PLACEHOLDERS]})", field=where)
    sample = subject_of(template, "s", 0, b"k")
    if len(template) > SUBJECT_CHARS_MAX or not all(
            _TOKEN.fullmatch(token) for token in sample.split(".")):
        raise InvalidDatastreamConfig(
            f"{where} must be a NATS subject of at most {SUBJECT_CHARS_MAX} characters without "
            f"wildcards, spaces or empty tokens, got {template!r}", field=where)


def headers_of(record: SourceRecord, context: WriterContext) -> dict[str, str]:
    """The NATS headers of a record's message (pure)."""
    out: dict[str, str] = {}
    for name, value in record.headers.items():
        if name == h.MSG_ID:
            _put(out, SOURCE_MSG_ID_HEADER, value)
        elif name not in LEADER_HEADERS:
            _put(out, name, value)
    if record.key is not None:
        _put(out, KEY_HEADER, record.key)
    out[SOURCE_HEADER] = f"{context.source_name}/{record.partition}"
    out[SOURCE_OFFSET_HEADER] = str(record.position)
    out[h.MSG_ID] = f"{context.datastream}/{record.partition}/{record.position}"
    return out


def _put(out: dict[str, str], name: str, value: bytes) -> None:
    try:
        text = value.decode()
    except UnicodeDecodeError:
        text = None
    if text is not None and text.isprintable():
        out[name] = text
    else:
        out[name + BASE64_SUFFIX] = base64.b64encode(value).decode()


class NatsSubjectDestination:
    def check(self, settings: Mapping[str, Any]) -> None:
        check_known(settings, SETTINGS, "destination.settings")
        check_url(settings, "destination.settings")
        check_security(settings, "destination.settings", token_is_user_secret=False)
        subject = setting_str(settings, "subject", "destination.settings", required=True)
        assert subject is not None
        check_template(subject)

    async def open(self, settings: Mapping[str, Any], endpoints: Endpoints,
                   context: WriterContext, client_id: str) -> SubjectWriter:
        nc = await connect_nats(settings, "destination.settings", client_id)
        return SubjectWriter(nc, str(settings["subject"]), context)


class SubjectWriter:
    def __init__(self, nc: Nats, template: str, context: WriterContext) -> None:
        self._nc = nc
        self._template = template
        self._context = context

    async def write(self, records: Sequence[SourceRecord]) -> None:
        if not records:
            return
        stream = self._context.source_name
        for record in records:
            await self._nc.publish(subject_of(self._template, stream, record.partition,
                                              record.key),
                                   record.value or b"", headers=headers_of(record,
                                                                           self._context))
        await self._nc.flush(timeout=FLUSH_TIMEOUT_S)  # raises when the server did not answer

    def checkpointable(self, partition: int, position: int) -> int | None:
        return position  # `write` returned: the server processed all of it

    async def close(self) -> None:
        await self._nc.close()
