"""The broker's gatekeeper: authentication, authorization and per-principal limits.

Theory of operation: the socket API and the HTTP API ask one `Gatekeeper` three things.
- Who is this? `authenticate(credentials)` (argon2 users, the broker token;
  jetstream.security.auth) and `certificate_principal` (a verified client certificate's CN).
  Failures are counted (`jetstream_broker_authentication_failures_total`) and logged with
  the user name, never the password.
- May they? `check(principal, request)`: the (operation, resource) pairs a request needs
  (`required`, a table by request type) are each decided from the ACL entries of the
  replicated metadata (jetstream.security.acl). A refusal raises NotAuthorized naming the
  operation and resource, counted (`jetstream_broker_authorization_refusals_total`) and
  logged (principal, operation, resource). Listing requests (METADATA, LIST_STREAMS) are
  not refused: `visible` filters their answers to the streams the principal may describe.
- Has it room? `admit(principal)` counts each principal's requests in flight on this broker
  (every connection of both APIs together) and refuses past `principal_requests_max`
  (TOO_MANY_IN_FLIGHT); brokers are not limited.
Without `authentication` every connection is the anonymous principal and nothing is checked;
without `authorization` an authenticated principal may do anything.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from jetstream.errors import NotAuthorized, TooManyInFlight, Unauthenticated
from jetstream.protocol import messages as m
from jetstream.raft_meta.fsm import MetadataState
from jetstream.security.acl import BROKER_PRINCIPAL, CLUSTER, DecisionCache
from jetstream.security.auth import Authenticator, broker_credentials, load_users
from jetstream.server.config import BrokerConfig
from jetstream.server.metrics import BrokerMetrics

log = logging.getLogger(__name__)

#: The principal of every connection when authentication is off.
ANONYMOUS = "ANONYMOUS"

#: (operation, resource_type, resource name)
Need = tuple[str, str, str]
_CLUSTER_ADMIN: Need = ("cluster_admin", "cluster", CLUSTER)
#: Datastream actions that only read (the rest change the cluster's pipes).
DATASTREAM_READS = frozenset({"get", "list", "diagnostics", "tasks", "batch_get"})


class HasState(Protocol):
    @property
    def state(self) -> MetadataState: ...


def required(request: m.Request) -> list[Need]:
    """What `request` needs, each (operation, resource type, name); [] for requests every
    authenticated principal may send (listings are filtered instead)."""
    match request:
        case m.FetchRequest(replica_id=replica) if replica >= 0:
            return [_CLUSTER_ADMIN]  # a follower's fetch: brokers only
        case m.FetchRequest(stream=s) | m.OffsetForTimestampRequest(stream=s) \
                | m.ListSegmentsRequest(stream=s) | m.GetRequest(stream=s) \
                | m.KeysRequest(stream=s) | m.RegistersRequest(stream=s):
            return [("read", "stream", s)]
        case m.EndOffsetForEpochRequest() | m.ReplicaFetchRequest() | m.ReplicaRangeRequest() \
                | m.ReportLeaderFailureRequest() | m.ScrubRequest() | m.AclAddRequest() \
                | m.AclRemoveRequest():
            return [_CLUSTER_ADMIN]
        case m.FragmentsRequest(stream=s, prune=prune):
            return [("alter" if prune else "describe", "stream", s)]
        case m.CreateStreamRequest(config=config):
            return [("create", "stream", str(config.get("name", "")))]
        case m.DeleteStreamRequest(name=s):
            return [("delete", "stream", s)]
        case m.UpdateStreamRequest(name=s):
            return [("alter", "stream", s)]
        case m.FindCoordinatorRequest(group=g) | m.DescribeGroupRequest(group=g):
            return [("describe", "group", g)]
        case m.GroupHeartbeatRequest(group=g, streams=streams):
            return [("group", "group", g), *(("read", "stream", s) for s in streams or ())]
        case m.CommitOffsetRequest(group=g, offsets=offsets) \
                | m.ResetOffsetsRequest(group=g, offsets=offsets):
            named = dict.fromkeys(str(o["stream"]) for o in offsets)
            return [("group", "group", g), *(("read", "stream", s) for s in named)]
        case m.FetchOffsetRequest(group=g):
            return [("group", "group", g)]
        case m.DeleteGroupRequest(group=g):
            return [("delete", "group", g)]
        case m.MetadataRequest(streams=named) if named:
            # Named streams: refused (whether they exist or not) unless describable; a
            # listing of every stream is filtered instead.
            return [("describe", "stream", s) for s in named]
        case m.ListGroupsRequest() | m.AclListRequest():
            return [("describe", "cluster", CLUSTER)]
        case m.MirrorAppendRequest(stream=s):
            return [("write", "stream", s)]
        case m.DatastreamRequest(action=action):
            # Datastreams are the cluster's pipes: managing them is cluster administration.
            return [("describe", "cluster", CLUSTER) if action in DATASTREAM_READS
                    else _CLUSTER_ADMIN]
    return []


class Gatekeeper:
    def __init__(self, config: BrokerConfig, metadata: HasState,
                 metrics: BrokerMetrics) -> None:
        self.authentication = config.authentication
        self.authorization = config.authorization
        self._metadata = metadata
        self._metrics = metrics
        self._requests_max = config.principal_requests_max
        self._in_flight: dict[str, int] = {}
        self._decisions = DecisionCache(config.super_user_set)
        self._authenticator = Authenticator(
            load_users(config.users, config.users_file),
            config.metadata_password) if config.authentication else None

    # -- authentication ---------------------------------------------------------------------

    async def authenticate(self, credentials: m.Credentials, where: str) -> str:
        """The principal `credentials` prove; Unauthenticated (counted, logged) otherwise."""
        if self._authenticator is None:
            return ANONYMOUS
        try:
            return await self._authenticator.authenticate(credentials)
        except Unauthenticated:
            self._metrics.authentication_failures_total += 1
            log.warning("authentication refused (%s): user %r, mechanism %s", where,
                        credentials.user, credentials.mechanism)
            raise

    # -- authorization ----------------------------------------------------------------------

    def may_now(self, principal: str | None, request: m.Request) -> bool:
        """Whether `principal` may send `request` at once (authenticated, allowed, an
        in-flight slot free), asked without counting or logging a refusal: a caller that
        finds False sends the request the usual way, which refuses it."""
        if principal is None:
            return False
        if not all(self.allowed(principal, *need) for need in required(request)):
            return False
        return principal == BROKER_PRINCIPAL or not self.authentication or \
            self._in_flight.get(principal, 0) < self._requests_max

    def allowed(self, principal: str, operation: str, resource_type: str, name: str) -> bool:
        if not self.authorization:
            return True
        state = self._metadata.state
        return self._decisions.decide(principal, operation, resource_type, name,
                                      state.acls, state.acl_version).allowed

    def check(self, principal: str, request: m.Request) -> None:
        """Raise NotAuthorized (counted, logged) unless `principal` may send `request`."""
        if not self.authorization:
            return
        for operation, resource_type, name in required(request):
            self.check_one(principal, operation, resource_type, name)

    def check_one(self, principal: str, operation: str, resource_type: str,
                  name: str) -> None:
        if not self.allowed(principal, operation, resource_type, name):
            self._metrics.authorization_refusals_total += 1
            log.warning("not authorized: principal %r, operation %s, %s %r", principal,
                        operation, resource_type, name)
            raise NotAuthorized(principal, operation, resource_type, name)

    def visible(self, principal: str, streams: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The stream descriptions `principal` may describe."""
        if not self.authorization:
            return streams
        return [s for s in streams if self.allowed(principal, "describe", "stream", s["name"])]

    def filter(self, principal: str, response: m.Response) -> m.Response:
        """A listing's answer, with only the streams `principal` may describe."""
        if not self.authorization:
            return response
        if isinstance(response, m.MetadataResponse):
            return m.MetadataResponse(response.brokers, self.visible(principal, response.streams),
                                      response.metadata_leader)
        if isinstance(response, m.ListStreamsResponse):
            return m.ListStreamsResponse(self.visible(principal, response.streams))
        return response

    # -- limits -----------------------------------------------------------------------------

    @contextmanager
    def admit(self, principal: str) -> Iterator[None]:
        """Hold one of `principal`'s in-flight slots for the block; TooManyInFlight when it
        holds `principal_requests_max` already."""
        if principal == BROKER_PRINCIPAL or not self.authentication:
            yield
            return
        held = self._in_flight.get(principal, 0)
        if held >= self._requests_max:
            self._metrics.in_flight_refusals_total += 1
            raise TooManyInFlight(f"{principal!r} has {held} requests in flight (limit "
                                  f"{self._requests_max})", principal=principal,
                                  principal_requests_max=self._requests_max)
        self._in_flight[principal] = held + 1
        try:
            yield
        finally:
            left = self._in_flight[principal] - 1
            if left:
                self._in_flight[principal] = left
            else:
                del self._in_flight[principal]


def peer_credentials(config: BrokerConfig) -> m.Credentials | None:
    """What this broker authenticates with when it calls another broker (or itself): the
    broker token, when authentication is on."""
    if not config.authentication:
        return None
    return broker_credentials(config.metadata_password)
