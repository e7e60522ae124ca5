"""The socket API's messages, in one namespace: `from jetstream.protocol import messages as m`.

Theory of operation: each message is a frozen dataclass of its frame header's fields,
checked strictly when built (base.py, fields.py); each concern declares its own messages in
a module of its own, with the table of its ops' headers:

    reads.py        FETCH, OFFSET_FOR_TIMESTAMP, LIST_SEGMENTS
    admin.py        METADATA, CREATE_STREAM, DELETE_STREAM, LIST_STREAMS
    replication.py  END_OFFSET_FOR_EPOCH, REPORT_LEADER_FAILURE
    offsets.py      COMMIT_OFFSET, FETCH_OFFSET, RESET_OFFSETS, DELETE_GROUP
    groups.py       FIND_COORDINATOR, GROUP_HEARTBEAT, LIST_GROUPS, DESCRIBE_GROUP
    kv.py           GET, KEYS
    integrity.py    REPLICA_RANGE, SCRUB
    replica_fetch.py REPLICA_FETCH (fetch sessions between brokers)
    auth.py         AUTHENTICATE, ACL_LIST, ACL_ADD, ACL_REMOVE

codec.py registers them by op and encodes and decodes frames of them; wire_errors.py carries
errors (error frames, error acks) across. This module only re-exports their public names,
so callers write `m.FetchRequest`, `m.decode_response` and `m.OFFSET_MAX` whichever module
defines them; it defines nothing itself. Add a message type in its concern's module and
name it here.
"""

from jetstream.protocol.admin import (
    CreateStreamRequest,
    DeleteStreamRequest,
    ListStreamsRequest,
    ListStreamsResponse,
    MetadataRequest,
    MetadataResponse,
    UpdateStreamRequest,
    UpdateStreamResponse,
)
from jetstream.protocol.auth import (
    AclAddRequest,
    AclChangeResponse,
    AclListRequest,
    AclListResponse,
    AclRemoveRequest,
    AuthenticateRequest,
    AuthenticateResponse,
    Credentials,
)
from jetstream.protocol.base import EmptyResponse, Message, Request, Response
from jetstream.protocol.codec import (
    REQUEST_TYPES,
    RESPONSE_TYPES,
    decode_request,
    decode_response,
    encode_error,
    encode_request,
    encode_response,
    expect_response,
)
from jetstream.protocol.datastreams import DatastreamRequest, DatastreamResponse
from jetstream.protocol.fields import (
    BROKER_ID_MAX,
    EPOCH_MAX,
    ERROR_CODE_CHARS_MAX,
    FETCH_BYTES_MAX,
    FETCH_WAIT_MS_MAX,
    HOST_CHARS_MAX,
    METADATA_STREAMS_MAX,
    OFFSET_MAX,
    OFFSET_METADATA_CHARS_MAX,
    PARTITION_MAX,
    PORT_MAX,
)
from jetstream.protocol.fragments import FragmentsRequest, FragmentsResponse
from jetstream.protocol.groups import (
    DescribeGroupRequest,
    DescribeGroupResponse,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    GroupHeartbeatRequest,
    GroupHeartbeatResponse,
    ListGroupsRequest,
    ListGroupsResponse,
)
from jetstream.protocol.integrity import (
    ReplicaRangeRequest,
    ReplicaRangeResponse,
    ScrubRequest,
    ScrubResponse,
)
from jetstream.protocol.kv import GetRequest, GetResponse, KeysRequest, KeysResponse
from jetstream.protocol.mirror import MirrorAppendRequest, MirrorAppendResponse
from jetstream.protocol.offsets import (
    RESET_TARGETS,
    CommitOffsetRequest,
    CommitOffsetResponse,
    DeleteGroupRequest,
    DeleteGroupResponse,
    FetchOffsetRequest,
    FetchOffsetResponse,
    ResetOffsetsRequest,
)
from jetstream.protocol.reads import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    SEGMENTS_MAX,
    FetchRequest,
    FetchResponse,
    Isolation,
    ListSegmentsRequest,
    ListSegmentsResponse,
    OffsetForTimestampRequest,
    OffsetForTimestampResponse,
)
from jetstream.protocol.registers import RegistersRequest, RegistersResponse
from jetstream.protocol.replica_fetch import (
    REPLICA_FETCH_ANSWERS_MAX,
    REPLICA_FETCH_CHANGES_MAX,
    PartitionAnswer,
    ReplicaFetchRequest,
    ReplicaFetchResponse,
    SessionPartition,
    decode_answers,
)
from jetstream.protocol.replication import (
    EndOffsetForEpochRequest,
    EndOffsetForEpochResponse,
    ReportLeaderFailureRequest,
)
from jetstream.protocol.wire_errors import error_from_header, error_header, error_registry

