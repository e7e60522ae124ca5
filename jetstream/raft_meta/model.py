"""The metadata data model: brokers, streams and their partitions.

Theory of operation: these values are what every broker agrees on. They change only through
commands applied by the metadata state machine (jetstream.raft_meta.fsm), which runs on one
broker (local metadata) or on every broker from a Raft log. They are plain frozen values that
convert to and from JSON-compatible dicts, so they can be persisted, replicated and sent to
clients without a schema of their own.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from jetstream.compaction.planner import DAY_MS, CleanupPolicy, CompactionConfig
from jetstream.errors import InvalidConfig, InvalidStreamConfig
from jetstream.protocol import names
from jetstream.protocol.envelope import AckPolicy
from jetstream.stream.config import FsyncPolicy, LogConfig, MiB
from jetstream.tiered import settings as tiered
from jetstream.tiered.names import Compression

#: Most partitions per stream and the largest replication factor.
PARTITIONS_MAX = 1024
REPLICATION_FACTOR_MAX = 7
MESSAGE_BYTES_MAX = 64 * MiB
#: The settings `update_stream` may change after a stream was created; the others (name,
#: subject, partitions, replication, min ISR, load-balance group, labels) are fixed.
UPDATABLE_FIELDS = frozenset({
    "ack_policy", "fsync", "fsync_interval_ms", "retention_ms", "retention_bytes",
    "retention_messages", "segment_bytes_max", "segment_ms_max", "max_message_bytes",
    "cleanup_policy", "min_cleanable_dirty_ratio", "min_compaction_lag_ms",
    "max_compaction_lag_ms", "delete_retention_ms", "duplicate_window_ms", "mirror",
}) | tiered.FIELDS
#: The longest message id dedupe window a stream may have.
DUPLICATE_WINDOW_MS_MAX = 7 * DAY_MS
#: Longest `mirror` setting (the source a mirror stream copies: "<cluster>/<stream>").
MIRROR_CHARS_MAX = 512


@dataclass(frozen=True, slots=True)
class StreamConfig:
    name: str
    subject: str
    partitions: int = 1
    ingest_group: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    replication_factor: int = 1
    min_isr: int = 1
    ack_policy: AckPolicy = AckPolicy.ALL
    fsync: FsyncPolicy = FsyncPolicy.ALWAYS
    fsync_interval_ms: int = 1000
    retention_ms: int | None = None
    retention_bytes: int | None = None
    retention_messages: int | None = None
    segment_bytes_max: int = 64 * MiB
    max_message_bytes: int = 1 * MiB
    segment_ms_max: int = 7 * DAY_MS
    cleanup_policy: CleanupPolicy = CleanupPolicy.DELETE
    min_cleanable_dirty_ratio: float = 0.5
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int | None = None
    delete_retention_ms: int = DAY_MS
    #: How long a message id (and an idempotent producer) is remembered after its publish.
    duplicate_window_ms: int = 120_000
    # Tiered storage (jetstream.tiered.settings).
    fragment_store: str | None = None
    fragment_compression: Compression = Compression.NONE
    local_retention_ms: int | None = None
    local_retention_bytes: int | None = None
    fragment_store_retention: tiered.StoreRetention = tiered.StoreRetention.DELETE
    fragment_format: tiered.FragmentFormat = tiered.FragmentFormat.SEGMENT
    #: Set on a stream a datastream mirrors batch by batch: the source it copies
    #: ("<cluster>/<stream>"). Only that copy writes it; None: an ordinary stream.
    mirror: str | None = None

    def __post_init__(self) -> None:
        names.check_stream_name(self.name)
        names.check_partitioned_subject(self.subject, _int(self, "partitions", 1,
                                                            PARTITIONS_MAX))
        if self.ingest_group is not None:
            names.check_group_name(self.ingest_group, "ingest_group")
        object.__setattr__(self, "labels", names.check_labels(self.labels))
        _int(self, "replication_factor", 1, REPLICATION_FACTOR_MAX)
        _int(self, "min_isr", 1, self.replication_factor)
        _int(self, "max_message_bytes", 64, MESSAGE_BYTES_MAX)
        _int(self, "duplicate_window_ms", 1, DUPLICATE_WINDOW_MS_MAX)
        if self.mirror is not None and (not isinstance(self.mirror, str) or not
                                        0 < len(self.mirror) <= MIRROR_CHARS_MAX):
            raise InvalidStreamConfig(f"mirror must be None or a string of 1..{MIRROR_CHARS_MAX}"
                                      f" characters, got {self.mirror!r}", field="mirror")
        enums: tuple[tuple[str, type[enum.Enum]], ...] = (
            ("ack_policy", AckPolicy), ("fsync", FsyncPolicy), ("cleanup_policy", CleanupPolicy),
            *tiered.ENUM_FIELDS)
        for name, enum_type in enums:
            value = getattr(self, name)
            try:
                object.__setattr__(self, name, enum_type(value))
            except ValueError:
                raise InvalidStreamConfig(
                    f"{name} must be one of {[m.value for m in enum_type]}, got {value!r}",
                    field=name) from None
        tiered.check(self)
        try:
            self._log_config(retention=True)  # retention values are checked whatever the policy
            self.compaction_config()
        except InvalidConfig as exc:  # each config names the field in its own error
            raise InvalidStreamConfig(str(exc), field=exc.fields.get("field", "")) from None

    def log_config(self) -> LogConfig:
        """The log's settings. Retention deletes segments only under a `delete` policy: a
        `compact` stream keeps every key's latest record however old."""
        return self._log_config(retention=self.cleanup_policy.deletes)

    def _log_config(self, *, retention: bool) -> LogConfig:
        deletes = retention
        return LogConfig(
            segment_bytes_max=self.segment_bytes_max,
            segment_ms_max=self.segment_ms_max,
            record_bytes_max=self.max_message_bytes + 64 * 1024,
            fsync=self.fsync,
            fsync_interval_ms=self.fsync_interval_ms,
            retention_ms=self.retention_ms if deletes else None,
            retention_bytes=self.retention_bytes if deletes else None,
            retention_messages=self.retention_messages if deletes else None,
        )

    def compaction_config(self) -> CompactionConfig:
        """The cleaner's settings. Records carrying a message id or a producer stamp inside
        the duplicate window are not compacted: a new leader rebuilds the window from them."""
        return CompactionConfig(
            min_cleanable_dirty_ratio=self.min_cleanable_dirty_ratio,
            min_compaction_lag_ms=self.min_compaction_lag_ms,
            max_compaction_lag_ms=self.max_compaction_lag_ms,
            delete_retention_ms=self.delete_retention_ms,
            segment_bytes_max=self.segment_bytes_max,
            duplicate_window_ms=self.duplicate_window_ms,
        )

    def updated(self, changes: Mapping[str, Any]) -> StreamConfig:
        """This config with `changes` (settings of UPDATABLE_FIELDS only), checked."""
        if not isinstance(changes, Mapping) or not changes:
            raise InvalidStreamConfig("an update names at least one setting", field="")
        fixed = sorted(set(changes) - UPDATABLE_FIELDS)
        if fixed:
            raise InvalidStreamConfig(
                f"{fixed[0]} cannot be changed after the stream was created (changeable: "
                f"{sorted(UPDATABLE_FIELDS)})", field=fixed[0])
        return replace(self, **changes)

    def partition_subject(self, partition: int) -> str:
        return names.partition_subject(self.subject, partition)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["labels"] = dict(self.labels)
        out["ack_policy"] = self.ack_policy.value
        out["fsync"] = self.fsync.value
        out["cleanup_policy"] = self.cleanup_policy.value
        out["fragment_compression"] = self.fragment_compression.value
        out["fragment_store_retention"] = self.fragment_store_retention.value
        out["fragment_format"] = self.fragment_format.value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StreamConfig:
        """Build from user input: unknown fields are an error (a typo must not pass)."""
        if not isinstance(data, Mapping):
            raise InvalidStreamConfig("a stream config is a map of fields", field="")
        data = _without_deprecated_names(data)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InvalidStreamConfig(f"unknown stream config fields: {unknown}",
                                      field=unknown[0])
        for required in ("name", "subject"):
            if required not in data:
                raise InvalidStreamConfig(f"{required} is required", field=required)
        return cls(**data)


