"""The options of `format("jetstream")`, parsed and checked once, where Spark hands them over.

Theory of operation: Spark passes every option as a string (case-insensitive names). This
module turns them into typed, frozen values and rejects bad ones with InvalidSparkOption,
which names the option; the readers and writers below never see raw strings. The names and
meanings follow Spark's Kafka source wherever Kafka has the option.

    option                  values                                   default
    brokers                 host:port,...                            $JETSTREAM_BROKERS
    stream                  a name, or names separated by ","        (stream or selector)
    selector                a label selector over stream labels      (stream or selector)
    startingOffsets         earliest | latest | JSON                 earliest (batch),
                            {"orders": {"0": 42, "1": -2}}            latest (streaming)
                            (-2: earliest, -1: latest, Kafka's)
    endingOffsets           latest | JSON (batch only)               latest
    startingTimestamp       ms since the epoch, all partitions       -
    endingTimestamp         ms since the epoch (batch only)          -
    readFrom                auto | files | brokers                   auto
    dataDir                 where segment files are read: a path or  the directory each
                            URL; "{broker_id}" is replaced            broker reports
    maxRecordsPerPartition  most offsets one Spark task reads        500000
    compacted               latest: one row per live key             -
    group                   consumer group whose committed offsets   -
                            a read starts from (and a streaming
                            query commits to)
    failOnDataLoss          true | false                             true
    maxOffsetsPerTrigger    most records per micro-batch             -
    verifyCrc               true | false                             true
    tlsCa, tlsCert, tlsKey  TLS to the brokers (readers and writer):  $JETSTREAM_CLIENT_TLS_*
                            their CA bundle, this job's certificate
                            and key (brokers verifying clients);
                            a jetstreams:// broker asks for TLS
    user, password, token   credentials for brokers with               $JETSTREAM_CLIENT_USER,
                            authentication                            _PASSWORD, _TOKEN
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from jetstream.errors import InvalidSparkOption
from jetstream.protocol.names import is_group_name, is_stream_name, parse_selector
from jetstream.security.tls import TlsArguments

BROKERS_ENV = "JETSTREAM_BROKERS"
#: Kafka's markers inside a JSON offsets document.
EARLIEST = -2
LATEST = -1
SPLIT_RECORDS_DEFAULT = 500_000
SPLIT_RECORDS_MAX = 1 << 40
STREAMS_MAX = 10_000

ReadFrom = Literal["auto", "files", "brokers"]
_READ_FROM = ("auto", "files", "brokers")


#: Per-partition offsets of a JSON document: {stream: {partition: offset}}.
OffsetsSpec = Mapping[str, Mapping[int, int]]


@dataclass(frozen=True, slots=True)
class Offsets:
    """Where a read starts or ends: `default` (EARLIEST or LATEST) for every partition not
    named in `per_partition`."""

    default: int
    per_partition: OffsetsSpec

    def for_partition(self, stream: str, partition: int) -> int:
        return self.per_partition.get(stream, {}).get(partition, self.default)


class ConnectArguments(TlsArguments):
    """The TLS and credential keyword arguments of jetstream.client.connect."""

    user: str | None
    password: str | None
    token: str | None


@dataclass(frozen=True, slots=True)
class ClientTls:
    """The TLS files and credentials a job's clients use (picklable: executors connect with
    them too)."""

    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)

    def connect_options(self) -> ConnectArguments:
        """Keyword arguments of jetstream.client.connect."""
        return ConnectArguments(tls_ca=self.ca, tls_cert=self.cert, tls_key=self.key,
                                user=self.user, password=self.password, token=self.token)


NO_TLS = ClientTls()


def tls_option(options: Mapping[str, str]) -> ClientTls:
    """tlsCa, tlsCert, tlsKey, user, password, token, else the JETSTREAM_CLIENT_* environment
    variables."""
    values = [_get(options, name) or os.environ.get(env) or None
              for name, env in (("tlsCa", "JETSTREAM_CLIENT_TLS_CA"),
                                ("tlsCert", "JETSTREAM_CLIENT_TLS_CERT"),
                                ("tlsKey", "JETSTREAM_CLIENT_TLS_KEY"))]
    if bool(values[1]) != bool(values[2]):
        raise InvalidSparkOption("tlsCert and tlsKey go together",
                                 field="tlsKey" if values[1] else "tlsCert")
    user, password, token = [_get(options, name) or os.environ.get(env) or None
                             for name, env in (("user", "JETSTREAM_CLIENT_USER"),
                                               ("password", "JETSTREAM_CLIENT_PASSWORD"),
                                               ("token", "JETSTREAM_CLIENT_TOKEN"))]
    if bool(user) != bool(password):
        raise InvalidSparkOption("user and password go together",
                                 field="password" if user else "user")
    return ClientTls(values[0], values[1], values[2], user, password, token)


@dataclass(frozen=True, slots=True)
class ReadOptions:
    brokers: str
    streams: tuple[str, ...]
    selector: str | None
    starting: Offsets
    ending: Offsets
    starting_timestamp_ms: int | None
    ending_timestamp_ms: int | None
    read_from: ReadFrom
    data_dir: str | None
    split_records: int
    compacted_latest: bool
    group: str | None
    fail_on_data_loss: bool
    max_offsets_per_trigger: int | None
    verify_crc: bool
    tls: ClientTls = NO_TLS


@dataclass(frozen=True, slots=True)
class WriteOptions:
    brokers: str
    stream: str
    #: Messages sent before waiting for acks (the publish window).
    window: int
    ack_timeout_s: float
    tls: ClientTls = NO_TLS
    #: Publish through an idempotent producer session per task attempt (no duplicates from
    #: retries inside the attempt; a later attempt fences the earlier).
    idempotent: bool = True


def _get(options: Mapping[str, str], name: str) -> str | None:
    """The option `name` whatever its case (Spark lower-cases names on some paths)."""
    lowered = name.lower()
    for key, value in options.items():
        if key.lower() == lowered:
            return value
    return None


def _int(options: Mapping[str, str], name: str, default: int | None, low: int, high: int
         ) -> int | None:
    text = _get(options, name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise InvalidSparkOption(f"{name} must be an integer, got {text!r}", field=name) from None
    if not low <= value <= high:
        raise InvalidSparkOption(f"{name} must be in [{low}, {high}], got {value}", field=name)
    return value


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    text = _get(options, name)
    if text is None:
        return default
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    raise InvalidSparkOption(f"{name} must be true or false, got {text!r}", field=name)


def brokers_option(options: Mapping[str, str]) -> str:
    brokers = _get(options, "brokers") or os.environ.get(BROKERS_ENV, "")
    if not brokers.strip():
        raise InvalidSparkOption(f"no brokers: set option brokers or ${BROKERS_ENV}",
                                 field="brokers")
    return brokers


def parse_offsets(text: str | None, name: str, default: int, *, allow_earliest: bool = True
                  ) -> Offsets:
    """"earliest", "latest" or Kafka's JSON form {"stream": {"partition": offset}}."""
    if text is None:
        return Offsets(default, {})
    stripped = text.strip()
    if stripped == "latest":
        return Offsets(LATEST, {})
    if stripped == "earliest" and allow_earliest:
        return Offsets(EARLIEST, {})
    try:
        document = json.loads(stripped)
    except ValueError:
        document = None
    if not isinstance(document, dict):
        raise InvalidSparkOption(
            f"{name} must be {'earliest, ' if allow_earliest else ''}latest or JSON like "
            f'{{"orders": {{"0": 42}}}}, got {text!r}', field=name)
    spec: dict[str, dict[int, int]] = {}
    for stream, partitions in document.items():
        if not is_stream_name(stream) or not isinstance(partitions, dict):
            raise InvalidSparkOption(f"{name}: {stream!r} must be a stream name mapping "
                                     "partitions to offsets", field=name)
        spec[stream] = {}
        for partition, offset in partitions.items():
            if not (isinstance(partition, str) and partition.isdigit()
                    and isinstance(offset, int) and not isinstance(offset, bool)
                    and offset >= (EARLIEST if allow_earliest else LATEST)):
                raise InvalidSparkOption(f"{name}: {stream}/{partition}: {offset!r} is not an "
                                         "offset (-2 earliest, -1 latest)", field=name)
            spec[stream][int(partition)] = offset
    return Offsets(default, spec)


