"""The error tree: every failure a caller can act on, each with a stable code.

Codes cross the wire (socket API, HTTP, acks), so they never change once published. Each class
says when it happens and what the caller should do. Data travels in attributes, never only in
the message text. An error a broker reports comes back to the client as the same class,
rebuilt from its code and fields (jetstream.protocol.messages.error_from_header); a code the
client does not know arrives as `RemoteError`.

One module per area; every class is re-exported here, so callers import from
`jetstream.errors`.
"""

from __future__ import annotations

from jetstream.errors.base import (
    InvalidConfig,
    JetstreamError,
)
from jetstream.errors.client import (
    AckTimeout,
    BrokerUnavailable,
    NoStreamForSubject,
)
from jetstream.errors.datastreams import (
    DatastreamExists,
    InvalidDatastreamConfig,
    UnknownConnector,
    UnknownDatastream,
)
from jetstream.errors.expectations import (
    DuplicateSequence,
    ExpectationFailed,
    KeyNotTracked,
    KeyOffsetMismatch,
    OffsetMismatch,
    OutOfOrderSequence,
    ProducerFenced,
    RegisterMismatch,
)
from jetstream.errors.groups import (
    FencedMember,
    GroupFull,
    GroupNotEmpty,
    NoCommittedOffset,
    NotCoordinator,
    OffsetBehindCommitted,
    PartitionNotAssigned,
    ProtectedStream,
    StaleMemberEpoch,
    TooManyGroups,
    UnknownMemberId,
)
from jetstream.errors.metadata import (
    KeyNotFound,
    MetadataUnavailable,
    NotCompacted,
    OffsetNotIndexed,
)
from jetstream.errors.nats_server import (
    NatsServerNotFound,
    NatsServerStartFailed,
)
from jetstream.errors.protocol import (
    FrameError,
    MethodNotAllowed,
    ProtocolError,
    RemoteError,
    UnknownRoute,
    UnsupportedVersion,
)
from jetstream.errors.security import (
    InsecureListener,
    InvalidAcl,
    NotAuthorized,
    TlsCertExpired,
    TlsCertNotYetValid,
    TlsConfigError,
    TlsFileUnreadable,
    TlsKeyMismatch,
    TooManyConnections,
    TooManyInFlight,
    Unauthenticated,
)
from jetstream.errors.spark import (
    DataLoss,
    InvalidSparkOption,
    SparkWriteFailed,
    UnwritableSchema,
)
from jetstream.errors.storage import (
    BatchTooLarge,
    CorruptFragment,
    CorruptRecord,
    DiskFull,
    FragmentStoreUnavailable,
    InvalidBatch,
    LogClosed,
    OffsetOutOfRange,
    RangeLost,
    RangeRepairing,
    RecordTooLarge,
    SegmentsChanged,
    StaleLeaderEpoch,
    StorageError,
)
from jetstream.errors.streams import (
    FencedLeaderEpoch,
    FetchSessionNotFound,
    InvalidFetchSessionEpoch,
    InvalidStreamConfig,
    NotEnoughReplicas,
    NotLeader,
    StreamExists,
    UnknownPartition,
    UnknownStream,
)

__all__ = [
    "AckTimeout",
    "BatchTooLarge",
    "BrokerUnavailable",
    "CorruptFragment",
    "CorruptRecord",
    "DataLoss",
    "DatastreamExists",
    "DiskFull",
    "DuplicateSequence",
    "ExpectationFailed",
    "FencedLeaderEpoch",
    "FencedMember",
    "FetchSessionNotFound",
    "FragmentStoreUnavailable",
    "FrameError",
    "GroupFull",
    "GroupNotEmpty",
    "InsecureListener",
    "InvalidAcl",
    "InvalidBatch",
    "InvalidConfig",
    "InvalidDatastreamConfig",
    "InvalidFetchSessionEpoch",
    "InvalidSparkOption",
    "InvalidStreamConfig",
    "JetstreamError",
    "KeyNotFound",
    "KeyNotTracked",
    "KeyOffsetMismatch",
    "LogClosed",
    "MetadataUnavailable",
    "MethodNotAllowed",
    "NatsServerNotFound",
    "NatsServerStartFailed",
    "NoCommittedOffset",
    "NoStreamForSubject",
    "NotAuthorized",
    "NotCompacted",
    "NotCoordinator",
    "NotEnoughReplicas",
    "NotLeader",
    "OffsetBehindCommitted",
    "OffsetMismatch",
    "OffsetNotIndexed",
    "OffsetOutOfRange",
    "OutOfOrderSequence",
    "PartitionNotAssigned",
    "ProducerFenced",
    "ProtectedStream",
    "ProtocolError",
    "RangeLost",
    "RangeRepairing",
    "RecordTooLarge",
    "RegisterMismatch",
    "RemoteError",
    "SegmentsChanged",
    "SparkWriteFailed",
    "StaleLeaderEpoch",
    "StaleMemberEpoch",
    "StorageError",
    "StreamExists",
    "TlsCertExpired",
    "TlsCertNotYetValid",
    "TlsConfigError",
    "TlsFileUnreadable",
    "TlsKeyMismatch",
    "TooManyConnections",
    "TooManyGroups",
    "TooManyInFlight",
    "Unauthenticated",
    "UnknownConnector",
    "UnknownDatastream",
    "UnknownMemberId",
    "UnknownPartition",
    "UnknownRoute",
    "UnknownStream",
    "UnsupportedVersion",
    "UnwritableSchema",
]
