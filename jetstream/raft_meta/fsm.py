"""The metadata state machine: commands in, new state and a result out.

Theory of operation: the state (brokers, streams, partition assignments) changes only by
`apply(command)`. Commands are frozen values; `apply` is deterministic (no clock, no
randomness, no IO), so every broker that applies the same commands in the same order holds
the same state — that is what lets the same class run behind a local file today and a Raft
log (pysyncobj) in a cluster. Placement is part of `apply` for the same reason.

Leader and ISR changes are compare-and-set on the partition's leader epoch: a command built
from stale state is rejected instead of undoing a newer decision. `ChangeLeaders` and
`ChangeIsrs` carry many such changes in one command (one Raft entry; Kafka's AlterPartition
and batched elections): each item is compared and set on its own, and the result is one
outcome per item, the new PartitionState or the error that refused it.

Work per command is proportional to what it changes: the state keeps each broker's replica
and leader counts (`replica_load`, `leader_load`), updated by create, delete and leader
changes and rebuilt by `from_dict`, so placing a stream looks at its own partitions and the
brokers, never at every existing partition.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from jetstream.datastreams import commands as ds
from jetstream.datastreams.model import DatastreamState, TaskAssignment
from jetstream.errors import (
    InvalidAcl,
    InvalidStreamConfig,
    JetstreamError,
    NotEnoughReplicas,
    StreamExists,
    UnknownPartition,
    UnknownStream,
)
from jetstream.raft_meta.model import BrokerInfo, PartitionState, StreamConfig
from jetstream.security.acl import ACL_ENTRIES_MAX, AclEntry


class StaleMetadataEpoch(JetstreamError):
    """A leader or ISR change named a leader epoch that is no longer current: it was decided
    on stale state. Re-read the partition and decide again."""

    code = "STALE_METADATA_EPOCH"
    retriable = True

    def __init__(self, stream: str, partition: int, expected_epoch: int,
                 current_epoch: int) -> None:
        super().__init__(f"{stream}/{partition} is at leader epoch {current_epoch}, not "
                         f"{expected_epoch}", stream=stream, partition=partition,
                         expected_epoch=expected_epoch, current_epoch=current_epoch)


class BrokerShuttingDown(JetstreamError):
    """A leader change named a broker that is shutting down (`ControlledShutdown`): it would
    only have to hand the leadership on, or keep it while it stops. Choose another in-sync
    replica, or wait until that broker has started again."""

    code = "BROKER_SHUTTING_DOWN"
    retriable = True

    def __init__(self, broker: int) -> None:
        super().__init__(f"broker {broker} is shutting down", broker=broker)


# -- commands ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RegisterBroker:
    broker: BrokerInfo


@dataclass(frozen=True, slots=True)
class ControlledShutdown:
    """A broker that is stopping (`active`) takes no leadership from now on: hand-overs,
    failovers and preferred-leader rounds pass it over, and a leader change naming it is
    refused (Kafka's controlled shutdown, whose controller likewise elects no broker that is
    shutting down). A starting broker is marked too, until its leader roles run at the
    epochs it renewed; then the mark comes off (`active` False)."""

    broker: int
    active: bool


@dataclass(frozen=True, slots=True)
class CreateStream:
    config: StreamConfig
    #: The brokers the proposer saw alive (None: every registered broker): replicas are
    #: placed on these only, and a replication factor above their number is refused.
    live: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class DeleteStream:
    name: str


@dataclass(frozen=True, slots=True)
class UpdateStream:
    """Change settings of a stream (StreamConfig.UPDATABLE_FIELDS); every replica applies
    the new config when it reconciles."""

    name: str
    changes: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class ChangeLeader:
    stream: str
    partition: int
    expected_epoch: int
    leader: int


@dataclass(frozen=True, slots=True)
class ChangeIsr:
    stream: str
    partition: int
    expected_epoch: int
    isr: tuple[int, ...]


#: Most items in one ChangeLeaders or ChangeIsrs (one Raft entry of a few hundred KiB at most).
BATCH_ITEMS_MAX = 1000


@dataclass(frozen=True, slots=True)
class ChangeLeaders:
    """Many leader changes in one command; each is compare-and-set on its own epoch."""

    items: tuple[ChangeLeader, ...]


@dataclass(frozen=True, slots=True)
class ChangeIsrs:
    """Many ISR changes in one command; each is compare-and-set on its own epoch."""

    items: tuple[ChangeIsr, ...]


@dataclass(frozen=True, slots=True)
class AddAcls:
    """Add access control entries (jetstream.security.acl); ones already there are kept."""

    entries: tuple[AclEntry, ...]


@dataclass(frozen=True, slots=True)
class RemoveAcls:
    """Remove access control entries; ones not there are passed over."""

    entries: tuple[AclEntry, ...]


#: The outcome of one item of a batch: the partition's new state, or why it was refused.
ItemOutcome = PartitionState | JetstreamError

Command = (RegisterBroker | ControlledShutdown | CreateStream | DeleteStream | UpdateStream
            | ChangeLeader | ChangeIsr | ChangeLeaders | ChangeIsrs | AddAcls | RemoveAcls
            # Datastreams' commands (jetstream.datastreams.commands).
            | ds.CreateDatastream | ds.DeleteDatastream | ds.PauseDatastream | ds.AssignTasks
            | ds.RenewTaskEpoch | ds.DrainTasks
            | ds.UpdateDatastreams)


@dataclass(frozen=True, slots=True)
class ShutdownMark:
    """Result of ControlledShutdown: whether the mark changed and, when it came off, the
    partitions the broker leads (their followers, held back while it was marked, start)."""

    changed: bool
    led: frozenset[tuple[str, int]] = frozenset()


@dataclass(frozen=True, slots=True)
class Created:
    """Result of CreateStream: `existed` when an identical stream was already there."""

    config: StreamConfig
    partitions: tuple[PartitionState, ...]
    existed: bool


class MetadataState:
    def __init__(self) -> None:
        self.brokers: dict[int, BrokerInfo] = {}
        self.streams: dict[str, StreamConfig] = {}
        self.partitions: dict[tuple[str, int], PartitionState] = {}
        #: Per broker: the partitions it holds a replica of, and those it leads (derived from
        #: `partitions`, kept up to date by the handlers; placement reads them).
        self.replica_load: dict[int, int] = {}
        self.leader_load: dict[int, int] = {}
        #: How many commands were applied: a version clients and brokers compare.
        self.version = 0
        #: Access control entries (value: the version that added each), and the version of
        #: the last change to them (decision caches start over when it moves).
        self.acls: dict[AclEntry, int] = {}
        self.acl_version = 0
        #: Datastreams by name (jetstream.datastreams.commands).
        self.datastreams: dict[str, DatastreamState] = {}
        #: Brokers that stopped their datastream tasks to stop (value: the version then).
        self.datastream_draining: dict[int, int] = {}
        #: Brokers shutting down (ControlledShutdown; value: the version that marked them).
        self.shutting_down: dict[int, int] = {}

    def apply(self, command: Command) -> Any:
        """Apply one command; raises a JetstreamError (state unchanged) when it is refused."""
        handler = getattr(self, "_apply_" + type(command).__name__)
        result = handler(command)
        self.version += 1
        return result

    # -- handlers ---------------------------------------------------------------------------

    def _apply_RegisterBroker(self, command: RegisterBroker) -> BrokerInfo:
        self.brokers[command.broker.id] = command.broker
        return command.broker

    def _apply_ControlledShutdown(self, command: ControlledShutdown) -> ShutdownMark:
        """Mark or unmark a broker shutting down."""
        broker = command.broker
        if command.active:
            if broker in self.shutting_down:
                return ShutdownMark(False)
            self.shutting_down[broker] = self.version
            return ShutdownMark(True)
        if self.shutting_down.pop(broker, None) is None:
            return ShutdownMark(False)
        return ShutdownMark(True, frozenset(key for key, p in self.partitions.items()
                                            if p.leader == broker))

    def _apply_CreateStream(self, command: CreateStream) -> Created:
        config = command.config
        existing = self.streams.get(config.name)
        if existing is not None:
            if existing != config:
                raise StreamExists(config.name)
            return Created(existing, self.stream_partitions(config.name), existed=True)
        brokers = self.brokers if command.live is None else {
            b: info for b, info in self.brokers.items() if b in command.live}
        if config.replication_factor > len(brokers):
            raise NotEnoughReplicas(config.replication_factor, len(brokers))
        placed = place_partitions(config, brokers, self.replica_load, self.leader_load,
                                  created_version=self.version)
        self.streams[config.name] = config
        for state in placed:
            self.partitions[(state.stream, state.partition)] = state
            self._count(state, 1)
        return Created(config, tuple(placed), existed=False)

    def _apply_DeleteStream(self, command: DeleteStream) -> StreamConfig:
        config = self.streams.pop(command.name, None)
        if config is None:
            raise UnknownStream(command.name)
        for p in range(config.partitions):
            self._count(self.partitions.pop((command.name, p)), -1)
        return config

    def _apply_UpdateStream(self, command: UpdateStream) -> StreamConfig:
        config = self.streams.get(command.name)
        if config is None:
            raise UnknownStream(command.name)
        updated = config.updated(command.changes)
        self.streams[command.name] = updated
        return updated

    def _apply_ChangeLeader(self, command: ChangeLeader) -> PartitionState:
        state = self._current(command.stream, command.partition, command.expected_epoch)
        if command.leader not in state.isr:
            raise InvalidStreamConfig(
                f"broker {command.leader} is not in the ISR {list(state.isr)}", field="leader")
        if command.leader in self.shutting_down and command.leader != state.leader:
            raise BrokerShuttingDown(command.leader)
        # The old leader leaves the ISR (it failed, or is handing over): the new leader's HW
        # must not wait for it. It rejoins as a follower once caught up.
        isr = tuple(b for b in state.isr if b != state.leader or b == command.leader)
        new = replace(state, leader=command.leader, isr=isr,
                      leader_epoch=state.leader_epoch + 1)
        self.partitions[(command.stream, command.partition)] = new
        _add(self.leader_load, state.leader, -1)
        _add(self.leader_load, new.leader, 1)
        return new

    def _apply_ChangeIsr(self, command: ChangeIsr) -> PartitionState:
        state = self._current(command.stream, command.partition, command.expected_epoch)
        isr = tuple(sorted(set(command.isr)))
        if state.leader not in isr or not set(isr) <= set(state.replicas):
            raise InvalidStreamConfig(
                f"ISR {list(isr)} must hold the leader {state.leader} and only replicas "
                f"{list(state.replicas)}", field="isr")
        new = replace(state, isr=isr)
        self.partitions[(command.stream, command.partition)] = new
        return new

    def _apply_ChangeLeaders(self, command: ChangeLeaders) -> tuple[ItemOutcome, ...]:
        return tuple(self._item(self._apply_ChangeLeader, item) for item in command.items)

    def _apply_ChangeIsrs(self, command: ChangeIsrs) -> tuple[ItemOutcome, ...]:
        return tuple(self._item(self._apply_ChangeIsr, item) for item in command.items)

    def _apply_AddAcls(self, command: AddAcls) -> int:
        new = [e for e in dict.fromkeys(command.entries) if e not in self.acls]
        if len(self.acls) + len(new) > ACL_ENTRIES_MAX:
            raise InvalidAcl(f"the cluster holds at most {ACL_ENTRIES_MAX} ACL entries",
                             field="acls")
        for entry in new:
            self.acls[entry] = self.version
        if new:
            self.acl_version = self.version + 1
        return len(new)

    def _apply_RemoveAcls(self, command: RemoveAcls) -> int:
        removed = [e for e in dict.fromkeys(command.entries)
                   if self.acls.pop(e, None) is not None]
        if removed:
            self.acl_version = self.version + 1
        return len(removed)
    # -- datastreams (jetstream.datastreams.commands) ----------------------------------------

    def _apply_CreateDatastream(self, command: ds.CreateDatastream) -> ds.DatastreamCreated:
        return ds.apply_create(self.datastreams, command, self.version)

    def _apply_DeleteDatastream(self, command: ds.DeleteDatastream) -> DatastreamState:
        return ds.apply_delete(self.datastreams, command)

    def _apply_PauseDatastream(self, command: ds.PauseDatastream) -> DatastreamState:
        return ds.apply_pause(self.datastreams, command)

    def _apply_AssignTasks(self, command: ds.AssignTasks) -> DatastreamState:
        return ds.apply_assign(self.datastreams, command, self.version)

    def _apply_RenewTaskEpoch(self, command: ds.RenewTaskEpoch) -> TaskAssignment:
        return ds.apply_renew(self.datastreams, command, self.version)

    def _apply_DrainTasks(self, command: ds.DrainTasks) -> bool:
        return ds.apply_drain(self.datastream_draining, command, self.version)

    def _apply_UpdateDatastreams(self, command: ds.UpdateDatastreams
                                 ) -> tuple[DatastreamState, ...]:
        return ds.apply_update(self.datastreams, command, self.version)

    @staticmethod
    def _item(handler: Any, item: ChangeLeader | ChangeIsr) -> ItemOutcome:
        """One item of a batch: its handler refuses it (state unchanged) or applies it."""
        try:
            result: PartitionState = handler(item)
        except JetstreamError as exc:
            return exc
        return result

    def _count(self, state: PartitionState, sign: int) -> None:
        for r in state.replicas:
            _add(self.replica_load, r, sign)
        _add(self.leader_load, state.leader, sign)

    def _current(self, stream: str, partition: int, expected_epoch: int) -> PartitionState:
        state = self.partitions.get((stream, partition))
        if state is None:
            if stream not in self.streams:
                raise UnknownStream(stream)
            raise UnknownPartition(stream, partition)
        if state.leader_epoch != expected_epoch:
            raise StaleMetadataEpoch(stream, partition, expected_epoch, state.leader_epoch)
        return state

    # -- queries ----------------------------------------------------------------------------

    def stream_partitions(self, name: str) -> tuple[PartitionState, ...]:
        config = self.streams.get(name)
        if config is None:
            raise UnknownStream(name)
        return tuple(self.partitions[(name, p)] for p in range(config.partitions))

    def partition(self, stream: str, partition: int) -> PartitionState:
        state = self.partitions.get((stream, partition))
        if state is None:
            if stream not in self.streams:
                raise UnknownStream(stream)
            raise UnknownPartition(stream, partition)
        return state

    def copy(self) -> MetadataState:
        """A copy that can be changed without touching this state: it holds only dicts of
        frozen values and ints, so copying the dicts is enough."""
        clone = MetadataState.__new__(MetadataState)
        for name, value in vars(self).items():
            assert isinstance(value, dict | int), (name, type(value))  # a new kind of field?
            setattr(clone, name, dict(value) if isinstance(value, dict) else value)
        return clone

    # -- persistence ------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "brokers": [b.to_dict() for b in self.brokers.values()],
            "streams": [s.to_dict() for s in self.streams.values()],
            "partitions": [p.to_dict() for p in self.partitions.values()],
            "acls": [[e.to_dict(), added] for e, added in self.acls.items()],
            "acl_version": self.acl_version,
            "datastreams": [d.to_dict() for d in self.datastreams.values()],
            "datastream_draining": [[b, v] for b, v in self.datastream_draining.items()],
            "shutting_down": [[b, v] for b, v in self.shutting_down.items()],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MetadataState:
        state = cls()
        state.version = data["version"]
        for b in data["brokers"]:
            state.brokers[b["id"]] = BrokerInfo(**b)
        for s in data["streams"]:
            state.streams[s["name"]] = StreamConfig.from_dict(s)
        for p in data["partitions"]:
            part = PartitionState.from_dict(p)
            state.partitions[(part.stream, part.partition)] = part
            state._count(part, 1)
        for entry, added in data.get("acls", ()):  # absent from dumps written before ACLs
            state.acls[AclEntry.from_dict(entry)] = added
        state.acl_version = data.get("acl_version", 0)
        for d in data.get("datastreams", ()):  # absent in states written before them
            datastream = DatastreamState.from_dict(d)
            state.datastreams[datastream.name] = datastream
        for broker, version in data.get("datastream_draining", ()):
            state.datastream_draining[int(broker)] = int(version)
        for broker, version in data.get("shutting_down", ()):  # absent before it
            state.shutting_down[int(broker)] = int(version)
        return state


def _add(counts: dict[int, int], broker: int, delta: int) -> None:
    """Add `delta` to a broker's count; a count back at 0 is dropped (a recount has none)."""
    value = counts.get(broker, 0) + delta
    assert value >= 0, (broker, value)
    if value:
        counts[broker] = value
    else:
        counts.pop(broker, None)


