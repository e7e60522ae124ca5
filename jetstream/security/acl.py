"""Access control lists: may principal P do operation O on resource R, given the entries?

Theory of operation: pure (no IO, no clock). An `AclEntry` allows or denies one principal
(or `*`, every authenticated principal) one operation (or `all`) on the resources of one
type (`stream`, `group`, `cluster`) that its pattern matches: a literal name, a prefix
ending in `*` (`orders-*`), or `*` alone (every resource of the type). `decide` answers:

1. the broker principal (`__broker`, brokers authenticating to each other) may do anything;
2. nobody else may write, create, delete or alter an internal stream (named `__*`);
3. a super user (the broker's `super_users` setting) may do anything else;
4. a matching deny entry refuses (deny wins over allow);
5. a matching allow entry allows; an allow of read, write, create, delete, alter or group on a
   resource implies describe on it (Kafka's rule);
6. otherwise the answer is no (default deny).

The entries live in the replicated metadata (jetstream.raft_meta.fsm: AddAcls, RemoveAcls),
so every broker decides from the same entries. `DecisionCache` remembers decisions until
the entries change (their version moves), so a request pays a dict lookup.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from jetstream.errors import InvalidAcl

#: Operations an entry may name; `all` matches every one of them.
OPERATIONS = ("read", "write", "create", "delete", "alter", "describe", "group",
              "cluster_admin")
ALL = "all"
RESOURCE_TYPES = ("stream", "group", "cluster")
PERMISSIONS = ("allow", "deny")
#: The principal brokers authenticate as when they call each other.
BROKER_PRINCIPAL = "__broker"
#: An entry's principal that matches every authenticated principal.
ANY_PRINCIPAL = "*"
#: The name of the one `cluster` resource.
CLUSTER = "cluster"
#: Operations an allow entry grants describe with (on the same resource).
IMPLY_DESCRIBE = frozenset({"read", "write", "create", "delete", "alter", "group"})
#: Operations only brokers may do on an internal (`__*`) stream.
INTERNAL_WRITES = frozenset({"write", "create", "delete", "alter"})
#: Longest principal and pattern; most entries the cluster holds; most in one command.
PRINCIPAL_CHARS_MAX = 256
PATTERN_CHARS_MAX = 256
ACL_ENTRIES_MAX = 10_000
ACL_BATCH_MAX = 1_000
#: Decisions a DecisionCache remembers before it starts over.
DECISIONS_CACHED_MAX = 65_536


@dataclass(frozen=True, slots=True, order=True)
class AclEntry:
    principal: str
    permission: str
    operation: str
    resource_type: str
    pattern: str

    def __post_init__(self) -> None:
        _check_text("principal", self.principal, PRINCIPAL_CHARS_MAX)
        _check_text("pattern", self.pattern, PATTERN_CHARS_MAX)
        _check_choice("permission", self.permission, PERMISSIONS)
        _check_choice("operation", self.operation, (*OPERATIONS, ALL))
        _check_choice("resource_type", self.resource_type, RESOURCE_TYPES)
        if "*" in self.pattern[:-1]:
            raise InvalidAcl(f"pattern {self.pattern!r}: '*' may only end it (a prefix)",
                             field="pattern")
        if self.principal == BROKER_PRINCIPAL:
            raise InvalidAcl(f"{BROKER_PRINCIPAL} is the brokers' own principal: it needs "
                             "no entries", field="principal")

    def matches(self, principal: str, operation: str, resource_type: str, name: str) -> bool:
        if self.resource_type != resource_type:
            return False
        if self.principal not in (principal, ANY_PRINCIPAL):
            return False
        if not pattern_matches(self.pattern, name):
            return False
        return self.operation in (operation, ALL) or (
            operation == "describe" and self.permission == "allow"
            and self.operation in IMPLY_DESCRIBE)

    def to_dict(self) -> dict[str, str]:
        return {"principal": self.principal, "permission": self.permission,
                "operation": self.operation, "resource_type": self.resource_type,
                "pattern": self.pattern}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AclEntry:
        """An entry from its plain form; InvalidAcl names the field at fault."""
        if not isinstance(data, Mapping):
            raise InvalidAcl("an ACL entry must be a map", field="acl")
        values = {}
        for name in ("principal", "permission", "operation", "resource_type", "pattern"):
            if name not in data:
                raise InvalidAcl(f"an ACL entry needs {name}", field=name)
            values[name] = data[name]
        return cls(**values)

    def __str__(self) -> str:
        return (f"{self.permission} {self.principal} {self.operation} "
                f"{self.resource_type}:{self.pattern}")


def pattern_matches(pattern: str, name: str) -> bool:
    """`name` is the literal `pattern`, or starts with it less its final `*`."""
    if pattern.endswith("*"):
        return name.startswith(pattern[:-1])
    return name == pattern


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    #: Why, for logs and error messages: "super user", "allowed by <entry>", ...
    reason: str


def decide(principal: str, operation: str, resource_type: str, name: str,
           entries: Iterable[AclEntry], super_users: frozenset[str]) -> Decision:
    """May `principal` do `operation` on the `resource_type` named `name`?"""
    assert operation in OPERATIONS and resource_type in RESOURCE_TYPES, (operation,
                                                                          resource_type)
    if principal == BROKER_PRINCIPAL:
        return Decision(True, "broker")
    if resource_type == "stream" and name.startswith("__") and operation in INTERNAL_WRITES:
        return Decision(False, "internal streams are written by brokers only")
    if principal in super_users:
        return Decision(True, "super user")
    allowed_by: AclEntry | None = None
    for entry in entries:
        if entry.matches(principal, operation, resource_type, name):
            if entry.permission == "deny":
                return Decision(False, f"denied by ({entry})")
            allowed_by = allowed_by or entry
    if allowed_by is not None:
        return Decision(True, f"allowed by ({allowed_by})")
    return Decision(False, "no entry allows it")


class DecisionCache:
    """`decide`, remembered per (principal, operation, resource) until the entries' version
    changes; at most DECISIONS_CACHED_MAX decisions (then it starts over)."""

    def __init__(self, super_users: frozenset[str]) -> None:
        self.super_users = super_users
        self._version = -1
        self._decisions: dict[tuple[str, str, str, str], Decision] = {}

    def decide(self, principal: str, operation: str, resource_type: str, name: str,
               entries: Iterable[AclEntry], version: int) -> Decision:
        if version != self._version or len(self._decisions) >= DECISIONS_CACHED_MAX:
            self._decisions.clear()
            self._version = version
        key = (principal, operation, resource_type, name)
        decision = self._decisions.get(key)
        if decision is None:
            decision = self._decisions[key] = decide(principal, operation, resource_type,
                                                     name, entries, self.super_users)
        return decision


def _check_text(name: str, value: object, chars_max: int) -> None:
    if not isinstance(value, str) or not value or len(value) > chars_max \
            or not value.isprintable():
        raise InvalidAcl(f"{name} must be printable text of 1..{chars_max} characters, got "
                         f"{value!r}", field=name)


def _check_choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise InvalidAcl(f"{name} must be one of {list(choices)}, got {value!r}", field=name)