def _streams(options: Mapping[str, str]) -> tuple[tuple[str, ...], str | None]:
    stream_text, selector = _get(options, "stream"), _get(options, "selector")
    if (stream_text is None) == (selector is None):
        raise InvalidSparkOption("give exactly one of the options stream and selector",
                                 field="stream")
    if selector is not None:
        parse_selector(selector, "selector")
        return (), selector
    assert stream_text is not None
    streams = tuple(dict.fromkeys(s.strip() for s in stream_text.split(",") if s.strip()))
    if not streams or len(streams) > STREAMS_MAX:
        raise InvalidSparkOption(f"stream must name 1 to {STREAMS_MAX} streams", field="stream")
    for name in streams:
        if not is_stream_name(name):
            raise InvalidSparkOption(f"stream {name!r} is not a stream name", field="stream")
    return streams, None


def parse_read_options(options: Mapping[str, str], *, streaming: bool = False) -> ReadOptions:
    streams, selector = _streams(options)
    read_from = (_get(options, "readFrom") or "auto").lower()
    if read_from not in _READ_FROM:
        raise InvalidSparkOption(f"readFrom must be one of {list(_READ_FROM)}, got "
                                 f"{read_from!r}", field="readFrom")
    compacted = _get(options, "compacted")
    if compacted not in (None, "latest"):
        raise InvalidSparkOption(f"compacted must be latest, got {compacted!r}",
                                 field="compacted")
    group = _get(options, "group")
    if group is not None and not is_group_name(group):
        raise InvalidSparkOption(f"group {group!r} is not a group name", field="group")
    ending_text = _get(options, "endingOffsets")
    if streaming and (ending_text is not None or _get(options, "endingTimestamp") is not None):
        raise InvalidSparkOption("endingOffsets and endingTimestamp are for batch reads",
                                 field="endingOffsets")
    if streaming and compacted is not None:
        raise InvalidSparkOption("compacted=latest is for batch reads", field="compacted")
    split_records = _int(options, "maxRecordsPerPartition", SPLIT_RECORDS_DEFAULT, 1,
                         SPLIT_RECORDS_MAX)
    assert split_records is not None
    return ReadOptions(
        brokers=brokers_option(options),
        streams=streams,
        selector=selector,
        starting=parse_offsets(_get(options, "startingOffsets"), "startingOffsets",
                               LATEST if streaming else EARLIEST),
        ending=parse_offsets(ending_text, "endingOffsets", LATEST, allow_earliest=False),
        starting_timestamp_ms=_int(options, "startingTimestamp", None, 0, 2**63 - 1),
        ending_timestamp_ms=_int(options, "endingTimestamp", None, 0, 2**63 - 1),
        read_from=read_from,  # type: ignore[arg-type]  # checked against _READ_FROM above
        data_dir=_get(options, "dataDir"),
        split_records=split_records,
        compacted_latest=compacted == "latest",
        group=group,
        fail_on_data_loss=_bool(options, "failOnDataLoss", True),
        max_offsets_per_trigger=_int(options, "maxOffsetsPerTrigger", None, 1, 2**62),
        verify_crc=_bool(options, "verifyCrc", True),
        tls=tls_option(options),
    )


def parse_write_options(options: Mapping[str, str]) -> WriteOptions:
    stream = _get(options, "stream")
    if stream is None or not is_stream_name(stream):
        raise InvalidSparkOption(f"the writer needs option stream (one stream name), got "
                                 f"{stream!r}", field="stream")
    window = _int(options, "window", 1000, 1, 100_000)
    timeout = _int(options, "ackTimeoutMs", 30_000, 1, 3_600_000)
    assert window is not None and timeout is not None
    return WriteOptions(brokers_option(options), stream, window, timeout / 1000,
                        tls_option(options), _bool(options, "idempotent", True))