def recount(partitions: Iterable[PartitionState]) -> tuple[dict[int, int], dict[int, int]]:
    """Each broker's replica and leader counts over `partitions` (what the state keeps)."""
    replicas: dict[int, int] = {}
    leaders: dict[int, int] = {}
    for state in partitions:
        for r in state.replicas:
            _add(replicas, r, 1)
        _add(leaders, state.leader, 1)
    return replicas, leaders


def place_partitions(config: StreamConfig, brokers: Mapping[int, BrokerInfo],
                     replicas_held: Mapping[int, int], partitions_led: Mapping[int, int], *,
                     created_version: int = 0) -> list[PartitionState]:
    """Replicas go to the brokers holding the fewest replicas, leaders to the brokers leading
    the fewest partitions (`replicas_held`, `partitions_led`: the counts per broker so far);
    ties break by broker id, so placement is deterministic."""
    replica_load = {b: replicas_held.get(b, 0) for b in brokers}
    leader_load = {b: partitions_led.get(b, 0) for b in brokers}
    placed = []
    for p in range(config.partitions):
        chosen = sorted(replica_load, key=lambda b: (replica_load[b], b))
        replicas = tuple(chosen[: config.replication_factor])
        leader = min(replicas, key=lambda b: (leader_load[b], b))
        for r in replicas:
            replica_load[r] += 1
        leader_load[leader] += 1
        ordered = (leader, *(r for r in replicas if r != leader))
        placed.append(PartitionState(config.name, p, ordered, leader, tuple(sorted(replicas)),
                                     leader_epoch=0, created_version=created_version))
    return placed
