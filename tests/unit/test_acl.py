"""The pure ACL decision (jetstream.security.acl), its metadata commands and the request
table of the gatekeeper: table tests and hypothesis properties."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jetstream.errors import InvalidAcl
from jetstream.protocol import messages as m
from jetstream.raft_meta.codec import decode_command, encode_command
from jetstream.raft_meta.fsm import AddAcls, MetadataState, RemoveAcls
from jetstream.security.acl import (
    ALL,
    BROKER_PRINCIPAL,
    IMPLY_DESCRIBE,
    OPERATIONS,
    RESOURCE_TYPES,
    AclEntry,
    DecisionCache,
    decide,
    pattern_matches,
)
from jetstream.server.gatekeeper import required

NONE: frozenset[str] = frozenset()
principals = st.sampled_from(["alice", "bob", "carol"])
operations = st.sampled_from(OPERATIONS)
resource_types = st.sampled_from(RESOURCE_TYPES)
names = st.sampled_from(["orders", "orders-eu", "order", "payroll", "__offsets", "cluster"])
patterns = st.sampled_from(["orders", "orders*", "order*", "*", "payroll", "__*", "cluster"])
entries = st.builds(AclEntry, st.sampled_from(["alice", "bob", "*"]),
                    st.sampled_from(["allow", "deny"]), st.sampled_from([*OPERATIONS, ALL]),
                    resource_types, patterns)


def allow(principal: str, operation: str, pattern: str, kind: str = "stream") -> AclEntry:
    return AclEntry(principal, "allow", operation, kind, pattern)


def deny(principal: str, operation: str, pattern: str, kind: str = "stream") -> AclEntry:
    return AclEntry(principal, "deny", operation, kind, pattern)


def test_table() -> None:
    acls = [allow("alice", "read", "orders*"), deny("alice", "read", "orders-secret"),
            allow("*", "describe", "public"), allow("bob", ALL, "bobs-*")]
    cases = [
        ("alice", "read", "orders-eu", True),
        ("alice", "describe", "orders-eu", True),  # implied by read
        ("alice", "write", "orders-eu", False),
        ("alice", "read", "orders-secret", False),  # deny wins
        ("alice", "read", "payroll", False),  # default deny
        ("carol", "describe", "public", True),  # any principal
        ("carol", "read", "public", False),
        ("bob", "delete", "bobs-x", True),
        ("bob", "write", "__offsets", False),  # internal: brokers only
        (BROKER_PRINCIPAL, "write", "__offsets", True),
    ]
    for principal, operation, name, expected in cases:
        assert decide(principal, operation, "stream", name, acls, NONE).allowed is expected, (
            principal, operation, name)
    assert decide("root", "delete", "stream", "x", [], frozenset({"root"})).allowed
    assert not decide("root", "write", "stream", "__offsets", [], frozenset({"root"})).allowed


def test_entries_are_checked() -> None:
    with pytest.raises(InvalidAcl, match="operation"):
        AclEntry("a", "allow", "fly", "stream", "x")
    with pytest.raises(InvalidAcl, match="prefix"):
        AclEntry("a", "allow", "read", "stream", "a*b")
    with pytest.raises(InvalidAcl, match="principal"):
        AclEntry(BROKER_PRINCIPAL, "allow", "read", "stream", "x")
    with pytest.raises(InvalidAcl, match="resource_type"):
        AclEntry.from_dict({"principal": "a", "permission": "allow", "operation": "read",
                            "resource_type": "topic", "pattern": "x"})


@given(st.lists(entries, max_size=8), principals, operations, resource_types, names)
def test_deny_wins_and_default_is_deny(acls: list[AclEntry], principal: str, operation: str,
                                       resource_type: str, name: str) -> None:
    decision = decide(principal, operation, resource_type, name, acls, NONE)
    matching = [e for e in acls if e.matches(principal, operation, resource_type, name)]
    internal = resource_type == "stream" and name.startswith("__") and operation in (
        "write", "create", "delete", "alter")
    expected = not internal and bool(matching) and all(e.permission == "allow"
                                                        for e in matching)
    assert decision.allowed is expected
    # Adding a deny for exactly this never allows more; an allow never allows less.
    exact_deny = AclEntry(principal, "deny", operation, resource_type, name)
    assert not decide(principal, operation, resource_type, name, [*acls, exact_deny],
                      NONE).allowed
    if decision.allowed:
        extra = AclEntry(principal, "allow", ALL, resource_type, "*")
        assert decide(principal, operation, resource_type, name, [*acls, extra], NONE).allowed


@given(st.lists(entries, max_size=8), principals, resource_types, names)
def test_an_allowed_operation_implies_describe_unless_denied(
        acls: list[AclEntry], principal: str, resource_type: str, name: str) -> None:
    for operation in IMPLY_DESCRIBE:
        if decide(principal, operation, resource_type, name, acls, NONE).allowed:
            denied = any(e.permission == "deny" and e.matches(principal, "describe",
                                                              resource_type, name)
                         for e in acls)
            assert decide(principal, "describe", resource_type, name, acls,
                          NONE).allowed is not denied


@given(st.lists(entries, max_size=8), principals, operations, resource_types, names)
def test_order_of_entries_does_not_matter(acls: list[AclEntry], principal: str,
                                          operation: str, resource_type: str,
                                          name: str) -> None:
    forwards = decide(principal, operation, resource_type, name, acls, NONE).allowed
    backwards = decide(principal, operation, resource_type, name, acls[::-1], NONE).allowed
    assert forwards is backwards


@given(st.text(alphabet="ab*", max_size=4), st.text(alphabet="ab", max_size=4))
def test_patterns(pattern: str, name: str) -> None:
    if "*" in pattern[:-1]:
        return
    if pattern.endswith("*"):
        assert pattern_matches(pattern, name) is name.startswith(pattern[:-1])
    else:
        assert pattern_matches(pattern, name) is (pattern == name)


def test_the_cache_starts_over_when_the_entries_change() -> None:
    cache = DecisionCache(NONE)
    acls = [allow("alice", "read", "x")]
    assert cache.decide("alice", "read", "stream", "x", acls, 1).allowed
    assert cache.decide("alice", "read", "stream", "x", [], 1).allowed  # remembered
    assert not cache.decide("alice", "read", "stream", "x", [], 2).allowed


@given(st.lists(st.tuples(st.booleans(), st.lists(entries, min_size=1, max_size=3)),
                max_size=6))
def test_metadata_commands_replay_to_the_same_state(
        steps: list[tuple[bool, list[AclEntry]]]) -> None:
    """Every broker applying the same commands holds the same ACLs; a dump restores them."""
    one, other = MetadataState(), MetadataState()
    for adding, batch in steps:
        command = AddAcls(tuple(batch)) if adding else RemoveAcls(tuple(batch))
        one.apply(command)
        other.apply(decode_command(encode_command(command)))
    assert one.acls == other.acls and one.acl_version == other.acl_version
    restored = MetadataState.from_dict(one.to_dict())
    assert restored.acls == one.acls and restored.acl_version == one.acl_version


def test_requests_name_what_they_need() -> None:
    assert required(m.FetchRequest("s", 0, 0, 1024, 0)) == [("read", "stream", "s")]
    assert required(m.FetchRequest("s", 0, 0, 1024, 0, replica_id=2)) == [
        ("cluster_admin", "cluster", "cluster")]
    assert required(m.DeleteStreamRequest("s")) == [("delete", "stream", "s")]
    assert required(m.RegistersRequest("s", 0)) == [("read", "stream", "s")]
    assert required(m.DatastreamRequest("list")) == [("describe", "cluster", "cluster")]
    assert required(m.DatastreamRequest("pause", "d")) == [
        ("cluster_admin", "cluster", "cluster")]
    assert required(m.DatastreamRequest("batch_get", body={"names": ["d"]})) == [
        ("describe", "cluster", "cluster")]
    for action in ("update", "batch_update"):
        assert required(m.DatastreamRequest(action, "d")) == [
            ("cluster_admin", "cluster", "cluster")]
    assert required(m.MetadataRequest(None)) == []  # filtered, not refused
    assert required(m.MetadataRequest(["a"])) == [("describe", "stream", "a")]
    commit = m.CommitOffsetRequest("g", [{"stream": "s", "partition": 0, "offset": 1}])
    assert required(commit) == [("group", "group", "g"), ("read", "stream", "s")]
    assert required(m.AclAddRequest([])) == [("cluster_admin", "cluster", "cluster")]
