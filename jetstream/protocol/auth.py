"""Messages of authentication and of access control lists.

Theory of operation: with the broker's `authentication` on, a connection may send only
HELLO and AUTHENTICATE until it has authenticated (or its client certificate named its
principal); anything else is answered UNAUTHENTICATED. AUTHENTICATE may be sent again: the
connection then acts as the new principal. ACL_LIST, ACL_ADD and ACL_REMOVE read and change
the access control lists (jetstream.security.acl), which live in the replicated metadata;
changing them needs `cluster_admin` on the cluster.

    op            request header                            response header
    AUTHENTICATE  mechanism: PLAIN|TOKEN|BROKER, user,      principal
                  password
    ACL_LIST      principal: str|nil, resource_type|nil     acls: [entry], version
    ACL_ADD       acls: [entry]                             changed: int (entries new)
    ACL_REMOVE    acls: [entry]                             changed: int (entries removed)
    entry = {principal, permission, operation, resource_type, pattern}
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from jetstream.protocol.base import Request, Response
from jetstream.protocol.fields import as_list, as_map, bad, check_int, check_str
from jetstream.protocol.frames import Op

MECHANISMS = ("PLAIN", "TOKEN", "BROKER")
USER_CHARS_MAX = 256
PASSWORD_CHARS_MAX = 1024
#: Most entries one ACL_ADD or ACL_REMOVE carries, and one ACL_LIST answers.
ACL_REQUEST_ENTRIES_MAX = 1_000
ACL_LIST_ENTRIES_MAX = 10_000


@dataclass(frozen=True, slots=True)
class Credentials:
    """What a client authenticates with: a user and password (mechanism PLAIN), a token
    `user:secret` (TOKEN, the same check), or the brokers' own token (BROKER)."""

    user: str
    password: str
    mechanism: str = "PLAIN"

    def __repr__(self) -> str:  # never print a password
        return f"Credentials(user={self.user!r}, mechanism={self.mechanism!r})"

    @classmethod
    def from_token(cls, token: str) -> Credentials:
        """`user:secret` as credentials; ValueError when it is not that."""
        user, sep, secret = token.partition(":")
        if not sep or not user or not secret:
            raise ValueError("a token is 'user:secret'")
        return cls(user, secret, "TOKEN")


@dataclass(frozen=True, slots=True)
class AuthenticateResponse(Response):
    principal: str

    def __post_init__(self) -> None:
        check_str("principal", self.principal, USER_CHARS_MAX)


@dataclass(frozen=True, slots=True, repr=False)
class AuthenticateRequest(Request):
    op: ClassVar[Op] = Op.AUTHENTICATE
    response_type: ClassVar[type[Response]] = AuthenticateResponse
    user: str
    password: str
    mechanism: str = "PLAIN"

    def __post_init__(self) -> None:
        if self.mechanism not in MECHANISMS:
            raise bad("mechanism", f"must be one of {list(MECHANISMS)}")
        check_str("user", self.user, USER_CHARS_MAX)
        check_str("password", self.password, PASSWORD_CHARS_MAX)

    def __repr__(self) -> str:  # never print a password
        return f"AuthenticateRequest(user={self.user!r}, mechanism={self.mechanism!r})"

    @property
    def credentials(self) -> Credentials:
        return Credentials(self.user, self.password, self.mechanism)


def _check_entries(name: str, entries: object, entries_max: int) -> None:
    items = as_list(name, entries)
    if len(items) > entries_max:
        raise bad(name, f"holds more than {entries_max} entries")
    for i, entry in enumerate(items):
        entry = as_map(f"{name}[{i}]", entry)
        for key in ("principal", "permission", "operation", "resource_type", "pattern"):
            if not isinstance(entry.get(key), str):
                raise bad(f"{name}[{i}].{key}", "must be a string")


@dataclass(frozen=True, slots=True)
class AclListResponse(Response):
    acls: list[dict[str, Any]]
    version: int = 0

    def __post_init__(self) -> None:
        _check_entries("acls", self.acls, ACL_LIST_ENTRIES_MAX)
        check_int("version", self.version, 0, 2**63 - 1)


@dataclass(frozen=True, slots=True)
class AclListRequest(Request):
    """The entries, all or those of one principal and/or resource type."""

    op: ClassVar[Op] = Op.ACL_LIST
    response_type: ClassVar[type[Response]] = AclListResponse
    principal: str | None = None
    resource_type: str | None = None

    def __post_init__(self) -> None:
        if self.principal is not None:
            check_str("principal", self.principal, USER_CHARS_MAX)
        if self.resource_type is not None:
            check_str("resource_type", self.resource_type, 16)


@dataclass(frozen=True, slots=True)
class AclChangeResponse(Response):
    changed: int

    def __post_init__(self) -> None:
        check_int("changed", self.changed, 0, ACL_LIST_ENTRIES_MAX)


@dataclass(frozen=True, slots=True)
class AclAddRequest(Request):
    op: ClassVar[Op] = Op.ACL_ADD
    response_type: ClassVar[type[Response]] = AclChangeResponse
    acls: list[dict[str, Any]]

    def __post_init__(self) -> None:
        _check_entries("acls", self.acls, ACL_REQUEST_ENTRIES_MAX)


@dataclass(frozen=True, slots=True)
class AclRemoveRequest(Request):
    op: ClassVar[Op] = Op.ACL_REMOVE
    response_type: ClassVar[type[Response]] = AclChangeResponse
    acls: list[dict[str, Any]]

    def __post_init__(self) -> None:
        _check_entries("acls", self.acls, ACL_REQUEST_ENTRIES_MAX)


#: The requests of this module, for the codec's registry.
REQUESTS: tuple[type[Request], ...] = (AuthenticateRequest, AclListRequest, AclAddRequest,
                                       AclRemoveRequest)
