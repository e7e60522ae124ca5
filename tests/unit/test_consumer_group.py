"""The consumer-group state machine against simulated members: joins, heartbeats (some of
whose answers are lost), leaves, crashes, pauses past the session (a zombie that wakes),
partition-count changes and coordinator failovers (restore from the last stored record).

The promises: no partition is ever consumed by two members at once (a member consumes what
its last answer allowed, while its lease — last heartbeat + session — lasts); what a member
consumes, the coordinator counts as held by it; a stale member cannot commit; once nothing
changes for a few rounds, every partition is consumed by exactly one member."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from jetstream.errors import (
    FencedMember,
    PartitionNotAssigned,
    StaleMemberEpoch,
    UnknownMemberId,
)
from jetstream.offsets.group import JOIN_EPOCH, LEAVE_EPOCH, Group, GroupState, Heartbeat
from jetstream.offsets.records import StreamPartition as SP

SESSION_MS = 10_000
NAMES = ["a", "b", "c", "d"]


def beat(member_id: str, epoch: int, owned: frozenset[SP] = frozenset(),
         streams: tuple[str, ...] = ("s",)) -> Heartbeat:
    return Heartbeat(member_id, epoch, streams, owned, SESSION_MS)


def test_join_heartbeat_commit_and_leave() -> None:
    group = Group("g")
    topology = {"s": 4}
    a = group.heartbeat(beat("", JOIN_EPOCH), 0, topology, "a")
    assert a.partitions == {SP("s", p) for p in range(4)} and a.member_epoch > 0
    b = group.heartbeat(beat("", JOIN_EPOCH), 1, topology, "b")
    assert b.partitions == frozenset()  # nothing free yet: a holds everything
    a2 = group.heartbeat(beat("a", a.member_epoch, a.partitions), 2, topology, "-")
    assert len(a2.partitions) == 2 and a2.member_epoch > a.member_epoch  # two are revoked
    revoked = a.partitions - a2.partitions
    some = next(iter(revoked))
    group.check_commit("a", a.member_epoch, some)  # a commits what it is giving up
    b_again = group.heartbeat(beat("b", b.member_epoch), 3, topology, "-")
    assert b_again.partitions == frozenset()  # still held by a until a confirms
    group.heartbeat(beat("a", a2.member_epoch, a2.partitions), 4, topology, "-")
    b2 = group.heartbeat(beat("b", b_again.member_epoch), 5, topology, "-")
    assert b2.partitions == revoked
    with pytest.raises(PartitionNotAssigned):
        group.check_commit("a", a2.member_epoch, some)
    group.check_commit("b", b.member_epoch, some)  # its previous epoch: a commit in flight
    with pytest.raises(StaleMemberEpoch):
        group.check_commit("b", b.member_epoch - 1, some)
    group.check_commit("b", b2.member_epoch, some)
    assert group.state is GroupState.STABLE
    left = group.heartbeat(beat("a", a2.member_epoch), 6, topology, "-")
    assert left.partitions == a2.partitions  # a keeps-alive; now it leaves:
    group.heartbeat(beat("a", LEAVE_EPOCH), 7, topology, "-")
    b3 = group.heartbeat(beat("b", b2.member_epoch, b2.partitions), 8, topology, "-")
    assert b3.partitions == {SP("s", p) for p in range(4)}


def test_an_expired_member_is_unknown_and_cannot_commit() -> None:
    group = Group("g")
    a = group.heartbeat(beat("", JOIN_EPOCH), 0, {"s": 2}, "a")
    assert group.expire(SESSION_MS + 1) == ["a"]
    with pytest.raises(UnknownMemberId):
        group.check_commit("a", a.member_epoch, SP("s", 0))
    with pytest.raises(UnknownMemberId):
        group.heartbeat(beat("a", a.member_epoch, a.partitions), SESSION_MS + 2, {"s": 2}, "-")
    group.check_commit("", -1, SP("s", 0))  # an empty group takes commits without a member


def test_a_wrong_epoch_is_fenced_and_a_commit_without_member_refused_while_members() -> None:
    group = Group("g")
    a = group.heartbeat(beat("", JOIN_EPOCH), 0, {"s": 2}, "a")
    with pytest.raises(FencedMember):
        group.heartbeat(beat("a", a.member_epoch + 5), 1, {"s": 2}, "-")
    with pytest.raises(UnknownMemberId):
        group.check_commit("", -1, SP("s", 0))


@dataclass
class Client:
    """A simulated member process."""

    name: str
    member_id: str = ""
    epoch: int = JOIN_EPOCH
    consuming: frozenset[SP] = frozenset()
    lease_until: int = -1
    crashed: bool = False
    paused: bool = False
    streams: tuple[str, ...] = ("s",)
    history: list[str] = field(default_factory=list)

    def effective(self, now: int) -> frozenset[SP]:
        """What it consumes now: its last answer's partitions, while its lease lasts."""
        if self.crashed or not self.member_id or now >= self.lease_until:
            return frozenset()
        return self.consuming

    def drop(self) -> None:
        self.member_id, self.epoch, self.consuming = "", JOIN_EPOCH, frozenset()


class GroupMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0
        self.topology = {"s": 4, "t": 2}
        self.group = Group("g")
        self.stored = self.group.stored()
        self.clients = {n: Client(n) for n in NAMES}
        self.ids = 0

    def persist(self) -> None:
        if self.group.dirty:  # the shell stores before answering
            self.stored = self.group.stored()
            self.group.dirty = False

    def send(self, client: Client, *, lose_answer: bool = False) -> None:
        if client.crashed or client.paused:
            return
        if client.member_id and self.now >= client.lease_until:
            client.drop()  # its lease ran out: it stopped consuming and must rejoin
        self.ids += 1
        try:
            answer = self.group.heartbeat(
                beat(client.member_id, client.epoch, client.effective(self.now),
                     client.streams), self.now, self.topology, f"m{self.ids}")
        except (UnknownMemberId, FencedMember):
            client.drop()
            return
        finally:
            self.persist()
        if lose_answer:
            return
        client.member_id, client.epoch = answer.member_id, answer.member_epoch
        client.consuming = answer.partitions
        client.lease_until = self.now + SESSION_MS

    @rule(name=st.sampled_from(NAMES), lose=st.booleans())
    def heartbeat(self, name: str, lose: bool) -> None:
        self.send(self.clients[name], lose_answer=lose)

    @rule(name=st.sampled_from(NAMES))
    def leave(self, name: str) -> None:
        client = self.clients[name]
        if client.member_id and not (client.crashed or client.paused):
            self.group.heartbeat(beat(client.member_id, LEAVE_EPOCH), self.now, self.topology,
                                 "-")
            self.persist()
            client.drop()

    @rule(name=st.sampled_from(NAMES))
    def crash(self, name: str) -> None:
        client = self.clients[name]
        client.crashed = True
        client.drop()

    @rule(name=st.sampled_from(NAMES))
    def restart(self, name: str) -> None:
        client = self.clients[name]
        client.crashed = client.paused = False

    @rule(name=st.sampled_from(NAMES))
    def pause(self, name: str) -> None:
        self.clients[name].paused = True

    @rule(name=st.sampled_from(NAMES), streams=st.sampled_from([("s",), ("t",), ("s", "t")]))
    def resubscribe(self, name: str, streams: tuple[str, ...]) -> None:
        self.clients[name].streams = streams

    @rule(ms=st.integers(1, 3 * SESSION_MS))
    def tick(self, ms: int) -> None:
        self.now += ms
        self.group.expire(self.now)
        self.persist()

    @rule(s=st.integers(0, 6), t=st.integers(0, 3))
    def repartition(self, s: int, t: int) -> None:
        self.topology = {"s": s, "t": t}
        self.group.refresh_topology(self.topology)
        self.persist()

    @rule()
    def failover(self) -> None:
        """A new coordinator loads the last stored record; releases it never stored are
        learnt again from the members' next heartbeats."""
        self.group = Group.restore("g", self.stored, self.now, self.topology)

    @rule(name=st.sampled_from(NAMES), partition=st.integers(0, 5))
    def commit(self, name: str, partition: int) -> None:
        client = self.clients[name]
        sp = SP("s", partition)
        try:
            self.group.check_commit(client.member_id, client.epoch, sp)
        except (UnknownMemberId, FencedMember, StaleMemberEpoch, PartitionNotAssigned):
            return
        # an accepted commit comes from a member that holds the partition or, without a
        # member, while the group has none
        if client.member_id:
            assert sp in self.group.members[client.member_id].owned
        else:
            assert not self.group.members

    @rule()
    def settle(self) -> None:
        """Paused and crashed members' sessions run out; the others heartbeat until nothing
        moves: then every partition is consumed by exactly one of them."""
        self.now += SESSION_MS + 1
        self.group.expire(self.now)
        self.persist()
        for client in self.clients.values():
            client.paused = False
        for _ in range(6):
            for client in self.clients.values():
                self.send(client)
        live = [c for c in self.clients.values() if c.member_id and not c.crashed]
        assert self.group.state is (GroupState.STABLE if live else GroupState.EMPTY)
        wanted = {SP(s, p) for c in live for s in c.streams
                  for p in range(self.topology.get(s, 0))}
        consumed = [sp for c in live for sp in c.effective(self.now)]
        assert sorted(consumed) == sorted(wanted)

    @invariant()
    def no_partition_consumed_twice(self) -> None:
        seen: dict[SP, str] = {}
        for client in self.clients.values():
            for sp in client.effective(self.now):
                assert sp not in seen, f"{sp} consumed by {seen[sp]} and {client.name}"
                seen[sp] = client.name

    @invariant()
    def what_a_member_consumes_it_holds(self) -> None:
        for client in self.clients.values():
            consuming = client.effective(self.now)
            if consuming:
                member = self.group.members.get(client.member_id)
                assert member is not None and consuming <= member.owned
                assert all(self.group.holder(sp) == client.member_id for sp in consuming)


GroupMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40,
                                          deadline=None)
test_group_state_machine = GroupMachine.TestCase