#: Deprecated spellings of config fields, still accepted: `group` named the load-balance group
#: before consumer groups existed.
DEPRECATED_FIELDS = {"group": "ingest_group"}


def _without_deprecated_names(data: Mapping[str, Any]) -> Mapping[str, Any]:
    if not DEPRECATED_FIELDS.keys() & data.keys():
        return data
    out = dict(data)
    for old, new in DEPRECATED_FIELDS.items():
        if old not in out:
            continue
        value = out.pop(old)
        if new in out and out[new] != value:
            raise InvalidStreamConfig(f"{old} (deprecated) and {new} disagree: give {new} only",
                                      field=new)
        out[new] = value
    return out


def _int(config: StreamConfig, name: str, low: int, high: int) -> int:
    value = getattr(config, name)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidStreamConfig(f"{name} must be an integer in [{low}, {high}], got {value!r}",
                                  field=name)
    return value


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    id: int
    host: str
    port: int
    http_port: int = 0

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class PartitionState:
    """Who holds a partition: its replicas (brokers), its leader, its in-sync replicas and
    the leader epoch, bumped at every leader change. `created_version` is the metadata
    version that created the stream: a stream created again under the same name has a larger
    one, so its epochs (from 0 again) are not mistaken for older ones of the first."""

    stream: str
    partition: int
    replicas: tuple[int, ...]
    leader: int
    isr: tuple[int, ...]
    leader_epoch: int
    created_version: int = 0

    def __post_init__(self) -> None:
        assert self.leader in self.isr, (self.leader, self.isr)
        assert set(self.isr) <= set(self.replicas), (self.isr, self.replicas)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["replicas"] = list(self.replicas)
        out["isr"] = list(self.isr)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PartitionState:
        return cls(data["stream"], data["partition"], tuple(data["replicas"]), data["leader"],
                   tuple(data["isr"]), data["leader_epoch"],
                   data.get("created_version", 0))  # absent in states written before it