__all__ = [
    "BROKER_ID_MAX",
    "EARLIEST_TIMESTAMP",
    "EPOCH_MAX",
    "ERROR_CODE_CHARS_MAX",
    "FETCH_BYTES_MAX",
    "FETCH_WAIT_MS_MAX",
    "HOST_CHARS_MAX",
    "LATEST_TIMESTAMP",
    "METADATA_STREAMS_MAX",
    "OFFSET_MAX",
    "OFFSET_METADATA_CHARS_MAX",
    "PARTITION_MAX",
    "PORT_MAX",
    "REPLICA_FETCH_ANSWERS_MAX",
    "REPLICA_FETCH_CHANGES_MAX",
    "REQUEST_TYPES",
    "RESET_TARGETS",
    "RESPONSE_TYPES",
    "SEGMENTS_MAX",
    "AclAddRequest",
    "AclChangeResponse",
    "AclListRequest",
    "AclListResponse",
    "AclRemoveRequest",
    "AuthenticateRequest",
    "AuthenticateResponse",
    "CommitOffsetRequest",
    "CommitOffsetResponse",
    "CreateStreamRequest",
    "Credentials",
    "DatastreamRequest",
    "DatastreamResponse",
    "DeleteGroupRequest",
    "DeleteGroupResponse",
    "DeleteStreamRequest",
    "DescribeGroupRequest",
    "DescribeGroupResponse",
    "EmptyResponse",
    "EndOffsetForEpochRequest",
    "EndOffsetForEpochResponse",
    "FetchOffsetRequest",
    "FetchOffsetResponse",
    "FetchRequest",
    "FetchResponse",
    "FindCoordinatorRequest",
    "FindCoordinatorResponse",
    "FragmentsRequest",
    "FragmentsResponse",
    "GetRequest",
    "GetResponse",
    "GroupHeartbeatRequest",
    "GroupHeartbeatResponse",
    "Isolation",
    "KeysRequest",
    "KeysResponse",
    "ListGroupsRequest",
    "ListGroupsResponse",
    "ListSegmentsRequest",
    "ListSegmentsResponse",
    "ListStreamsRequest",
    "ListStreamsResponse",
    "Message",
    "MetadataRequest",
    "MetadataResponse",
    "MirrorAppendRequest",
    "MirrorAppendResponse",
    "OffsetForTimestampRequest",
    "OffsetForTimestampResponse",
    "PartitionAnswer",
    "RegistersRequest",
    "RegistersResponse",
    "ReplicaFetchRequest",
    "ReplicaFetchResponse",
    "ReplicaRangeRequest",
    "ReplicaRangeResponse",
    "ReportLeaderFailureRequest",
    "Request",
    "ResetOffsetsRequest",
    "Response",
    "ScrubRequest",
    "ScrubResponse",
    "SessionPartition",
    "UpdateStreamRequest",
    "UpdateStreamResponse",
    "decode_answers",
    "decode_request",
    "decode_response",
    "encode_error",
    "encode_request",
    "encode_response",
    "error_from_header",
    "error_header",
    "error_registry",
    "expect_response",
]
